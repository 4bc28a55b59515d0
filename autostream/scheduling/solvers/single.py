"""``single``: every op on the main stream, in program order (the baseline)."""

from __future__ import annotations

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import check_options, schedule_from_assignment


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """One stream, topological program order.

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_node("a", duration=3.0)
    >>> solve(SchedulingProblem(g, streams=4)).streams_used
    1
    """
    check_options("single", options)
    return schedule_from_assignment(problem, {n: 0 for n in problem.graph}, "single")
