"""The steps of a ``cpsat`` solve: pieces, their plans, the bound, the polish, the choice.

Imported when a plan is solved, not when the plan cache answers (CP-SAT takes a
quarter of a second to load).
"""

from __future__ import annotations

import dataclasses
import math
import time

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers import critical_path, nimble, opara, round_robin, tf_greedy
from autostream.scheduling.solvers._graphs import cross_stream_edges, transitive_reduction_edges
from autostream.scheduling.solvers.base import schedule_from_assignment
from autostream.scheduling.solvers.cpsat.bounds import pieces_lower_bound
from autostream.scheduling.solvers.cpsat.clock import DET_PER_SECOND, WALL_FACTOR
from autostream.scheduling.solvers.cpsat.distinct import MIN_PIECE_SHARE, plan_distinct
from autostream.scheduling.solvers.cpsat.ladder import (
    LADDER,
    PiecePlan,
    best_candidate,
    bounds_itself,
    least_budget,
    piece_baselines,
    plan_piece,
)
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.solvers.cpsat.pieces import Piece, cut_into_pieces
from autostream.scheduling.solvers.cpsat.stats import CpsatStats
from autostream.scheduling.solvers.cpsat.task_plan import worst_status

#: nimble's transitive closure is quadratic: left out of the portfolio beyond this
_PORTFOLIO_MAX_OPS = 1000
_BASELINES = {
    "round_robin": round_robin.solve,
    "tf_greedy": tf_greedy.solve,
    "opara": opara.solve,
    "critical_path": critical_path.solve,
    "nimble": nimble.solve,
}
#: tie order between equally fast plans (after cross edges and streams used)
_PREFERENCE = ("single", "cpsat", *(m.name for m in LADDER[1:]), "heft", "overlap", *_BASELINES)


def plan(problem: SchedulingProblem, opts: CpsatOptions, started: float) -> Schedule:
    """Solve ``problem`` (the module docstring of :mod:`autostream.scheduling.solvers.cpsat` has the steps)."""
    seconds = opts.seconds(len(problem.graph))
    # a time_limit is the user's wall-clock limit too; the budget by size only a budget
    wall = seconds if opts.time_limit is not None else WALL_FACTOR * seconds
    deadline = _deadline(problem, wall, started) if opts.wall_clock else math.inf
    return _plan(problem, dataclasses.replace(opts, time_limit=seconds), started, deadline)


def _plan(problem: SchedulingProblem, opts: CpsatOptions, started: float,
          deadline: float) -> Schedule:
    """The named steps of a solve (see the module docstring)."""
    pieces = _pieces(problem, opts)
    baselines = piece_baselines(problem)  # a whole-graph piece and the polish start from them
    planned = plan_distinct(problem, pieces, opts, deadline, baselines)
    plans = list(planned.plans)
    candidates: dict[str, Schedule] = {}
    bound = problem.lower_bound()
    if pieces:
        candidates["cpsat"] = schedule_from_assignment(
            problem, planned.stream_of, "cpsat", order=planned.order)
        bound = pieces_lower_bound(problem, pieces, planned.core_bounds)
    if _worth_polishing(problem, opts, pieces, candidates, bound + planned.resolution, plans):
        whole = plan_piece(problem, problem, _time_left(opts, plans), opts, deadline,
                           warm=candidates["cpsat"], baselines=baselines)
        candidates["cpsat"] = whole.schedule
        bound = max(bound, whole.bound)
        plans.append(whole)
    candidates.update(baselines)
    candidates.update(_portfolio(problem, opts))  # cheap: after the searches, in the reserve
    edges = transitive_reduction_edges(problem.graph, problem.topo_order)
    best = best_candidate(problem, candidates, _PREFERENCE, edges)
    return _finish(problem, candidates, best, bound, edges, pieces, plans, planned.resolution,
                   started)


def _worth_polishing(problem: SchedulingProblem, opts: CpsatOptions, pieces: list[Piece],
                     candidates: dict[str, Schedule], bound: float,
                     plans: list[PiecePlan]) -> bool:
    """A graph that fits one model, cut into several pieces, without a proven optimum,
    with the time a piece gets at least still left: the whole-graph model,
    warm-started from the stitched plan, may do better (the cuts moved ops, and a
    piece's plan cannot use the idle time of its neighbours)."""
    return (len(pieces) > 1 and len(problem.graph) <= opts.window
            and candidates["cpsat"].makespan > bound + 1e-6
            and _time_left(opts, plans) >= max(MIN_PIECE_SHARE * opts.time_limit,
                                               least_budget(problem, opts)))


def _time_left(opts: CpsatOptions, plans: list[PiecePlan]) -> float:
    used = sum(s.deterministic_time for p in plans for s in p.searches)
    return max(opts.time_limit - used / DET_PER_SECOND, 0.0)


def _portfolio(problem: SchedulingProblem, opts: CpsatOptions) -> dict[str, Schedule]:
    """The cheap baselines with ``portfolio`` (one stream and HEFT are always candidates,
    so the plan is never worse than its warm start)."""
    if not opts.portfolio:
        return {}
    return {name: fn(problem) for name, fn in _BASELINES.items()
            if len(problem.graph) <= _PORTFOLIO_MAX_OPS or name != "nimble"}


def _pieces(problem: SchedulingProblem, opts: CpsatOptions) -> list[Piece]:
    """The pieces to plan: none when there is nothing to place, one without ``decompose``
    or when cutting a graph that fits one model, whose model bounds it, leaves a single
    piece with ops to place (cuts near a source of STG graphs): that piece is the graph
    less a few ops, but its loose ops cost it its own bound, so its search can neither
    prove nor stop early."""
    if (problem.streams == 1 and not problem.pinned) or len(problem.graph) <= 1:
        return []  # one stream beside no link: program order is optimal
    whole = [Piece(problem.topo_order, None, None)]
    if not opts.decompose:
        return whole
    pieces = cut_into_pieces(problem)
    if (len(problem.graph) <= opts.window and bounds_itself(problem, opts)
            and sum(_has_choices(problem, p) for p in pieces) <= 1):
        return whole
    return pieces


def _has_choices(problem: SchedulingProblem, piece: Piece) -> bool:
    """Does the piece place two ops that take time (else it has nothing to decide)?"""
    return sum(problem.duration(v) > 0 for v in piece.own) > 1


def _deadline(problem: SchedulingProblem, seconds: float, started: float) -> float:
    """When the searches must stop (wall clock): the Python work after them (the
    baselines, simulating the candidates) stays inside ``seconds``."""
    reserve = min(0.25 * seconds, 0.2 + 2e-4 * len(problem.graph))
    return started + seconds - reserve


def _finish(problem: SchedulingProblem, candidates: dict[str, Schedule], best: str,
            bound: float, edges: list[tuple[str, str]], pieces: list[Piece],
            plans: list[PiecePlan], resolution: float, started: float) -> Schedule:
    chosen = candidates[best]
    searches = [s for p in plans for s in p.searches]
    stats = CpsatStats(
        source=best,
        status=worst_status(s.status for s in searches),
        bound=bound,
        gap=chosen.makespan / bound - 1.0 if bound > 0 else 0.0,
        proven=bool(plans) and all(p.proven for p in plans),
        deterministic=all(s.deterministic for s in searches),
        pieces=len(pieces),
        pieces_solved=len(plans),
        piece_sources=tuple(sorted({p.source for p in plans})),
        tasks=max((p.tasks for p in plans), default=0),
        windows=sum(s.windows for s in searches),
        windows_reused=sum(s.windows_reused for s in searches),
        windows_greedy=sum(s.windows_greedy for s in searches),
        cross_edges=cross_stream_edges(edges, dict(chosen.stream_of)),
        single_stream_us=candidates["single"].makespan,
        heft_us=candidates["heft"].makespan,
        solve_seconds=round(sum(s.solve_seconds for s in searches), 4),
        deterministic_time=round(sum(s.deterministic_time for s in searches), 4),
        plan_seconds=round(time.perf_counter() - started, 4),
    )
    optimal = chosen.makespan <= bound + resolution + 1e-6
    return dataclasses.replace(chosen, solver="cpsat", lower_bound=bound, optimal=optimal,
                               stats=stats)


