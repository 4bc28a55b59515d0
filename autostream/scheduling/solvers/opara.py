"""``opara``: Opara's stream allocator and launch order (Chen et al., 2023).

An op inherits the stream of an input when it is that input's first user (in
program order) and no earlier user claimed it; otherwise it opens a new stream.
Opara does not cap the number of streams: here virtual stream ``k`` runs on
stream ``k mod streams``.  The launch order is Kahn's algorithm taking, among the
ready ops, the one with the smallest resource footprint first (Opara profiles
shared memory; here the footprint is ``duration x share``, then duration).
"""

from __future__ import annotations

import heapq

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import (
    VirtualStreamStats,
    check_options,
    schedule_from_assignment,
)


def opara_launch_order(problem: SchedulingProblem) -> tuple[str, ...]:
    """Kahn's order, ready ops smallest footprint first, ties by program order.

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_node("big", duration=9.0); g.add_node("small", duration=1.0)
    >>> opara_launch_order(SchedulingProblem(g, streams=2))
    ('small', 'big')
    """
    g, idx = problem.graph, problem.topo_index

    def key(n: str) -> tuple[float, float, int]:
        d = problem.duration(n)
        return (d * problem.share(n), d, idx[n])

    indeg = {n: g.in_degree(n) for n in g}
    ready = [(key(n), n) for n in g if indeg[n] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for s in g.successors(n):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (key(s), s))
    return tuple(order)


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """First-user inheritance, new stream otherwise, folded modulo ``streams``.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> solve(SchedulingProblem(g, streams=4)).stats.virtual_streams
    2
    """
    check_options("opara", options)
    g, idx = problem.graph, problem.topo_index
    first_user = {
        n: min(g.successors(n), key=idx.__getitem__) for n in g if g.out_degree(n) > 0
    }
    virtual: dict[str, int] = {}
    claimed: set[str] = set()
    count = 0
    for n in problem.topo_order:
        for p in sorted(g.predecessors(n), key=idx.__getitem__):
            if first_user[p] == n and p not in claimed:
                claimed.add(p)
                virtual[n] = virtual[p]
                break
        else:
            virtual[n] = count
            count += 1
    stream_of = {n: k % problem.streams for n, k in virtual.items()}
    return schedule_from_assignment(
        problem, stream_of, "opara", order=opara_launch_order(problem),
        stats=VirtualStreamStats(count),
    )
