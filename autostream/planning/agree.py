"""Rank-consistent plans without a collective of autostream's own.

A plan is a deterministic function of the graph, the cost table's content and the
options (CP-SAT without wall-clock cuts on graphs that communicate), so ranks that
compile the same graph with the same table and options plan it the same way by
construction.  Nothing is gathered: a collective issued by the library would pair
with one of the program's own whenever ranks compile, recompile or call a graph at
different points, which valid SPMD code does (``docs/distributed.md``).

A check is still made, out of band: each rank ``set``s its plan digest in the
default process group's c10d store under a key made of the graph's digest and its
rank, then reads the digests other ranks have already set for that graph, without
waiting for the ones not there yet (:func:`check_through_store`).  A mismatch is
explained (:func:`describe_mismatch`: the ranks and their digests) and logged; no
rank changes its graph because of it, since only the rank compiling second sees it,
and every plan issues the collectives in program order (``verify.check_collective_order``),
so ranks holding different plans still pair their collectives correctly.

>>> key = graph_key(torch.fx.symbolic_trace(lambda x: x + 1).graph)
>>> store = {}
>>> check_through_store(key, "aa", 0, 2, store=DictStore(store)) is None  # rank 1 not there yet
True
>>> print(check_through_store(key, "bb", 1, 2, store=DictStore(store)))  # doctest: +ELLIPSIS
ranks planned this graph differently: rank 0 digest aa, rank 1 digest bb ...
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch
import torch.fx

from autostream.fx.graph import target_name
from autostream.scheduling.schedule import Sync

log = logging.getLogger("autostream")

#: prefix of every key autostream sets in a process group's store
KEY_PREFIX = "autostream/plan"


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the check uses."""

    def set(self, key: str, value: str) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...


class DictStore:
    """A store kept in a dict (tests and doctests; several "ranks" may share the dict)."""

    def __init__(self, data: dict[str, bytes] | None = None):
        self.data = {} if data is None else data

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


def outcome_digest(nodes: Iterable[str], schedule: Any | None,
                   syncs: Sequence[Sync] = ()) -> str:
    """A hash of the graph (its node names, targets) and of the plan applied to it
    (``None``: the graph is left unchanged): streams, launch order and syncs."""
    h = hashlib.sha256()
    h.update("|".join(nodes).encode())
    if schedule is None:
        h.update(b"#unchanged")
    else:
        ops = [n for n in schedule.order if schedule.stream_of[n] >= 0]
        h.update(("#" + "|".join(f"{n}@{schedule.stream_of[n]}" for n in ops)).encode())
        h.update(("#" + "|".join(f"{s.producer}>{s.consumer}" for s in syncs)).encode())
    return h.hexdigest()


def graph_key(graph: torch.fx.Graph, salt: str = "") -> str:
    """A digest of what a plan depends on in ``graph``: node names, targets, arguments
    and each value's shape and dtype, and ``salt`` (the pass's options).  The same graph
    on two ranks has the same key; rank-dependent shapes give different keys, which
    are then never compared."""
    h = hashlib.sha256(salt.encode())
    for node in graph.nodes:
        value = node.meta.get("val", node.meta.get("example_value"))
        shape = (f"{tuple(value.shape)}:{value.dtype}" if isinstance(value, torch.Tensor)
                 else "")
        target = target_name(node) if node.op == "call_function" else str(node.target)
        h.update(f"{node.name}={node.op}:{target}({node.args},{node.kwargs}){shape};".encode())
    return h.hexdigest()


def describe_mismatch(digests: dict[int, str]) -> str | None:
    """Why ``digests`` (rank -> plan digest of one graph) differ, or ``None``.

    >>> describe_mismatch({0: "aa", 1: "aa"}) is None
    True
    >>> describe_mismatch({0: "aa", 1: "bb", 2: "aa"})[:70]
    'ranks planned this graph differently: ranks [0, 2] digest aa, rank 1 d'
    """
    if len(set(digests.values())) <= 1:
        return None
    groups: dict[str, list[int]] = {}
    for rank in sorted(digests):
        groups.setdefault(digests[rank], []).append(rank)
    parts = [f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
             for ranks in groups.values()]
    said = ", ".join(f"{who} digest {d[:10]}" for who, d in zip(parts, groups, strict=True))
    return (f"ranks planned this graph differently: {said} (another cost table, other pass "
            f"options or another autostream version on some rank). Every rank keeps its own "
            f"plan, which still issues the collectives in program order, so they pair "
            f"correctly, but the ranks run different schedules. Fix: give every rank the "
            f"same cost_table, options and autostream version")


def _default_store() -> tuple[Store, int, int] | None:
    """The default process group's store, this rank and the world size, or ``None``
    (no process group, or one rank)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store(), dist.get_rank(), dist.get_world_size()


def check_through_store(key: str, digest: str, rank: int | None = None,
                        world_size: int | None = None, store: Store | None = None
                        ) -> str | None:
    """Publish this rank's ``digest`` for graph ``key`` and compare it with the digests
    other ranks have already published; never waits for a rank (keys not set yet are
    skipped).  The mismatch explained (:func:`describe_mismatch`), or ``None`` (no
    mismatch seen, one process, or a store that cannot be reached: a debug log says so).
    """
    if store is None:
        found = _default_store()
        if found is None:
            return None
        store, rank, world_size = found
    assert rank is not None and world_size is not None
    digests = {rank: digest}
    try:
        store.set(f"{KEY_PREFIX}/{key}/{rank}", digest)
        for other in range(world_size):
            name = f"{KEY_PREFIX}/{key}/{other}"
            if other != rank and store.check([name]):
                digests[other] = store.get(name).decode()
    except Exception as exc:  # noqa: BLE001 - a check that cannot run must not break compiling
        log.debug("autostream: plan digests not compared through the store: %s", exc)
        return None
    return describe_mismatch(digests)
