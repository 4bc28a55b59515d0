"""``critical_path``: NVIDIA apex ``torchsched``'s rule.

The longest path by depth (number of ops, not cost) stays on the main stream;
every other op goes round-robin, in program order, to the ``streams - 1`` side
streams.  ``getitem``-like ops (node attribute ``target`` containing
``getitem``) follow their producer.
"""

from __future__ import annotations

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import check_options, schedule_from_assignment


def deepest_path(problem: SchedulingProblem) -> list[str]:
    """The longest path counted in ops; ties broken by program order.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("b", "c"), ("a", "d")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> deepest_path(SchedulingProblem(g, streams=2))
    ['a', 'b', 'c']
    """
    g, idx = problem.graph, problem.topo_index
    depth: dict[str, int] = {}
    nxt: dict[str, str | None] = {}
    for n in reversed(problem.topo_order):
        best: str | None = None
        for s in sorted(g.successors(n), key=idx.__getitem__):
            if best is None or depth[s] > depth[best]:
                best = s
        depth[n] = 1 + (depth[best] if best is not None else 0)
        nxt[n] = best
    if not depth:
        return []
    node: str | None = max(problem.topo_order, key=lambda n: (depth[n], -idx[n]))
    path = []
    while node is not None:
        path.append(node)
        node = nxt[node]
    return path


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """Deepest path on stream 0, the rest round-robin over streams ``1..streams-1``.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> solve(SchedulingProblem(g, streams=2)).makespan
    2.0
    """
    check_options("critical_path", options)
    g = problem.graph
    main = set(deepest_path(problem))
    side = problem.streams - 1
    stream_of: dict[str, int] = {}
    k = 0
    for n in problem.topo_order:
        preds = list(g.predecessors(n))
        if n in main or side == 0:
            stream_of[n] = 0
        elif "getitem" in str(g.nodes[n].get("target", "")) and preds:
            stream_of[n] = stream_of[preds[0]]
        else:
            stream_of[n] = 1 + k % side
            k += 1
    return schedule_from_assignment(problem, stream_of, "critical_path")
