"""Lower bounds that see layers: the pieces' bounds add up.

Nothing overlaps a cut, so once the loose ops are dropped (a relaxation) the
makespan is the sum of the pieces' spans, and each span is at least its core's
bound less its head's duration (which the previous piece counted).  A core's
bound is Graham's ``max(critical path, work / streams, contended work /
capacity)``, the head-body-tail bound (:mod:`.energy`), or, better, CP-SAT's proven
optimum of the core without shares (:mod:`.ladder`).  The whole graph's Graham bound still holds, so the result is
the larger of the two.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers.cpsat.canonical import canonical_form
from autostream.scheduling.solvers.cpsat.energy import PrecedenceEnergy
from autostream.scheduling.solvers.cpsat.pieces import Piece, core_problem, cut_into_pieces


def pieces_lower_bound(problem: SchedulingProblem, pieces: Sequence[Piece],
                       core_bounds: Sequence[float]) -> float:
    """The sum of the pieces' core bounds (each less its head), at least Graham's bound.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("b", "c")]); nx.set_node_attributes(g, 2.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> pieces_lower_bound(p, cut_into_pieces(p), [2.0, 4.0, 4.0])
    6.0
    """
    total = sum(b - (problem.duration(p.head) if p.head is not None else 0.0)
                for p, b in zip(pieces, core_bounds, strict=True))
    return max(total, problem.lower_bound())


def core_graham(core: SchedulingProblem, piece: Piece) -> float:
    """Graham's bound of a piece's core: its cuts overlap nothing, so they add to the
    bound of the ops between them.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("h", "x"), ("h", "y"), ("x", "t"), ("y", "t")])
    >>> nx.set_node_attributes(g, 2.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> p.lower_bound(), core_graham(p, Piece(("h", "x", "y", "t"), "h", "t"))
    (6.0, 6.0)
    >>> core_graham(SchedulingProblem(g, streams=1), Piece(("h", "x", "y", "t"), "h", "t"))
    8.0
    """
    return _CoreTerms.of(core, piece).bound(core.capacity)


def graham_by_pieces(problem: SchedulingProblem, capacity_factor: float = 1.0) -> float:
    """Graham's bound summed over the strict pieces (no search, no op moved).

    ``capacity_factor`` scales the device capacity, for the models that relax it.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", x) for x in "bcx"] + [(x, "d") for x in "bcx"]
    ...                + [("d", "e"), ("d", "f"), ("e", "g"), ("f", "g")])
    >>> nx.set_node_attributes(g, {"a": 1, "b": 4, "c": 4, "x": 4, "d": 1, "e": 6, "f": 1,
    ...                            "g": 1}, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> p.lower_bound(), graham_by_pieces(p)
    (13.0, 15.0)
    """
    return graham_by_pieces_at(problem, (capacity_factor,))[0]


def graham_by_pieces_at(problem: SchedulingProblem, factors: Sequence[float]
                        ) -> tuple[float, ...]:
    """:func:`graham_by_pieces` at each capacity factor: the strict cuts and the pieces'
    work do not depend on the capacity, so they are found once, and once for all the
    copies of a piece (a model's identical layers)."""
    pieces = cut_into_pieces(problem, strict=True)
    distinct: dict[str, _CoreTerms] = {}
    terms = []
    for p in pieces:
        core = core_problem(problem, p)
        key = json.dumps([canonical_form(core), p.head is None, p.tail is None])
        if key not in distinct:
            distinct[key] = _CoreTerms.of(core, p)
        terms.append(distinct[key])
    heads = [problem.duration(p.head) if p.head is not None else 0.0 for p in pieces]
    whole = _Terms.of(problem)
    out = []
    for factor in factors:
        capacity = problem.capacity * factor if factor != 1.0 else problem.capacity
        bound = {id(t): t.bound(capacity) for t in distinct.values()}
        total = sum(bound[id(t)] - h for t, h in zip(terms, heads, strict=True))
        out.append(max(total, whole.bound(capacity)))
    return tuple(out)


@dataclass(frozen=True)
class _Terms:
    """The terms of a problem's Graham bound (:meth:`SchedulingProblem.lower_bound`) but
    the capacity it divides the contended work by."""

    path: float
    per_stream: float
    contended: float
    lane: float
    energy: PrecedenceEnergy | None = None  # the head-body-tail bound, where it is computed

    @classmethod
    def of(cls, p: SchedulingProblem, energy: bool = False) -> _Terms:
        return cls(p.critical_path(), p.total_work() / p.streams, p.contended_work(),
                   p.lane_work(), PrecedenceEnergy.of(p) if energy else None)

    def bound(self, capacity: float) -> float:
        graham = max(self.path, self.per_stream, self.contended / capacity, self.lane)
        return max(graham, self.energy.bound(capacity)) if self.energy is not None else graham


@dataclass(frozen=True)
class _CoreTerms:
    """A core's terms, and those of its ops between the cuts, with the cuts' time."""

    core: _Terms
    between: _Terms
    cuts: float

    @classmethod
    def of(cls, core: SchedulingProblem, piece: Piece) -> _CoreTerms:
        cuts = [v for v in (piece.head, piece.tail) if v is not None]
        inner = core.graph.subgraph([v for v in core.graph if v not in cuts])
        between = SchedulingProblem(inner, core.streams, core.sync_latency_us, core.capacity)
        return cls(_Terms.of(core, energy=True), _Terms.of(between),
                   sum(core.duration(v) for v in cuts))

    def bound(self, capacity: float) -> float:
        return max(self.core.bound(capacity), self.cuts + self.between.bound(capacity))
