"""Predicted peak memory of a plan: tensor sizes and lifetimes laid on its timeline.

:func:`predict_memory` is the one entry.  A plan's memory is the sum of the
storages live at each moment:

1. **graph inputs and constants** (weights) are the caller's: live for the whole
   call, counted in every figure;
2. an op's fresh storage (not a view or an alias: storages come from the fake
   values FX keeps in ``meta["val"]``, as in torch's ``memory_estimator``) is live
   from the op's start until the runtime drops the last value referencing it:
   after its last read on its own stream, or, for a storage another stream reads,
   when its allocating stream has waited for every read (the join at the latest),
   :mod:`autostream.memory.lifetimes`; the graph's outputs are never dropped;
3. times come from a :class:`~autostream.scheduling.timeline.Timeline` of the plan (the
   planner's simulated one, so concurrent ops overlap their storages), or, for
   the accelerator runtime whose allocator counts at launch, the launch order
   (:func:`launch_timeline`).  Ties at one instant follow the launch order, a
   release before a wait first.

``peak_bytes`` is the most bytes live at once: what the CPU runtime holds and an
accelerator allocator's ``max_memory_allocated`` reports.  ``bound_bytes`` is the
most any run can hold: on CPU the threads may interleave otherwise than the
timeline within the plan's syncs (:mod:`autostream.memory.bound`), so budgets are
held against it; on an accelerator allocations follow the launch order, one
interleaving, and the bound is the peak.  ``reserved_bytes``
adds the caching allocator's per-stream pools: a block freed on one stream serves
later allocations of that stream only, so each stream keeps the most its own
allocations ever needed at once.

>>> import networkx as nx
>>> from autostream.scheduling.schedule import Schedule
>>> deps = nx.DiGraph([("a", "b"), ("b", "c")])
>>> mem = GraphMemory.from_sizes(deps, {"a": 100, "b": 10, "c": 1})
>>> s = Schedule("single", dict.fromkeys("abc", 0), ("a", "b", "c"),
...              {"a": 0.0, "b": 1.0, "c": 2.0}, {"a": 1.0, "b": 2.0, "c": 3.0}, 3.0, 3.0)
>>> predict_memory(mem, s).peak_bytes  # b runs while a is still read
110
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import networkx as nx
import torch
import torch.fx

from autostream.cost.signature import symint_hint
from autostream.memory.bound import interleaving_bound
from autostream.memory.lifetimes import (
    LaunchStep,
    alias_groups,
    fake_storages,
    plan_steps,
    release_points,
)
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.timeline import OpSpan, Timeline

__all__ = ["GraphMemory", "MemoryProfile", "StorageLife", "allocation_timeline", "launch_timeline",
           "predict_memory"]


@dataclass(frozen=True)
class GraphMemory:
    """What a graph allocates and who reads it: the plan-independent half of a prediction."""

    #: value (an op's result or a graph input) -> the storages it references
    storages_of: Mapping[str, tuple[str, ...]]
    #: storage -> its size in bytes
    nbytes: Mapping[str, int]
    #: storage -> the op allocating it (graph inputs and constants are absent: the caller's)
    allocated_by: Mapping[str, str]
    #: op -> the values it reads
    reads: Mapping[str, tuple[str, ...]]
    #: graph inputs and constants, in graph order
    inputs: tuple[str, ...]
    #: values the graph returns
    outputs: frozenset[str]
    #: value -> its alias group; ``None`` when some value has no fake value
    group_of: Mapping[str, str] | None
    #: values without a fake value (counted as 0 bytes)
    unsized: tuple[str, ...] = ()
    #: where the storages live: ``"cpu"``, or the accelerator's device type
    device_type: str = "cpu"

    @property
    def input_bytes(self) -> int:
        owned = {s for v in self.inputs for s in self.storages_of.get(v, ())}
        return sum(self.nbytes[s] for s in owned)

    @classmethod
    def from_graph(cls, graph: torch.fx.Graph | torch.fx.GraphModule) -> GraphMemory:
        """Sizes and aliasing from the fake values FX keeps (``meta["val"]``).

        >>> from autostream.fx.capture import capture_graphs
        >>> [gm] = capture_graphs(torch.nn.ReLU(), (torch.randn(8, 4),))
        >>> mem = GraphMemory.from_graph(gm)
        >>> mem.input_bytes, sorted(mem.nbytes.values())
        (128, [128, 128])
        """
        graph = graph.graph if isinstance(graph, torch.fx.GraphModule) else graph
        nodes = [n for n in graph.nodes if n.op != "output"]
        sources = {"placeholder", "get_attr"}
        key_name: dict[object, str] = {}
        storages_of: dict[str, tuple[str, ...]] = {}
        nbytes: dict[str, int] = {}
        allocated_by: dict[str, str] = {}
        unsized: list[str] = []
        devices: set[str] = set()
        refs = {node.name: fake_storages(node) for node in nodes}
        for node in nodes:
            keys = refs[node.name]
            if keys is None:
                unsized.append(node.name)
                keys = []
            names = []
            for i, key in enumerate(dict.fromkeys(keys)):
                if key not in key_name:
                    name = key_name[key] = node.name if i == 0 else f"{node.name}:{i}"
                    nbytes[name] = _concrete(key.nbytes)
                    devices.add(key.device.type)
                    if node.op not in sources:
                        allocated_by[name] = node.name
                names.append(key_name[key])
            storages_of[node.name] = tuple(names)
        output = next(n for n in graph.nodes if n.op == "output")
        return cls(
            storages_of=storages_of, nbytes=nbytes, allocated_by=allocated_by,
            reads={n.name: tuple(a.name for a in n.all_input_nodes)
                   for n in nodes if n.op not in sources},
            inputs=tuple(n.name for n in nodes if n.op in sources),
            outputs=frozenset(n.name for n in output.all_input_nodes),
            group_of=alias_groups(nodes, refs), unsized=tuple(unsized),
            device_type=min(devices - {"cpu", "meta"}, default="cpu"))

    @classmethod
    def from_sizes(cls, deps: nx.DiGraph, nbytes: Mapping[str, int],
                   outputs: Iterable[str] | None = None) -> GraphMemory:
        """Each op allocates one storage of ``nbytes[op]`` bytes and reads its predecessors;
        the outputs are the sinks unless given (a DAG without FX, for tests and STG graphs)."""
        returned = frozenset(outputs if outputs is not None
                             else (n for n in deps if deps.out_degree(n) == 0))
        return cls(
            storages_of={n: (n,) for n in deps}, nbytes={n: int(nbytes.get(n, 0)) for n in deps},
            allocated_by={n: n for n in deps},
            reads={n: tuple(sorted(deps.predecessors(n))) for n in deps},
            inputs=(), outputs=returned, group_of={n: n for n in deps})


def _concrete(n: int | torch.SymInt) -> int:
    """A symbolic size's traced value (0 when it has none: unbacked)."""
    if not isinstance(n, torch.SymInt):
        return int(n)
    try:
        return symint_hint(n)
    except Exception:  # noqa: BLE001 - unbacked: no size to predict with
        return 0


@dataclass(frozen=True)
class StorageLife:
    """When one storage is live on a plan's timeline (``end`` is ``inf`` for kept ones)."""

    storage: str
    nbytes: int
    #: the op allocating it, and that op's stream
    allocated_by: str
    stream: int
    start: float
    end: float
    #: the op whose end frees it, or the op whose wait frees it (before it starts);
    #: both ``None`` when it is kept to the end of the call
    freed_after: str | None = None
    freed_before: str | None = None


@dataclass(frozen=True)
class MemoryProfile:
    """A plan's predicted memory, in bytes."""

    #: inputs plus the most bytes live at once, and when (microseconds)
    peak_bytes: int
    peak_us: float
    input_bytes: int
    #: with per-stream caching pools (see the module docstring)
    reserved_bytes: int
    #: (time, live bytes) after each change, inputs included
    curve: tuple[tuple[float, int], ...]
    #: storages live at the peak, largest first
    at_peak: tuple[str, ...]
    lives: Mapping[str, StorageLife]
    #: values whose size is unknown (counted as 0 bytes)
    unsized: int = 0
    #: inputs plus the most bytes any interleaving within the syncs holds (>= ``peak_bytes``)
    bound_bytes: int = 0
    #: storages live at that worst moment, largest first
    bound_at: tuple[str, ...] = ()

    @property
    def binding_at(self) -> tuple[str, ...]:
        """The storages live at the moment that decides ``bound_bytes``."""
        return self.bound_at if self.bound_bytes > self.peak_bytes else self.at_peak


def launch_timeline(schedule: Schedule) -> Timeline:
    """Op ``i`` of the launch order from ``i`` to ``i + 1``: when an accelerator's caching
    allocator, which counts on the host at launch, sees each allocation and free.

    >>> s = Schedule("x", {"a": 0, "b": 1}, ("a", "b"), {}, {}, 0.0, 0.0)
    >>> launch_timeline(s).end
    {'a': 1.0, 'b': 2.0}
    """
    spans = {n: OpSpan(n, schedule.stream_of[n], float(i), float(i + 1))
             for i, n in enumerate(schedule.order)}
    n = float(len(schedule.order))
    return Timeline(spans, n, (), n, "launch order")


def allocation_timeline(memory: GraphMemory, schedule: Schedule, timeline: Timeline) -> Timeline:
    """When ``memory``'s device allocates: ``timeline`` (the run) on CPU, the launch
    order on an accelerator, whose caching allocator counts on the host at launch."""
    return timeline if memory.device_type == "cpu" else launch_timeline(schedule)


def predict_memory(memory: GraphMemory, schedule: Schedule, syncs: Iterable[Sync] = (),
                   timeline: Timeline | None = None) -> MemoryProfile:
    """The predicted memory of ``schedule`` with ``syncs`` (default: the schedule's own times).

    Args:
        memory: the graph's sizes and reads (:meth:`GraphMemory.from_graph`).
        schedule: streams and launch order of every op.
        syncs: the plan's syncs (they decide when storages read across streams die).
        timeline: when each op runs; ``Timeline.from_schedule(schedule)`` by default.
    """
    tl = timeline or Timeline.from_schedule(schedule, syncs)
    steps = plan_steps(schedule, syncs, memory.reads)
    points = release_points(steps, memory.inputs, memory.outputs, memory.group_of)
    launch = {n: i for i, n in enumerate(schedule.order)}
    lives = _lives(memory, schedule, tl, steps, points, launch)
    profile = _sweep(memory, lives, launch)
    if memory.device_type != "cpu" or schedule.streams_used <= 1:
        return replace(profile, bound_bytes=profile.peak_bytes, bound_at=profile.at_peak)
    bound = interleaving_bound(
        steps, memory.nbytes, memory.allocated_by,
        {s: life.freed_after for s, (life, _) in lives.items()},
        {s: life.freed_before for s, (life, _) in lives.items()})
    return replace(profile, bound_bytes=max(profile.peak_bytes, memory.input_bytes
                                            + bound.live_bytes), bound_at=bound.live)


#: order of events at one instant, within one launch position
_WAIT_FREE, _ALLOC, _OP_FREE = 0, 1, 2
#: (time, launch position, kind): the order of allocations and frees
_Key = tuple[float, int, int]


def _release_key(step: LaunchStep, tl: Timeline, launch: Mapping[str, int]) -> _Key:
    if step.kind == "op":
        return tl.spans[step.name].end, launch[step.name], _OP_FREE
    if step.name == JOIN:
        return max(tl.output, tl.makespan), len(launch), _WAIT_FREE
    return tl.spans[step.name].start, launch[step.name], _WAIT_FREE


def _lives(memory: GraphMemory, schedule: Schedule, tl: Timeline, steps: Sequence[LaunchStep],
           points: Mapping[str, int | None], launch: Mapping[str, int]
           ) -> dict[str, tuple[StorageLife, _Key | None]]:
    """Every op-allocated storage's interval, from its op's start to its last value's drop,
    with the drop's place in the event order (``None``: kept to the end)."""
    drops: dict[str, list[int | None]] = {}
    for value, storages in memory.storages_of.items():
        for s in storages:
            drops.setdefault(s, []).append(points.get(value))
    out = {}
    for s, op in memory.allocated_by.items():
        indices = drops.get(s, [None])
        step = None if None in indices else steps[max(
            indices, key=lambda i: _release_key(steps[i], tl, launch))]
        key = None if step is None else _release_key(step, tl, launch)
        life = StorageLife(
            s, memory.nbytes[s], op, schedule.stream_of[op], tl.spans[op].start,
            math.inf if key is None else key[0],
            freed_after=step.name if step is not None and step.kind == "op" else None,
            freed_before=step.name if step is not None and step.kind == "wait"
            and step.name != JOIN else None)
        out[s] = (life, key)
    return out


def _sweep(memory: GraphMemory, lives: Mapping[str, tuple[StorageLife, _Key | None]],
           launch: Mapping[str, int]) -> MemoryProfile:
    base = memory.input_bytes
    events: list[tuple[_Key, str, int]] = []
    for s, (life, free) in lives.items():
        events.append(((life.start, launch[life.allocated_by], _ALLOC), s, 1))
        if free is not None:
            events.append((free, s, -1))
    events.sort()
    size = {s: life.nbytes for s, (life, _) in lives.items()}
    stream = {s: life.stream for s, (life, _) in lives.items()}
    live, per_stream, pools = 0, {}, {}
    peak, peak_t, live_set, at_peak = base, 0.0, set(), ()
    curve = [(0.0, base)]
    for (t, _, _), s, sign in events:
        live += sign * size[s]
        per_stream[stream[s]] = per_stream.get(stream[s], 0) + sign * size[s]
        pools[stream[s]] = max(pools.get(stream[s], 0), per_stream[stream[s]])
        (live_set.add if sign > 0 else live_set.discard)(s)
        curve.append((t, base + live))
        if base + live > peak:
            peak, peak_t = base + live, t
            at_peak = tuple(sorted(live_set, key=lambda x: (-size[x], x)))
    return MemoryProfile(peak, peak_t, base, base + sum(pools.values()), tuple(curve), at_peak,
                         {s: life for s, (life, _) in lives.items()}, len(memory.unsized))
