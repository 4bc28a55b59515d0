"""The minimal record/wait pairs that make a schedule respect every dependence.

Program order on each stream already orders ops of that stream.  A cross-stream
dependence ``u -> v`` needs a sync unless it is implied by a chain of stream order
and other dependences.  Over the DAG ``H`` = stream-order edges + cross-stream
dependences + join edges (last op of each side stream -> the output), the syncs
are exactly the cross-stream edges of ``H``'s transitive reduction, which for a
DAG is unique and therefore the minimum such set.

The reduction is computed with vector clocks in ``O(|E| * streams)``: walking the
launch order, ``clock[v][s]`` is the latest position on stream ``s`` that happens
before (or is) ``v``.  A cross edge ``u -> v`` is redundant iff another
predecessor ``w`` of ``v`` in ``H`` already has ``clock[w][stream(u)] >= pos(u)``.

Lane tasks (a collective's transfer on its link, negative stream numbers) need no
syncs: the dependence graph orders the launch before its wait directly.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from autostream.scheduling.schedule import JOIN, Schedule, Sync


def _h_predecessors(
    deps: nx.DiGraph, schedule: Schedule
) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Launch order incl. JOIN, stream predecessor of each node, cross-stream sources."""
    stream_of = _streams_only(schedule)
    order = [n for n in schedule.order if n in stream_of]
    stream_of[JOIN] = 0
    order.append(JOIN)
    prev_on_stream: dict[int, str] = {}
    stream_pred: dict[str, list[str]] = {}
    cross: dict[str, list[str]] = {}
    position = {n: i for i, n in enumerate(order)}
    for n in order:
        s = stream_of[n]
        stream_pred[n] = [prev_on_stream[s]] if s in prev_on_stream else []
        prev_on_stream[s] = n
        if n == JOIN:
            sources: Iterable[str] = (last for st, last in prev_on_stream.items() if st != 0)
        else:
            sources = deps.predecessors(n)
        srcs = sorted({u for u in sources if stream_of[u] != s}, key=position.__getitem__)
        for u in srcs:
            if position[u] > position[n]:
                raise ValueError(f"launch order puts {n!r} before its producer {u!r}")
        cross[n] = srcs
    return order, stream_pred, cross


def compute_syncs(deps: nx.DiGraph, schedule: Schedule) -> list[Sync]:
    """Minimal syncs for ``schedule`` over the dependence graph ``deps``.

    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> s = Schedule("x", {"a": 0, "b": 0, "c": 1, "d": 0}, ("a", "c", "b", "d"),
    ...              {}, {}, 0.0, 0.0)
    >>> compute_syncs(g, s)
    [Sync(producer='a', consumer='c'), Sync(producer='c', consumer='d')]
    """
    order, stream_pred, cross = _h_predecessors(deps, schedule)
    stream_of = _streams_only(schedule)
    stream_of[JOIN] = 0
    streams = sorted(set(stream_of.values()))
    slot = {s: i for i, s in enumerate(streams)}
    pos_on_stream: dict[str, int] = {}
    count = dict.fromkeys(streams, 0)
    clock: dict[str, list[int]] = {}
    syncs: list[Sync] = []
    for n in order:
        s = stream_of[n]
        pos_on_stream[n] = count[s]
        count[s] += 1
        preds = stream_pred[n] + cross[n]
        vec = [-1] * len(streams)
        for w in preds:
            cw = clock[w]
            for i, val in enumerate(cw):
                if val > vec[i]:
                    vec[i] = val
        for u in cross[n]:
            su, pu = slot[stream_of[u]], pos_on_stream[u]
            implied = any(clock[w][su] >= pu for w in preds if w != u)
            if not implied:
                syncs.append(Sync(u, n))
        vec[slot[s]] = pos_on_stream[n]
        clock[n] = vec
    return syncs


def _streams_only(schedule: Schedule) -> dict[str, int]:
    return {n: s for n, s in schedule.stream_of.items() if s >= 0}


def group_waits(syncs: Iterable[Sync]) -> dict[str, list[str]]:
    """consumer -> producers it waits for (in first-seen order)."""
    waits: dict[str, list[str]] = {}
    for sync in syncs:
        waits.setdefault(sync.consumer, []).append(sync.producer)
    return waits


def recorded_producers(syncs: Iterable[Sync]) -> list[str]:
    """Producers that need a ``record`` (one record serves every wait on it)."""
    return list(dict.fromkeys(s.producer for s in syncs))
