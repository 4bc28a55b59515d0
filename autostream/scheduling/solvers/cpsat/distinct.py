"""Plan every distinct piece once, sharing the time, and stitch the copies.

Pieces with the same key (:func:`.pieces.piece_key`) are copies of one another:
the first is planned, its plan stamped onto the others.  A piece that places a
single op runs it on its head's stream.  The distinct pieces share the time in
proportion to their weight (size times copies: what they add to the makespan),
the lightest first: a piece that proves its plan optimal early leaves its unused
time to the heavier pieces after it.  Budgets count CP-SAT's deterministic time, so
they are the same on every machine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.cpsat.bounds import core_graham
from autostream.scheduling.solvers.cpsat.clock import DET_PER_SECOND, wall_share
from autostream.scheduling.solvers.cpsat.ladder import PiecePlan, plan_piece
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.solvers.cpsat.pieces import Piece, core_problem, piece_key, piece_problem
from autostream.scheduling.solvers.cpsat.stitch import PieceLayout, stitch

#: the share of the time every distinct piece gets at least, whatever the others used
#: (a later round plans a piece again only with this much left, and at least what its
#: models' solves cost: :func:`.ladder.least_budget`)
MIN_PIECE_SHARE = 0.1
#: passes over the pieces: the later ones spend the time left on the pieces whose
#: plans are not proven optimal
ROUNDS = 2


@dataclass(frozen=True)
class PiecesPlan:
    """The stitched plan of all pieces, the bound of every piece's core, and the plans made."""

    stream_of: dict[str, int]
    order: tuple[str, ...]
    core_bounds: tuple[float, ...]  # per piece (copies share their original's)
    resolution: float  # us the integer models may lose to rounding, all pieces together
    plans: tuple[PiecePlan, ...]  # one per distinct piece planned


def plan_distinct(problem: SchedulingProblem, pieces: Sequence[Piece], opts: CpsatOptions,
                  deadline: float, baselines: Mapping[str, Schedule] | None = None
                  ) -> PiecesPlan:
    """Plan each distinct piece of ``problem`` once within ``opts.time_limit``
    (``baselines``: :func:`.ladder.piece_baselines` of ``problem``, for a piece that is
    the whole graph)."""
    keys = [piece_key(problem, p) for p in pieces]
    first: dict[str, Piece] = {}
    for k, p in zip(keys, pieces, strict=True):
        first.setdefault(k, p)
    copies = Counter(keys)
    weight = {k: copies[k] * len(first[k].ops) for k in first if len(first[k].own) > 1}
    plans: dict[str, PiecePlan] = {}
    todo = sorted(weight, key=weight.__getitem__)  # stable: ties keep graph order
    for _ in range(ROUNDS):
        _plan_round(problem, first, weight, todo, plans, opts, deadline, baselines)
        todo = [k for k in todo if not plans[k].optimal]
    bounds = {k: plans[k].bound if k in plans else _trivial_bound(problem, first[k])
              for k in first}
    layouts = {k: PieceLayout.of(first[k], plan.schedule) for k, plan in plans.items()}
    stream_of, order = stitch(pieces, [layouts.get(k) for k in keys], problem.streams)
    resolution = sum(plans[k].resolution for k in keys if k in plans)
    return PiecesPlan(stream_of, order, tuple(bounds[k] for k in keys), resolution,
                      tuple(plans[k] for k in first if k in plans))


def _plan_round(problem: SchedulingProblem, first: dict[str, Piece], weight: dict[str, int],
                todo: list[str], plans: dict[str, PiecePlan], opts: CpsatOptions,
                deadline: float, baselines: Mapping[str, Schedule] | None) -> None:
    """Plan the pieces ``todo`` (again: warm-started from their plans) with the time left."""
    remaining = sum(weight[k] for k in todo)
    for k in todo:
        left = opts.time_limit - _det_used(plans.values()) / DET_PER_SECOND
        least = MIN_PIECE_SHARE * opts.time_limit
        budget = max(left * weight[k] / remaining, least)
        if k in plans and (left < least or budget < plans[k].least):
            continue
        plans[k] = _plan_one(problem, first[k], budget, opts,
                             wall_share(deadline, weight[k], remaining), plans.get(k), baselines)
        remaining -= weight[k]


def _det_used(plans: Iterable[PiecePlan]) -> float:
    return sum(s.deterministic_time for p in plans for s in p.searches)


def _plan_one(problem: SchedulingProblem, piece: Piece, budget: float, opts: CpsatOptions,
              deadline: float, earlier: PiecePlan | None,
              baselines: Mapping[str, Schedule] | None) -> PiecePlan:
    whole = piece.head is None and piece.tail is None and not piece.loose
    sub = problem if whole else piece_problem(problem, piece)
    core = core_problem(problem, piece) if piece.loose else sub
    warm = earlier.schedule if earlier is not None else None
    known = earlier.baselines if earlier is not None else baselines if whole else None
    plan = plan_piece(sub, core, budget, opts, deadline, warm, known)
    plan = plan.with_bound(core_graham(core, piece))
    return plan if earlier is None else plan.merged(earlier)


def _trivial_bound(problem: SchedulingProblem, piece: Piece) -> float:
    return core_graham(core_problem(problem, piece), piece)
