"""What must happen before each op of a rewritten graph, on another stream: the verifier's dependences.

The dependences are those :func:`autostream.dialects.verify.verify_rewrite` and
:func:`autostream.planning.check.check` check: :func:`autostream.fx.graph.build_op_graph`
of the graph without its stream ops (read as a hand placement is,
:func:`autostream.dialects.hand.strip_stream_ops`) — data; memory on storages, views
included (read-after-write, write-after-read, write-after-write); random and side-effect
order; collective order — plus the effects a lifted graph's nodes carry
(:meth:`autostream.fx.call_effects.GraphEffects.of_lifted`).  Their direction is the
graph's linear order, the order the sequential runtime runs.  The race sanitizer
(:mod:`autostream.runtime.sanitizer`) checks each before its op runs; it is computed once
per runner.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch.fx

from autostream.dialects.hand import strip_stream_ops
from autostream.fx.call_effects import GraphEffects
from autostream.fx.graph import OpGraph, build_op_graph, dependence_storage, memory_hazard
from autostream.runtime.program import StreamProgram


@dataclass(frozen=True)
class Order:
    """``before``, on stream ``stream``, must happen before the op this order belongs to.

    ``kind`` is the dependence's (``"data"``, ``"memory"``, ``"effect"``, ``"comm"``);
    ``storage`` the storage both touch (its graph input's or op's name) and ``hazard``
    which one (``"write-after-read"``...), for a memory dependence.
    """

    before: torch.fx.Node
    stream: int
    kind: str = "data"
    storage: str = ""
    hazard: str = ""


def rewritten_dependences(gm: torch.fx.GraphModule) -> OpGraph:
    """The dependence graph of a rewritten graph's ops (node names kept; ``gm`` unchanged).

    >>> import torch
    >>> from autostream.runtime.builder import DialectBuilder
    >>> b = DialectBuilder(); x = b.input("x")
    >>> with b.stream(1):
    ...     y = b.call(torch.ops.aten.neg.default, x)
    >>> z = b.call(torch.ops.aten.mul_.Tensor, x, 2.0)
    >>> sorted(rewritten_dependences(b.finish(y, z)).edges(data="kind"))
    [('neg_default', 'mul__tensor', 'memory')]
    """
    clean = strip_stream_ops(torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)))
    return GraphEffects.of_lifted(clean.graph).add_to(build_op_graph(clean))


def cross_stream_orders(gm: torch.fx.GraphModule, program: StreamProgram
                        ) -> dict[torch.fx.Node, tuple[Order, ...]]:
    """Op (and the graph's output) -> the orders it needs from ops on other streams.

    The output needs only what it reads (the runtime joins every stream before returning).

    >>> import torch
    >>> from autostream.runtime.builder import DialectBuilder
    >>> from autostream.runtime.program import parse_program
    >>> b = DialectBuilder(); x = b.input("x")
    >>> with b.stream(1):
    ...     y = b.call(torch.ops.aten.mm.default, x, x)
    >>> z = b.call(torch.ops.aten.mul_.Tensor, x, 2.0)
    >>> gm = b.finish(y, z)
    >>> [(o.before.name, o.hazard) for o in cross_stream_orders(gm, parse_program(gm))[z]]
    [('mm_default', 'write-after-read')]
    """
    stream_of = program.stream_of
    by_name = {n.name: n for n in stream_of}
    deps = rewritten_dependences(gm)
    out: dict[torch.fx.Node, tuple[Order, ...]] = {}
    inputs = frozenset(program.placeholders) | frozenset(program.constants)
    for step in program.steps:
        if step.kind != "op":
            continue
        v = step.node
        orders = {u: Order(u, stream_of.get(u, 0)) for u in v.all_input_nodes
                  if u not in inputs and stream_of.get(u, 0) != step.stream}
        if v.name in deps:
            for name, _, kind in deps.in_edges(v.name, data="kind", default="data"):
                u = by_name[name]
                if u in orders or stream_of[u] == step.stream:
                    continue
                storage = dependence_storage(u, v) if kind == "memory" else ""
                orders[u] = Order(u, stream_of[u], kind, storage,
                                  memory_hazard(u, v, storage) if storage else "")
        if orders:
            out[v] = tuple(orders.values())
    output = program.output
    out[output] = tuple(Order(u, stream_of.get(u, 0)) for u in output.all_input_nodes
                        if u not in inputs and stream_of.get(u, 0) != 0)
    return out
