"""Discrete-event prediction of a plan's timeline on one device.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autostream.problem import SchedulingProblem

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
    gates = {n: [(p, lat if crosses_streams(stream_of, p, n) else 0.0) for p in g.predecessors(n)]
             for n in order}
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
    head = dict.fromkeys(queues, 0)
    stream_free = dict.fromkeys(queues, 0.0)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    remaining: dict[str, float] = {}
    running: set[str] = set()
    now = 0.0

    def ready_time(n: str) -> float | None:
        t = max(stream_free[stream_of[n]], release[n])
        for p, delay in gates[n]:
            if p not in end:
                return None
            t = max(t, end[p] + delay)
        return t

    while len(end) < len(order):
        # Start every stream head that is ready now; find the next future ready time.
        next_ready = float("inf")
        progressed = True
        while progressed:
            progressed = False
            for s in sorted(queues):
                if head[s] >= len(queues[s]):
                    continue
                n = queues[s][head[s]]
                if n in running:
                    continue
                t = ready_time(n)
                if t is None:
                    continue
                if t <= now + _EPS:
                    start[n] = now
                    remaining[n] = problem.duration(n)
                    running.add(n)
                    if remaining[n] <= _EPS:
                        running.discard(n)
                        end[n] = now
                        stream_free[s] = now
                        head[s] += 1
                    progressed = True
                else:
                    next_ready = min(next_ready, t)
        if not running:
            if len(end) == len(order):  # the last ops had zero duration
                break
            if next_ready == float("inf"):
                missing = [n for n in order if n not in end]
                raise ValueError(f"plan deadlocks: ops {missing[:5]} can never start")
            now = next_ready
            continue
        load = sum(problem.share(n) for n in running)
        slow = problem.capacity / load if load > problem.capacity else 1.0
        rates = {n: (slow if problem.share(n) > 0 else 1.0) for n in running}
        dt = min(remaining[n] / rates[n] for n in running)
        dt = min(dt, next_ready - now)
        now += dt
        for n in sorted(running):
            remaining[n] -= dt * rates[n]
            if remaining[n] <= _EPS * max(1.0, problem.duration(n)):
                running.discard(n)
                end[n] = now
                s = stream_of[n]
                stream_free[s] = now
                head[s] += 1
    return start, end
