"""Reports in words: what was done to which graph, with which cost table, and why.

``PassReport.summary()`` and the backend's report use these; the log line of a report is
its summary in one line (``autostream.latest``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autostream.cost import TableCostModel
    from autostream.passes import PassReport


def table_label(model: TableCostModel, name: str | os.PathLike | None, device: str) -> str:
    """The cost table a graph on ``device`` was planned with, in words: its name, whether
    the user gave it or it is the device's default, measured or spec-derived, and a
    warning when it was made for another kind of device.

    >>> from autostream.cost import TableCostModel
    >>> table_label(TableCostModel.load("h200"), "h200", "cpu")
    "'h200' (given; cuda, spec-derived, not profiled; made for cuda devices, but the graph is on cpu: its times are not this machine's)"
    """
    d = model.table.device
    kind = d.get("kind", model.profile.kind)
    how = (f"measured on {d['name']}" if model.profile.origin == "measured"
           else "spec-derived, not profiled")
    given = ("given" if name is not None
             else f"the default of {device} graphs")
    label = name if name is not None else DEFAULT_NAMES.get(device, model.profile.name)
    text = f"{os.fspath(label)!r} ({given}; {kind}, {how}"
    mismatch = table_mismatch(kind, device)
    return text + (f"; {mismatch})" if mismatch else ")")


#: the shipped table each device type defaults to (``autostream.cost.defaults``)
DEFAULT_NAMES = {"cpu": "cpu", "cuda": "h200", "npu": "ascend910b"}


def table_mismatch(table_kind: str, device: str) -> str | None:
    """Why a table of ``table_kind`` devices says little about a graph on ``device``.

    >>> table_mismatch("cpu", "cpu") is None, table_mismatch("npu", "meta") is None
    (True, True)
    """
    if device in ("", "meta") or table_kind == device:
        return None
    return (f"made for {table_kind} devices, but the graph is on {device}: its times are not "
            f"this machine's")


def pass_summary(report: PassReport) -> str:
    """A few lines: the graph and the outcome, the cost table and cost sources, the solver.

    The first line is the report's ``reason``; the others need a plan.
    """
    where = f" ({report.device})" if report.device else ""
    lines = [f"autostream pass, graph of {report.graph_nodes} nodes{where}: "
             f"{outcome_text(report)}"]
    lines += [f"  {line}" for line in plan_lines(report)]
    return "\n".join(lines)


def outcome_text(report: PassReport) -> str:
    """``applied: <what>`` or ``left unchanged: <why>``."""
    return f"applied: {report.reason}" if report.applied else report.reason


def plan_lines(report: PassReport) -> list[str]:
    """The cost table and the solver of a report's plan (none without a plan)."""
    plan = report.plan
    if plan is None:
        return []
    table = f"cost table {report.cost_table}" if report.cost_table else "cost table: unknown"
    solved = "proven optimal" if plan.schedule.optimal else "feasible"
    return [f"{table}; cost sources: {plan.cost_sources}",
            f"solver {plan.schedule.solver} ({solved}), {plan.op_graph.number_of_nodes()} ops, "
            f"planned in {plan.plan_seconds:.2f} s"]
