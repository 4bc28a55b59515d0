"""``cpsat``: stream assignment with OR-Tools CP-SAT, piece by piece, proven where it can.

1. **Pieces** (:mod:`.pieces`): the graph is cut at ops nothing overlaps (a layer's
   residual add, a norm), once ops that wait only for inputs (weight transposes,
   masks) or feed only outputs (cache writes) are moved out of the way.  Pieces
   with the same canonical structure (:mod:`.canonical`) are planned once and
   stamped (:mod:`.distinct`, :mod:`.stitch`).
2. **Tasks** (:mod:`.tasks`): a piece's ops become integer tasks; zero-duration ops
   merge into a neighbour (no loss), times are rounded down.
3. **Models** (:mod:`.model`, :mod:`.windows`, :mod:`.task_plan`): CP-SAT's stream
   model with sync latency (or the machines model without), warm-started from
   HEFT; a piece larger than ``window`` tasks is solved window by window.  The
   makespan first, then the cross-stream edges at that makespan.
4. **Contention** (:mod:`.ladder`): when a piece's ops can oversubscribe the device,
   a ladder of capacities, the simulator picking the best plan.
5. **Bound** (:mod:`.bounds`): the pieces' bounds add up; a piece's is CP-SAT's
   proven optimum of its core (the exact model without shares relaxes the
   simulator), else the larger of Graham's and the head-body-tail bound
   (:mod:`.energy`).
6. **Choice**: the best predicted plan (the timeline simulator) among the stitched
   CP-SAT plan, one stream, HEFT and the cheap baselines; ties go to fewer
   cross-stream edges, then fewer streams.

Determinism (:mod:`.clock`): budgets count CP-SAT's deterministic time with fixed
seeds, so the same problem and options give the same plan on every machine, unless
the wall-clock safety cap cut a search (``stats.deterministic`` says so);
``wall_clock=False`` drops the caps (graphs that communicate: every rank must plan
alike).  Collectives' transfers (``problem.pinned``, tasks on a process group's
link) are tasks on their link, beside the streams, in the models and the bounds
(:mod:`.model`, :mod:`.energy`); such plans also compete with the one-stream
overlap (``docs/distributed.md``).  Plans
are kept in a persistent cache keyed by the canonical problem and the options
(:mod:`.cache`).  ``docs/cpsat.md`` has the design and its reasons.
"""

from __future__ import annotations

import dataclasses
import time

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.cpsat import cancel
from autostream.scheduling.solvers.cpsat.cache import PlanCache
from autostream.scheduling.solvers.cpsat.options import OPTIONS, CpsatOptions
from autostream.scheduling.solvers.cpsat.stats import CpsatStats

__all__ = ["OPTIONS", "CpsatOptions", "CpsatStats", "solve"]


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """Plan with CP-SAT (options: :class:`CpsatOptions`), from the plan cache when it has it.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> nx.set_node_attributes(g, {"a": 1.0, "b": 3.0, "c": 3.0, "d": 1.0}, "duration")
    >>> s = solve(SchedulingProblem(g, streams=2), time_limit=1.0, cache=False)
    >>> s.makespan, s.optimal, s.streams_used
    (5.0, True, 2)
    """
    opts = CpsatOptions.from_options(options)
    scope = cancel.current()
    if scope is not None and scope.deterministic:
        opts = dataclasses.replace(opts, wall_clock=False)
    started = time.perf_counter()
    cache = PlanCache.from_environment() if opts.cache else None
    path = cache.path(problem, opts) if cache is not None else None
    if path is not None and (hit := PlanCache.load(path, problem)) is not None:
        return _stamp_time(hit, started)
    if scope is not None and scope.fallback is not None:  # a compile's fast plan
        scope.missed = True
        return scope.fallback(problem)
    from autostream.scheduling.solvers.cpsat.planner import plan  # CP-SAT loads only to solve

    schedule = plan(problem, opts, started)
    # a search stopped by a cancelled background plan is not what the options give
    if path is not None and schedule.stats.deterministic and not (scope and scope.cancelled):
        PlanCache.store(path, problem, schedule)
    return schedule


def _stamp_time(schedule: Schedule, started: float) -> Schedule:
    stats = dataclasses.replace(schedule.stats, cache_hit=True,
                                plan_seconds=round(time.perf_counter() - started, 4))
    return dataclasses.replace(schedule, stats=stats)
