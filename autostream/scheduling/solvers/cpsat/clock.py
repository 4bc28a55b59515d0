"""CP-SAT's clocks: a reproducible deterministic limit first, a wall-clock cap as a safety net.

A solve gets ``budget`` seconds.  It stops at ``budget * DET_PER_SECOND`` of CP-SAT's
deterministic time (the same search on every machine and rank, so the same plan), or
at a wall-clock cap of ``WALL_FACTOR * budget`` (never later than what the whole plan
has left), whichever comes first: on a machine that is not overloaded the
deterministic limit binds.  A search the wall clock stopped may differ from one run
to the next; :func:`hit_wall` says when that happened.
Searches are interleaved over ``workers`` subsolvers with one task per worker per
batch, which keeps a multi-worker search reproducible (CP-SAT's default batch
size does not).  ``docs/cpsat.md`` says how these constants were chosen.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from autostream.scheduling.solvers.cpsat.cancel import watch

#: CP-SAT deterministic seconds per second of budget: about what one core of a
#: 2-core machine advances CP-SAT's deterministic clock by per second.
DET_PER_SECOND = 0.1
#: a solve's wall-clock cap per second of budget: no solve takes the time of the next
WALL_FACTOR = 3.0
#: the least budget worth an interleaved portfolio: CP-SAT checks its deterministic limit
#: only between batches of one task per worker (about 0.1 deterministic s each), so a
#: smaller budget goes to one worker, which checks it all along
PORTFOLIO_MIN_S = 1.0
#: No solve gets a smaller wall-clock cap: a small solve stops on its deterministic
#: limit even on a loaded machine (and OR-Tools 9.15 aborts the whole process, a failed
#: ``CHECK``, when a tiny wall cap stops a hinted interleaved search early).
MIN_WALL_S = 1.0
#: the least budget one solve gets (s): less may stop CP-SAT before it has read its hint
MIN_SOLVE_S = 0.01


def make_solver(budget: float, seed: int, workers: int, wall_left: float = float("inf"),
                use_lp: bool = True) -> cp_model.CpSolver:
    """A solver limited to ``budget`` seconds (deterministic clock), capped by ``wall_left``
    (infinite: no wall-clock cap at all, the search is reproducible).

    ``use_lp=False`` turns CP-SAT's linear relaxation off (pure propagation and search).

    >>> make_solver(0.001, 0, 8, wall_left=5.0).parameters.max_time_in_seconds >= MIN_WALL_S
    True
    >>> make_solver(0.001, 0, 8).parameters.max_time_in_seconds > 1e300
    True
    """
    solver = cp_model.CpSolver()
    p = solver.parameters
    if budget < PORTFOLIO_MIN_S:
        workers = 1
    p.random_seed = seed
    p.num_workers = workers
    p.interleave_search = workers > 1
    p.interleave_batch_size = workers
    if not use_lp:
        p.linearization_level = 0
    p.max_deterministic_time = max(budget, MIN_SOLVE_S) * DET_PER_SECOND
    if math.isfinite(wall_left):  # infinite: the deterministic clock alone (wall_clock=False)
        p.max_time_in_seconds = max(min(budget * WALL_FACTOR, wall_left), MIN_WALL_S)
    return watch(solver)  # a background plan's scope can stop it (``cancel``)


def wall_share(deadline: float, part: float, whole: float,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """A deadline for ``part`` of the work left before ``deadline``: its share of the
    wall-clock time left (at least ``MIN_WALL_S``), so that on a slow machine no step
    takes the time of the steps after it.

    >>> wall_share(123.0, part=4.0, whole=4.0)  # the last step: the whole deadline
    123.0
    >>> wall_share(500.0, 1.0, 4.0, clock=lambda: 100.0)  # a quarter of the time left
    200.0
    """
    now = clock()
    if whole <= 0 or part >= whole:
        return deadline
    return now + max(MIN_WALL_S, (deadline - now) * part / whole)


def hit_wall(solver: cp_model.CpSolver, status: int) -> bool:
    """Did the wall-clock cap (not the deterministic clock) stop the search?

    A proof (optimal, infeasible) means the search ran to its end, cap or not.
    """
    if status in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
        return False
    return solver.wall_time >= solver.parameters.max_time_in_seconds - 1e-3
