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

Edges are dependences: ``u -> v`` means ``v`` may start only after ``u`` ends (plus
``sync_latency_us`` when the two run on different streams).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx


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
        if not nx.is_directed_acyclic_graph(self.graph):
            cycle = nx.find_cycle(self.graph)
            path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
            raise ValueError(f"the task graph has a cycle: {path}; a schedule needs a DAG")

    # -- per-task data -------------------------------------------------------------
    def duration(self, node: str) -> float:
        return float(self.graph.nodes[node]["duration"])

    def share(self, node: str) -> float:
        return float(self.graph.nodes[node].get("share", 0.0))

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """A deterministic topological order (ties broken by program ``order``)."""
        key = {n: (self.graph.nodes[n].get("order", 0), str(n)) for n in self.graph}
        return tuple(nx.lexicographical_topological_sort(self.graph, key=lambda n: key[n]))

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
        return sum(self.duration(n) for n in self.graph)

    def contended_work(self) -> float:
        """Sum of duration x share: the device-time the ops need at capacity 1."""
        return sum(self.duration(n) * self.share(n) for n in self.graph)

    def single_stream_time(self) -> float:
        """Makespan on one stream: every op back to back (no syncs are needed)."""
        return self.total_work()

    def lower_bound(self) -> float:
        """``max(critical path, work / streams, contended work / capacity)`` (Graham)."""
        return max(
            self.critical_path(),
            self.total_work() / self.streams,
            self.contended_work() / self.capacity,
        )
