"""Plan one piece: CP-SAT under each contention model, the simulator picks; prove its bound.

The device model of the simulator is processor sharing: ops whose shares exceed
the capacity slow down rather than wait.  CP-SAT cannot model that exactly, so a
piece whose ops can oversubscribe the device is planned under a *ladder* of
models (``contention="auto"``): shares as a cumulative of the real capacity
(``cpsat``: never oversubscribes), of 1.5x the capacity (``cpsat_x1.5``) and
no shares at all (``cpsat_relaxed``); the last two use the machines model with
the latency added after colouring.  Each gets a share of the time and the
simulator picks the best plan, against HEFT's and one stream's.  A piece whose
ops can never exceed the capacity together (the widest ``streams`` shares fit)
needs one exact model without shares.

The lower bound: the piece's core (the piece without its loose ops) relaxes the
piece, and the exact model without shares, times rounded down, relaxes the
simulator (an op never runs faster than its duration).  So CP-SAT's proven
optimum of that model bounds the core's span; when the plan's model is that
model, one solve gives both, else a second solve proves the bound, where it can
beat Graham's (when contention is not what bounds it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers import heft, overlap, single
from autostream.scheduling.solvers._graphs import cross_stream_edges, transitive_reduction_edges
from autostream.scheduling.solvers.base import schedule_from_assignment
from autostream.scheduling.solvers.cpsat.bounds import graham_by_pieces_at
from autostream.scheduling.solvers.cpsat.clock import DET_PER_SECOND, wall_share
from autostream.scheduling.solvers.cpsat.local_search import improve
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.solvers.cpsat.task_plan import TaskPlan, plan_tasks
from autostream.scheduling.solvers.cpsat.tasks import (
    TaskGraph,
    build_tasks,
    to_units,
    widest_at_once,
)

log = logging.getLogger("autostream")


@dataclass(frozen=True)
class Mode:
    """One contention model of the ladder."""

    name: str  # the plan's candidate name
    factor: float  # the device capacity x the real one; inf: shares ignored
    approximate: bool  # machines model, latency added after colouring


EXACT = Mode("cpsat", math.inf, False)  # no overlap can exceed the capacity
BLOCKING = Mode("cpsat", 1.0, False)
LADDER = (BLOCKING, Mode("cpsat_x1.5", 1.5, True), Mode("cpsat_relaxed", math.inf, True))
_RELAXED = LADDER[-1]
#: the share of a piece's time its separate bound solve gets at least (it also gets
#: what the plan's solves left)
BOUND_SHARE = 0.3
#: the share of a piece's time the local search on the simulator gets, and how many
#: op simulations it counts per second (a 100-op plan simulates in about a millisecond)
SEARCH_SHARE = 0.2
OP_SIMULATIONS_PER_SECOND = 100_000
#: the least time worth a model's solve (s): a piece is planned again only when each of
#: its models gets this much (:func:`least_budget`)
MIN_MODE_S = 0.05


@dataclass(frozen=True)
class PiecePlan:
    """The best plan of one piece, its bound, and how they were found."""

    schedule: Schedule  # of the piece's own problem
    source: str  # the candidate kept: a mode's name, "heft" or "single"
    bound: float  # lower bound of the core's makespan (head included), us
    proven: bool  # CP-SAT proved ``bound`` optimal for the core
    searches: tuple[TaskPlan, ...]  # every CP-SAT plan made for the piece, bound solve included
    tasks: int  # tasks of the largest model solved
    #: how much the integer model's rounding may hide (us): a plan within ``bound +
    #: resolution`` is optimal as far as the model can tell
    resolution: float = 0.0
    #: one stream's and HEFT's plans of the piece (a later round of it starts from them)
    baselines: Mapping[str, Schedule] = field(default_factory=dict)
    #: the least a later plan of the piece costs (s, :func:`least_budget`)
    least: float = 0.0

    @property
    def deterministic(self) -> bool:
        return all(t.deterministic for t in self.searches)

    @property
    def optimal(self) -> bool:
        """Does the plan meet the bound (up to the model's resolution)?"""
        return self.schedule.makespan <= self.bound + self.resolution + 1e-6

    def with_bound(self, bound: float) -> PiecePlan:
        """The same plan with a better (larger) bound found elsewhere."""
        return dataclasses.replace(self, bound=max(self.bound, bound))

    def merged(self, earlier: PiecePlan) -> PiecePlan:
        """This later plan of the same piece, with everything the earlier one found."""
        proven = self.proven or earlier.proven
        resolution = max(self.resolution, earlier.resolution)
        source = earlier.source if self.source == "warm" else self.source
        return dataclasses.replace(self, source=source, bound=max(self.bound, earlier.bound),
                                   proven=proven, resolution=resolution,
                                   searches=earlier.searches + self.searches)


def contention_modes(problem: SchedulingProblem, contention: str) -> tuple[Mode, ...]:
    """The models a piece is planned with.

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_nodes_from("ab", duration=1.0, share=0.4)
    >>> [m.name for m in contention_modes(SchedulingProblem(g, streams=2), "auto")]
    ['cpsat']
    >>> g.nodes["b"]["share"] = 0.8
    >>> [m.name for m in contention_modes(SchedulingProblem(g, streams=2), "auto")]
    ['cpsat', 'cpsat_x1.5', 'cpsat_relaxed']
    """
    lanes = problem.pinned
    widest = widest_at_once(((problem.share(v), lanes.get(v, 0)) for v in problem.graph
                             if problem.duration(v) > 0), problem.streams)
    if widest <= problem.capacity + 1e-9:
        return (EXACT,)
    return {"auto": LADDER, "blocking": (BLOCKING,), "relaxed": (_RELAXED,)}[contention]


@dataclass
class _Found:
    """What the solves of one piece found so far."""

    candidates: dict[str, Schedule]  # name -> plan of the piece, re-timed by the simulator
    bound: float  # lower bound of the core's makespan, us
    searches: list[TaskPlan] = field(default_factory=list)
    tasks: int = 0
    proven: bool = False
    resolution: float = 0.0

    def add(self, tg: TaskGraph, plan: TaskPlan, bounds: bool) -> None:
        """One search; ``bounds``: its model relaxes the core, so a proof is its bound."""
        self.searches.append(plan)
        self.tasks = max(self.tasks, len(tg))
        if bounds and tg.relaxes and plan.bound is not None and plan.windows == 1:
            self.bound = max(self.bound, plan.bound / tg.scale)
            self.proven = self.proven or plan.status == "OPTIMAL"
            self.resolution = tg.rounding_us

    @property
    def used(self) -> float:
        """Seconds of budget the searches used (deterministic clock)."""
        return sum(x.deterministic_time for x in self.searches) / DET_PER_SECOND


def plan_piece(problem: SchedulingProblem, core: SchedulingProblem, budget: float,
               opts: CpsatOptions, deadline: float, warm: Schedule | None = None,
               baselines: Mapping[str, Schedule] | None = None) -> PiecePlan:
    """Plan ``problem`` within ``budget`` seconds (deterministic clock) and bound ``core``.

    ``warm``: a plan of ``problem`` to start from (it competes with HEFT's for the hint).
    ``baselines``: :func:`piece_baselines` of ``problem``, when the caller has them.
    """
    modes = contention_modes(problem, opts.contention)
    own_bound = core is problem and bounds_itself(problem, opts)
    prove = not own_bound and _path_bound(core)
    found = _Found(dict(baselines or piece_baselines(problem)), core.lower_bound())
    if warm is not None:
        found.candidates["warm"] = warm
    share = budget * (1 - BOUND_SHARE * prove - SEARCH_SHARE) / len(modes)
    floors = graham_by_pieces_at(problem, [m.factor for m in modes])
    for k, (mode, floor) in enumerate(zip(modes, floors, strict=True)):
        _solve_mode(problem, mode, found, share, opts,
                    wall_share(deadline, share, budget - k * share), warm, own_bound, floor)
    if prove:
        _prove_core(core, found, max(budget * BOUND_SHARE, budget * (1 - SEARCH_SHARE) - found.used),
                    opts, wall_share(deadline, BOUND_SHARE, BOUND_SHARE + SEARCH_SHARE))
    return _best(problem, found, budget * SEARCH_SHARE, _least(modes))


def least_budget(problem: SchedulingProblem, opts: CpsatOptions) -> float:
    """The least time worth a plan of ``problem`` by :func:`plan_piece`: ``MIN_MODE_S``
    for each of its models (``PiecePlan.least`` of a piece planned already).

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_nodes_from("ab", duration=1.0, share=0.8)
    >>> least_budget(SchedulingProblem(g, streams=2), CpsatOptions())
    0.15000000000000002
    """
    return _least(contention_modes(problem, opts.contention))


def _least(modes: tuple[Mode, ...]) -> float:
    return len(modes) * MIN_MODE_S


def bounds_itself(problem: SchedulingProblem, opts: CpsatOptions) -> bool:
    """Does the model that plans ``problem`` also bound it?  Only the exact model without
    shares (no contention possible) does."""
    return contention_modes(problem, opts.contention) == (EXACT,)


def piece_baselines(problem: SchedulingProblem) -> dict[str, Schedule]:
    """The plans every piece's plan competes with: one stream and HEFT, and with
    collectives the one-stream overlap (:mod:`autostream.scheduling.solvers.overlap`)."""
    out = {"single": single.solve(problem), "heft": heft.solve(problem)}
    if problem.pinned:
        out["overlap"] = overlap.solve(problem)
    return out


def _solve_mode(problem: SchedulingProblem, mode: Mode, found: _Found, budget: float,
                opts: CpsatOptions, deadline: float, warm: Schedule | None,
                own_bound: bool, floor: float) -> None:
    """One model of the ladder; ``floor``: Graham's bound over the piece's own cuts under
    the mode's capacity (:func:`.bounds.graham_by_pieces`)."""
    tg = _tasks(problem, mode, opts.window)
    plan = plan_tasks(tg, problem.streams, budget, opts, lower_bound=_floor(floor, tg),
                      approximate=mode.approximate, warm=warm, deadline=deadline)
    found.add(tg, plan, own_bound and mode.factor == math.inf)
    if plan.found:
        found.candidates[mode.name] = _schedule(problem, tg, plan)
    else:
        log.info("cpsat: CP-SAT found no plan for a %d-op piece (%s, %s); using its warm start",
                 len(problem.graph), plan.status, mode.name)


def _prove_core(core: SchedulingProblem, found: _Found, budget: float, opts: CpsatOptions,
                deadline: float) -> None:
    """The separate bound solve: the exact model of the core without shares, when it fits
    one window and relaxes the core (a core over the window collapses its chains, and a
    model with chains collapsed proves nothing of it)."""
    tg = _tasks(core, EXACT, opts.window)
    if len(tg) <= opts.window and tg.relaxes:
        plan = plan_tasks(tg, core.streams, budget, dataclasses.replace(opts, sync_share=0.0),
                          deadline=deadline)
        found.add(tg, plan, bounds=True)


def _best(problem: SchedulingProblem, found: _Found, search_seconds: float,
          least: float) -> PiecePlan:
    """The fastest candidate, improved by the local search when not known to be optimal."""
    source = best_candidate(problem, found.candidates,
                            ("single", "warm", *(m.name for m in LADDER), "heft", "overlap"))
    best = found.candidates[source]
    if best.makespan > found.bound + found.resolution + 1e-6:
        moved = improve(problem, best, _evaluations(problem, search_seconds))
        if moved.makespan < best.makespan:
            best, source = moved, f"{source}+moves"
    return PiecePlan(best, source, found.bound, found.proven, tuple(found.searches), found.tasks,
                     found.resolution, {k: found.candidates[k] for k in ("single", "heft")},
                     least)


def _evaluations(problem: SchedulingProblem, seconds: float) -> int:
    """Plans the local search may simulate in ``seconds`` (counted, so reproducible)."""
    return int(seconds * OP_SIMULATIONS_PER_SECOND / max(len(problem.graph), 1))


def _floor(floor: float, tg: TaskGraph) -> int:
    """A bound of the piece in the model's units, less what rounding may lose: no plan of
    the model is shorter."""
    return to_units(max(floor - tg.rounding_us, 0.0), tg.scale)


def _path_bound(core: SchedulingProblem) -> bool:
    """Is Graham's bound of ``core`` its critical path or its work, not its device time?
    Only then can the model without shares prove more: it adds the sync latency and
    the streams' order, while it knows nothing of contention."""
    return max(core.critical_path(), core.total_work() / core.streams) \
        >= core.contended_work() / core.capacity


def _tasks(problem: SchedulingProblem, mode: Mode, window: int) -> TaskGraph:
    # the approximate modes colour a timeline of the machines model, where a
    # zero-duration task takes its predecessor's stream anyway: they keep them apart
    return build_tasks(problem, collapse_chains=len(problem.graph) > window,
                       shares=mode.factor != math.inf,
                       capacity_factor=1.0 if mode.factor == math.inf else mode.factor,
                       merge_zero=not mode.approximate)


def _schedule(problem: SchedulingProblem, tg: TaskGraph, plan: TaskPlan) -> Schedule:
    """The integer plan as ops on streams, launched in start order, re-timed by the
    simulator; the plan before its cross-edge solve instead if that runs faster."""
    out = _ops_schedule(problem, tg, plan.stream, plan.start)
    if plan.unsynced is not None:
        before = _ops_schedule(problem, tg, *plan.unsynced)
        if before.makespan < out.makespan - 1e-9:
            return before
    return out


def _ops_schedule(problem: SchedulingProblem, tg: TaskGraph, stream: dict[int, int],
                  start: dict[int, int]) -> Schedule:
    order = tuple(n for v in sorted(stream, key=lambda v: (start[v], v)) for n in tg.members[v])
    stream_of = {n: stream[v] for v in stream for n in tg.members[v]}
    return schedule_from_assignment(problem, stream_of, "cpsat", order=order)


def best_candidate(problem: SchedulingProblem, candidates: dict[str, Schedule],
                   preference: tuple[str, ...],
                   edges: list[tuple[str, str]] | None = None) -> str:
    """The fastest plan; ties go to fewer cross-stream edges, fewer streams, then
    ``preference`` order (names not listed come last).  ``edges``: the problem's
    transitive reduction, when the caller has it."""
    if edges is None:
        edges = transitive_reduction_edges(problem.graph, problem.topo_order)

    def rank(name: str) -> tuple[float, int, int, int]:
        s = candidates[name]
        return (round(s.makespan, 6), cross_stream_edges(edges, dict(s.stream_of)),
                s.streams_used, preference.index(name) if name in preference else len(preference))

    return min(candidates, key=rank)
