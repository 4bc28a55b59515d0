"""Keep plans inside their memory budget: check a plan, and repair or replace one over budget.

:func:`fit_plan` is the one entry.  A plan whose predicted peak
(:func:`autostream.memory.predict_memory`) is within the budget is kept as it is.
Otherwise these are tried in turn, each checked the same way:

1. **ordering edges**: at the predicted peak, an edge from an op that frees a live
   storage to the op allocating another live storage, so the second starts only
   once the first is gone (the pair that can stop overlapping the most bytes;
   ties: the earliest allocation, then the earliest free); the solver then plans
   the graph with that edge as one more dependence, and the runtime enforces it
   with a sync.  Up to :data:`MAX_EDGES` edges, one per round, while still over;
2. the fast heuristic solvers' plans, on the graph with and without those edges;
3. the same solver on fewer streams;
4. one stream, within every budget (the budget is an increase over its peak).

Of the plans that fit, the fastest predicted one is used when it still beats one
stream by ``MIN_RELATIVE_GAIN``; else the graph stays on one stream.  A plan over
budget is never returned.  CP-SAT's own model is not changed: its plans are
checked and repaired here like every other solver's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx

from autostream.budget import format_bytes
from autostream.memory import GraphMemory, MemoryProfile, launch_timeline, predict_memory
from autostream.problem import SchedulingProblem
from autostream.schedule import Schedule, Sync
from autostream.simulate import Timeline, simulate_plan
from autostream.solvers import get_solver
from autostream.sync import compute_syncs

__all__ = ["Candidate", "FitInputs", "PlanMemory", "RuntimeCosts", "evaluate", "fit_plan"]

#: ordering edges added, at most, while repairing one plan
MAX_EDGES = 8
#: live storages at the peak considered for an edge (the largest)
PEAK_CANDIDATES = 16
#: heuristic solvers whose plans replace one that cannot be repaired (fast, no search)
FALLBACK_SOLVERS = ("heft", "critical_path", "tf_greedy", "nimble", "opara", "round_robin")

Edge = tuple[str, str]


@dataclass(frozen=True)
class RuntimeCosts:
    """The multi-stream runtime's host costs (``CostModel.runtime_*_us``)."""

    op_us: float = 0.0
    call_us: float = 0.0
    segment_us: float = 0.0


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


@dataclass(frozen=True)
class PlanMemory:
    """The memory figures a plan carries (bytes)."""

    peak_bytes: int
    single_stream_peak_bytes: int
    #: ``None`` without a budget
    limit_bytes: int | None
    reserved_bytes: int
    profile: MemoryProfile
    #: ordering edges the plan was repaired with
    edges: tuple[Edge, ...] = ()
    #: how the plan was obtained when it had to be repaired or replaced
    how: str = "as solved"

    @property
    def increase(self) -> float:
        """The peak's rise above one stream's, as a fraction."""
        base = self.single_stream_peak_bytes
        return self.peak_bytes / base - 1.0 if base > 0 else 0.0


def evaluate(inputs: FitInputs, schedule: Schedule, problem: SchedulingProblem,
             edges: tuple[Edge, ...] = (), how: str = "as solved") -> Candidate:
    """``schedule`` with its syncs (ordering edges included), predicted time and memory.

    Memory is laid on the simulated run on CPU and on the launch order on an
    accelerator (its caching allocator counts on the host, at launch).
    """
    if schedule.streams_used <= 1:
        timeline, syncs = Timeline.from_schedule(schedule), ()
        predicted = schedule.makespan
    else:
        syncs = tuple(compute_syncs(_with_edges(inputs.deps, edges), schedule))
        timeline = simulate_plan(problem, schedule, syncs, launch_overhead_us=inputs.costs.op_us,
                                 segment_overhead_us=inputs.costs.segment_us)
        predicted = timeline.makespan + inputs.costs.call_us
    if inputs.memory.device_type != "cpu":
        timeline = launch_timeline(schedule)
    profile = predict_memory(inputs.memory, schedule, syncs, timeline)
    return Candidate(how, schedule, syncs, problem, predicted, profile, edges)


def fit_plan(inputs: FitInputs, candidate: Candidate, single: Candidate, limit: int | None,
             min_gain: float) -> tuple[Candidate, list[str]]:
    """``candidate`` if its peak is within ``limit`` bytes, else the fastest repair or
    replacement that is (``single`` when none beats it by ``min_gain``), and notes."""
    if limit is None or candidate.memory.peak_bytes <= limit:
        return candidate, []
    notes = [f"{candidate.how} plan peaks at {format_bytes(candidate.memory.peak_bytes)}, over "
             f"the budget of {format_bytes(limit)} (one stream: "
             f"{format_bytes(single.memory.peak_bytes)})"]
    bar = single.predicted_us * (1 - min_gain)
    tried = _attempts(inputs, candidate, limit)
    fits = [c for c in tried if c.memory.peak_bytes <= limit and c.schedule.streams_used > 1
            and c.predicted_us < bar]
    if not fits:
        notes.append(f"no repair fits and beats one stream ({len(tried)} tried); keeping one "
                     "stream")
        return replace(single, how="one stream (memory budget)"), notes
    best = min(fits, key=lambda c: c.predicted_us)
    notes.append(f"using {best.how}: {best.predicted_us:.1f} us instead of "
                 f"{candidate.predicted_us:.1f} us, peak {format_bytes(best.memory.peak_bytes)}")
    return best, notes


def _attempts(inputs: FitInputs, candidate: Candidate, limit: int) -> list[Candidate]:
    repaired = _repair_with_edges(inputs, candidate, limit)
    tried = list(repaired)
    if any(c.memory.peak_bytes <= limit for c in repaired):
        return tried
    edges = repaired[-1].edges if repaired else ()
    for name in FALLBACK_SOLVERS:
        if name == inputs.solver:
            continue
        for extra in dict.fromkeys([(), edges]):
            problem = _with_problem_edges(inputs.problem, extra)
            schedule = _solve(name, problem, {})
            label = f"{name}" + (f" with {len(extra)} ordering edge(s)" if extra else "")
            tried.append(evaluate(inputs, schedule, problem, extra, label))
    if any(c.memory.peak_bytes <= limit and c.schedule.streams_used > 1 for c in tried):
        return tried
    for streams in range(inputs.problem.streams - 1, 1, -1):
        problem = replace(inputs.problem, streams=streams)
        schedule = _solve(inputs.solver, problem, inputs.solver_options)
        tried.append(evaluate(inputs, schedule, problem, (), f"{inputs.solver} on {streams} "
                                                            "streams"))
    return tried


def _repair_with_edges(inputs: FitInputs, candidate: Candidate, limit: int) -> list[Candidate]:
    out: list[Candidate] = []
    current, edges = candidate, candidate.edges
    while current.memory.peak_bytes > limit and len(edges) < MAX_EDGES:
        deps = _with_edges(inputs.deps, edges)
        edge = ending_edge(current.memory, deps)
        if edge is None:
            break
        edges = (*edges, edge)
        problem = _with_problem_edges(inputs.problem, edges)
        schedule = _solve(inputs.solver, problem, inputs.solver_options)
        current = evaluate(inputs, schedule, problem, edges,
                           f"{inputs.solver} with {len(edges)} ordering edge(s)")
        out.append(current)
    return out


def ending_edge(profile: MemoryProfile, deps: nx.DiGraph) -> Edge | None:
    """The ordering edge ``(frees, allocates)`` that stops the most bytes overlapping at the
    peak, or ``None`` when no edge can (every candidate would close a cycle).

    >>> import networkx as nx
    >>> from autostream.schedule import Schedule
    >>> deps = nx.DiGraph([("a", "b"), ("c", "d")])
    >>> mem = GraphMemory.from_sizes(deps, {"a": 8, "b": 1, "c": 8, "d": 1})
    >>> s = Schedule("x", {"a": 0, "b": 0, "c": 1, "d": 1}, ("a", "c", "b", "d"),
    ...              {"a": 0.0, "c": 0.0, "b": 1.0, "d": 1.0},
    ...              {"a": 1.0, "c": 1.0, "b": 2.0, "d": 2.0}, 2.0, 2.0)
    >>> ending_edge(predict_memory(mem, s), deps)  # a's storage dies with b: c waits for it
    ('b', 'c')
    """
    lives = profile.lives
    peak = profile.at_peak[:PEAK_CANDIDATES]
    best: tuple[tuple, Edge] | None = None  # the smallest key wins
    for r in sorted({_freer(lives[s]) for s in peak} - {None}):
        before = nx.ancestors(deps, r) | {r}
        after = nx.descendants(deps, r)
        r_end = max(lives[s].end for s in peak if _freer(lives[s]) == r)
        freed = sum(lives[s].nbytes for s in peak if lives[s].end <= r_end)
        for t in peak:
            a = lives[t].allocated_by
            if a in before or a in after:
                continue
            key = (-min(lives[t].nbytes, freed), lives[t].start, r_end, r, a)
            if best is None or key < best[0]:
                best = (key, (r, a))
    return None if best is None else best[1]


def _freer(life) -> str | None:
    return life.freed_after or life.freed_before


def _with_edges(deps: nx.DiGraph, edges: Sequence[Edge]) -> nx.DiGraph:
    if not edges:
        return deps
    g = deps.copy()
    g.add_edges_from(edges, kind="memory_order")
    return g


def _with_problem_edges(problem: SchedulingProblem, edges: Sequence[Edge]) -> SchedulingProblem:
    if not edges:
        return problem
    return replace(problem, graph=_with_edges(problem.graph, edges))


def _solve(name: str, problem: SchedulingProblem, options: Mapping[str, Any]) -> Schedule:
    return get_solver(name)(problem, **options)
