"""The integer task graph CP-SAT works on: times rounded down to units, ops merged into tasks.

CP-SAT needs integer times.  The *scale* is the number of time units per
microsecond: the smallest power of ten up to ``10_000`` at which every duration
and the sync latency are integers, else the finest that keeps the total work
under ``MAX_UNITS``.  Times are rounded *down*, so the integer model never asks
more of a plan than the real times do: an optimum it proves is a lower bound of
the real makespan (the plan itself is always re-timed by the simulator).  Device
shares become integers out of ``SHARE_UNITS`` (rounded up: the model never
oversubscribes the device).

Ops become tasks by merges that lose nothing: a zero-duration op with a single
predecessor runs on its predecessor's stream right after it (no plan is better
off with it elsewhere: its successors get the value no later), and a
zero-duration op without predecessors and with a single successor runs right
before that successor.  A collective's transfer (a task on a process group's link,
``problem.pinned``) is a task of its own: nothing merges into it, it merges into
nothing.  With ``collapse_chains`` a linear chain (``u``'s single
successor ``v`` has the single predecessor ``u``) also becomes one task, whose
share is the largest of its members'; that merge may lose a little (the chain can
no longer be split over streams), so the model then bounds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers._graphs import transitive_reduction_edges

SHARE_UNITS = 1000
MAX_UNITS = 10_000_000
_SCALES = (1.0, 10.0, 100.0, 1000.0, 10_000.0)


@dataclass(frozen=True)
class TaskGraph:
    """Tasks ``0..n-1`` in topological order, with integer durations and shares."""

    members: tuple[tuple[str, ...], ...]  # the ops of each task, in topological order
    duration: tuple[int, ...]
    share: tuple[int, ...]  # out of SHARE_UNITS; 0 when the model ignores contention
    preds: tuple[tuple[int, ...], ...]  # transitive reduction, ascending
    succs: tuple[tuple[int, ...], ...]
    scale: float  # time units per microsecond
    latency: int
    capacity: int  # out of SHARE_UNITS
    #: an optimum of this model, over ``scale``, is a lower bound of the real makespan:
    #: no chain was collapsed and contention is either ignored or can never bind
    relaxes: bool
    #: the most any path can lose to rounding down, us: a plan within ``optimum /
    #: scale + rounding_us`` is optimal as far as this model can tell
    rounding_us: float = 0.0
    #: per task, the (negative) stream number of the link it runs on
    #: (``problem.pinned``), 0 for a task that needs a stream; empty: no lanes
    lane: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.members)

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(u, v) for v in range(len(self)) for u in self.preds[v]]

    def on_lane(self, v: int) -> bool:
        """Does task ``v`` run on a link (beside the streams) rather than on a stream?"""
        return bool(self.lane) and self.lane[v] < 0

    def latency_between(self, producer_stream: int, consumer_stream: int) -> int:
        """The sync latency an edge pays between these streams: none on one stream, none
        to or from a link (the collective's own machinery orders it)."""
        if producer_stream == consumer_stream or producer_stream < 0 or consumer_stream < 0:
            return 0
        return self.latency

    @property
    def contended(self) -> bool:
        """Does any task occupy a share of the device in the model?"""
        return any(self.share)


def time_scale(problem: SchedulingProblem) -> float:
    """Units per microsecond for ``problem``'s durations and sync latency.

    >>> g = nx.DiGraph(); g.add_node("a", duration=1.5)
    >>> time_scale(SchedulingProblem(g, streams=1))
    10.0
    >>> g.add_node("b", duration=1 / 3)
    >>> time_scale(SchedulingProblem(g, streams=1))
    10000.0
    """
    values = [problem.duration(n) for n in problem.graph] + [problem.sync_latency_us]
    total = max(sum(values), 1e-9)
    finest = 1.0
    for scale in _SCALES:
        if total * scale > MAX_UNITS:
            break
        finest = scale
        if all(abs(v * scale - round(v * scale)) <= 1e-6 * max(1.0, v * scale) for v in values):
            return scale
    return finest if total * finest <= MAX_UNITS else MAX_UNITS / total


def to_units(us: float, scale: float) -> int:
    """``us`` in units, rounded down (a value within 1e-6 units of an integer is that integer)."""
    return int(math.floor(us * scale + 1e-6))


def task_groups(problem: SchedulingProblem, collapse_chains: bool,
                merge_zero: bool = True) -> list[list[str]]:
    """The ops of each task (topological order), tasks in a topological order.

    ``merge_zero=False`` keeps zero-duration ops tasks of their own.

    >>> g = nx.DiGraph([("a", "v"), ("v", "b"), ("v", "c")])
    >>> nx.set_node_attributes(g, {"a": 1.0, "v": 0.0, "b": 1.0, "c": 1.0}, "duration")
    >>> task_groups(SchedulingProblem(g, streams=2), collapse_chains=False)
    [['a', 'v'], ['b'], ['c']]
    """
    g = problem.graph
    index = problem.topo_index
    lanes = problem.pinned  # transfers: tasks of their own
    leader: dict[str, str] = {}  # op -> the op its task is built around
    for n in problem.topo_order:
        preds = list(g.predecessors(n))
        zero = merge_zero and problem.duration(n) == 0 and n not in lanes
        leader[n] = leader[preds[0]] if len(preds) == 1 and zero and preds[0] not in lanes else n
    for n in problem.topo_order:
        if (merge_zero and leader[n] == n and problem.duration(n) == 0 and g.in_degree(n) == 0
                and g.out_degree(n) == 1 and n not in lanes):
            w = next(iter(g.successors(n)))
            if leader[w] != n and leader[w] not in lanes:  # else n leads ops of its own
                leader[n] = leader[w]
    if collapse_chains:
        _collapse_chains(problem, leader)
    groups: dict[str, list[str]] = {}
    for n in problem.topo_order:
        groups.setdefault(_root(leader, n), []).append(n)
    return [groups[k] for k in sorted(groups, key=index.__getitem__)]


def _root(leader: dict[str, str], n: str) -> str:
    while leader[n] != n:
        n = leader[n]
    return n


def _collapse_chains(problem: SchedulingProblem, leader: dict[str, str]) -> None:
    """Merge task B into task A when A is B's only predecessor and B is A's only successor
    (neither a transfer)."""
    g = problem.graph
    lanes = problem.pinned
    succ: dict[str, set[str]] = {}
    pred: dict[str, set[str]] = {}
    for u, v in g.edges:
        a, b = _root(leader, u), _root(leader, v)
        if a != b:
            succ.setdefault(a, set()).add(b)
            pred.setdefault(b, set()).add(a)
    for n in problem.topo_order:  # leaders in topological order
        if leader[n] != n or len(pred.get(n, ())) != 1 or n in lanes:
            continue
        a = _root(leader, next(iter(pred[n])))
        if len(succ.get(a, ())) == 1 and a not in lanes:
            leader[n] = a
            succ[a] = succ.pop(n, set())
            for c in succ[a]:
                pred[c] = {a if p == n else p for p in pred[c]}


def build_tasks(
    problem: SchedulingProblem,
    collapse_chains: bool = False,
    shares: bool = True,
    capacity_factor: float = 1.0,
    merge_zero: bool = True,
) -> TaskGraph:
    """The integer task graph of ``problem``.

    ``shares=False`` drops the device shares (contention left to the simulator);
    ``capacity_factor > 1`` lets the model oversubscribe the device by that factor
    (the simulator's processor sharing then slows the overlapping ops down);
    ``merge_zero=False`` keeps every zero-duration op a task of its own.

    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, {"a": 1.25, "b": 2.0, "c": 0.0}, "duration")
    >>> tg = build_tasks(SchedulingProblem(g, streams=2))
    >>> tg.members, tg.duration, tg.scale, tg.relaxes
    ((('a', 'c'), ('b',)), (125, 200), 100.0, True)
    """
    scale = time_scale(problem)
    groups = task_groups(problem, collapse_chains, merge_zero)
    task_of = {n: k for k, group in enumerate(groups) for n in group}
    tg = nx.DiGraph()
    tg.add_nodes_from(range(len(groups)))
    tg.add_edges_from(
        (task_of[u], task_of[v]) for u, v in problem.graph.edges if task_of[u] != task_of[v]
    )
    reduced = transitive_reduction_edges(tg, list(range(len(groups))))
    preds: list[list[int]] = [[] for _ in groups]
    succs: list[list[int]] = [[] for _ in groups]
    for u, v in reduced:
        preds[v].append(u)
        succs[u].append(v)
    capacity = int(math.floor(problem.capacity * capacity_factor * SHARE_UNITS + 1e-9))
    share = tuple(
        min(capacity, int(math.ceil(max(problem.share(n) for n in group) * SHARE_UNITS - 1e-9)))
        if shares else 0  # an op wider than the device still runs, alone
        for group in groups
    )
    duration = tuple(to_units(sum(problem.duration(n) for n in group), scale) for group in groups)
    pinned = problem.pinned
    lane = tuple(pinned.get(group[0], 0) for group in groups) if pinned else ()
    collapsed = any(sum(problem.duration(n) > 0 for n in group) > 1 for group in groups)
    lost = sum(problem.duration(n) * scale - to_units(problem.duration(n), scale)
               for n in problem.graph)
    lost += len(reduced) * (problem.sync_latency_us * scale - to_units(problem.sync_latency_us, scale))
    return TaskGraph(
        members=tuple(tuple(group) for group in groups),
        duration=duration,
        share=share,
        preds=tuple(tuple(sorted(p)) for p in preds),
        succs=tuple(tuple(sorted(s)) for s in succs),
        scale=scale,
        latency=to_units(problem.sync_latency_us, scale),
        capacity=capacity,
        relaxes=not collapsed and not _can_bind(share, duration, capacity, problem.streams, lane),
        rounding_us=max(lost, 0.0) / scale,
        lane=lane,
    )


def _can_bind(share: tuple[int, ...], duration: tuple[int, ...], capacity: int,
              streams: int, lane: tuple[int, ...] = ()) -> bool:
    """Can tasks running at once exceed the capacity?"""
    lane = lane or (0,) * len(share)
    return widest_at_once(((s, k) for s, d, k in zip(share, duration, lane) if d > 0),
                          streams) > capacity


def widest_at_once(shares: Iterable[tuple[float, int]], streams: int) -> float:
    """The most device share tasks can hold at once: one task per stream and one per
    link.  ``shares``: ``(share, link)`` of each task that takes time, ``link`` the
    negative stream number of its link, 0 for a stream task.

    >>> widest_at_once([(0.5, 0), (0.4, 0), (0.3, 0), (0.2, -1), (0.1, -1)], streams=2)
    1.1
    """
    on_streams: list[float] = []
    per_link: dict[int, float] = {}
    for share, link in shares:
        if link < 0:
            per_link[link] = max(per_link.get(link, 0), share)
        else:
            on_streams.append(share)
    return sum(sorted(on_streams, reverse=True)[:streams]) + sum(per_link.values())
