"""A candidate plan checked as it would run: its syncs, predicted time and memory.

:func:`evaluate` is how the planner (:mod:`autostream.planning.plan`) and the memory fit
(:mod:`autostream.planning.fit`) see every plan they weigh: each collective wait on the
stream that launched it (:mod:`autostream.scheduling.waits`), the plan placed as the
compiler will place it, its syncs (:mod:`autostream.scheduling.sync`), its simulated run
(:mod:`autostream.scheduling.simulate`), then its memory
(:mod:`autostream.memory.predict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import networkx as nx

from autostream.cost.runtime_target import RuntimeCosts
from autostream.memory.predict import (
    GraphMemory,
    MemoryProfile,
    allocation_timeline,
    predict_memory,
)
from autostream.scheduling.placement import Placement
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule, Sync
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.sync import compute_syncs
from autostream.scheduling.timeline import Timeline
from autostream.scheduling.waits import launches_of_waits, waits_with_launches

__all__ = ["Candidate", "Edge", "FitInputs", "evaluate", "with_edges"]

Edge = tuple[str, str]


@dataclass(frozen=True)
class FitInputs:
    """What checking and re-solving a plan needs."""

    #: the real dependences (ordering edges are added on top of them)
    deps: nx.DiGraph
    #: the problem the plan was solved on
    problem: SchedulingProblem
    memory: GraphMemory
    solver: str
    solver_options: Mapping[str, Any] = field(default_factory=dict)
    costs: RuntimeCosts = RuntimeCosts()
    #: what the compiler does to a multi-stream plan after the pass; every such plan is
    #: checked as placed (``None``: it runs as planned)
    place: Placement | None = None

    @cached_property
    def launch_of_wait(self) -> dict[str, str]:
        """Each collective wait -> its launch (``scheduling.waits``), found once per graph."""
        return launches_of_waits(self.deps)


@dataclass(frozen=True)
class Candidate:
    """One checked plan: its syncs, predicted time and memory, and how it was made."""

    how: str
    schedule: Schedule
    syncs: tuple[Sync, ...]
    problem: SchedulingProblem
    predicted_us: float
    memory: MemoryProfile
    edges: tuple[Edge, ...] = ()


def evaluate(inputs: FitInputs, schedule: Schedule, problem: SchedulingProblem,
             edges: tuple[Edge, ...] = (), how: str = "as solved", retime: bool = False
             ) -> Candidate:
    """``schedule`` with its syncs (ordering edges included), predicted time and memory.

    ``retime``: the edges were added after solving; the schedule's times are
    recomputed with them (as they are when a collective's wait moves to the stream that
    launched it, ``scheduling.waits``, and when ``inputs.place`` places a multi-stream
    schedule: its syncs are then the placement's).  Memory is laid on the simulated run
    on CPU and on the launch order on an accelerator (its caching allocator counts on the
    host, at launch).
    """
    held = waits_with_launches(schedule, inputs.launch_of_wait)
    if held is not schedule:
        schedule, retime = held, True
    deps = with_edges(inputs.deps, edges)
    placed: tuple[Sync, ...] | None = None
    if inputs.place is not None and schedule.streams_used > 1:
        schedule, placed = inputs.place.place(schedule, deps)
        retime = True
    if schedule.streams_used <= 1:
        if placed is not None:  # placed onto one stream: its times are the replay's
            solved = simulate_plan(problem, schedule, ())
            schedule = replace(schedule, start=solved.start, end=solved.end,
                               makespan=solved.makespan, optimal=False)
        timeline, syncs = Timeline.from_schedule(schedule), ()
        predicted = schedule.makespan
        if inputs.costs.issue_us > 0:  # one host thread issues every op: maybe host-bound
            timeline = simulate_plan(problem, schedule, (),
                                     launch_overhead_us=inputs.costs.issue_us)
            predicted = timeline.makespan
        predicted += inputs.costs.fixed_us
    else:
        syncs = tuple(compute_syncs(deps, schedule)) if placed is None else tuple(placed)
        if retime:
            solved = simulate_plan(problem, schedule, syncs)
            schedule = replace(schedule, start=solved.start, end=solved.end,
                               makespan=solved.makespan, optimal=False)
        timeline = simulate_plan(problem, schedule, syncs,
                                 launch_overhead_us=inputs.costs.issue_us + inputs.costs.op_us,
                                 segment_overhead_us=inputs.costs.segment_us)
        predicted = timeline.makespan + inputs.costs.call_us + inputs.costs.fixed_us
    timeline = allocation_timeline(inputs.memory, schedule, timeline)
    profile = predict_memory(inputs.memory, schedule, syncs, timeline)
    return Candidate(how, schedule, syncs, problem, predicted, profile, edges)


def with_edges(deps: nx.DiGraph, edges: Sequence[Edge]) -> nx.DiGraph:
    """``deps`` with the ordering ``edges`` added (kind ``memory_order``); ``deps`` itself
    when there are none."""
    if not edges:
        return deps
    g = deps.copy()
    g.add_edges_from(edges, kind="memory_order")
    return g
