"""Windows of the task graph solved one after the other, and the greedy plan of one window.

A window is a run of consecutive tasks (topological order) placed after the
tasks before it are fixed.  What the earlier tasks leave behind is the window's
*boundary*: when each stream becomes free, the end and stream of every outside
predecessor, and the device load still running.  Two windows with the same tasks
(durations, shares, edges) and the same boundary relative to their origin have
the same solutions, which is how identical layers are solved once
(``Window.key``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autostream.scheduling.solvers.cpsat.tasks import TaskGraph


@dataclass
class Placed:
    """Integer placement of the tasks fixed so far."""

    stream: dict[int, int] = field(default_factory=dict)
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    stream_free: dict[int, int] = field(default_factory=dict)

    def put(self, task: int, stream: int, start: int, duration: int) -> None:
        self.stream[task], self.start[task], self.end[task] = stream, start, start + duration
        self.stream_free[stream] = max(self.stream_free.get(stream, 0), start + duration)


@dataclass(frozen=True)
class Window:
    """Tasks ``tasks`` (ascending ids) to place after ``placed``; all times absolute units."""

    tasks: tuple[int, ...]
    lo: int  # no window task starts before lo
    free: tuple[int, ...]  # per stream, >= lo
    ext: dict[int, tuple[tuple[int, int], ...]]  # task -> ((pred end, pred stream), ...)
    loads: tuple[tuple[int, int, int], ...]  # (start, end, share) still running after lo
    fresh: tuple[int, ...]  # streams nothing has used yet (interchangeable)

    @staticmethod
    def make(tg: TaskGraph, tasks: tuple[int, ...], placed: Placed, streams: int) -> Window:
        inside = set(tasks)
        ext = {
            v: tuple((placed.end[p], placed.stream[p]) for p in tg.preds[v] if p not in inside)
            for v in tasks
        }
        released = [max(e for e, _ in ext[v]) for v in tasks if ext[v]]
        # A window task with no outside predecessor is still launched after the tasks
        # before it, so it cannot start before the earliest release of the window.
        lo = min(released) if released else min(
            (f for s, f in placed.stream_free.items() if s >= 0), default=0)
        free = tuple(max(lo, placed.stream_free.get(s, 0)) for s in range(streams))
        loads = tuple(
            sorted(
                (max(placed.start[t], lo), placed.end[t], tg.share[t])
                for t in placed.end
                if placed.end[t] > lo and tg.share[t] > 0 and tg.duration[t] > 0
            )
        )
        fresh = tuple(s for s in range(streams) if s not in placed.stream_free)
        return Window(tasks, lo, free, ext, loads, fresh)

    def key(self, tg: TaskGraph) -> tuple:
        """Everything a solution depends on, relative to ``lo`` (equal keys, equal solutions)."""
        pos = {v: i for i, v in enumerate(self.tasks)}
        lo = self.lo
        return (
            tuple(
                (
                    tg.duration[v],
                    tg.share[v],
                    tg.lane[v] if tg.lane else 0,
                    tuple(pos[p] for p in tg.preds[v] if p in pos),
                    tuple(sorted((e - lo, s) for e, s in self.ext[v])),
                )
                for v in self.tasks
            ),
            tuple(f - lo for f in self.free),
            tuple((s - lo, e - lo, r) for s, e, r in self.loads),
            self.fresh,
        )

    def allowed_streams(self, streams: int) -> list[list[int]]:
        """Candidate streams per window task: used streams plus the first fresh ones.

        Fresh streams are interchangeable, so the i-th task need only consider the
        first ``i + 1`` of them (symmetry breaking).
        """
        used = [s for s in range(streams) if s not in self.fresh]
        return [sorted(used + list(self.fresh[: i + 1])) for i in range(len(self.tasks))]


def _fits(loads: list[tuple[int, int, int]], t: int, d: int, share: int, capacity: int) -> bool:
    if share <= 0 or d <= 0:
        return True
    events = []
    for s, e, r in loads:
        if s < t + d and e > t:
            events.append((max(s, t), r))
            events.append((min(e, t + d), -r))
    load = share
    for _, r in sorted(events, key=lambda x: (x[0], x[1])):
        load += r
        if load > capacity:
            return False
    return True


def greedy_window(
    tg: TaskGraph, win: Window, streams: int, rank: list[float]
) -> tuple[dict[int, int], dict[int, int]]:
    """HEFT on a window (upward rank, earliest finish, gap insertion): a placement the
    window's CP-SAT model accepts (``model.feasible``), whatever the window.

    Returns ``(stream, start)``.  Tasks go by decreasing upward rank (ties: task
    id, so predecessors first), each to the allowed stream where it finishes
    earliest, in the earliest idle gap of that stream that fits (no :func:`clash`
    with what the stream holds, including zero-duration tasks placed before); a
    transfer to the earliest gap of its link.
    """
    pos = {v: i for i, v in enumerate(win.tasks)}
    allowed = win.allowed_streams(streams)
    busy: dict[int, list[tuple[int, int]]] = {  # per stream, and per link as it is used
        s: [(win.lo, f)] if f > win.lo else [] for s, f in enumerate(win.free)}
    loads = list(win.loads)
    stream: dict[int, int] = {}
    start: dict[int, int] = {}
    for v in sorted(win.tasks, key=lambda v: (-rank[v], v)):
        d, r = tg.duration[v], tg.share[v]
        best: tuple[int, int, int] | None = None
        for s in [tg.lane[v]] if tg.on_lane(v) else allowed[pos[v]]:
            ready = win.lo
            for e, ps in win.ext[v]:
                ready = max(ready, e + tg.latency_between(ps, s))
            for p in tg.preds[v]:
                if p in stream:
                    ready = max(ready, start[p] + tg.duration[p]
                                + tg.latency_between(stream[p], s))
            t = earliest_start(busy.setdefault(s, []), loads, ready, d, r, tg.capacity)
            if best is None or t + d < best[0]:
                best = (t + d, s, t)
        assert best is not None
        _, s, t = best
        stream[v], start[v] = s, t
        busy[s].append((t, t + d))
        busy[s].sort()
        if r > 0 and d > 0:
            loads.append((t, t + d, r))
    return stream, start


def earliest_start(
    busy: list[tuple[int, int]], loads: list[tuple[int, int, int]],
    ready: int, d: int, share: int, capacity: int,
) -> int:
    """Earliest ``t >= ready`` with ``[t, t + d)`` idle on the stream (``busy``: its
    intervals, ``(start, end)``) and ``share`` fitting in ``capacity`` beside ``loads``
    (``(start, end, share)``).

    >>> earliest_start([(0, 4)], [], 1, 2, 0, 10), earliest_start([], [(0, 5, 7)], 1, 2, 4, 10)
    (4, 5)
    """
    candidates = sorted(
        {ready} | {e for _, e in busy if e > ready} | {e for _, e, _ in loads if e > ready}
    )
    for t in candidates:
        if any(clash(s, e - s, t, d) for s, e in busy):
            continue
        if _fits(loads, t, d, share, capacity):
            return t
    raise AssertionError("unreachable: after every busy interval the stream is idle")


def clash(a: int, da: int, b: int, db: int) -> bool:
    """Do intervals ``[a, a + da)`` and ``[b, b + db)`` overlap as CP-SAT's no-overlap reads
    them?  A zero-length interval clashes only strictly inside a longer one: it may sit at
    either end.

    >>> clash(0, 10, 5, 0), clash(0, 10, 0, 0), clash(0, 10, 10, 0), clash(3, 0, 3, 0)
    (True, False, False, False)
    >>> clash(0, 10, 9, 5), clash(0, 10, 10, 5)
    (True, False)
    """
    if da == 0 and db == 0:
        return False
    if da == 0 or db == 0:
        point, s, d = (a, b, db) if da == 0 else (b, a, da)
        return s < point < s + d
    return a < b + db and b < a + da


def upward_rank(tg: TaskGraph, streams: int) -> list[float]:
    """Longest path from each task to an exit, with the expected sync latency per edge
    (none to or from a link)."""
    lat = tg.latency * (streams - 1) / streams
    rank = [0.0] * len(tg)
    for v in reversed(range(len(tg))):
        rank[v] = tg.duration[v] + max(
            ((0.0 if tg.on_lane(v) or tg.on_lane(s) else lat) + rank[s] for s in tg.succs[v]),
            default=0.0)
    return rank


def cut_windows(tg: TaskGraph, size: int) -> list[tuple[int, ...]]:
    """Consecutive task runs of at most ``size``, cut after a bottleneck task when possible.

    >>> from autostream.scheduling.solvers.cpsat.tasks import build_tasks
    >>> from autostream.scheduling.problem import SchedulingProblem
    >>> import networkx as nx
    >>> g = nx.path_graph(5, create_using=nx.DiGraph); nx.set_node_attributes(g, 1.0, "duration")
    >>> cut_windows(build_tasks(SchedulingProblem(g, streams=2)), 2)
    [(0, 1), (2, 3), (4,)]
    """
    n = len(tg)
    # cut_before[i]: every edge from a task before i - 1 lands at or before i - 1,
    # so task i - 1 is a bottleneck (e.g. a layer's residual add) and ends a window.
    cut_before = [False] * (n + 1)
    furthest = -1
    for i in range(n):
        cut_before[i + 1] = furthest <= i
        furthest = max(furthest, max(tg.succs[i], default=i))
    cut_before[n] = True
    out = []
    lo = 0
    while lo < n:
        hi = min(n, lo + size)
        if hi < n:
            cuts = [i for i in range(lo + max(1, size // 3), hi + 1) if cut_before[i]]
            if cuts:
                hi = cuts[-1]
        out.append(tuple(range(lo, hi)))
        lo = hi
    return out
