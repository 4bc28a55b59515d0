"""Read a hand placement of streams out of a graph: the same ``Schedule`` and ``Sync`` s a plan is.

What is read, in the graph's node order (the launch order):

- **TorchAir scopes** (``air.scope_enter`` with ``_user_stream_label``, as
  ``npu_stream_switch`` emits them, and ``air.scope_exit``): the ops between run on the
  labelled stream; a scope without a label (``limit_core_num``) keeps the stream;
- **``air.record`` / ``air.wait``**: a record stands for the last op launched on its
  stream (under CUDA and ACL semantics also for what that stream waited for since); a wait
  orders the next op launched on its stream after it (a join when it is the main stream's
  last word before ``output``).  Under ACL, a wait on a plain tensor waits for its producer
  (TorchAir's ``apply_event_record`` records right after it);
- **``air.wait_tensor``** (``npu_wait_tensor(self, dependency)``): the next op of the
  current stream waits for ``dependency``'s producer; ``self`` flows on (an ordering edge
  only);
- **Dynamo's user streams**: ``node.meta["custom"]["stream"]`` puts an op on that stream
  (a stream index no op is annotated with is the ambient stream, 0);
  ``streams.record_event`` / ``wait_event`` / ``wait_stream`` / ``sync_dealloc`` are syncs.

Semantics by target (``mode``): ``"cuda"`` orders only what records and waits order;
``"ge"``: GE orders every cross-stream data edge itself and joins every stream before the
graph's output, a record stands for its stream's last op alone (``torchair.md``), and a
wait landing on an op whose converter puts it on a ``Const`` made for a scalar argument
(``addmm``: ``torchair_modes.ge_wait_landing``) orders that op's reads of the other
arguments, and the stream's next op, not the reads made before that ``Const`` is used:
a data edge the placement waits for there is left unordered (a race, whatever GE's own
ordering of data edges does: the placement did not rely on it);
``"acl"``: a side scope waits for the graph's start only and is joined at the output
(TorchAir's tagged events per scope), and ``air.wait_tensor`` orders nothing (no ACL pass
handles it; its kernels raise).

>>> import torch
>>> from autostream.runtime.builder import DialectBuilder
>>> b = DialectBuilder(); x = b.input("x")
>>> with b.stream(1):
...     y = b.call(torch.ops.aten.neg.default, x); t = b.record()
>>> z = b.call(torch.ops.aten.relu.default, x); _ = b.wait(t)
>>> hand = read_placement(b.finish(y, z))
>>> hand.stream_of, hand.syncs
({'neg_default': 1, 'relu_default': 0}, (Sync(producer='neg_default', consumer='<output>'),))
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.fx

from autostream.dialects.torchair import air_kind, is_stream_op, is_wait_tensor, scope_label
from autostream.dialects.torchair_modes import ge_wait_landing
from autostream.fx.graph import build_op_graph
from autostream.scheduling.schedule import JOIN, Schedule, Sync

MODES = ("cuda", "ge", "acl")
MAIN = "main"
_DYNAMO_SYNCS = ("record_event", "wait_event", "wait_stream", "sync_dealloc")


def check_mode(mode: str) -> str:
    """``mode`` if it is a target autostream knows, else a ``ValueError`` naming them.

    >>> check_mode("npu")
    Traceback (most recent call last):
    ...
    ValueError: mode 'npu': expected one of cuda, ge, acl (CUDA events; TorchAir GE, max-autotune; TorchAir ACL graph, reduce-overhead)
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)} (CUDA events; "
                         f"TorchAir GE, max-autotune; TorchAir ACL graph, reduce-overhead)")
    return mode


@dataclass(frozen=True)
class HandPlacement:
    """A placement read from a graph: ops' streams, launch order and syncs."""

    #: the graph without its stream ops (node names kept): what the ops compute
    graph: torch.fx.GraphModule
    stream_of: dict[str, int]
    order: tuple[str, ...]
    syncs: tuple[Sync, ...]
    #: stream -> its label as written (``"main"`` for 0)
    labels: dict[int, str]
    #: the kinds of stream ops found ("scopes", "record/wait", "wait_tensor", "dynamo")
    kinds: tuple[str, ...] = ()
    #: what the placement does that the target cannot run, in words
    problems: tuple[str, ...] = field(default_factory=tuple)
    #: GE: data edges ``(producer, consumer)`` a wait meant to order but put on a ``Const``
    #: the consumer reads after them (``torchair_modes.ge_wait_landing``)
    waits_on_const: tuple[tuple[str, str], ...] = ()

    @property
    def streams_used(self) -> int:
        return len(set(self.stream_of.values()))

    def schedule(self) -> Schedule:
        """The placement as a ``Schedule`` (no times: simulate it for those)."""
        zero = dict.fromkeys(self.order, 0.0)
        return Schedule("hand", dict(self.stream_of), self.order, zero, zero, 0.0, 0.0)


def _dynamo_op(node: torch.fx.Node) -> str | None:
    t = node.target
    if node.op == "call_function" and getattr(t, "namespace", None) == "streams":
        return t._schema.name.split("::", 1)[-1]
    return None


def _annotated_stream(node: torch.fx.Node) -> int | None:
    custom = node.meta.get("custom")
    if isinstance(custom, dict) and isinstance(custom.get("stream"), int):
        return custom["stream"]
    return None


def _producer(node: object) -> str | None:
    """The op whose end makes ``node``'s value ready (through getitem and ``wait_tensor``)."""
    while isinstance(node, torch.fx.Node):
        if node.op in ("placeholder", "get_attr"):
            return None
        if node.target is operator.getitem or is_wait_tensor(node):
            node = node.args[0]
            continue
        return node.name
    return None


def strip_stream_ops(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` edited in place: every stream op removed (``wait_tensor``'s users read its
    ``self``) and Dynamo's stream annotations dropped; returns it."""
    graph = gm.graph
    for node in reversed(list(graph.nodes)):
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and "stream" in custom:
            node.meta["custom"] = {k: v for k, v in custom.items() if k != "stream"}
        if is_wait_tensor(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif is_stream_op(node) or _dynamo_op(node) is not None:
            graph.erase_node(node)  # its users (a record's waits) are gone: reversed order
    graph.lint()
    gm.recompile()
    return gm


class _Reader:
    def __init__(self, mode: str, dynamo_streams: set[int]) -> None:
        self.mode = mode
        self.labels: dict[str, int] = {MAIN: 0}
        self.dynamo_streams = dynamo_streams
        self.stack = [0]
        self.last: dict[int, str] = {}
        self.pending: dict[int, list[str]] = {}
        self.tokens: dict[object, list[str]] = {}
        self.stream_of: dict[str, int] = {}
        self.order: list[str] = []
        self.syncs: list[Sync] = []
        self.kinds: list[str] = []
        self.problems: list[str] = []
        self.waits_on_const: list[tuple[str, str]] = []

    def stream(self, label: str) -> int:
        return self.labels.setdefault(label, len(self.labels))

    def dynamo(self, index: int) -> int:
        return self.stream(f"stream {index}") if index in self.dynamo_streams else 0

    def saw(self, kind: str) -> None:
        if kind not in self.kinds:
            self.kinds.append(kind)

    def snapshot(self, stream: int) -> list[str]:
        """What a record on ``stream`` stands for now."""
        out = [self.last[stream]] if stream in self.last else []
        if self.mode != "ge":  # an event covers the waits before it; GE's record does not
            out += self.pending.get(stream, [])
        return out

    def read(self, node: torch.fx.Node) -> None:
        kind = air_kind(node)
        current = self.stack[-1]
        if kind == "scope_enter":
            label = scope_label(node)
            self.saw("scopes")
            self.stack.append(current if label is None else self.stream(label))
        elif kind == "scope_exit":
            if len(self.stack) > 1:
                self.stack.pop()
            else:
                self.problems.append(f"scope_exit {node.name} has no matching scope_enter")
        elif kind == "record":
            self.saw("record/wait")
            self.tokens[node] = self.snapshot(current)
        elif kind == "wait":
            self.saw("record/wait")
            for t in node.args[0]:
                if t in self.tokens:
                    self.pending.setdefault(current, []).extend(self.tokens[t])
                elif self.mode == "acl" and _producer(t) is not None:
                    self.pending.setdefault(current, []).append(_producer(t))
                else:
                    self.problems.append(f"{node.name} waits on {t}, which is not a record "
                                         f"made before it")
        elif is_wait_tensor(node):
            self.saw("wait_tensor")
            if self.mode == "acl":  # TorchAir's ACL passes leave it alone: it orders nothing
                self.problems.append(
                    f"{node.name}: air.wait_tensor (npu_wait_tensor) orders nothing in an ACL "
                    f"graph and has no kernel there (TorchAir's CPU and NPU kernels raise): "
                    f"use air.record/air.wait")
                return
            producer = _producer(node.args[1])
            if producer is not None:
                self.pending.setdefault(current, []).append(producer)
        elif _dynamo_op(node) is not None:
            self.read_dynamo(node, _dynamo_op(node))
        elif node.op == "output":
            for p in self.pending.pop(0, []):
                if self.stream_of[p] != 0:
                    self.syncs.append(Sync(p, JOIN))
        elif node.op in ("call_function", "call_method", "call_module"):
            self.op(node, current)

    def read_dynamo(self, node: torch.fx.Node, name: str) -> None:
        self.saw("dynamo")
        args = node.args
        if name == "record_event":
            self.tokens[("event", args[0])] = self.snapshot(self.dynamo(args[1]))
        elif name in ("wait_event", "sync_dealloc"):
            token = self.tokens.get(("event", args[0]))
            if token is None:
                self.problems.append(f"{node.name} waits on event {args[0]}, never recorded "
                                     f"before it")
            else:
                self.pending.setdefault(self.dynamo(args[1]), []).extend(token)
        elif name == "wait_stream":
            waiting, waited = self.dynamo(args[0]), self.dynamo(args[1])
            self.pending.setdefault(waiting, []).extend(self.snapshot(waited))
        elif name.startswith("synchronize"):
            self.problems.append(f"{node.name}: streams.{name} blocks the host; not modelled")

    def op(self, node: torch.fx.Node, current: int) -> None:
        annotated = _annotated_stream(node)
        stream = self.dynamo(annotated) if annotated is not None else current
        pending = list(dict.fromkeys(self.pending.pop(stream, [])))
        carried: list[str] = []
        if self.mode == "ge" and pending:
            pending, carried = self.land(node, stream, pending)
        for p in pending:
            if self.stream_of[p] != stream:
                self.syncs.append(Sync(p, node.name))
        self.stream_of[node.name] = stream
        self.order.append(node.name)
        self.last[stream] = node.name
        if carried:
            self.pending.setdefault(stream, []).extend(carried)

    def land(self, node: torch.fx.Node, stream: int, pending: list[str]
             ) -> tuple[list[str], list[str]]:
        """GE: a wait landing on ``node``'s ``Const`` (``ge_wait_landing``) orders its reads of
        the inputs it leaves out only through the ops after it: ``(syncs onto node, producers
        the stream's next op waits for)``; the producers of the inputs left unordered that
        the wait meant to cover are ``waits_on_const``."""
        landing = ge_wait_landing(node)
        if not landing.unordered_inputs and not landing.lost:
            return pending, []
        missed = {_producer(i) for i in landing.unordered_inputs} - {None}
        covered = {_producer(i) for i in node.all_input_nodes} - missed - {None}
        position = {n: i for i, n in enumerate(self.order)}

        def awaited(src: str) -> bool:  # src ran on a waited stream no later than its record
            return any(self.stream_of[p] == self.stream_of.get(src) and src in position
                       and position[src] <= position[p] for p in pending)

        self.waits_on_const += [(src, node.name) for src in sorted(missed)
                                if self.stream_of.get(src, stream) != stream and awaited(src)]
        onto = [src for src in sorted(covered)
                if self.stream_of.get(src, stream) != stream and awaited(src)]
        return (onto, []) if landing.lost else (onto, pending)


def read_placement(gm: torch.fx.GraphModule, mode: str = "cuda") -> HandPlacement:
    """The hand placement in ``gm`` (left unchanged) under ``mode``'s semantics
    (``"cuda"``, ``"ge"``, ``"acl"``; module docstring)."""
    check_mode(mode)
    annotated = {s for n in gm.graph.nodes if (s := _annotated_stream(n)) is not None}
    reader = _Reader(mode, annotated)
    for node in gm.graph.nodes:
        reader.read(node)
    if len(reader.stack) > 1:
        reader.problems.append(f"{len(reader.stack) - 1} scope_enter node(s) are never exited")
    clean = strip_stream_ops(torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)))
    names = {n.name for n in clean.graph.nodes}
    lost = [n for n in reader.order if n not in names]
    if lost:
        raise RuntimeError(f"copying the graph renamed ops {lost[:3]}; cannot read the placement")
    syncs = reader.syncs
    side = sorted({s for s in reader.stream_of.values() if s != 0})
    if mode in ("ge", "acl"):  # joined before the output by the compiler
        last = {reader.stream_of[n]: n for n in reader.order}
        syncs += [Sync(last[s], JOIN) for s in side]
    if mode == "ge":  # GE orders cross-stream data edges itself, but for those a wait misses
        deps = build_op_graph(clean)
        missed = set(reader.waits_on_const)
        syncs += [Sync(u, v) for u, v, kind in deps.edges(data="kind", default="data")
                  if kind == "data" and reader.stream_of[u] != reader.stream_of[v]
                  and (u, v) not in missed]
    labels = {s: label for label, s in reader.labels.items()
              if s == 0 or s in reader.stream_of.values()}
    return HandPlacement(clean, reader.stream_of, tuple(reader.order),
                         tuple(dict.fromkeys(syncs)), labels, tuple(reader.kinds),
                         tuple(reader.problems), tuple(reader.waits_on_const))


def has_placement(nodes: Iterable[torch.fx.Node]) -> bool:
    """Whether any node is a stream op or carries a Dynamo stream annotation."""
    return any(is_stream_op(n) or _dynamo_op(n) is not None or _annotated_stream(n) is not None
               for n in nodes)
