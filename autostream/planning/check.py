"""Check a hand placement of streams, and set it beside autostream's plan of the same graph.

:func:`check` reads the placement (``dialects.hand``), writes it in autostream's own
dialect (``dialects.rewrite``) and replays it with the project's verifier
(``dialects.verify``): every dependence left unordered is a :class:`Race` (the two ops,
their streams, the storage, the source lines from ``node.meta["stack_trace"]``),
collectives on more than one stream are named, and the placement is simulated on the
same cost table as autostream's plan, its bound and one stream.  A race's edge is left
out of the simulation (the op runs when its stream gets to it, as on the device).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import networkx as nx
import torch
import torch.fx

from autostream.cost.defaults import default_table
from autostream.cost.label import table_label
from autostream.dialects.hand import MAIN, HandPlacement, check_mode, read_placement
from autostream.dialects.input_mutations import ge_output_ref_edges
from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.torchair_modes import (
    GE_MODE,
    GE_PLACEMENT,
    acl_reinplace_hazards,
    acl_scope_overhead_us,
)
from autostream.dialects.verify import verify_rewrite
from autostream.fx.device import graph_device
from autostream.fx.graph import communicates, dependence_storage
from autostream.planning.plan import Plan, PlanOptions, build_problem, load_cost_model, plan_graph
from autostream.scheduling.schedule import JOIN, Schedule
from autostream.scheduling.simulate import simulate_plan

if TYPE_CHECKING:
    from autostream.cost import CostModel

#: TorchAir's ``config.mode`` of each target (``None``: CUDA events)
TORCHAIR_MODE = {"cuda": None, "ge": GE_MODE, "acl": "reduce-overhead"}

log = logging.getLogger("autostream")


@dataclass(frozen=True)
class Race:
    """Two ops a dependence orders that the placement lets run in either order."""

    ops: tuple[str, str]
    streams: tuple[str, str]
    #: the storage both touch (a graph input's or an op's name)
    storage: str
    #: ``file:line (code)`` of each op, ``"?"`` where the graph has no stack trace
    source: tuple[str, str]
    #: "data" (read before written), "memory" (a write against a read or write), "wait on a
    #: Const" (GE: the wait meant for it lands on a ``Const`` its consumer reads after it) ...
    kind: str = "data"

    def describe(self) -> str:
        return (f"{self.ops[0]} on {self.streams[0]} ({self.source[0]}) and {self.ops[1]} on "
                f"{self.streams[1]} ({self.source[1]}) race on {self.storage} ({self.kind})")


@dataclass(frozen=True)
class HandCheck:
    """What :func:`check` found: races, other problems, and four predicted times (us)."""

    mode: str
    races: tuple[Race, ...]
    problems: tuple[str, ...]
    #: stream labels holding collectives, when more than one does
    collective_streams: tuple[str, ...]
    hand_streams: int
    dependences_checked: int
    hand_us: float
    autostream_us: float
    bound_us: float
    single_stream_us: float
    plan: Plan = field(repr=False, compare=False)
    placement: HandPlacement = field(repr=False, compare=False)
    #: the cost table of the four times, in words (``cost.label.table_label``)
    cost_table: str = ""
    #: what the predicted times rest on beyond the table's entries (collectives' link
    #: fits scaled to another world size, ...: ``Plan.comm_notes``)
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.races or self.problems or self.collective_streams)

    def figures(self) -> dict[str, Any]:
        """The figures ``autostream check --json`` writes."""
        return {
            "mode": self.mode,
            "cost_table": self.cost_table,
            "races": [dataclasses.asdict(r) for r in self.races],
            "problems": list(self.problems),
            "collective_streams": list(self.collective_streams),
            "hand_streams": self.hand_streams,
            "dependences_checked": self.dependences_checked,
            "hand_us": self.hand_us,
            "autostream_us": self.autostream_us,
            "autostream_streams": self.plan.schedule.streams_used,
            "bound_us": self.bound_us,
            "single_stream_us": self.single_stream_us,
            "stream_ops_read": list(self.placement.kinds),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        """The check in words: what was checked, what was found, the four times and the
        cost table they rest on (``figures()`` gives the numbers)."""
        lines = [f"hand placement ({', '.join(self.placement.kinds) or 'no stream ops'}; "
                 f"{self.hand_streams} stream(s)), checked as {self.mode}: "
                 f"{self.dependences_checked} dependences checked, {len(self.races)} race(s)"]
        lines += [f"  race: {r.describe()}" for r in self.races]
        lines += [f"  problem: {p}" for p in self.problems]
        if self.collective_streams:
            lines.append(f"  collectives on {len(self.collective_streams)} streams "
                         f"({', '.join(self.collective_streams)}): ranks may issue them in "
                         f"different orders; keep them on one stream")
        lines.append(f"  predicted: hand {self.hand_us:.1f} us, autostream "
                     f"{self.autostream_us:.1f} us ({self.plan.schedule.streams_used} "
                     f"stream(s)), bound {self.bound_us:.1f} us, one stream "
                     f"{self.single_stream_us:.1f} us")
        lines += [f"  note: {n}" for n in self.notes]
        if self.cost_table:
            lines.append(f"  cost table: {self.cost_table}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<HandCheck {self.summary()}>"


def source_line(node: torch.fx.Node | None) -> str:
    """``file:line (code)`` of the innermost frame of ``node.meta["stack_trace"]``.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> n = g.call_function(torch.ops.aten.relu.default, (x,))
    >>> n.meta["stack_trace"] = '  File "m.py", line 7, in forward\\n    y = x.relu()\\n'
    >>> source_line(n)
    'm.py:7 (y = x.relu())'
    """
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return "?"
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            parts = lines[i].split('"')
            where = parts[1] if len(parts) > 2 else lines[i]
            number = lines[i].split("line ", 1)[-1].split(",", 1)[0]
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{where}:{number}" + (f" ({code})" if code else "")
    return lines[-1]


def _races(placement: HandPlacement, deps: nx.DiGraph, unordered: list[tuple[str, str]]
           ) -> tuple[Race, ...]:
    label = placement.labels
    on_const = set(placement.waits_on_const)
    out = []
    for u, v in unordered:
        fu, fv = deps.nodes[u]["fx"], deps.nodes[v]["fx"]
        kind = "wait on a Const" if (u, v) in on_const else deps.edges[u, v].get("kind", "data")
        out.append(Race((u, v), (label[placement.stream_of[u]], label[placement.stream_of[v]]),
                        dependence_storage(fu, fv), (source_line(fu), source_line(fv)), kind))
    return tuple(out)


def simulate_hand(plan: Plan, placement: HandPlacement, streams: int,
                  unordered: list[tuple[str, str]], costs: CostModel,
                  min_share: float = 0.0, launch_us: float | None = None,
                  latency_us: float | None = None) -> float:
    """The placement's predicted time on ``plan``'s costs, races left unordered.
    ``min_share``, ``launch_us`` (the host issuing one op every that many us) and
    ``latency_us`` change the device model, to see which part a prediction rests on."""
    problem = build_problem(plan.op_graph, plan.estimates, streams,
                            plan.problem.sync_latency_us if latency_us is None else latency_us,
                            transfers=plan.transfers)
    problem.graph.remove_edges_from(unordered)
    for _, data in problem.graph.nodes(data=True):
        if data.get("duration", 0) > 0:
            data["share"] = max(data.get("share", 1.0), min_share)
    stream_of = dict(placement.stream_of)
    order: list[str] = []
    pinned = problem.pinned
    for n in placement.order:
        order.append(n)
        for task in sorted(t for t in problem.graph.successors(n) if t in pinned):
            stream_of[task] = pinned[task]
            order.append(task)
    zero = dict.fromkeys(order, 0.0)
    schedule = Schedule("hand", stream_of, tuple(order), zero, zero, 0.0, 0.0)
    if schedule.streams_used <= 1:
        return simulate_plan(problem, schedule, (), launch_overhead_us=launch_us or 0.0).makespan
    syncs = [s for s in placement.syncs if s.consumer == JOIN or (s.producer, s.consumer)
             not in set(unordered)]
    launch = costs.runtime_op_us if launch_us is None else launch_us
    timeline = simulate_plan(problem, schedule, syncs, launch_overhead_us=launch,
                             segment_overhead_us=costs.runtime_segment_us)
    return timeline.makespan + costs.runtime_call_us


def check_placement(gm: torch.fx.GraphModule, mode: str, options: PlanOptions,
                    cost_model: CostModel, ge_placement: bool = True, cost_table: str = ""
                    ) -> HandCheck:
    """:func:`check` with the planner's options and cost model given (the pass's own).
    ``ge_placement=False``: autostream's plan is timed as planned, without GE's moves of
    lazy views and waits (which the hand placement's time leaves out too).
    ``cost_table``: the cost model in words, for the check's summary."""
    check_mode(mode)
    placement = read_placement(gm, mode)
    acl = mode == "acl"
    streams = max(options.max_streams, placement.streams_used)
    with _notes_told_in_summary() as told:
        plan = plan_graph(placement.graph, dataclasses.replace(options, max_streams=streams),
                          cost_model, acl_reinplace_hazards if acl else
                          ge_output_ref_edges if mode == "ge" else None,
                          acl_scope_overhead_us(cost_model.sync_latency_us) if acl else 0.0,
                          GE_PLACEMENT if mode == "ge" and ge_placement else None)
        told.update(plan.comm_notes)
    deps = plan.op_graph
    written = torch.fx.GraphModule(placement.graph, copy.deepcopy(placement.graph.graph))
    rewrite_graph(written, placement.schedule(), placement.syncs)
    verified = verify_rewrite(written, deps)
    unordered = sorted(set(verified.unordered))
    problems = [p for p in verified.problems if not p.startswith("dependence ")]
    side = {s: label for s, label in placement.labels.items() if s != 0}
    problems = [_relabel(p, side) for p in problems]
    comm_streams = sorted({placement.stream_of[n] for n in placement.order
                           if communicates(deps.nodes[n]["fx"])})
    hand_us = simulate_hand(plan, placement, streams, unordered, cost_model)
    return HandCheck(
        mode, _races(placement, deps, unordered), (*placement.problems, *problems),
        tuple(placement.labels[s] for s in comm_streams) if len(comm_streams) > 1 else (),
        placement.streams_used, verified.checked["dependences"], hand_us, plan.predicted_us,
        plan.schedule.lower_bound, plan.single_stream_us, plan, placement, cost_table,
        plan.comm_notes)


@contextlib.contextmanager
def _notes_told_in_summary() -> Iterator[set[str]]:
    """Hold back the ``autostream`` log records made inside; at the end let through those
    whose message is not ``autostream: NOTE`` for a note added to the yielded set (the
    check's summary tells those, once, beside the times they qualify)."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    told: set[str] = set()
    log.addFilter(hold)
    try:
        yield told
    finally:
        log.removeFilter(hold)
        for record in held:
            if record.getMessage().removeprefix("autostream: ") not in told:
                log.handle(record)


def _relabel(problem: str, side: dict[int, str]) -> str:
    for s, label in side.items():
        problem = problem.replace(f"side stream {s} ", f"side stream {label!r} ")
    return problem


def check(gm: torch.fx.GraphModule, mode: str = "cuda", cost_table: Any = None,
          max_streams: int = 2, time_limit: float | None = None,
          max_memory_increase: float | str | None = None, ge_placement: bool = True
          ) -> HandCheck:
    """Check the streams placed by hand in a captured graph ``gm`` (left unchanged).

    ``mode``: the target's semantics, ``"cuda"`` (events), ``"ge"`` (TorchAir GE) or
    ``"acl"`` (TorchAir ACL graph).  autostream's plan may use as many streams as the
    placement, or ``max_streams`` if more, and uses fewer where more do not pay (its
    ``plan.schedule.streams_used`` says how many); ``max_memory_increase=None``: no
    memory budget (the placement has none).  Under ``"ge"`` autostream's plan is timed as GE places it (``ge_placement``); the hand
    placement as written.  ``cost_table=None``: the default table of the target's device,
    as the pass would pick it there: ``ascend910b`` under ``"ge"`` and ``"acl"`` (TorchAir's
    modes), else that of the graph's device (``cpu`` for a graph of CPU or fake tensors).

    >>> from autostream.runtime.builder import DialectBuilder
    >>> b = DialectBuilder(); x = b.input("x")
    >>> with b.stream(1):
    ...     y = b.call(torch.ops.aten.neg.default, x)
    >>> gm = b.finish(b.call(torch.ops.aten.add.Tensor, x, y))
    >>> [r.ops for r in check(gm, cost_table="h200").races]  # no wait before the add
    [('neg_default', 'add_tensor')]
    """
    options = PlanOptions(max_streams=max_streams, cost_table=None, time_limit=time_limit,
                          max_memory_increase=max_memory_increase)
    device = "npu" if mode in ("ge", "acl") else graph_device(gm.graph)
    if cost_table is None:
        model: CostModel = default_table(device).model
    else:
        model = load_cost_model(cost_table)
    named = (cost_table if isinstance(cost_table, (str, os.PathLike)) or cost_table is None
             else getattr(getattr(model, "table", None), "source", type(model).__name__))
    # TorchAir's modes: the default is the target's, not that of the graph's device
    whose = f"mode {mode!r}: TorchAir's target, Ascend" if TORCHAIR_MODE[mode] else None
    return check_placement(gm, mode, options, model, ge_placement,
                           table_label(model, named, device, whose))


__all__ = ["MAIN", "HandCheck", "Race", "TORCHAIR_MODE", "check", "check_placement",
           "simulate_hand", "source_line"]
