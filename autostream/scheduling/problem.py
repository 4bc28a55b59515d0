"""The scheduling problem every solver sees: a DAG of timed tasks and a device.

The problem is independent of FX: tests, the STG benchmark and the compiler pass
all build one.  Node attributes on ``graph``:

- ``duration`` (float, microseconds, >= 0): the op's time when it runs alone;
- ``share`` (float in [0, 1]): the fraction of the device the op occupies while it
  runs.  Ops running at the same time on different streams must fit in
  ``capacity`` (the sum of their shares <= capacity).  ``share == 0`` means the op
  does not contend (the STG benchmark, metadata-only ops); ``share == 1`` means it
  saturates the device and can overlap with nothing but zero-share ops.
- ``order`` (int): the node's position in the original program; used to break ties
  so that every solver is deterministic.
- ``lane`` (str, optional): the task runs on this serial resource instead of a
  stream: a process group's link (``"link:<group>"``), where a collective's
  transfer runs between its launch and its wait, beside the compute of every
  stream.  A lane runs its tasks one at a time, in launch order; its tasks never
  occupy a stream and need no syncs (edges to and from them pay no sync latency).
  Schedules place lane ``k`` of :attr:`SchedulingProblem.links` on stream number
  ``-(k + 1)``.

Edges are dependences: ``u -> v`` means ``v`` may start only after ``u`` ends (plus
``sync_latency_us`` when the two run on different streams).

The problem names its resources (:attr:`SchedulingProblem.resources`): the
device's compute capacity, the streams, one link per process group.  Solvers,
the simulator and reports read that one list.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx


@dataclass(frozen=True)
class Resource:
    """One resource the tasks use: ``kind`` "device" (cumulative shares up to
    ``capacity``), "streams" (``capacity`` in-order queues) or "link" (one serial lane)."""

    name: str
    kind: str
    capacity: float


def lane_stream(index: int) -> int:
    """The stream number schedules give lane ``index``: negative, never a real stream's.

    >>> lane_stream(0), lane_stream(1)
    (-1, -2)
    """
    return -(index + 1)


@dataclass(frozen=True, eq=False)
class SchedulingProblem:
    """A DAG of tasks to place on ``streams`` streams of one device.

    >>> g = nx.DiGraph()
    >>> g.add_node("a", duration=2.0, share=0.0, order=0)
    >>> g.add_node("b", duration=3.0, share=0.0, order=1)
    >>> p = SchedulingProblem(g, streams=2)
    >>> p.lower_bound()
    3.0
    """

    graph: nx.DiGraph
    streams: int
    sync_latency_us: float = 0.0
    capacity: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.streams, int) or self.streams < 1:
            raise ValueError(f"streams must be an integer >= 1, got {self.streams!r}")
        if self.sync_latency_us < 0:
            raise ValueError(f"sync_latency_us must be >= 0, got {self.sync_latency_us}")
        if self.capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {self.capacity}")
        for n, data in self.graph.nodes(data=True):
            d = data.get("duration")
            if d is None or d < 0 or d != d:
                raise ValueError(f"task {n!r} has invalid duration {d!r}: durations must be >= 0")
            s = data.get("share", 0.0)
            if not 0.0 <= s <= 1.0:
                raise ValueError(f"task {n!r} has device share {s!r}; shares lie in [0, 1]")
            lane = data.get("lane")
            if lane is not None and (not isinstance(lane, str) or not lane):
                raise ValueError(f"task {n!r} has lane {lane!r}; a lane is a non-empty name")
        if not self._acyclic():
            cycle = nx.find_cycle(self.graph)
            path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
            raise ValueError(f"the task graph has a cycle: {path}; a schedule needs a DAG")

    def _acyclic(self) -> bool:
        """Whether the graph is a DAG: sorting it topologically is the check."""
        try:
            self.topo_order  # noqa: B018
        except nx.NetworkXUnfeasible:
            return False
        return True

    # -- per-task data -------------------------------------------------------------
    def duration(self, node: str) -> float:
        return self.durations[node]

    def share(self, node: str) -> float:
        return self.shares[node]

    # The graph is not changed once the problem is made: per-task data is read once.
    @cached_property
    def durations(self) -> dict[str, float]:
        """Task -> its duration (microseconds)."""
        return {n: float(d["duration"]) for n, d in self.graph.nodes(data=True)}

    @cached_property
    def shares(self) -> dict[str, float]:
        """Task -> its device share."""
        return {n: float(d.get("share", 0.0)) for n, d in self.graph.nodes(data=True)}

    def lane(self, node: str) -> str | None:
        """The lane (link) a task runs on, ``None`` for a task that needs a stream."""
        return self.graph.nodes[node].get("lane")

    # -- resources -------------------------------------------------------------------
    @cached_property
    def links(self) -> tuple[str, ...]:
        """The lanes the tasks use, sorted; lane ``k`` is stream ``lane_stream(k)``."""
        return tuple(sorted({d["lane"] for _, d in self.graph.nodes(data=True) if d.get("lane")}))

    @cached_property
    def pinned(self) -> dict[str, int]:
        """Lane task -> the (negative) stream number of its lane."""
        index = {lane: k for k, lane in enumerate(self.links)}
        return {n: lane_stream(index[d["lane"]]) for n, d in self.graph.nodes(data=True)
                if d.get("lane")}

    @property
    def resources(self) -> tuple[Resource, ...]:
        """The device, the streams and one serial link per lane.

        >>> g = nx.DiGraph(); g.add_node("t", duration=1.0, lane="link:tp")
        >>> [r.name for r in SchedulingProblem(g, streams=2).resources]
        ['device', 'streams', 'link:tp']
        """
        return (Resource("device", "device", self.capacity),
                Resource("streams", "streams", float(self.streams)),
                *(Resource(lane, "link", 1.0) for lane in self.links))

    def place_lanes(self, stream_of: dict[str, int], order: tuple[str, ...]
                    ) -> tuple[dict[str, int], tuple[str, ...]]:
        """A plan of the stream tasks completed with the lane tasks: each on its lane, in
        ``order`` right after its last predecessor (its launch, or the link's previous
        transfer).

        >>> g = nx.DiGraph([("ar", "ar.t"), ("ar.t", "w"), ("ar", "w"), ("x", "w")])
        >>> nx.set_node_attributes(g, 1.0, "duration"); g.nodes["ar.t"]["lane"] = "link:0"
        >>> SchedulingProblem(g, streams=2).place_lanes({"ar": 0, "x": 1, "w": 0}, ("ar", "x", "w"))
        ({'ar': 0, 'x': 1, 'w': 0, 'ar.t': -1}, ('ar', 'ar.t', 'x', 'w'))
        """
        pinned = self.pinned
        out: list[str] = []
        done: set[str] = set()

        def emit(n: str) -> None:
            out.append(n)
            done.add(n)
            for s in sorted(self.graph.successors(n), key=self.topo_index.__getitem__):
                if s in pinned and s not in done and all(p in done for p in self.graph.predecessors(s)):
                    emit(s)

        for n in order:
            emit(n)
        return {**stream_of, **pinned}, tuple(out)

    def lane_work(self) -> float:
        """The busiest lane's total time (a lane runs one task at a time)."""
        work: dict[str, float] = {}
        for n in self.pinned:
            lane = self.graph.nodes[n]["lane"]
            work[lane] = work.get(lane, 0.0) + self.duration(n)
        return max(work.values(), default=0.0)

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """A deterministic topological order: of the ready tasks, the first by program
        ``order`` (then name) goes first.  Raises ``nx.NetworkXUnfeasible`` on a cycle.

        >>> g = nx.DiGraph([("b", "a")]); g.add_node("c")
        >>> nx.set_node_attributes(g, {"a": 0, "b": 1, "c": 2}, "order")
        >>> nx.set_node_attributes(g, 1.0, "duration")
        >>> SchedulingProblem(g, streams=1).topo_order
        ('b', 'a', 'c')
        """
        key = {n: (self.graph.nodes[n].get("order", 0), str(n)) for n in self.graph}
        by_key = sorted(self.graph, key=key.__getitem__)
        position = {n: i for i, n in enumerate(by_key)}
        if all(position[u] < position[v] for u, v in self.graph.edges):
            # program order is topological (FX graphs): the smallest key is always ready
            return tuple(by_key)
        return tuple(nx.lexicographical_topological_sort(self.graph, key=key.__getitem__))

    @cached_property
    def topo_index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.topo_order)}

    # -- bounds ----------------------------------------------------------------------
    def critical_path(self) -> float:
        """Length of the longest path (sum of durations), ignoring sync latency."""
        finish: dict[str, float] = {}
        for n in self.topo_order:
            ready = max((finish[p] for p in self.graph.predecessors(n)), default=0.0)
            finish[n] = ready + self.duration(n)
        return max(finish.values(), default=0.0)

    def total_work(self) -> float:
        """Sum of the durations of the tasks that run on streams (lanes run beside them)."""
        pinned = self.pinned
        return sum(self.duration(n) for n in self.graph if n not in pinned)

    def contended_work(self) -> float:
        """Sum of duration x share: the device-time the ops need at capacity 1."""
        return sum(self.duration(n) * self.share(n) for n in self.graph)

    def single_stream_time(self) -> float:
        """Makespan on one stream of a problem without lanes: every op back to back (no
        syncs are needed).  With lanes (transfers beside the stream) it is the ``single``
        solver's makespan, and this raises ``ValueError`` saying so."""
        if self.links:
            raise ValueError("this problem has link lanes: its one-stream makespan is the "
                             "'single' solver's (get_solver('single')(problem).makespan)")
        return self.total_work()

    def lower_bound(self) -> float:
        """``max(critical path, work / streams, contended work / capacity, busiest lane)``
        (Graham, with the lanes as machines of their own)."""
        return self._graham_bound

    @cached_property
    def _graham_bound(self) -> float:
        return max(
            self.critical_path(),
            self.total_work() / self.streams,
            self.contended_work() / self.capacity,
            self.lane_work(),
        )
