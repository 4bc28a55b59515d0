"""Replay a plan under a memory cap: ops wait for memory as they wait for their inputs.

:func:`capped_replay` is the one entry.  It keeps the plan's streams and replays
its launch order as a list schedule (each stream in order, an op starting once its
producers have ended) with one more rule: an op whose fresh storages would lift
the live bytes above ``cap`` waits until enough storages are freed.  Storages are
freed as the runtimes free them (:mod:`autostream.memory.lifetimes`): when the last op
reading one ends, or, when another stream read it, as its allocating stream starts
its next op, which then gets ordering edges from those reads (its wait makes the
free safe).  Outputs and inputs are never freed.  Each op held back for memory gets
an ordering edge from the op whose end let it go, and the replay's start order is
the new launch order, so the runtime can enforce the cap with ordinary syncs.
When every stream would wait for memory, the op launched first starts anyway, as
it would on one stream.

Storages stand alone here (alias groups are not merged), so this is an estimate:
:func:`autostream.memory.predict.predict_memory` checks the result exactly.

>>> import networkx as nx
>>> from autostream.memory.predict import GraphMemory
>>> from autostream.scheduling.problem import SchedulingProblem
>>> from autostream.scheduling.schedule import Schedule
>>> deps = nx.DiGraph([("a", "b"), ("c", "d")])
>>> nx.set_node_attributes(deps, 1.0, "duration")
>>> mem = GraphMemory.from_sizes(deps, {"a": 8, "b": 1, "c": 8, "d": 1})
>>> s = Schedule("x", {"a": 0, "b": 0, "c": 1, "d": 1}, ("a", "c", "b", "d"), {}, {}, 0.0, 0.0)
>>> capped_replay(s, SchedulingProblem(deps, 2), mem, cap=10)
(('a', 'b', 'c', 'd'), (('b', 'c'),))
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from autostream.memory.predict import GraphMemory
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule

__all__ = ["capped_replay"]

Edge = tuple[str, str]


def capped_replay(schedule: Schedule, problem: SchedulingProblem, memory: GraphMemory, cap: int,
                  durations: Mapping[str, float] | None = None
                  ) -> tuple[tuple[str, ...], tuple[Edge, ...]]:
    """The launch order and the ordering edges of ``schedule`` replayed under ``cap`` bytes.

    ``durations``: each op's time (default: the problem's); pass a timeline's spans
    to keep the slowdowns of contention.
    """
    replay = _Replay(schedule, problem, memory, cap, durations)
    replay.run()
    return tuple(replay.started), tuple(replay.edges)


class _Replay:
    """State of one capped replay (see the module docstring)."""

    def __init__(self, schedule: Schedule, problem: SchedulingProblem, memory: GraphMemory,
                 cap: int, durations: Mapping[str, float] | None):
        self.problem, self.cap = problem, cap
        self.stream_of = schedule.stream_of
        self.queues = schedule.stream_sequences()
        self.position = {n: i for i, n in enumerate(schedule.order)}
        self.duration = dict(durations) if durations is not None else {
            n: problem.duration(n) for n in schedule.order}
        self.allocates: dict[str, list[str]] = {}
        for s, op in memory.allocated_by.items():
            self.allocates.setdefault(op, []).append(s)
        self.size = memory.nbytes
        self.readers = _reads_per_storage(memory)
        self.waiting_reads: dict[str, set[str] | None] = {
            st: set(r) for st, r in self.readers.items()}
        self.touches: dict[str, set[str]] = {op: set(ss) for op, ss in self.allocates.items()}
        for storage, readers in self.waiting_reads.items():
            for op in readers:
                self.touches.setdefault(op, set()).add(storage)
        self.allocated: set[str] = set()
        self.stream_of_storage = {st: self.stream_of[op] for st, op in memory.allocated_by.items()}
        #: stream -> storages freed when it starts its next op, with the reads to order first
        self.pending: dict[int, list[str]] = {}
        self.kept = {s for v in memory.outputs for s in memory.storages_of.get(v, ())}
        self.live = memory.input_bytes
        self.head = dict.fromkeys(self.queues, 0)
        self.free_at = dict.fromkeys(self.queues, 0.0)
        self.end: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.started: list[str] = []
        self.edges: list[Edge] = []
        self.held: set[str] = set()
        self.last_freer: str | None = None
        self.now = 0.0

    def run(self) -> None:
        while len(self.started) < len(self.position):
            ready = self._ready()
            fits = [n for n in ready if self._fits(n)]
            if not fits and not self.running and ready:
                fits = [ready[0]]  # every stream waits for memory: launch order decides
            for n in fits[:1]:
                self._start(n)
            if fits:
                continue
            self.held.update(ready)
            self._advance()

    def _ready(self) -> list[str]:
        out = []
        for s, queue in self.queues.items():
            if self.head[s] >= len(queue) or self.free_at[s] > self.now:
                continue
            n = queue[self.head[s]]
            if n in self.running or n in self.end:
                continue
            if all(p in self.end and self.end[p] + self._latency(p, n) <= self.now
                   for p in self.problem.graph.predecessors(n)):
                out.append(n)
        return sorted(out, key=self.position.__getitem__)

    def _latency(self, p: str, n: str) -> float:
        return self.problem.sync_latency_us if self.stream_of[p] != self.stream_of[n] else 0.0

    def _fits(self, n: str) -> bool:
        need = sum(self.size[s] for s in self.allocates.get(n, ()))
        after = self.live - sum(self.size[s] for s in self.pending.get(self.stream_of[n], ()))
        return need == 0 or after + need <= self.cap

    def _start(self, n: str) -> None:
        freer = self.last_freer
        if n in self.held and freer is not None and self.stream_of[freer] != self.stream_of[n]:
            self.edges.append((freer, n))
        self.held.discard(n)
        for storage in self.pending.pop(self.stream_of[n], []):
            self.live -= self.size[storage]
            self.edges += [(r, n) for r in sorted(self.readers[storage], key=self.position.get)
                           if self.stream_of[r] != self.stream_of[n]]
        self.started.append(n)
        self.live += sum(self.size[s] for s in self.allocates.get(n, ()))
        self.running[n] = self.now + self.duration[n]
        self.free_at[self.stream_of[n]] = math.inf

    def _advance(self) -> None:
        """Move to the next op end (or the next moment an input becomes ready)."""
        later = [t for t in self._gate_times() if t > self.now]
        if self.running:
            later.append(min(self.running.values()))
        if not later:
            raise ValueError("capped replay is stuck: the schedule does not cover the problem")
        self.now = min(later)
        for n in sorted((n for n, t in self.running.items() if t <= self.now),
                        key=self.position.__getitem__):
            self._finish(n)

    def _gate_times(self) -> list[float]:
        return [self.end[p] + self._latency(p, n)
                for s, queue in self.queues.items() if self.head[s] < len(queue)
                for n in [queue[self.head[s]]]
                for p in self.problem.graph.predecessors(n) if p in self.end]

    def _finish(self, n: str) -> None:
        del self.running[n]
        self.end[n] = self.now
        s = self.stream_of[n]
        self.head[s] += 1
        self.free_at[s] = self.now
        self.allocated.update(self.allocates.get(n, ()))
        freed = False
        for storage in sorted(self.touches.get(n, ())):
            waiting = self.waiting_reads[storage]
            if waiting is None:
                continue
            waiting.discard(n)
            if not waiting and storage not in self.kept and storage in self.allocated:
                self.waiting_reads[storage] = None
                home = self.stream_of_storage[storage]
                if any(self.stream_of[r] != home for r in self.readers[storage]):
                    self.pending.setdefault(home, []).append(storage)
                    continue
                self.live -= self.size[storage]
                freed = True
        if freed:
            self.last_freer = n


def _reads_per_storage(memory: GraphMemory) -> dict[str, set[str]]:
    """Op-allocated storage -> the ops reading a value that references it."""
    out: dict[str, set[str]] = {s: set() for s in memory.allocated_by}
    for op, read in memory.reads.items():
        for v in read:
            for s in memory.storages_of.get(v, ()):
                if s in out:
                    out[s].add(op)
    return out
