"""What each call of a Dynamo graph really does to memory, randomness and thread state.

A Dynamo graph calls Python functions (``torch.nn.functional.batch_norm``,
``operator.and_``, ``Tensor.index_copy_``), whose names do not say what they write:
``F.batch_norm(x, running_mean, running_var, training=True)`` writes both running
statistics, ``operator.and_`` writes nothing.  :func:`trace_call_effects` runs the graph
once on fake tensors (no data, no device work) and watches every ATen op each call
dispatches:

- **writes**: a storage that existed before the call and that an op's schema marks
  written (``Tensor(a!)``), plus the few ops whose schema does not say so
  (``native_batch_norm`` and its cuDNN/MIOpen twins write the running statistics when
  training);
- **reads**: the storages of every tensor the call is given (views share their base's);
- **random**: an op that draws random numbers with the arguments it got (an attention
  kernel with ``dropout_p=0`` draws none);
- **side effects**: an op torch registers as side-effecting, or a call that is not an
  ATen op at all;
- **state**: the call changed the thread's grad, inference or autocast mode.

Where the truth cannot be established (a module call, a graph without example values,
an op the fake run refuses) :class:`EffectsUnknown` says why.

>>> import operator
>>> g = torch.fx.Graph()
>>> a, b, x = g.placeholder("a"), g.placeholder("b"), g.placeholder("x")
>>> both = g.call_function(operator.and_, (a, b))
>>> write = g.call_method("add_", (x, 1))
>>> _ = g.output((both, write))
>>> a.meta["example_value"] = b.meta["example_value"] = torch.ones(2, dtype=torch.bool)
>>> x.meta["example_value"] = torch.ones(2)
>>> effects = trace_call_effects(torch.fx.GraphModule(torch.nn.Module(), g))
>>> effects.calls["and_"].writes, effects.written_inputs()
(frozenset(), {'x'})
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autostream.fx.graph import OpGraph, draws_random_numbers
from autostream.fx.thread_state import ThreadState

#: ``node.meta`` key under which a lifted graph's nodes carry their :class:`CallEffects`
EFFECTS_KEY = "autostream_effects"


class EffectsUnknown(ValueError):
    """What a call of the graph does could not be established; the message says why."""


@dataclass(frozen=True)
class CallEffects:
    """One call's reads and writes (storage ids of the trace), randomness, side effects."""

    aten_ops: tuple[str, ...]
    reads: frozenset[int]
    writes: frozenset[int]
    random: bool = False
    side_effect: bool = False
    #: how the call changed the thread's state (grad, inference, autocast), if it did
    state_change: str = ""

    @property
    def ordered(self) -> bool:
        """Random draws and side effects keep their program order among themselves."""
        return self.random or self.side_effect


@dataclass(frozen=True)
class GraphEffects:
    """The effects of every call of a graph, by node name, in program order."""

    calls: Mapping[str, CallEffects]
    #: placeholder name -> the storage id of its tensor (aliased inputs share one)
    input_storage: Mapping[str, int]

    def memory_edges(self) -> Iterator[tuple[str, str]]:
        """``(u, v)``: ``v`` reads or writes a storage ``u`` wrote, or writes one ``u`` read.

        Program order is kept between every write of a storage and every other access
        of it; reads of a storage no call writes stay unordered.
        """
        last_write: dict[int, str] = {}
        reads_since: dict[int, list[str]] = {}
        for name, call in self.calls.items():
            for s in call.reads - call.writes:
                if s in last_write:
                    yield last_write[s], name
                reads_since.setdefault(s, []).append(name)
            for s in sorted(call.writes):
                for reader in reads_since.pop(s, []):
                    if reader != name:
                        yield reader, name
                if s in last_write:
                    yield last_write[s], name
                last_write[s] = name

    def written_inputs(self) -> set[str]:
        """Placeholders whose storage some call writes."""
        written = {s for call in self.calls.values() for s in call.writes}
        return {p for p, s in self.input_storage.items() if s in written}

    def add_to(self, op_graph: OpGraph) -> OpGraph:
        """``op_graph`` (edited and returned) with the memory and program-order edges of
        these effects added (edge kinds ``"memory"`` and ``"effect"``)."""
        for u, v in self.memory_edges():
            if u != v and not op_graph.has_edge(u, v):
                op_graph.add_edge(u, v, kind="memory")
        ordered = [n for n, call in self.calls.items() if call.ordered]
        for u, v in zip(ordered, ordered[1:]):
            if not op_graph.has_edge(u, v):
                op_graph.add_edge(u, v, kind="effect")
        return op_graph

    @classmethod
    def of_lifted(cls, graph: torch.fx.Graph) -> GraphEffects:
        """The effects a lifted graph's nodes carry (``node.meta[EFFECTS_KEY]``), in the
        graph's order; none for a graph that was not lifted.

        >>> GraphEffects.of_lifted(torch.fx.Graph()).calls
        {}
        """
        return cls({n.name: n.meta[EFFECTS_KEY] for n in graph.nodes if EFFECTS_KEY in n.meta},
                   {})


# ops that write arguments their schema does not mark written (argument indices),
# when called with training=True (argument 5)
_UNANNOTATED_WRITES = {
    "aten::native_batch_norm": (3, 4),
    "aten::cudnn_batch_norm": (3, 4),
    "aten::miopen_batch_norm": (3, 4),
}


#: ops reading a tensor's value into Python, which fake tensors cannot run
_SCALAR_READS = frozenset({torch.ops.aten._local_scalar_dense.default})


class _Storages:
    """Storage -> small int id, for every tensor the trace has seen."""

    def __init__(self) -> None:
        self.ids: dict[StorageWeakRef, int] = {}
        self._alive: list[torch.Tensor] = []  # keep storages alive: weak refs may be reused

    def key(self, t: torch.Tensor) -> StorageWeakRef:
        try:
            return StorageWeakRef(t.untyped_storage())
        except (NotImplementedError, RuntimeError) as exc:
            raise EffectsUnknown(f"a {t.layout} tensor has no storage to follow ({exc})") from None

    def id_of(self, t: torch.Tensor, new: bool = True, alias: int | None = None) -> int | None:
        """``t``'s storage id; a storage not seen before gets a new one (or ``alias``'s)."""
        key = self.key(t)
        if key not in self.ids:
            if not new:
                return None
            self.ids[key] = len(self.ids) if alias is None else alias
            self._alive.append(t)
        return self.ids[key]

    def of(self, value: Any) -> frozenset[int]:
        return frozenset(self.id_of(t) for t in tree_leaves(value) if isinstance(t, torch.Tensor))


class _Recorder(TorchDispatchMode):
    """Watches the ATen ops of one call: what they write, draw and do besides."""

    def __init__(self, storages: _Storages) -> None:
        super().__init__()
        self.storages = storages
        self.known_before = set(storages.ids.values())
        self.ops: list[str] = []
        self.writes: set[int] = set()
        self.random = False
        self.side_effect = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(str(func))
        if not isinstance(func, torch._ops.OpOverload):
            self.side_effect = True
            self._written(tree_leaves((args, kwargs)))
        else:
            self._observe(func, args, kwargs)
        return func(*args, **kwargs)

    def _observe(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
        schema = func._schema
        if func in torch.fx.node._side_effectful_functions:
            self.side_effect = True
        self.random = self.random or draws_random_numbers(func, args, kwargs)
        if torch.Tag.maybe_aliasing_or_mutating in func.tags:
            self._written(tree_leaves((args, kwargs)))
        unannotated = _UNANNOTATED_WRITES.get(schema.name, ())
        training = len(args) > 5 and args[5] is True
        for i, arg in enumerate(schema.arguments):
            marked = arg.alias_info is not None and arg.alias_info.is_write
            if marked or (training and i in unannotated):
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                self._written(tree_leaves(value))

    def _written(self, values: list[Any]) -> None:
        for v in values:
            if isinstance(v, torch.Tensor):
                s = self.storages.id_of(v, new=False)
                if s is not None and s in self.known_before:
                    self.writes.add(s)


class _Tracer(torch.fx.Interpreter):
    """Runs the graph on fake tensors, one recorder per call."""

    def __init__(self, gm: torch.fx.GraphModule, mode: FakeTensorMode) -> None:
        super().__init__(gm)
        self.mode = mode
        self.storages = _Storages()
        self.calls: dict[str, CallEffects] = {}
        self.input_storage: dict[str, int] = {}
        self._alias_of: dict[StorageWeakRef, int] = {}

    def placeholder(self, target, args, kwargs):
        node = self.node
        example = node.meta.get("example_value", node.meta.get("val"))
        if not isinstance(example, torch.Tensor):
            if example is None:
                raise EffectsUnknown(f"input {node.name!r} has no example value")
            return example
        fresh = torch.empty_strided(example.shape, example.stride(), dtype=example.dtype,
                                    device=example.device)
        # inputs that alias one another in the example share one id
        original = self.storages.key(example)
        self._alias_of[original] = self.storages.id_of(fresh, alias=self._alias_of.get(original))
        self.input_storage[node.name] = self._alias_of[original]
        return fresh

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            value = self.mode.from_tensor(value)
        self.storages.of(value)
        return value

    def run_node(self, n: torch.fx.Node) -> Any:
        self.node = n
        if n.op in ("placeholder", "get_attr", "output"):
            return super().run_node(n)
        if n.op == "call_module":
            raise EffectsUnknown(f"{n.name!r} calls a module, whose state the graph does not show")
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        reads = self.storages.of((args, kwargs))
        given = [(t, self.storages.key(t)) for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)]
        before = ThreadState.capture()
        recorder = _Recorder(self.storages)
        try:
            with recorder:
                value = super().run_node(n)
        except EffectsUnknown:
            raise
        except DataDependentOutputException as exc:
            # ``.item()`` and friends: a read whose value fake tensors do not know;
            # Dynamo's example value stands in for it
            value = n.meta.get("example_value")
            if exc.func not in _SCALAR_READS or value is None:
                raise EffectsUnknown(f"{n.name!r} needs data fake tensors do not have "
                                     f"({exc.func})") from None
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise EffectsUnknown(f"{n.name!r} could not be run on fake tensors "
                                 f"({type(exc).__name__}: {first})") from None
        after = ThreadState.capture()
        self.storages.of(value)
        # a tensor moved to another storage (``set_``, ``resize_``): both are written
        moved = {i for t, key in given if self.storages.key(t) != key
                 for i in (self.storages.ids[key], self.storages.id_of(t))}
        self.calls[n.name] = CallEffects(
            aten_ops=tuple(recorder.ops), reads=reads, writes=frozenset(recorder.writes | moved),
            random=recorder.random, side_effect=recorder.side_effect,
            state_change="; ".join(before.differences(after)))
        return value


def _fake_mode(gm: torch.fx.GraphModule) -> FakeTensorMode:
    examples = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes
                if n.op == "placeholder"]
    mode = torch._guards.detect_fake_mode(examples)
    if mode is not None:
        return mode
    if any(isinstance(e, torch.Tensor) for e in examples):
        return FakeTensorMode(allow_non_fake_inputs=True)
    return FakeTensorMode()


def trace_call_effects(gm: torch.fx.GraphModule) -> GraphEffects:
    """The effects of every call of ``gm`` (a graph whose inputs carry example values).

    Runs on a thread of its own under the caller's thread state, so a call that changes
    the state (``_set_grad_enabled``) cannot leave it changed here, even if the run fails.
    """
    state = ThreadState.capture()
    result: list[GraphEffects | BaseException] = []

    def run() -> None:
        try:
            mode = _fake_mode(gm)
            tracer = _Tracer(gm, mode)
            with state.carried(), mode:
                tracer.run()
            result.append(GraphEffects(dict(tracer.calls), dict(tracer.input_storage)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result.append(exc)

    thread = threading.Thread(target=run, name="autostream-effects", daemon=True)
    thread.start()
    thread.join()
    [outcome] = result
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def aot_mutated_inputs(dynamo: torch.fx.GraphModule) -> frozenset[str] | None:
    """The inputs of ``dynamo`` that AOTAutograd, compiling it just now, found mutated.

    Read from the compile's ``TracingContext`` (``None`` outside a compile).  Raises
    :class:`EffectsUnknown` when AOTAutograd's inputs are not ``dynamo``'s (it merged
    aliased inputs) and some are mutated: the writes then cannot be attributed.
    """
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return None
    names = [n.name for n in dynamo.graph.nodes if n.op == "placeholder"]
    mutated = [i for i, info in enumerate(meta.input_info)
               if info.mutates_data or info.mutates_metadata]
    if len(meta.input_info) != len(names):
        if mutated:
            raise EffectsUnknown(f"AOTAutograd reports {len(mutated)} mutated inputs of "
                                 f"{len(meta.input_info)}, but the graph has {len(names)}")
        return frozenset()
    return frozenset(names[i] for i in mutated)
