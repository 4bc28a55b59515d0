"""Predict when every op of a plan runs on a modelled device.

**The device model** (:func:`simulate`, :func:`run_events`).
Given which stream each op runs on and the launch order, every stream runs its ops
in order; an op starts when the previous op on its stream has ended and each of
its producers has ended (plus the sync latency when the producer ran on another
stream).  Concurrent ops share the device: while the shares of the running ops sum
to ``S > capacity``, each op with a non-zero share progresses at rate
``capacity / S`` (processor sharing).  Zero-share ops never slow down.

A solver that models contention as a blocking resource (``cpsat``, ``heft``)
delays an op instead of slowing it; for a work-conserving device both give the
same makespan whenever the solver's plan never exceeds the capacity, which is
what the planners guarantee.

Lanes (``problem.pinned``, negative stream numbers) are serial queues like
streams, run beside them: a collective's transfer starts on its link once its
launch has ended and the transfers before it on the link are done.  Edges to or
from a lane task pay no sync latency (the collective's own machinery orders them).

**A whole plan** (:func:`simulate_plan`), the independent check of a planner's
prediction: the same device model, plus what the plan itself fixes:

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
by :func:`simulate` (``schedule_from_assignment``), so its
``makespan`` and this replay agree exactly, like every other solver's; only the
model's own objective value (its integer makespan) can differ.  A schedule built
by hand with other times can be drawn as planned with ``Timeline.from_schedule``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.timeline import OpSpan, Timeline, output_time, sync_events

__all__ = ["cross_stream_syncs", "crosses_streams", "run_events", "segment_leaders", "simulate",
           "simulate_plan"]

_EPS = 1e-9


Gate = tuple[str, float]


def simulate(
    problem: SchedulingProblem,
    stream_of: Mapping[str, int],
    order: Sequence[str],
) -> tuple[dict[str, float], dict[str, float]]:
    """Predict ``(start, end)`` of every op for the given assignment and launch order.

    >>> import networkx as nx
    >>> g = nx.DiGraph()
    >>> g.add_node("a", duration=4.0, share=1.0)
    >>> g.add_node("b", duration=4.0, share=1.0)
    >>> p = SchedulingProblem(g, streams=2)
    >>> start, end = simulate(p, {"a": 0, "b": 1}, ["a", "b"])
    >>> end["a"], end["b"]
    (8.0, 8.0)
    """
    g = problem.graph
    position = {n: i for i, n in enumerate(order)}
    for u, v in g.edges:
        if position[u] > position[v]:
            raise ValueError(f"launch order puts {v!r} before its producer {u!r}")
    lat = problem.sync_latency_us
    gates = {}
    for n in order:
        sn = stream_of[n]
        # crosses_streams, inlined: this is the local search's inner loop
        gates[n] = [(p, lat if sn >= 0 and (sp := stream_of[p]) != sn and sp >= 0 else 0.0)
                    for p in g.predecessors(n)]
    return run_events(problem, stream_of, order, gates, dict.fromkeys(order, 0.0))


def crosses_streams(stream_of: Mapping[str, int], u: str, v: str) -> bool:
    """Whether the edge ``u -> v`` joins two different streams (a sync); lanes never do.

    >>> crosses_streams({"a": 0, "b": 1, "t": -1}, "a", "b"), crosses_streams({"a": 0, "t": -1}, "a", "t")
    (True, False)
    """
    su, sv = stream_of[u], stream_of[v]
    return su != sv and su >= 0 and sv >= 0


def run_events(
    problem: SchedulingProblem,
    stream_of: Mapping[str, int],
    order: Sequence[str],
    gates: Mapping[str, Sequence[Gate]],
    release: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, float]]:
    """The event loop: op ``n`` starts once its stream is free, ``release[n]`` has passed
    and every gate ``(p, delay)`` has ``end[p] + delay`` passed; contention slows ops."""
    queues: dict[int, list[str]] = {}
    for n in order:
        queues.setdefault(stream_of[n], []).append(n)
    streams = sorted(queues)
    head = dict.fromkeys(queues, 0)
    stream_free = dict.fromkeys(queues, 0.0)
    duration, share, capacity = problem.durations, problem.shares, problem.capacity
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    remaining: dict[str, float] = {}
    running: set[str] = set()
    now = 0.0

    # A head's ready time, once its gates have all ended, stays what it is until it
    # runs (its stream is free until then); a head waits at least for one unended gate.
    ready_at: dict[int, tuple[int, float]] = {}  # stream -> (head index, ready time)
    waits_for: dict[int, tuple[int, str]] = {}  # stream -> (head index, a gate not ended)

    def ready_time(s: int, h: int, n: str) -> float | None:
        known = ready_at.get(s)
        if known is not None and known[0] == h:
            return known[1]
        blocked = waits_for.get(s)
        if blocked is not None and blocked[0] == h and blocked[1] not in end:
            return None
        t = max(stream_free[s], release[n])
        for p, delay in gates[n]:
            e = end.get(p)
            if e is None:
                waits_for[s] = (h, p)
                return None
            t = max(t, e + delay)
        ready_at[s] = (h, t)
        return t

    while len(end) < len(order):
        # Start every stream head that is ready now; find the next future ready time.
        next_ready = float("inf")
        progressed = True
        while progressed:
            progressed = False
            for s in streams:
                queue, h = queues[s], head[s]
                if h >= len(queue):
                    continue
                n = queue[h]
                if n in running:
                    continue
                t = ready_time(s, h, n)
                if t is None:
                    continue
                if t <= now + _EPS:
                    start[n] = now
                    remaining[n] = duration[n]
                    running.add(n)
                    if remaining[n] <= _EPS:
                        running.discard(n)
                        end[n] = now
                        stream_free[s] = now
                        head[s] = h + 1
                    progressed = True
                elif t < next_ready:
                    next_ready = t
        if not running:
            if len(end) == len(order):  # the last ops had zero duration
                break
            if next_ready == float("inf"):
                missing = [n for n in order if n not in end]
                raise ValueError(f"plan deadlocks: ops {missing[:5]} can never start")
            now = next_ready
            continue
        # fsum: exact, so the same whatever order the set yields (hash seeds differ per
        # process, and every rank must simulate the same times)
        load = math.fsum(share[n] for n in running)
        slow = capacity / load if load > capacity else 1.0
        rates = {n: (slow if share[n] > 0 else 1.0) for n in running}
        dt = min(remaining[n] / rates[n] for n in running)
        dt = min(dt, next_ready - now)
        now += dt
        for n in sorted(running):
            remaining[n] -= dt * rates[n]
            if remaining[n] <= _EPS * max(1.0, duration[n]):
                running.discard(n)
                end[n] = now
                s = stream_of[n]
                stream_free[s] = now
                head[s] += 1
    return start, end


def cross_stream_syncs(
    problem: SchedulingProblem,
    stream_of: Mapping[str, int],
    order: Sequence[str] | None = None,
) -> list[Sync]:
    """One sync per cross-stream dependence plus one join per side stream (not minimal).

    A stand-in for :func:`autostream.scheduling.sync.compute_syncs` that is always correct; the
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
    >>> from autostream.scheduling.solvers import solve
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
                     if not crosses_streams(stream_of, p, n)] for n in order}
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
    events = sync_events(spans, all_syncs, lat)
    return Timeline(
        spans, makespan, events, output_time(spans, events, lat), "simulated",
        {"launch_overhead_us": launch_overhead_us, "segment_overhead_us": segment_overhead_us},
    )
