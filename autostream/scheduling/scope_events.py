"""An ACL graph's per-scope events, as a cost of the scheduling problem the solvers optimise.

TorchAir's ACL graph (``reduce-overhead``) brackets every stream scope with events
(``_acl_concrete_graph/graph_pass.py:646-676``): a tagged-event wait right after
``scope_enter``, a tagged-event record right before ``scope_exit``, and one
tagged-event wait per scope right before ``output``.  Short scopes therefore cost more
than their syncs.  The model:

- **a scope begins at a wait.**  The rewritten graph is emitted in :func:`grouped_order`:
  it stays on a stream until that stream's next op waits for a record not yet emitted,
  so a side stream opens a new scope only at an op that waits (and once at its first op);
- **each cross-stream dependence pays the scope's events** on top of its record/wait
  pair (:func:`scope_latency_us`), in the problem itself: CP-SAT's model, its warm
  starts (HEFT and the baselines), its bounds and the simulator all read one
  ``sync_latency_us``, so the solver, the bound and the predicted makespan agree.  A
  scope's events cost 1.5 record/wait pairs
  (``dialects.torchair_modes.acl_scope_overhead_us``).

The charge per dependence is a proxy, not the exact cost: it over-counts where several
dependences share one wait (or one scope) or feed the main stream, and leaves out a side
stream's first scope when no wait opens it.  What it guarantees: every further scope is
opened by a wait for a cross-stream dependence, which pays the charge, so no plan splits
work into short scopes for free.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import networkx as nx

from autostream.scheduling.schedule import JOIN, Schedule, Sync


def scope_latency_us(sync_latency_us: float, scope_us: float) -> float:
    """The latency of a cross-stream dependence when each one pays a scope's events.

    >>> scope_latency_us(5.0, 7.5)  # ACL: 1.5 pairs (``torchair_modes.acl_scope_overhead_us``)
    12.5
    >>> scope_latency_us(5.0, 0.0)  # GE and CUDA: the record/wait pair alone
    5.0
    """
    if scope_us < 0:
        raise ValueError(f"a scope's event cost must be >= 0 us, got {scope_us}")
    return sync_latency_us + scope_us


def count_scopes(schedule: Schedule) -> int:
    """Side-stream scopes of the graph rewritten in ``schedule.order``: one each time the
    emitted order enters a side stream (``rewrite.rewrite_graph``); lanes emit nothing.

    >>> zero = dict.fromkeys("abcd", 0.0)
    >>> s = Schedule("x", {"a": 0, "b": 1, "c": 0, "d": 1}, tuple("abcd"), zero, zero, 0.0, 0.0)
    >>> count_scopes(s)
    2
    """
    scopes, current = 0, 0
    for n in schedule.order:
        stream = schedule.stream_of[n]
        if stream < 0 or stream == current:
            continue
        scopes += stream != 0
        current = stream
    return scopes


def grouped_order(schedule: Schedule, syncs: Iterable[Sync],
                  deps: nx.DiGraph) -> tuple[str, ...]:
    """A launch order with each stream's ops in the same order, every dependence and sync
    kept, that leaves a stream only when its next op cannot be emitted yet.

    Each stream's sequence and every sync are unchanged, so the device timeline is too;
    only where the host switches scopes moves.  Ties go to the op first in
    ``schedule.order``: the order is deterministic.

    >>> zero = dict.fromkeys("abcd", 0.0)
    >>> g = nx.DiGraph([("a", "c"), ("b", "d")])
    >>> s = Schedule("x", {"a": 0, "b": 1, "c": 0, "d": 1}, tuple("abcd"), zero, zero, 0.0, 0.0)
    >>> order = grouped_order(s, [Sync("d", JOIN)], g)
    >>> order, count_scopes(Schedule("x", s.stream_of, order, zero, zero, 0.0, 0.0))
    (('a', 'c', 'b', 'd'), 1)
    """
    stream_of = schedule.stream_of
    position = {n: i for i, n in enumerate(schedule.order)}
    hb = nx.DiGraph()
    hb.add_nodes_from(schedule.order)
    for seq in schedule.stream_sequences().values():
        hb.add_edges_from(zip(seq, seq[1:], strict=False))
    hb.add_edges_from((s.producer, s.consumer) for s in syncs if s.consumer != JOIN)
    hb.add_edges_from((u, v) for u, v in deps.edges if u in position and v in position)
    missing = {n: hb.in_degree(n) for n in hb}
    ready: dict[int, list[tuple[int, str]]] = {}  # stream -> its ready ops, first in order first

    def push(n: str) -> None:
        heapq.heappush(ready.setdefault(stream_of[n], []), (position[n], n))

    for n, k in missing.items():
        if k == 0:
            push(n)
    out: list[str] = []
    current = 0
    while any(ready.values()):
        # a lane's task emits nothing; then the current stream; else the first op ready
        lanes = [s for s, q in ready.items() if q and s < 0]
        if lanes:
            stream = min(lanes, key=lambda s: ready[s][0])
        elif ready.get(current):
            stream = current
        else:
            stream = min((s for s, q in ready.items() if q), key=lambda s: ready[s][0])
        _, n = heapq.heappop(ready[stream])
        out.append(n)
        current = stream if stream >= 0 else current
        for m in hb.successors(n):
            missing[m] -= 1
            if missing[m] == 0:
                push(m)
    if len(out) != len(position):
        raise ValueError("the schedule's stream order, syncs and dependences form a cycle; "
                         "plan the graph again (compute_syncs gives syncs that follow it)")
    return tuple(out)
