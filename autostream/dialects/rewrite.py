"""Rewrite an FX graph in the TorchAir stream dialect for a schedule and its syncs.

The linear node order becomes the schedule's launch order.  Ops of side stream
``k`` sit between ``air.scope_enter(["_user_stream_label"], ["stream_k"])`` and
``air.scope_exit()``; a sync is ``t = air.record()`` right after its producer (on
the producer's stream) and ``air.wait([t, ...])`` right before its consumer (on
the consumer's stream); side streams are joined by a ``wait`` on the main stream
right before ``output``.  A side stream with a core budget gets a second scope inside
its stream scope with the keys ``torchair.scope.limit_core_num`` emits (separate: TorchAir's
ACL graph turns a scope holding both core keys into ``set_stream_limit`` and drops the
scope).  Existing nodes are moved, never recreated, so their
``meta`` stays intact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from autostream.dialects.input_mutations import emits_task
from autostream.dialects.torchair import STREAM_LABEL_KEY, AirOps, air_ops, stream_label
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.sync import group_waits, recorded_producers


@dataclass(frozen=True)
class GraphSnapshot:
    """The node order of a graph before a rewrite, to undo it."""

    order: tuple[torch.fx.Node, ...]


def snapshot(graph: torch.fx.Graph) -> GraphSnapshot:
    return GraphSnapshot(tuple(graph.nodes))


def restore(graph: torch.fx.Graph, snap: GraphSnapshot) -> None:
    """Erase nodes added since ``snap`` and put the original nodes back in their order.

    Added nodes are only used by later added nodes (a wait uses a record), so one
    sweep from the end erases them all.
    """
    original = set(snap.order)
    for node in reversed(list(graph.nodes)):
        if node not in original:
            graph.erase_node(node)
    cursor = graph._root
    for node in snap.order:
        cursor.append(node)
        cursor = node


def _fake_token(gm: torch.fx.GraphModule) -> torch.Tensor | None:
    """A FakeTensor standing for a record token, in the graph's fake mode if it has one."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch._subclasses.FakeTensor):
            with val.fake_mode:
                return torch.empty(0)
    return None


def inputs_first(graph: torch.fx.Graph) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Move placeholders and ``get_attr`` nodes to the front of ``graph``; returns its output
    node and the last of them (where ops are then laid out in launch order)."""
    front = [n for n in graph.nodes if n.op in ("placeholder", "get_attr")]
    output = next(n for n in graph.nodes if n.op == "output")
    cursor = graph._root
    for node in front:
        cursor.append(node)
        cursor = node
    return output, cursor


def rewrite_graph(
    gm: torch.fx.GraphModule,
    schedule: Schedule,
    syncs: Sequence[Sync],
    ops: AirOps | None = None,
    join_before_last: bool = False,
    core_scopes: Mapping[int, Mapping[str, str]] | None = None,
) -> list[torch.fx.Node]:
    """Reorder ``gm.graph`` to the launch order and insert scope/record/wait nodes.

    ``join_before_last``: the join wait goes right before the last launched op (which must
    be on the main stream; input ``copy_``, ``getitem`` and views do not count) instead of
    right before ``output``, so that it precedes a real op (TorchAir's GE attaches a wait
    to the next op on its stream; see ``dialects.torchair_modes``).  Returns the inserted nodes.  ``gm`` is edited in place
    and recompiled.  ``core_scopes``: side stream -> the scope keys of its core budget
    (``core_budgets.scope_keys``).
    """
    ops = ops or air_ops()
    core_scopes = core_scopes or {}
    if 0 in core_scopes:
        raise ValueError("the main stream keeps the whole chip: core_scopes names side "
                         "streams only")
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    waits = group_waits(syncs)
    recorded = set(recorded_producers(syncs))
    token_val = _fake_token(gm)
    inserted: list[torch.fx.Node] = []
    tokens: dict[str, torch.fx.Node] = {}

    output, cursor = inputs_first(graph)

    def emit(target, args=()) -> torch.fx.Node:
        nonlocal cursor
        with graph.inserting_after(cursor):
            new = graph.call_function(target, args)
        inserted.append(new)
        cursor = new
        return new

    def exit_scope(stream: int) -> None:
        for _ in range(1 + (stream in core_scopes)):
            emit(ops.scope_exit)

    # the join lands on the last launched op that is a GE task (not an input copy_, which
    # GE removes, nor a getitem or a view)
    launched = [n for n in schedule.order
                if schedule.stream_of[n] >= 0 and emits_task(by_name[n])]
    last = launched[-1] if join_before_last and launched and JOIN in waits else None
    if last is not None:
        if schedule.stream_of[last] != 0:
            raise ValueError(f"join_before_last needs the last launched op on the main "
                             f"stream; {last!r} is on stream {schedule.stream_of[last]}")
        waits[last] = waits.get(last, []) + [p for p in waits.pop(JOIN)
                                              if p not in waits.get(last, [])]
    current = 0
    for name in schedule.order:
        stream = schedule.stream_of[name]
        if stream < 0:  # a lane task (a transfer) is not a node: its launch runs it
            continue
        node = by_name[name]
        if stream != current:
            if current != 0:
                exit_scope(current)
            if stream != 0:
                emit(ops.scope_enter, ([STREAM_LABEL_KEY], [stream_label(stream)]))
                if stream in core_scopes:
                    keys = core_scopes[stream]
                    emit(ops.scope_enter, (list(keys), [keys[k] for k in keys]))
            current = stream
        if name in waits:
            emit(ops.wait, ([tokens[p] for p in waits[name]],))
        cursor.append(node)
        cursor = node
        if name in recorded:
            token = emit(ops.record)
            if token_val is not None:
                token.meta["val"] = token_val
            tokens[name] = token
    if current != 0:
        exit_scope(current)
    if JOIN in waits:
        emit(ops.wait, ([tokens[p] for p in waits[JOIN]],))
    cursor.append(output)
    graph.lint()
    gm.recompile()
    return inserted
