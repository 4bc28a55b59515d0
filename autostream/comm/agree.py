"""Rank-consistent decisions: every rank applies the same plan and keeps the same candidate.

Plans are deterministic (CP-SAT without wall-clock cuts on graphs that communicate),
but a rank can still differ: another cost table on its host, a failure on one rank
only, a different graph.  So, at compile time, each rank hashes what it decided
for a graph that communicates (:func:`outcome_digest`) and the ranks compare
digests over the default process group (one ``all_gather_object``, as
``torch._inductor``'s overlap scheduler aligns its estimates).  If any differs,
every rank falls back to the unchanged graph, which issues the collectives in
program order like every plan does.  The backend's measured choice between the
plan and the single-stream graph is made once for all ranks, on each candidate's
slowest rank (:func:`slowest_rank_medians`).

All ranks must compile the graph (SPMD): a graph that only some ranks compile
would leave the others waiting in the ``all_gather``.

>>> d = outcome_digest(["x", "mm"], None)
>>> rank_disagreement(d, gather=lambda d: [d, d]) is None
True
>>> rank_disagreement(d, gather=lambda d: [d, "0" * 64])[:36]
'ranks planned this graph differently'
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from autostream.comm.groups import is_distributed
from autostream.schedule import Sync

Gather = Callable[[Any], list[Any]]


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


def gather_over_world(value: Any) -> list[Any]:
    """``value`` of every rank of the default process group, by rank."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    gathered: list[Any] = [None] * dist.get_world_size()
    # The pass runs inside AOTAutograd: its fake mode and the Python dispatcher are on.
    # Through the Python dispatcher, gloo's collective would hold the GIL while it waits
    # for its process group's queue, whose thread may be waiting for the GIL (a deadlock
    # seen on 2 ranks); without it the binding releases the GIL as usual.
    with unset_fake_temporarily(), _disable_current_modes(), torch._C._DisablePythonDispatcher():
        dist.all_gather_object(gathered, value)
    return gathered


def rank_disagreement(digest: str, gather: Gather | None = None) -> str | None:
    """Why the ranks' digests differ, or ``None`` when they agree (or run alone).

    ``gather`` (tests) replaces the ``all_gather_object`` over the default group.
    """
    if gather is None:
        if not is_distributed():
            return None
        gather = gather_over_world
    digests = gather(digest)
    if len(set(digests)) <= 1:
        return None
    same = [r for r, d in enumerate(digests) if d == digest]
    others = [r for r, d in enumerate(digests) if d != digest]
    these = f"rank {same[0]}" if len(same) == 1 else f"ranks {same}"
    return (f"ranks planned this graph differently ({these} digest {digest[:10]}, ranks "
            f"{others} another): every rank keeps the single-stream graph")


def slowest_rank_medians(medians: Mapping[str, float], gather: Gather | None = None
                         ) -> dict[str, float]:
    """Each candidate's median on its slowest rank: one decision for all ranks.

    >>> slowest_rank_medians({"a": 1.0, "b": 2.0}, gather=lambda m: [m, {"a": 3.0, "b": 2.5}])
    {'a': 3.0, 'b': 2.5}
    """
    if gather is None:
        if not is_distributed():
            return dict(medians)
        gather = gather_over_world
    every = gather(dict(medians))
    return {name: max(m[name] for m in every) for name in medians}
