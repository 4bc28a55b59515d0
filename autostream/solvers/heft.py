"""``heft``: Heterogeneous Earliest Finish Time list scheduling (Topcuoglu et al., TPDS 2002).

Ops are taken by decreasing upward rank (the longest path from the op to an exit,
with the expected sync latency on every edge); each goes to the stream where it
finishes earliest, inserted into the earliest idle gap that fits (insertion
policy).  The placement also respects the device capacity: an op with share
``r`` is only placed where the already placed concurrent ops leave ``r`` free.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from autostream.problem import SchedulingProblem
from autostream.schedule import Schedule
from autostream.solvers.base import launch_order, schedule_from_assignment

_EPS = 1e-9


@dataclass(frozen=True)
class Placement:
    """A capacity-feasible placement: stream, start and end of every op."""

    stream_of: dict[str, int]
    start: dict[str, float]
    end: dict[str, float]

    @property
    def makespan(self) -> float:
        return max(self.end.values(), default=0.0)


def upward_rank(problem: SchedulingProblem) -> dict[str, float]:
    """Longest path from each op to an exit, durations plus the expected sync latency."""
    latency = problem.sync_latency_us * (problem.streams - 1) / problem.streams
    rank: dict[str, float] = {}
    for n in reversed(problem.topo_order):
        tail = max((latency + rank[s] for s in problem.graph.successors(n)), default=0.0)
        rank[n] = problem.duration(n) + tail
    return rank


class _Timeline:
    """Busy intervals of each stream and the device load, for gap search."""

    def __init__(self, streams: int, capacity: float) -> None:
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(streams)]
        self.loaded: list[tuple[float, float, float]] = []  # (start, end, share), share > 0
        self.capacity = capacity

    def load_fits(self, t: float, d: float, share: float) -> bool:
        if share <= 0:
            return True
        hi = t + d
        events = []
        for s, e, r in self.loaded:
            if s < hi - _EPS and e > t + _EPS:
                events.append((max(s, t), r))
                events.append((min(e, hi), -r))
        load = share
        for _, r in sorted(events, key=lambda x: (x[0], x[1])):
            load += r
            if load > self.capacity + _EPS:
                return False
        return True

    def earliest(self, stream: int, ready: float, d: float, share: float) -> float:
        """Earliest start >= ready where the stream is idle and the capacity suffices."""
        candidates = {ready}
        candidates.update(e for _, e in self.busy[stream] if e > ready)
        if share > 0:
            candidates.update(e for _, e, _ in self.loaded if e > ready)
        busy = self.busy[stream]
        for t in sorted(candidates):
            i = bisect.bisect_right(busy, (t + d - _EPS, float("inf")))
            # the interval before index i must end by t; none may start before t + d
            if i > 0 and busy[i - 1][1] > t + _EPS and busy[i - 1][0] < t + d - _EPS:
                continue
            if d <= _EPS and i > 0 and busy[i - 1][0] < t - _EPS < busy[i - 1][1] - _EPS:
                continue
            if self.load_fits(t, d, share):
                return t
        raise AssertionError("unreachable: the end of the timeline always fits")

    def place(self, stream: int, t: float, d: float, share: float) -> None:
        bisect.insort(self.busy[stream], (t, t + d))
        if share > 0 and d > 0:
            self.loaded.append((t, t + d, share))


def heft_placement(problem: SchedulingProblem) -> Placement:
    """Run HEFT and return its capacity-feasible placement (used as a CP-SAT hint)."""
    rank = upward_rank(problem)
    idx = problem.topo_index
    queue = sorted(problem.graph, key=lambda n: (-rank[n], idx[n]))
    timeline = _Timeline(problem.streams, problem.capacity)
    stream_of: dict[str, int] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    lat = problem.sync_latency_us
    for n in queue:
        d, share = problem.duration(n), problem.share(n)
        best: tuple[float, int, float] | None = None
        # Try used streams plus one fresh stream: all fresh streams are equivalent.
        used = sorted(set(stream_of.values()))
        candidates = used + ([len(used)] if len(used) < problem.streams else [])
        for s in candidates:
            ready = max(
                (end[p] + (lat if stream_of[p] != s else 0.0) for p in problem.graph.predecessors(n)),
                default=0.0,
            )
            t = timeline.earliest(s, ready, d, share)
            if best is None or t + d < best[0] - _EPS:
                best = (t + d, s, t)
        assert best is not None
        _, s, t = best
        timeline.place(s, t, d, share)
        stream_of[n], start[n], end[n] = s, t, t + d
    return Placement(stream_of, start, end)


def solve(problem: SchedulingProblem, **_: object) -> Schedule:
    """HEFT with insertion, contention-aware.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> solve(SchedulingProblem(g, streams=2)).makespan
    2.0
    """
    placement = heft_placement(problem)
    order = launch_order(problem, placement.start)
    return schedule_from_assignment(
        problem, placement.stream_of, "heft", order=order, placement_makespan=placement.makespan
    )
