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
model, one solve gives both, else a second solve proves the bound.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from autostream.problem import SchedulingProblem
from autostream.schedule import Schedule
from autostream.solvers import heft, single
from autostream.solvers._graphs import cross_stream_edges, transitive_reduction_edges
from autostream.solvers.base import schedule_from_assignment
from autostream.solvers.cpsat.options import CpsatOptions
from autostream.solvers.cpsat.task_plan import TaskPlan, plan_tasks
from autostream.solvers.cpsat.tasks import TaskGraph, build_tasks


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
#: the share of a piece's time its separate bound solve gets
BOUND_SHARE = 0.3


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

    @property
    def deterministic(self) -> bool:
        return all(t.deterministic for t in self.searches)

    def with_bound(self, bound: float) -> PiecePlan:
        """The same plan with a better (larger) bound found elsewhere."""
        return dataclasses.replace(self, bound=max(self.bound, bound))


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
    widest = sorted((problem.share(v) for v in problem.graph if problem.duration(v) > 0),
                    reverse=True)[:problem.streams]
    if sum(widest) <= problem.capacity + 1e-9:
        return (EXACT,)
    return {"auto": LADDER, "blocking": (BLOCKING,), "relaxed": (_RELAXED,)}[contention]


def plan_piece(problem: SchedulingProblem, core: SchedulingProblem, budget: float,
               opts: CpsatOptions, deadline: float, warm: Schedule | None = None) -> PiecePlan:
    """Plan ``problem`` within ``budget`` seconds (deterministic clock) and bound ``core``.

    ``warm``: a plan of ``problem`` to start from (it competes with HEFT's for the hint).
    """
    modes = contention_modes(problem, opts.contention)
    own_bound = modes == (EXACT,) and core is problem
    plan_budget = budget if own_bound else budget * (1 - BOUND_SHARE)
    candidates = {"single": single.solve(problem), "heft": heft.solve(problem)}
    if warm is not None:
        candidates["warm"] = warm
    searches: list[TaskPlan] = []
    tasks = 0
    bound, proven, resolution = core.lower_bound(), False, 0.0
    for k, mode in enumerate(modes):
        now = time.perf_counter()
        tg = _tasks(problem, mode, opts.window)
        plan = plan_tasks(tg, problem.streams, plan_budget / len(modes), opts,
                          approximate=mode.approximate, warm=warm,
                          deadline=now + (deadline - now) / (len(modes) - k + (not own_bound)))
        searches.append(plan)
        tasks = max(tasks, len(tg))
        if plan.found:
            candidates[mode.name] = _schedule(problem, tg, plan)
        if own_bound:
            bound, proven, resolution = _proven(bound, tg, plan)
    if not own_bound:
        tg = _tasks(core, EXACT, opts.window)
        if len(tg) <= opts.window:
            plan = plan_tasks(tg, core.streams, budget * BOUND_SHARE,
                              dataclasses.replace(opts, sync_share=0.0),
                              deadline=deadline)
            searches.append(plan)
            bound, proven, resolution = _proven(bound, tg, plan)
    source = best_candidate(problem, candidates,
                            ("single", "warm", *(m.name for m in LADDER), "heft"))
    return PiecePlan(candidates[source], source, bound, proven, tuple(searches), tasks,
                     resolution)


def _tasks(problem: SchedulingProblem, mode: Mode, window: int) -> TaskGraph:
    return build_tasks(problem, collapse_chains=len(problem.graph) > window,
                       shares=mode.factor != math.inf,
                       capacity_factor=1.0 if mode.factor == math.inf else mode.factor)


def _schedule(problem: SchedulingProblem, tg: TaskGraph, plan: TaskPlan) -> Schedule:
    """The integer plan as ops on streams, launched in start order, re-timed by the simulator."""
    order = tuple(n for v in sorted(plan.stream, key=lambda v: (plan.start[v], v))
                  for n in tg.members[v])
    stream_of = {n: plan.stream[v] for v in plan.stream for n in tg.members[v]}
    return schedule_from_assignment(problem, stream_of, "cpsat", order=order)


def _proven(bound: float, tg: TaskGraph, plan: TaskPlan) -> tuple[float, bool, float]:
    """``(bound, proven, resolution)``: the better of ``bound`` and the plan's proven
    one, when its model relaxes the problem."""
    if not tg.relaxes or plan.bound is None or plan.windows != 1:
        return bound, False, 0.0
    proved = plan.bound / tg.scale
    return max(bound, proved), plan.status == "OPTIMAL", tg.rounding_us


def best_candidate(problem: SchedulingProblem, candidates: dict[str, Schedule],
                   preference: tuple[str, ...]) -> str:
    """The fastest plan; ties go to fewer cross-stream edges, fewer streams, then
    ``preference`` order (names not listed come last)."""
    edges = transitive_reduction_edges(problem.graph, problem.topo_order)

    def rank(name: str) -> tuple[float, int, int, int]:
        s = candidates[name]
        return (round(s.makespan, 6), cross_stream_edges(edges, dict(s.stream_of)),
                s.streams_used, preference.index(name) if name in preference else len(preference))

    return min(candidates, key=rank)
