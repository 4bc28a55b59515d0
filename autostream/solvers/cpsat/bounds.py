"""Lower bounds that see layers: the pieces' bounds add up.

Nothing overlaps a cut, so once the loose ops are dropped (a relaxation) the
makespan is the sum of the pieces' spans, and each span is at least its core's
bound less its head's duration (which the previous piece counted).  A core's
bound is Graham's ``max(critical path, work / streams, contended work /
capacity)`` or, better, CP-SAT's proven optimum of the core without shares
(:mod:`.ladder`).  The whole graph's Graham bound still holds, so the result is
the larger of the two.
"""

from __future__ import annotations

from collections.abc import Sequence

from autostream.problem import SchedulingProblem
from autostream.solvers.cpsat.pieces import Piece, core_problem, cut_into_pieces


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
    cuts = [v for v in (piece.head, piece.tail) if v is not None]
    inner = core.graph.subgraph([v for v in core.graph if v not in cuts])
    between = SchedulingProblem(inner, core.streams, core.sync_latency_us, core.capacity)
    return max(core.lower_bound(),
               sum(core.duration(v) for v in cuts) + between.lower_bound())


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
    if capacity_factor != 1.0:
        problem = SchedulingProblem(problem.graph, problem.streams, problem.sync_latency_us,
                                    problem.capacity * capacity_factor)
    pieces = cut_into_pieces(problem, strict=True)
    return pieces_lower_bound(
        problem, pieces, [core_graham(core_problem(problem, p), p) for p in pieces])
