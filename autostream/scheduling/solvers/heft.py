"""``heft``: Heterogeneous Earliest Finish Time list scheduling (Topcuoglu et al., TPDS 2002).

Ops are taken by decreasing upward rank (the longest path from the op to an exit,
with the expected sync latency on every edge); each goes to the stream where it
finishes earliest, inserted into the earliest idle gap that fits (insertion
policy).  The placement also respects the device capacity: an op with share
``r`` is only placed where the already placed concurrent ops leave ``r`` free.
A lane task (a collective's transfer, ``problem.pinned``) goes to its link, a
serial machine of its own beside the streams, with no sync latency on its edges.
"""

from __future__ import annotations

import bisect

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import (
    Timed,
    check_options,
    launch_order,
    schedule_from_assignment,
)

_EPS = 1e-9

#: how many of a stream's latest busy intervals the gap search looks into
INSERTION_WINDOW = 64


def upward_rank(problem: SchedulingProblem) -> dict[str, float]:
    """Longest path from each op to an exit, durations plus the expected sync latency."""
    latency = problem.sync_latency_us * (problem.streams - 1) / problem.streams
    rank: dict[str, float] = {}
    for n in reversed(problem.topo_order):
        tail = max((latency + rank[s] for s in problem.graph.successors(n)), default=0.0)
        rank[n] = problem.duration(n) + tail
    return rank


class _LoadProfile:
    """The device load as a step function: ``loads[i]`` holds on ``[times[i], times[i+1])``."""

    def __init__(self) -> None:
        self.times: list[float] = [0.0]
        self.loads: list[float] = [0.0]

    def _split(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        if abs(self.times[i] - t) <= _EPS:
            return i
        self.times.insert(i + 1, t)
        self.loads.insert(i + 1, self.loads[i])
        return i + 1

    def add(self, start: float, end: float, share: float) -> None:
        a, b = self._split(start), self._split(end)
        for k in range(a, b):
            self.loads[k] += share

    def overflow_end(self, start: float, end: float, limit: float) -> float | None:
        """End of the last step in ``[start, end)`` whose load exceeds ``limit``, or ``None``.

        No start before that end (and after ``start``) can fit: its window would still
        cover that step.
        """
        times, loads = self.times, self.loads
        i = max(bisect.bisect_right(times, start + _EPS) - 1, 0)
        last = None
        while i < len(times) and times[i] < end - _EPS:
            if loads[i] > limit + _EPS:
                last = i
            i += 1
        if last is None:
            return None
        return times[last + 1] if last + 1 < len(times) else float("inf")


class _Timeline:
    """Busy intervals of each stream and the device load, for gap search."""

    def __init__(self, streams: int, capacity: float) -> None:
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(streams)]
        self.load = _LoadProfile()
        self.capacity = capacity

    def _stream_conflict(self, stream: int, t: float, d: float) -> float | None:
        """End of the last busy interval of ``stream`` overlapping ``[t, t + d)``, or ``None``.

        No start before that end (and after ``t``) can fit: its window would still
        overlap that interval.
        """
        busy = self.busy[stream]
        hi = t + max(d, 0.0)
        i = bisect.bisect_left(busy, (hi - _EPS, float("-inf")))  # first interval starting >= hi
        k = i - 1
        if k >= 0 and busy[k][1] > t + _EPS and (d > _EPS or busy[k][0] < t - _EPS):
            return busy[k][1]
        return None

    def earliest(self, stream: int, ready: float, d: float, share: float) -> float:
        """Earliest start >= ready where the stream is idle and the capacity suffices.

        Each conflict moves the candidate start past it: past the end of the busy
        interval in the way, or past the step of the load profile that overflows.
        Gaps are searched among the last ``INSERTION_WINDOW`` intervals of the
        stream only, which keeps HEFT near-linear on graphs of thousands of ops.
        """
        busy = self.busy[stream]
        t = ready
        if len(busy) > INSERTION_WINDOW:
            t = max(t, busy[-INSERTION_WINDOW][1])
        while True:
            blocked_until = self._stream_conflict(stream, t, d)
            if blocked_until is None and share > 0 and d > _EPS:
                blocked_until = self.load.overflow_end(t, t + d, self.capacity - min(share, self.capacity))
            if blocked_until is None:
                return t
            t = blocked_until

    def place(self, stream: int, t: float, d: float, share: float) -> None:
        bisect.insort(self.busy[stream], (t, t + d))
        if share > 0 and d > 0:
            self.load.add(t, t + d, share)


def _machine(problem: SchedulingProblem, stream: int) -> int:
    """The timeline's machine of a stream; lane ``-(k + 1)`` is machine ``streams + k``."""
    return stream if stream >= 0 else problem.streams - stream - 1


def heft_placement(problem: SchedulingProblem) -> Timed:
    """Run HEFT and return its capacity-feasible placement: stream, start and end of every
    op (used as a CP-SAT hint)."""
    rank = upward_rank(problem)
    idx = problem.topo_index
    queue = sorted(problem.graph, key=lambda n: (-rank[n], idx[n]))
    timeline = _Timeline(problem.streams + len(problem.links), problem.capacity)
    stream_of: dict[str, int] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    lat = problem.sync_latency_us
    pinned = problem.pinned
    used = 0  # streams 0..used-1 hold ops: a fresh stream is always the next number
    for n in queue:
        d, share = problem.duration(n), problem.share(n)
        best: tuple[float, int, float] | None = None
        # Try used streams plus one fresh stream: all fresh streams are equivalent.
        candidates = list(range(min(used + 1, problem.streams)))
        if n in pinned:
            candidates = [pinned[n]]
        for s in candidates:
            ready = max(
                (end[p] + (lat if stream_of[p] != s and min(stream_of[p], s) >= 0 else 0.0)
                 for p in problem.graph.predecessors(n)),
                default=0.0,
            )
            t = timeline.earliest(_machine(problem, s), ready, d, share)
            if best is None or t + d < best[0] - _EPS:
                best = (t + d, s, t)
        assert best is not None
        _, s, t = best
        timeline.place(_machine(problem, s), t, d, share)
        stream_of[n], start[n], end[n] = s, t, t + d
        used = max(used, s + 1)
    return Timed(stream_of, start, end)


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """HEFT with insertion, contention-aware.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> solve(SchedulingProblem(g, streams=2)).makespan
    2.0
    """
    check_options("heft", options)
    placement = heft_placement(problem)
    order = launch_order(problem, placement.start)
    return schedule_from_assignment(problem, placement.stream_of, "heft", order=order)
