"""Plan every distinct piece once, sharing the time, and stitch the copies.

Pieces with the same key (:func:`.pieces.piece_key`) are copies of one another:
the first is planned, its plan stamped onto the others.  A piece that places a
single op runs it on its head's stream.  The distinct pieces share the time in
proportion to their weight (size times copies: what they add to the makespan),
the heaviest first; a piece that proves its plan optimal early leaves its unused
time to the pieces after it.  Budgets count CP-SAT's deterministic time, so
they are the same on every machine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from autostream.problem import SchedulingProblem
from autostream.solvers.cpsat.bounds import core_graham
from autostream.solvers.cpsat.clock import DET_PER_SECOND
from autostream.solvers.cpsat.ladder import PiecePlan, plan_piece
from autostream.solvers.cpsat.options import CpsatOptions
from autostream.solvers.cpsat.pieces import Piece, core_problem, piece_key, piece_problem
from autostream.solvers.cpsat.stitch import PieceLayout, stitch


@dataclass(frozen=True)
class PiecesPlan:
    """The stitched plan of all pieces, the bound of every piece's core, and the plans made."""

    stream_of: dict[str, int]
    order: tuple[str, ...]
    core_bounds: tuple[float, ...]  # per piece (copies share their original's)
    resolution: float  # us the integer models may lose to rounding, all pieces together
    plans: tuple[PiecePlan, ...]  # one per distinct piece planned

    @property
    def proven(self) -> bool:
        return all(p.proven for p in self.plans)


def plan_distinct(problem: SchedulingProblem, pieces: Sequence[Piece], opts: CpsatOptions,
                  deadline: float) -> PiecesPlan:
    """Plan each distinct piece of ``problem`` once within ``opts.time_limit``."""
    keys = [piece_key(problem, p) for p in pieces]
    first = {k: p for k, p in reversed(list(zip(keys, pieces, strict=True)))}
    copies = Counter(keys)
    weight = {k: copies[k] * len(first[k].ops) for k in first if len(first[k].own) > 1}
    todo = sorted(weight, key=lambda k: -weight[k])  # stable: ties keep graph order
    remaining = sum(weight.values())
    det_used = 0.0
    plans: dict[str, PiecePlan] = {}
    for k in todo:
        left = opts.time_limit - det_used / DET_PER_SECOND
        plans[k] = _plan_one(problem, first[k], left * weight[k] / remaining, opts, deadline)
        det_used += sum(s.deterministic_time for s in plans[k].searches)
        remaining -= weight[k]
    bounds = {k: plans[k].bound if k in plans else _trivial_bound(problem, first[k])
              for k in first}
    layouts = {k: PieceLayout.of(first[k], plan.schedule) for k, plan in plans.items()}
    stream_of, order = stitch(pieces, [layouts.get(k) for k in keys], problem.streams)
    resolution = sum(plans[k].resolution for k in keys if k in plans)
    return PiecesPlan(stream_of, order, tuple(bounds[k] for k in keys), resolution,
                      tuple(plans[k] for k in first if k in plans))


def _plan_one(problem: SchedulingProblem, piece: Piece, budget: float, opts: CpsatOptions,
              deadline: float) -> PiecePlan:
    whole = piece.head is None and piece.tail is None and not piece.loose
    sub = problem if whole else piece_problem(problem, piece)
    core = core_problem(problem, piece) if piece.loose else sub
    plan = plan_piece(sub, core, budget, opts, deadline)
    graham = core_graham(core, piece)
    return plan if plan.bound >= graham else plan.with_bound(graham)


def _trivial_bound(problem: SchedulingProblem, piece: Piece) -> float:
    return core_graham(core_problem(problem, piece), piece)
