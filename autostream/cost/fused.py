"""Costs as Inductor runs a graph: a pointwise op fused into its pointwise producer is free.

Inductor fuses a chain of pointwise ops into one kernel that reads the chain's inputs and
writes its output once; for memory-bound elementwise work that kernel takes about as long
as the chain's first op alone.  :class:`FusedCosts` wraps a cost model: a pointwise op
whose pointwise producer has it as only user costs nothing (``source="free"``, ``note``
names the producer); everything else is the wrapped model's.  The planner then sees a
chain as one task with free followers, and splitting it across streams only adds syncs.
What is not modelled: epilogues fused into reductions or matmuls, horizontal fusion.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.fx

from autostream.cost.model import FREE, OpCost
from autostream.cost.protocol import CostModel


def is_pointwise(node: torch.fx.Node) -> bool:
    """A call of an ATen overload tagged pointwise.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> is_pointwise(g.call_function(torch.ops.aten.relu.default, (x,)))
    True
    """
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and torch.Tag.pointwise in target.tags)


def fused_producers(graph: torch.fx.Graph) -> dict[str, str]:
    """Pointwise op -> the pointwise producer Inductor fuses it into (vertical fusion of a
    single-user producer).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> a = g.call_function(torch.ops.aten.relu.default, (x,))
    >>> b = g.call_function(torch.ops.aten.tanh.default, (a,))
    >>> fused_producers(g)
    {'tanh_default': 'relu_default'}
    """
    out = {}
    for node in graph.nodes:
        if not is_pointwise(node):
            continue
        for p in node.all_input_nodes:
            if is_pointwise(p) and len(p.users) == 1:
                out[node.name] = p.name
                break
    return out


class FusedCosts:
    """``base``'s estimates, with the ops of :func:`fused_producers` free."""

    def __init__(self, base: CostModel, graph: torch.fx.Graph) -> None:
        self.base = base
        self.fused = fused_producers(graph)
        self.sync_latency_us = base.sync_latency_us
        self.runtime_op_us = base.runtime_op_us
        self.runtime_call_us = base.runtime_call_us
        self.runtime_segment_us = base.runtime_segment_us

    def estimate(self, node: torch.fx.Node) -> OpCost:
        producer = self.fused.get(node.name)
        if producer is None:
            return self.base.estimate(node)
        return replace(FREE, note=f"fused into {producer} by Inductor")

    def transfer(self, collective, nbytes, backend=None, world_size=None):
        return self.base.transfer(collective, nbytes, backend, world_size)

    def __getattr__(self, name: str):  # what else a model offers (``profile``, ``table``)
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


def split_fusions(fused: dict[str, str], stream_of: dict[str, int]) -> list[tuple[str, str]]:
    """The (op, producer) fusions a plan puts on two streams (Inductor will not fuse them).

    >>> split_fusions({"b": "a", "c": "b"}, {"a": 0, "b": 0, "c": 1})
    [('c', 'b')]
    """
    return [(op, p) for op, p in fused.items()
            if op in stream_of and p in stream_of and stream_of[op] != stream_of[p]]
