"""When a runtime may drop each value of a multi-stream program, and which values share memory.

The rule every runtime follows (and :mod:`autostream.memory.predict` predicts):

1. A value whose storage is produced and read on one stream only is dropped right
   after its last read (right after it is produced when nothing reads it).
2. A storage that another stream reads, or whose views live on another stream, is
   kept until its *allocating* stream has waited for every read: it is dropped at
   the first step of that stream after which, through records and waits, every read
   and every view of it happens-before (the final join at the latest).  A caching
   allocator reuses a freed block on its allocating stream without any sync, so an
   earlier drop could hand the block to a new tensor while the other stream still
   reads it (``docs/memory.md``).
3. Values returned by the graph are never dropped.

Rule 2 works per *alias group*: values sharing a storage (views, ``getitem`` of
multi-output ops, in-place results), found from the ``FakeTensor`` each node
carries (``meta["val"]`` or Dynamo's ``meta["example_value"]``).  When some node
has none, aliasing is unknown and every value read on another stream is kept to the
end of the call instead.

>>> steps = [LaunchStep("op", "a", 0), LaunchStep("op", "b", 1, reads=("a",)),
...          LaunchStep("record", "t", 1), LaunchStep("op", "c", 0, reads=("a",)),
...          LaunchStep("wait", "w", 0, tokens=("t",)), LaunchStep("op", "d", 0, reads=("b",))]
>>> release_points(steps, inputs=(), outputs={"d"}, group_of={n: n for n in "abcd"})
{'a': 4, 'b': None, 'c': 3, 'd': None}
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.sync import group_waits, recorded_producers

__all__ = ["LaunchStep", "StorageRef", "alias_groups", "fake_storages", "plan_steps",
           "release_points"]

StepKind = Literal["op", "record", "wait"]


@dataclass(frozen=True)
class LaunchStep:
    """One step of one stream, in launch order: what :func:`release_points` needs.

    ``op``: ``name`` is the value it produces, ``reads`` the values it reads;
    ``record``: ``name`` is the token; ``wait``: ``tokens`` are the tokens waited for.
    """

    kind: StepKind
    name: str
    stream: int
    reads: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class StorageRef:
    """One storage of a fake value: its identity (as torch's ``memory_estimator.StorageKey``,
    which older torch lacks), device and size."""

    key: int
    device: torch.device
    nbytes: int | torch.SymInt = field(compare=False)


def fake_storages(node: torch.fx.Node) -> list[StorageRef] | None:
    """The storages of a node's fake value(s), or ``None`` when it carries none.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> fake_storages(x) is None
    True
    """
    val = node.meta.get("val", node.meta.get("example_value"))
    if val is None:
        return None
    if isinstance(val, torch._subclasses.FakeTensor):
        fakes = [val]  # most nodes: one tensor, no tree to walk
    else:
        fakes = [t for t in tree_leaves(val) if isinstance(t, torch._subclasses.FakeTensor)]
        if not fakes and any(isinstance(t, torch.Tensor) for t in tree_leaves(val)):
            return None  # real tensors: no storage identity to compare
    return [StorageRef(t.untyped_storage()._cdata, t.device, t.untyped_storage().nbytes())
            for t in fakes]


def alias_groups(nodes: Iterable[torch.fx.Node],
                 storages_of: Mapping[str, list[StorageRef] | None] | None = None
                 ) -> dict[str, str] | None:
    """Node name -> the name of the first node of its alias group (values sharing storage).

    ``None`` when a value-producing node has no fake value (aliasing unknown).
    ``storages_of``: each node's :func:`fake_storages`, when the caller has them.
    """
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    owner: dict[StorageRef, str] = {}
    for node in nodes:
        if node.op == "output":
            continue
        storages = storages_of[node.name] if storages_of is not None else fake_storages(node)
        if storages is None:
            return None
        parent[node.name] = node.name
        for key in storages:
            if key in owner:
                a, b = find(owner[key]), find(node.name)
                parent[b] = a  # the earlier node stays the root
            else:
                owner[key] = node.name
    return {n: find(n) for n in parent}


@dataclass
class _Group:
    """The values of one alias group and where they are read (during the scan)."""

    members: list[str] = field(default_factory=list)
    #: stream -> highest position (1-based op count) on it of a read or a producer
    needs: dict[int, int] = field(default_factory=dict)
    last_step: int = -1
    streams: set[int] = field(default_factory=set)
    stream: int = 0  # the allocating stream: its first member's
    returned: bool = False


def release_points(
    steps: Sequence[LaunchStep],
    inputs: Sequence[str],
    outputs: Collection[str],
    group_of: Mapping[str, Hashable] | None,
) -> dict[str, int | None]:
    """Value -> index of the step after which a runtime drops it; ``None``: kept to the end.

    ``inputs`` are the graph's inputs (on stream 0); ``group_of`` maps each value to
    its alias group (:func:`alias_groups`), or is ``None`` when aliasing is unknown.
    """
    groups = _scan(steps, inputs, outputs, group_of)
    last = _last_reads(steps)
    out: dict[str, int | None] = {}
    for g in groups.values():
        if g.returned:
            out.update(dict.fromkeys(g.members))
        elif len(g.streams) <= 1:
            out.update({m: last.get(m) for m in g.members})
    crossing = [g for g in groups.values() if not g.returned and len(g.streams) > 1]
    if group_of is None:
        out.update({m: None for g in crossing for m in g.members})
    elif crossing:
        out.update(_joined_releases(steps, crossing))
    order = [*inputs, *(s.name for s in steps if s.kind == "op")]
    return {v: out[v] for v in order}


def _scan(steps: Sequence[LaunchStep], inputs: Sequence[str], outputs: Collection[str],
          group_of: Mapping[str, Hashable] | None) -> dict[Hashable, _Group]:
    groups: dict[Hashable, _Group] = {}
    key_of: dict[str, Hashable] = {}
    position: dict[int, int] = {}

    def note(value: str, stream: int, pos: int, index: int) -> None:
        g = groups[key_of[value]]
        g.needs[stream] = max(g.needs.get(stream, 0), pos)
        g.last_step = max(g.last_step, index)
        g.streams.add(stream)

    def add(value: str, stream: int, pos: int, index: int) -> None:
        key = group_of.get(value, value) if group_of is not None else value
        key_of[value] = key
        if key not in groups:
            groups[key] = _Group(stream=stream)
        groups[key].members.append(value)
        groups[key].returned |= value in outputs
        note(value, stream, pos, index)

    for name in inputs:
        add(name, 0, 0, -1)
    for i, step in enumerate(steps):
        if step.kind != "op":
            continue
        pos = position[step.stream] = position.get(step.stream, 0) + 1
        for r in step.reads:
            if r in key_of:
                note(r, step.stream, pos, i)
        add(step.name, step.stream, pos, i)
    return groups


def _last_reads(steps: Sequence[LaunchStep]) -> dict[str, int]:
    """Rule 1: each value's last read (or its production when nothing reads it)."""
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.kind == "op":
            last[step.name] = i
            for r in step.reads:
                last[r] = i
    return last


def _joined_releases(steps: Sequence[LaunchStep], groups: list[_Group]) -> dict[str, int | None]:
    """Rule 2: the first step of the allocating stream whose clock covers every read."""
    out: dict[str, int | None] = {m: None for g in groups for m in g.members}
    pending: dict[int, list[_Group]] = {}
    for g in sorted(groups, key=lambda g: g.last_step):
        pending.setdefault(g.stream, []).append(g)
    clock: dict[int, dict[int, int]] = {}
    token_clock: dict[str, dict[int, int]] = {}
    for i, step in enumerate(steps):
        vc = clock.setdefault(step.stream, {})
        if step.kind == "op":
            vc[step.stream] = vc.get(step.stream, 0) + 1
        elif step.kind == "record":
            token_clock[step.name] = dict(vc)
            continue
        else:
            for t in step.tokens:
                for s, c in token_clock.get(t, {}).items():
                    vc[s] = max(vc.get(s, 0), c)
        waiting = pending.get(step.stream, [])  # by last read: the rest are not yet due
        due = []
        for g in waiting:
            if g.last_step > i:
                break
            due.append(g)
        done = [g for g in due if all(vc.get(s, 0) >= p for s, p in g.needs.items())]
        for g in done:
            waiting.remove(g)
            out.update(dict.fromkeys(g.members, i))
    return out


def plan_steps(schedule: Schedule, syncs: Iterable[Sync],
               reads: Mapping[str, Sequence[str]]) -> list[LaunchStep]:
    """The steps :func:`autostream.dialects.rewrite.rewrite_graph` lays out for a plan.

    A wait right before each consumer, a record right after each producer, and the
    join (a wait on stream 0) after every op.  ``reads``: op -> the values it reads.

    >>> s = Schedule("x", {"a": 0, "b": 1}, ("a", "b"), {}, {}, 0.0, 0.0)
    >>> [(p.kind, p.name) for p in plan_steps(s, [Sync("a", "b"), Sync("b", JOIN)], {"b": ["a"]})]
    [('op', 'a'), ('record', 'a'), ('wait', 'b'), ('op', 'b'), ('record', 'b'), ('wait', '<output>')]
    """
    syncs = list(syncs)
    waits = group_waits(syncs)
    recorded = set(recorded_producers(syncs))
    out: list[LaunchStep] = []
    for name in schedule.order:
        stream = schedule.stream_of[name]
        if name in waits:
            out.append(LaunchStep("wait", name, stream, tokens=tuple(waits[name])))
        out.append(LaunchStep("op", name, stream, reads=tuple(reads.get(name, ()))))
        if name in recorded:
            out.append(LaunchStep("record", name, stream))
    if JOIN in waits:
        out.append(LaunchStep("wait", JOIN, 0, tokens=tuple(waits[JOIN])))
    return out
