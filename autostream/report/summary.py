"""Pass reports in words: what was done to which graph, with which cost table, and why.

``PassReport.summary()`` and the backend's report use these (duck-typed on the report:
this layer sits below the pass); a report's log line is its summary in one line
(``report.latest``).
"""

from __future__ import annotations

from typing import Any


def pass_summary(report: Any) -> str:
    """A few lines: the graph and the outcome, the cost table and cost sources, the solver.

    The first line is the report's ``reason``; the others need a plan.
    """
    where = f" ({report.device})" if report.device else ""
    lines = [f"autostream pass, graph of {report.graph_nodes} nodes{where}: "
             f"{outcome_text(report)}"]
    lines += [f"  {line}" for line in plan_lines(report)]
    return "\n".join(lines)


def outcome_text(report: Any) -> str:
    """``applied: <what>`` or ``left unchanged: <why>``."""
    return f"applied: {report.reason}" if report.applied else report.reason


def plan_lines(report: Any) -> list[str]:
    """The cost table and the solver of a report's plan (none without a plan)."""
    plan = report.plan
    if plan is None:
        return []
    table = f"cost table {report.cost_table}" if report.cost_table else "cost table: unknown"
    solved = "proven optimal" if plan.schedule.optimal else "feasible"
    return [f"{table}; cost sources: {plan.cost_sources}",
            f"solver {plan.schedule.solver} ({solved}), {plan.op_graph.number_of_nodes()} ops, "
            f"planned in {plan.plan_seconds:.2f} s"
            + (f", search budget {report.time_limit}" if getattr(report, "time_limit", "") else "")]
