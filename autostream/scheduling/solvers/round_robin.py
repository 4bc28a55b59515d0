"""``round_robin``: op ``i`` of the program order goes to stream ``i mod streams``."""

from __future__ import annotations

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import check_options, schedule_from_assignment


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """Deal the ops out over the streams in topological program order.

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_nodes_from("abc", duration=1.0)
    >>> sorted(solve(SchedulingProblem(g, streams=2)).stream_of.values())
    [0, 0, 1]
    """
    check_options("round_robin", options)
    stream_of = {n: i % problem.streams for i, n in enumerate(problem.topo_order)}
    return schedule_from_assignment(problem, stream_of, "round_robin")
