"""Keep plans inside their memory budget: check a plan, and repair or replace one over budget.

:func:`fit_plan` is the one entry.  A plan is within the budget when the most bytes
it can hold is: ``MemoryProfile.bound_bytes``
(:func:`autostream.memory.predict.predict_memory`), over every interleaving its syncs allow
on CPU threads, the launch order's peak on an accelerator.  A plan within it is kept
as it is.  Otherwise these are tried in turn, each plan checked the same way
(:func:`autostream.planning.evaluate.evaluate`),
stopping at the first step that yields one within budget:

1. **ordering edges** (:func:`repair_in_order`): keeping the plan's streams and
   launch order, add an edge from an op that frees a storage live at the peak to a
   later-launched op on another stream that allocates one, so the second waits for
   the first to be gone (a sync enforces it).  Each round tries the best-ranked
   edges and keeps the one that lowers the peak most; then, unless the repaired plan
   already keeps ``KEEP_GAIN`` of the unconstrained plan's gain, the solver plans the
   graph again with those edges as dependences (it may order it better);
2. the fast heuristic solvers' plans, as they are and (the fastest ones) repaired
   with ordering edges;
3. the same solver on fewer streams, as it is and repaired (also when what fitted
   keeps less than ``KEEP_GAIN`` of the unconstrained plan's gain), from the most
   streams down, until a plan fits and keeps that share;
4. one stream, within every budget (the budget is an increase over its peak).

Of the plans that fit, the fastest predicted one is used when it still beats one
stream by ``MIN_RELATIVE_GAIN``; else the graph stays on one stream.  A plan over
budget is never returned.  CP-SAT's own model is not changed: its plans are
checked and repaired here like every other solver's.  The work is bounded by a
count of plan evaluations (deterministic), not by a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autostream.memory.budget import format_bytes
from autostream.memory.cap import capped_replay
from autostream.memory.predict import GraphMemory, MemoryProfile, StorageLife
from autostream.planning.evaluate import Candidate, Edge, FitInputs, evaluate, with_edges
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers import get_solver

__all__ = ["PlanMemory", "ending_edges", "fit_plan", "repair", "repair_in_order"]

#: ordering edges added, at most, while repairing one plan
MAX_EDGES = 32
#: capped replays per repair, each with the cap lowered by the last overshoot
CAP_ROUNDS = 3
#: edges evaluated per round of :func:`repair_in_order`
EDGES_PER_ROUND = 8
#: plan evaluations one repair may spend: this many node-evaluations, at least
#: ``MIN_EVALUATIONS`` (deterministic, unlike a time limit)
EVALUATION_BUDGET = 20_000
MIN_EVALUATIONS = 16
#: over-budget fallback plans that are repaired too (the fastest ones)
REPAIRED_FALLBACKS = 2
#: a fitting plan that keeps less than this share of the unconstrained plan's gain over
#: one stream sends the search on to fewer streams as well (step 3)
KEEP_GAIN = 0.5
#: live storages at the peak considered for an edge (the largest)
PEAK_CANDIDATES = 16
#: heuristic solvers whose plans replace one that cannot be repaired (fast, no search)
FALLBACK_SOLVERS = ("heft", "critical_path", "tf_greedy", "opara", "round_robin")


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
    def bound_bytes(self) -> int:
        """The most the plan can hold in any interleaving of its streams (what the budget
        binds; ``MemoryProfile.bound_bytes``)."""
        return self.profile.bound_bytes

    @property
    def increase(self) -> float:
        """The peak's rise above one stream's, as a fraction."""
        base = self.single_stream_peak_bytes
        return self.peak_bytes / base - 1.0 if base > 0 else 0.0


def fit_plan(inputs: FitInputs, candidate: Candidate, single: Candidate, limit: int | None,
             min_gain: float) -> tuple[Candidate, list[str]]:
    """``candidate`` if its peak is within ``limit`` bytes, else the fastest repair or
    replacement that is (``single`` when none beats it by ``min_gain``), and notes."""
    if limit is None or candidate.memory.bound_bytes <= limit:
        return candidate, []
    notes = [f"{candidate.how} may peak at {format_bytes(candidate.memory.bound_bytes)}, over "
             f"the budget of {format_bytes(limit)} (one stream: "
             f"{format_bytes(single.memory.peak_bytes)})"]
    bar = single.predicted_us * (1 - min_gain)
    # a plan this fast keeps KEEP_GAIN of the gain: searching further is not worth a solve
    enough = single.predicted_us - KEEP_GAIN * (single.predicted_us - candidate.predicted_us)
    evals = _Evaluations(max(MIN_EVALUATIONS, EVALUATION_BUDGET // max(1, len(inputs.deps))))
    fits = [c for c in _attempts(inputs, candidate, limit, evals, enough)
            if _fits(c, limit) and c.predicted_us < bar]
    if not fits or min(c.predicted_us for c in fits) > enough:
        # what fits keeps little of the gain: fewer streams may keep more within budget
        fits += [c for c in _fewer_streams(inputs, limit, evals, enough)
                 if _fits(c, limit) and c.predicted_us < bar]
    if not fits:
        notes.append("no repair fits the budget and beats one stream; keeping one stream")
        return replace(single, how="one stream (memory budget)"), notes
    best = min(fits, key=lambda c: c.predicted_us)
    notes.append(f"using {best.how}: {best.predicted_us:.1f} us instead of "
                 f"{candidate.predicted_us:.1f} us, peak at most {format_bytes(best.memory.bound_bytes)}")
    return best, notes


def _attempts(inputs: FitInputs, candidate: Candidate, limit: int, evals: _Evaluations,
              enough: float) -> list[Candidate]:
    """Steps 1-2 of the module docstring, stopping at the first step that fits (the caller
    goes on to step 3); a repaired plan predicted within ``enough`` us is not re-solved."""
    repaired = repair(inputs, candidate, limit, evals)
    tried = [repaired]
    if repaired.memory.bound_bytes <= limit:
        if repaired.edges and repaired.predicted_us > enough:
            # the solver may order the graph with those edges better
            problem = _with_problem_edges(inputs.problem, repaired.edges)
            schedule = _solve(inputs.solver, problem, inputs.solver_options)
            tried.append(evaluate(inputs, schedule, problem, repaired.edges,
                                  f"{inputs.solver} with {len(repaired.edges)} ordering edge(s)"))
        return tried
    others = [evaluate(inputs, _solve(name, inputs.problem, {}), inputs.problem, how=name)
              for name in FALLBACK_SOLVERS if name != inputs.solver]
    tried += others
    over = sorted((c for c in others if c.memory.bound_bytes > limit and c.schedule.streams_used > 1),
                  key=lambda c: c.predicted_us)
    tried += [repair(inputs, c, limit, evals) for c in over[:REPAIRED_FALLBACKS]]
    return tried


def _fewer_streams(inputs: FitInputs, limit: int, evals: _Evaluations, enough: float
                   ) -> list[Candidate]:
    """Step 3: the solver on each smaller stream count (down to 2), as is and repaired,
    until one fits within ``enough`` us."""
    tried: list[Candidate] = []
    for streams in range(inputs.problem.streams - 1, 1, -1):
        problem = replace(inputs.problem, streams=streams)
        schedule = _solve(inputs.solver, problem, inputs.solver_options)
        fewer = evaluate(inputs, schedule, problem, (), f"{inputs.solver} on {streams} streams")
        tried += [fewer, repair(inputs, fewer, limit, evals)]
        if any(_fits(c, limit) and c.predicted_us <= enough for c in tried[-2:]):
            break
    return tried


def _over(c: Candidate, limit: int) -> tuple[bool, int, float]:
    """Ranks plans: within ``limit`` first, then the lowest bound over it, then the fastest."""
    over = c.memory.bound_bytes > limit
    return over, c.memory.bound_bytes if over else 0, c.predicted_us


def _fits(c: Candidate, limit: int) -> bool:
    return c.memory.bound_bytes <= limit and c.schedule.streams_used > 1


class _Evaluations:
    """A deterministic budget of plan evaluations for one repair (not wall-clock time)."""

    def __init__(self, budget: int):
        self.left = budget

    def take(self, n: int) -> int:
        n = min(n, self.left)
        self.left -= n
        return n


def repair(inputs: FitInputs, candidate: Candidate, limit: int, evals: _Evaluations
           ) -> Candidate:
    """``candidate`` replayed under a memory cap (:func:`autostream.memory.cap.capped_replay`),
    then given ordering edges (:func:`repair_in_order`) while still over ``limit``.

    The replay frees storages at their last read; where the exact prediction still
    overshoots (storages kept for other streams' reads), the cap is lowered by the
    overshoot and the replay run again, up to :data:`CAP_ROUNDS` times.  Returns the
    fastest plan within ``limit``, else the one with the lowest peak.
    """
    if candidate.memory.bound_bytes <= limit:
        return candidate
    durations = {n: candidate.schedule.end[n] - candidate.schedule.start[n]
                 for n in candidate.schedule.order}
    tried, cap = [candidate], limit
    for _ in range(CAP_ROUNDS):
        if not evals.take(1):
            break
        order, added = capped_replay(candidate.schedule, candidate.problem, inputs.memory, cap,
                                     durations)
        capped = evaluate(inputs, replace(candidate.schedule, order=order),
                          _with_problem_edges(candidate.problem, added),
                          (*candidate.edges, *added), f"{candidate.how} under a memory cap",
                          retime=True)
        tried.append(repair_in_order(inputs, capped, limit, evals))
        if _fits(tried[-1], limit):
            break
        cap -= tried[-1].memory.bound_bytes - limit
    return min(tried, key=lambda c: _over(c, limit))


def repair_in_order(inputs: FitInputs, candidate: Candidate, limit: int,
                    evals: _Evaluations | None = None) -> Candidate:
    """Add ordering edges to ``candidate``, keeping its streams and launch order, until
    its peak fits ``limit`` (or no edge lowers it).

    Each round evaluates the :data:`EDGES_PER_ROUND` best-ranked edges
    (:func:`ending_edges`) and keeps the one with the lowest peak (the fastest among
    those that fit).  An edge goes forward in the launch order, so the order stays
    valid and nothing is re-solved.
    """
    evals = evals or _Evaluations(EVALUATION_BUDGET)
    current = candidate
    while current.memory.bound_bytes > limit and len(current.edges) < MAX_EDGES:
        edges = ending_edges(current, inputs.memory)[:evals.take(EDGES_PER_ROUND)]
        if not edges:
            break
        label = f"{candidate.how} with {len(current.edges) + 1} ordering edge(s)"
        trials = [evaluate(inputs, current.schedule, _with_problem_edges(current.problem, (e,)),
                           (*current.edges, e), label, retime=True) for e in edges]
        best = min(trials, key=lambda c: _over(c, limit))
        if best.memory.bound_bytes > current.memory.bound_bytes:
            break
        current = best
    return current


def ending_edges(candidate: Candidate, memory: GraphMemory) -> list[Edge]:
    """Ordering edges that could lower ``candidate``'s peak, best first.

    For storages live at the peak, on different streams: ``(frees one, allocates
    another)``, so the allocation waits until the first storage is gone; and, for a
    storage kept alive after its last read because another stream read it,
    ``(that read, the allocating stream's next op)``, whose wait lets the storage go
    (:mod:`autostream.memory.lifetimes`).  Every edge goes forward in the launch order.
    Ranked by the bytes that stop overlapping, then the earliest allocation and the
    earliest free.

    >>> import networkx as nx
    >>> from autostream.memory.predict import predict_memory
    >>> from autostream.scheduling.schedule import Schedule
    >>> deps = nx.DiGraph([("a", "b"), ("c", "d")])
    >>> mem = GraphMemory.from_sizes(deps, {"a": 8, "b": 1, "c": 8, "d": 1})
    >>> s = Schedule("x", {"a": 0, "b": 0, "c": 1, "d": 1}, ("a", "b", "c", "d"),
    ...              {"a": 0.0, "b": 1.0, "c": 0.0, "d": 1.0},
    ...              {"a": 1.0, "b": 2.0, "c": 1.0, "d": 2.0}, 2.0, 2.0)
    >>> c = Candidate("x", s, (), None, 2.0, predict_memory(mem, s))
    >>> ending_edges(c, mem)  # a's storage dies with b: c may start after it
    [('b', 'c'), ('b', 'd')]
    """
    profile, schedule = candidate.memory, candidate.schedule
    lives = profile.lives
    position = {n: i for i, n in enumerate(schedule.order)}
    peak = profile.binding_at[:PEAK_CANDIDATES]
    ranked: dict[Edge, tuple] = {}

    def offer(edge: Edge, key: tuple) -> None:
        if edge not in candidate.edges:
            ranked[edge] = min(key, ranked.get(edge, key))

    for r in {_freer(lives[s]) for s in peak} - {None}:
        r_end = max(lives[s].end for s in peak if _freer(lives[s]) == r)
        freed = sum(lives[s].nbytes for s in peak if lives[s].end <= r_end)
        for t in peak:
            a = lives[t].allocated_by
            if position[a] > position[r] and schedule.stream_of[a] != schedule.stream_of[r]:
                offer((r, a), (-min(lives[t].nbytes, freed), lives[t].start, r_end, r, a))
    for s, edge in _release_edges(peak, lives, memory, schedule, position).items():
        offer(edge, (-lives[s].nbytes, lives[s].start, 0.0, *edge))
    return sorted(ranked, key=ranked.__getitem__)


def _release_edges(peak: Sequence[str], lives: Mapping[str, StorageLife], memory: GraphMemory,
                   schedule: Schedule, position: Mapping[str, int]) -> dict[str, Edge]:
    """Storage -> ``(its last read on another stream, its stream's next op after it)``,
    for storages that outlive that read."""
    values = {s: {v for v, ss in memory.storages_of.items() if s in ss} for s in peak}
    sequences = schedule.stream_sequences()
    out: dict[str, Edge] = {}
    for s in peak:
        life = lives[s]
        readers = [op for op, vs in memory.reads.items() if values[s].intersection(vs)
                   and schedule.stream_of[op] != life.stream]
        if not readers:
            continue
        last = max(readers, key=position.__getitem__)
        later = [n for n in sequences[life.stream] if position[n] > position[last]]
        if later and life.end > schedule.end[last]:
            out[s] = (last, later[0])
    return out


def _freer(life) -> str | None:
    return life.freed_after or life.freed_before


def _with_problem_edges(problem: SchedulingProblem, edges: Sequence[Edge]) -> SchedulingProblem:
    if not edges:
        return problem
    return replace(problem, graph=with_edges(problem.graph, edges))


def _solve(name: str, problem: SchedulingProblem, options: Mapping[str, Any]) -> Schedule:
    return get_solver(name)(problem, **options)
