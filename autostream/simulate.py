"""Replay a plan (schedule + syncs) on a modelled device and return its ``Timeline``.

``simulate_plan`` is the independent check of a planner's prediction.  It uses the
same device model as :func:`autostream.timeline.simulate` (per-stream in-order
execution, processor-sharing contention: while the running ops' shares sum to
``S > capacity`` each op with a non-zero share progresses at ``capacity / S``),
and adds what the plan itself fixes:

- **syncs**: when ``syncs`` is given, cross-stream ordering comes *only* from them:
  the consumer's stream waits until ``producer end + sync_latency_us``.  Every data
  dependence must be ordered by the stream order plus the syncs, else ``ValueError``
  names the unordered pair.  With ``syncs=None`` every cross-stream dependence acts as
  its own sync (what the solvers assume).  A minimal sync set gives the same times:
  a dependence it drops is implied by a chain that already pays one latency.
- **launch overhead**: the host issues the ops in ``schedule.order``, one every
  ``launch_overhead_us``; an op never starts before it was issued.
- **segment overhead**: each run of one stream's ops between two of its syncs (a
  wait before it, a record after it, or the stream's start) starts
  ``segment_overhead_us`` later than it could (``segment_leaders``): what a runtime
  pays to enter it, on CPU the GIL taken back from the other streams.
- **join**: ``output`` is when the main stream may return: its own last op, and every
  side stream's last op plus one sync latency (the join before ``output``).
  ``makespan`` is the last op's end, the quantity ``Schedule.makespan`` predicts.
- **lanes**: a task on a lane (a collective's transfer on its process group's
  link) is ordered by its edges alone: its launch starts it, its wait waits for it;
  no sync, no launch slot, no segment.

Modelling difference with ``cpsat``: inside its model CP-SAT treats the capacity as
a blocking resource (an op waits until its share is free, with integer time units)
where this simulator slows concurrent ops down instead.  CP-SAT's times only pick
the stream assignment and the launch order: the ``Schedule`` it returns is re-timed
by :func:`autostream.timeline.simulate` (``schedule_from_assignment``), so its
``makespan`` and this replay agree exactly, like every other solver's; only the
model's own objective value (its integer makespan) can differ.  A schedule built
by hand with other times can be drawn as planned with ``Timeline.from_schedule``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from autostream.problem import SchedulingProblem
from autostream.schedule import JOIN, Schedule, Sync
from autostream.timeline import crosses_streams, run_events


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
        events = _sync_events(spans, list(syncs or ()), sync_latency_us)
        output = _output_time(spans, events, sync_latency_us)
        return cls(spans, schedule.makespan, events, output, label or schedule.solver)


def cross_stream_syncs(
    problem: SchedulingProblem,
    stream_of: Mapping[str, int],
    order: Sequence[str] | None = None,
) -> list[Sync]:
    """One sync per cross-stream dependence plus one join per side stream (not minimal).

    A stand-in for :func:`autostream.sync.compute_syncs` that is always correct; the
    join is recorded after each side stream's last op in launch ``order`` (default:
    the topological order).

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> cross_stream_syncs(SchedulingProblem(g, streams=2), {"a": 1, "b": 0})
    [Sync(producer='a', consumer='<output>'), Sync(producer='a', consumer='b')]
    """
    out = [Sync(u, v) for u, v in problem.graph.edges if crosses_streams(stream_of, u, v)]
    last: dict[int, str] = {}
    for n in order if order is not None else problem.topo_order:
        if stream_of[n] >= 0:
            last[stream_of[n]] = n
    out += [Sync(n, JOIN) for s, n in sorted(last.items()) if s != 0]
    return sorted(out, key=lambda s: (problem.topo_index[s.producer], s.consumer))


def _sync_events(
    spans: Mapping[str, OpSpan], syncs: list[Sync], latency: float
) -> tuple[SyncEvent, ...]:
    events = []
    for s in syncs:
        p = spans[s.producer]
        consumer_stream = 0 if s.consumer == JOIN else spans[s.consumer].stream
        lat = latency if consumer_stream != p.stream else 0.0
        events.append(SyncEvent(s.producer, s.consumer, p.stream, consumer_stream, p.end, p.end + lat))
    return tuple(events)


def _output_time(spans: Mapping[str, OpSpan], events: tuple[SyncEvent, ...], latency: float) -> float:
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


def _check_ordered(problem: SchedulingProblem, schedule: Schedule, syncs: list[Sync]) -> None:
    """Every dependence must follow from stream order plus syncs (happens-before)."""
    hb: dict[str, list[str]] = {n: [] for n in schedule.order}
    for seq in schedule.stream_sequences().values():
        for a, b in zip(seq, seq[1:], strict=False):
            hb[a].append(b)
    for s in syncs:
        if s.consumer != JOIN:
            hb[s.producer].append(s.consumer)
    stream_of = schedule.stream_of
    for u, v in problem.graph.edges:  # a launch starts its transfer, a wait waits for it
        if stream_of[u] < 0 or stream_of[v] < 0:
            hb[u].append(v)
    position = {n: i for i, n in enumerate(schedule.order)}
    for a, succ in hb.items():
        for b in succ:
            if position[b] < position[a]:
                raise ValueError(
                    f"sync {a!r} -> {b!r} goes against the launch order; "
                    "the wait would never be satisfied"
                )
    index = {n: i for i, n in enumerate(schedule.order)}
    reach: dict[str, int] = {}
    for n in reversed(schedule.order):  # launch order is a topological order of hb
        bits = 1 << index[n]
        for m in hb[n]:
            bits |= reach[m]
        reach[n] = bits
    for u, v in problem.graph.edges:
        if not reach[u] >> index[v] & 1:
            raise ValueError(
                f"dependence {u!r} -> {v!r} is not ordered: {u!r} on stream "
                f"{schedule.stream_of[u]}, {v!r} on stream {schedule.stream_of[v]} and no "
                "sync chain links them; add Sync(producer, consumer) or use compute_syncs"
            )


def segment_leaders(schedule: Schedule, syncs: Iterable[Sync]) -> set[str]:
    """The first op of each run of one stream's ops between two of its syncs.

    A run starts at the stream's first op, at an op a cross-stream wait precedes and
    after an op a cross-stream record follows (a join's record ends its stream).

    >>> zero = dict.fromkeys("abcde", 0.0)
    >>> s = Schedule("hand", {"a": 0, "b": 0, "c": 1, "d": 0, "e": 0}, tuple("abcde"),
    ...              zero, zero, 0.0, 0.0)
    >>> sorted(segment_leaders(s, [Sync("a", "c"), Sync("c", "d"), Sync("c", JOIN)]))
    ['a', 'b', 'c', 'd']
    """
    stream_of = schedule.stream_of
    cross = [s for s in syncs if s.consumer != JOIN
             and stream_of[s.producer] != stream_of[s.consumer]]
    waited = {s.consumer for s in cross}
    recorded = {s.producer for s in cross}
    leaders: set[str] = set()
    for stream, seq in schedule.stream_sequences().items():
        if stream < 0:  # a lane: nothing of the host's runs there
            continue
        for i, n in enumerate(seq):
            if i == 0 or n in waited or seq[i - 1] in recorded:
                leaders.add(n)
    return leaders


def simulate_plan(
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] | None = None,
    launch_overhead_us: float = 0.0,
    segment_overhead_us: float = 0.0,
) -> Timeline:
    """Replay ``schedule`` (streams, launch order) with ``syncs`` on the modelled device.

    >>> import networkx as nx
    >>> from autostream.solvers import solve
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 2.0, "duration")
    >>> p = SchedulingProblem(g, streams=2, sync_latency_us=1.0)
    >>> plan = solve(p, "heft")
    >>> simulate_plan(p, plan).makespan == plan.makespan
    True
    >>> simulate_plan(p, plan, launch_overhead_us=5.0).makespan
    17.0
    >>> simulate_plan(p, plan, segment_overhead_us=1.0).makespan  # a | b, and c after the wait
    7.0
    """
    if launch_overhead_us < 0:
        raise ValueError(f"launch_overhead_us must be >= 0, got {launch_overhead_us}")
    if segment_overhead_us < 0:
        raise ValueError(f"segment_overhead_us must be >= 0, got {segment_overhead_us}")
    g = problem.graph
    stream_of = schedule.stream_of
    order = tuple(schedule.order)
    missing = set(g) - set(order)
    if missing or len(order) != len(g):
        raise ValueError(
            f"schedule does not cover the problem: ops missing from its order: "
            f"{sorted(map(str, missing))[:5]}; plan the same problem you simulate"
        )
    lat = problem.sync_latency_us
    sync_list = list(syncs) if syncs is not None else None
    gates: dict[str, list[tuple[str, float]]]
    if sync_list is None:
        gates = {n: [(p, lat if crosses_streams(stream_of, p, n) else 0.0)
                     for p in g.predecessors(n)] for n in order}
    else:
        for s in sync_list:
            if s.producer not in stream_of or (s.consumer != JOIN and s.consumer not in stream_of):
                raise ValueError(f"{s} names an op that is not in the schedule")
        _check_ordered(problem, schedule, sync_list)
        gates = {n: [(p, 0.0) for p in g.predecessors(n)
                     if stream_of[p] == stream_of[n] or min(stream_of[p], stream_of[n]) < 0]
                 for n in order}
        for s in sync_list:
            if s.consumer != JOIN:
                cross = stream_of[s.producer] != stream_of[s.consumer]
                gates[s.consumer].append((s.producer, lat if cross else 0.0))
    launched = [n for n in order if stream_of[n] >= 0]  # the host issues no transfer
    release = dict.fromkeys(order, 0.0)
    release.update({n: (i + 1) * launch_overhead_us for i, n in enumerate(launched)})
    all_syncs = sync_list if sync_list is not None else cross_stream_syncs(problem, stream_of, order)
    if segment_overhead_us > 0 and schedule.streams_used > 1:
        previous = {b: a for stream, seq in schedule.stream_sequences().items() if stream >= 0
                    for a, b in zip(seq, seq[1:], strict=False)}
        for n in segment_leaders(schedule, all_syncs):
            gates[n] = [(p, d + segment_overhead_us) for p, d in gates[n]]
            if n in previous:
                gates[n].append((previous[n], segment_overhead_us))
            else:
                release[n] += segment_overhead_us
    start, end = run_events(problem, stream_of, order, gates, release)
    spans = {n: OpSpan(n, stream_of[n], start[n], end[n]) for n in order}
    makespan = max(end.values(), default=0.0)
    events = _sync_events(spans, all_syncs, lat)
    return Timeline(
        spans, makespan, events, _output_time(spans, events, lat), "simulated",
        {"launch_overhead_us": launch_overhead_us, "segment_overhead_us": segment_overhead_us},
    )
