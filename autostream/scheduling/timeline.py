"""A plan's timeline: where and when every op ran (or is predicted to run), and its syncs.

:class:`Timeline` is what the simulator (:mod:`autostream.scheduling.simulate`) predicts, what
the threads runtime measures (``Timeline.from_spans``) and what the reports draw.

>>> t = Timeline.from_spans({"a": (0, 0.0, 2.0), "b": (1, 1.0, 3.0)})
>>> t.spans["b"].duration, t.makespan
(2.0, 3.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from autostream.scheduling.schedule import JOIN, Schedule, Sync

__all__ = ["OpSpan", "SyncEvent", "Timeline", "output_time", "sync_events"]


@dataclass(frozen=True)
class OpSpan:
    """One op's interval on one stream, in microseconds."""

    op: str
    stream: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class SyncEvent:
    """A record/wait pair on the timeline: the event is recorded when ``producer``
    ends (``record``); the consumer's stream may proceed from ``ready`` on.

    ``consumer == JOIN`` is the join of a side stream before the graph's output.
    """

    producer: str
    consumer: str
    producer_stream: int
    consumer_stream: int
    record: float
    ready: float


@dataclass(frozen=True)
class Timeline:
    """Per-op start/end/stream, the makespan and the sync events of one run of a plan.

    >>> t = Timeline.from_spans({"a": (0, 0.0, 2.0), "b": (1, 0.0, 3.0)})
    >>> t.makespan, t.streams
    (3.0, (0, 1))
    """

    spans: Mapping[str, OpSpan]
    makespan: float
    syncs: tuple[SyncEvent, ...] = ()
    output: float = 0.0
    label: str = "predicted"
    stats: Mapping[str, float] = field(default_factory=dict)

    @property
    def streams(self) -> tuple[int, ...]:
        return tuple(sorted({s.stream for s in self.spans.values()}))

    @property
    def start(self) -> dict[str, float]:
        return {n: s.start for n, s in self.spans.items()}

    @property
    def end(self) -> dict[str, float]:
        return {n: s.end for n, s in self.spans.items()}

    @classmethod
    def from_spans(
        cls,
        spans: Mapping[str, tuple[int, float, float]],
        label: str = "measured",
        syncs: tuple[SyncEvent, ...] = (),
    ) -> Timeline:
        """Build a timeline from ``op -> (stream, start_us, end_us)`` (e.g. a measured run)."""
        ops = {n: OpSpan(n, int(s), float(a), float(b)) for n, (s, a, b) in spans.items()}
        makespan = max((s.end for s in ops.values()), default=0.0)
        return cls(ops, makespan, syncs, makespan, label)

    @classmethod
    def from_schedule(
        cls,
        schedule: Schedule,
        syncs: Iterable[Sync] | None = None,
        sync_latency_us: float = 0.0,
        label: str | None = None,
    ) -> Timeline:
        """The planner's own prediction (``schedule.start``/``end``) as a timeline."""
        spans = {
            n: OpSpan(n, schedule.stream_of[n], schedule.start[n], schedule.end[n])
            for n in schedule.order
        }
        events = sync_events(spans, list(syncs or ()), sync_latency_us)
        output = output_time(spans, events, sync_latency_us)
        return cls(spans, schedule.makespan, events, output, label or schedule.solver)


def sync_events(
    spans: Mapping[str, OpSpan], syncs: list[Sync], latency: float
) -> tuple[SyncEvent, ...]:
    """The record/wait events of ``syncs`` over ``spans``: recorded when the producer ends,
    ready ``latency`` later when the consumer runs on another stream."""
    events = []
    for s in syncs:
        p = spans[s.producer]
        consumer_stream = 0 if s.consumer == JOIN else spans[s.consumer].stream
        lat = latency if consumer_stream != p.stream else 0.0
        events.append(SyncEvent(s.producer, s.consumer, p.stream, consumer_stream, p.end, p.end + lat))
    return tuple(events)


def output_time(spans: Mapping[str, OpSpan], events: tuple[SyncEvent, ...], latency: float) -> float:
    """When the main stream may return: its last op, and each side stream joined."""
    last: dict[int, float] = {}
    for s in spans.values():
        if s.stream >= 0:  # a lane's last transfer is waited for by an op on a stream
            last[s.stream] = max(last.get(s.stream, 0.0), s.end)
    out = last.get(0, 0.0)
    joined = {e.producer_stream: e.ready for e in events if e.consumer == JOIN}
    for stream, t in last.items():
        if stream != 0:
            out = max(out, joined.get(stream, t + latency))
    return out
