"""A lower bound that sees layers: sum the Graham bound over separator-delimited segments.

A *separator* is an op that every other op either precedes or follows (a layer's
residual add, say).  Separators cut the timeline: everything before one ends
before it ends, everything after starts after it ends.  So the makespan is at
least the sum, over the segments between consecutive separators, of
``max(critical path, work / streams, contended work / capacity)`` of the segment,
which is much tighter than the whole-graph bound on deep, layered graphs.
"""

from __future__ import annotations

from collections.abc import Sequence

from autostream.problem import SchedulingProblem
from autostream.solvers._graphs import reachability


def separators(problem: SchedulingProblem) -> list[str]:
    """Ops every other op precedes or follows, in topological order.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> separators(SchedulingProblem(g, streams=2))
    ['a', 'd']
    """
    topo = problem.topo_order
    n = len(topo)
    desc = reachability(problem.graph, topo)
    anc = reachability(problem.graph.reverse(copy=False), topo[::-1])
    full = (1 << n) - 1
    out = []
    for v in topo:
        # anc[v] is indexed on the reversed order: bit j means topo[n - 1 - j]
        if desc[v] | _reverse_bits(anc[v], n) == full:
            out.append(v)
    return out


def _reverse_bits(bits: int, n: int) -> int:
    return int(format(bits, f"0{n}b")[::-1], 2) if n else 0


def segmented_lower_bound(
    problem: SchedulingProblem, capacity_factor: float = 1.0, cuts: Sequence[str] | None = None
) -> float:
    """Sum of the Graham bounds of the segments between separators (>= ``problem.lower_bound()``
    on a graph with separators, equal to it without).

    ``capacity_factor`` scales the device capacity (``math.inf``: no contention), for
    models that relax it; ``cuts``: the problem's separators, when already known.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", x) for x in "bcx"] + [(x, "d") for x in "bcx"]
    ...                + [("d", "e"), ("d", "f"), ("e", "g"), ("f", "g")])
    >>> nx.set_node_attributes(g, {"a": 1, "b": 4, "c": 4, "x": 4, "d": 1, "e": 6, "f": 1,
    ...                            "g": 1}, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> p.lower_bound(), segmented_lower_bound(p)
    (13.0, 15.0)
    """
    capacity = problem.capacity * capacity_factor
    cuts = set(separators(problem) if cuts is None else cuts)
    total = 0.0
    segment: list[str] = []
    for v in problem.topo_order:
        if v in cuts:
            total += _segment_bound(problem, segment, capacity) + problem.duration(v)
            segment = []
        else:
            segment.append(v)
    total += _segment_bound(problem, segment, capacity)
    return max(total, problem.critical_path(), problem.total_work() / problem.streams,
               problem.contended_work() / capacity, problem.lane_work())


def _segment_bound(problem: SchedulingProblem, ops: list[str], capacity: float) -> float:
    if not ops:
        return 0.0
    inside = set(ops)
    finish: dict[str, float] = {}
    for v in ops:  # ops are in topological order
        ready = max((finish[u] for u in problem.graph.predecessors(v) if u in inside), default=0.0)
        finish[v] = ready + problem.duration(v)
    work = sum(problem.duration(v) for v in ops if v not in problem.pinned)  # lanes run beside
    contended = sum(problem.duration(v) * problem.share(v) for v in ops)
    return max(max(finish.values()), work / problem.streams, contended / capacity)
