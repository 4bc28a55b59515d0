"""``tf_greedy``: TensorFlow's ``AssignStreams`` rule, folded to ``streams``.

In topological order, an op inherits the stream of its first input (in program
order) whose fan-out is one; otherwise it opens a new virtual stream.  Virtual
stream ``k`` runs on stream ``k mod streams`` (TensorFlow's ``max_streams``).
"""

from __future__ import annotations

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import (
    VirtualStreamStats,
    check_options,
    schedule_from_assignment,
)


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """Fan-out-one inheritance, new stream otherwise, folded modulo ``streams``.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> s = solve(SchedulingProblem(g, streams=4))
    >>> s.streams_used, s.stats.virtual_streams
    (3, 3)
    """
    check_options("tf_greedy", options)
    g, idx = problem.graph, problem.topo_index
    virtual: dict[str, int] = {}
    count = 0
    for n in problem.topo_order:
        inherit = [p for p in sorted(g.predecessors(n), key=idx.__getitem__) if g.out_degree(p) == 1]
        if inherit:
            virtual[n] = virtual[inherit[0]]
        else:
            virtual[n] = count
            count += 1
    stream_of = {n: k % problem.streams for n, k in virtual.items()}
    return schedule_from_assignment(problem, stream_of, "tf_greedy",
                                    stats=VirtualStreamStats(count))
