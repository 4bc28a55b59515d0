"""``overlap``: one stream, ordered so that collectives' transfers overlap compute.

Dynamo traces each functional collective's wait right after its launch, so in program
order a transfer overlaps nothing.  This plan launches each collective as early and
places each wait as late as the dependences allow, on one stream: what a
hand-written ``async_op=True`` does, without a second stream (on CPU without the
multi-stream runtime's costs).  Without collectives it is HEFT's order on one stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers import heft
from autostream.scheduling.solvers.base import check_options, schedule_from_assignment


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """One stream, ordered so that transfers overlap compute: each collective launched as
    early (HEFT on one stream beside the links; the collectives keep their program order,
    which the graph's edges fix) and each wait placed as late as the dependences allow
    (:func:`sink_transfer_readers`).  Named ``overlap`` so that a plan can tell it from
    the program order (``single``).

    >>> import networkx as nx
    >>> g = nx.DiGraph([("launch", "xfer"), ("xfer", "wait"), ("launch", "wait")])
    >>> g.add_nodes_from(["mm", "wait", "launch"], duration=10.0)
    >>> g.add_node("xfer", duration=30.0, lane="link:0")
    >>> nx.set_node_attributes(g, {"launch": 0, "xfer": 1, "wait": 2, "mm": 3}, "order")
    >>> s = solve(SchedulingProblem(g, streams=2))
    >>> [n for n in s.order if n != "xfer"], s.makespan
    (['launch', 'mm', 'wait'], 50.0)
    """
    check_options("overlap", options)
    one = SchedulingProblem(problem.graph, streams=1, sync_latency_us=problem.sync_latency_us,
                            capacity=problem.capacity)
    early = heft.solve(one)
    late = schedule_from_assignment(one, early.stream_of, "overlap",
                                    order=sink_transfer_readers(one, early.order))
    return late if late.makespan <= early.makespan + 1e-9 else replace(early, solver="overlap")


def sink_transfer_readers(problem: SchedulingProblem, order: Sequence[str]) -> tuple[str, ...]:
    """``order`` with each op that reads a transfer (a collective's wait, a ``getitem`` of
    a coalesced result), and each op after those that launches no collective, moved to
    just before its first successor (the end when none); the moved ops keep their order
    among themselves.

    A reader blocks its stream until the transfer is done: placed as late as the ops
    that need it allow, the compute before it overlaps the transfer however long the
    transfer really takes (a prediction that ends the transfer early would otherwise
    place the wait early for free).  Launches stay where they are.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("launch", "xfer"), ("xfer", "wait"), ("wait", "add")])
    >>> g.add_nodes_from(["launch", "wait", "add", "mm"], duration=1.0)
    >>> g.add_node("xfer", duration=5.0, lane="link:0")
    >>> one = SchedulingProblem(g, streams=1)
    >>> sink_transfer_readers(one, ["launch", "xfer", "wait", "add", "mm"])
    ('launch', 'xfer', 'mm', 'wait', 'add')
    """
    g = problem.graph
    lanes = problem.pinned
    after: set[str] = set()  # the readers and everything after them: one pass in order
    for n in order:
        if n not in lanes and any(p in lanes or p in after for p in g.predecessors(n)):
            after.add(n)
    movable = {n for n in after if not any(m in lanes for m in g.successors(n))}
    fixed = [n for n in order if n not in movable]
    slot = {n: i for i, n in enumerate(fixed)}
    before: dict[str, int] = {}  # movable op -> the fixed op it goes right before
    for n in reversed(order):
        if n in movable:
            before[n] = min((before[s] if s in movable else slot[s] for s in g.successors(n)),
                            default=len(fixed))
    at: dict[int, list[str]] = {}
    for n in order:  # the moved ops keep their order among themselves
        if n in movable:
            at.setdefault(before[n], []).append(n)
    out: list[str] = []
    for i, n in enumerate(fixed):
        out += at.get(i, [])
        out.append(n)
    return (*out, *at.get(len(fixed), []))
