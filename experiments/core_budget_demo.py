"""A graph where a core budget helps, and a table that says so, for tests and the harness.

The main stream runs ``a = x @ w1`` (the whole chip, 10 us) and then a chain of fifteen
narrow ops on ``a`` (a quarter of the chip, 5 us each, the first a softmax); ``b = a @ w2`` (the whole chip,
20 us) can run beside the chain.  Without a budget ``b`` slows the chain down while
they overlap (their shares sum to 1.25); with three quarters of the chip for ``b``'s
stream the two fit and the chain runs at full speed.  The table is the shipped
``ascend910b`` with one entry per op of this graph (hand-written times and shares: an
illustration, not a measurement).  The chain is long enough that it, not the join of
``b`` back to the main stream, ends the plan even at the ACL graph's dearer syncs
(``autostream.scheduling.scope_events``), so the budget shows in both TorchAir modes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

#: hand-written (time us, share) per op of the demo graph
COSTS = {"aten.mm.default": (10.0, 1.0), "wide": (20.0, 1.0), "narrow": (5.0, 0.25)}


class WideBeside(nn.Module):
    """``a = x @ w1``; ``b = a @ w2`` beside fifteen narrow elementwise ops on ``a``."""

    def __init__(self, n: int = 64) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(n, n) / n)
        self.w2 = nn.Parameter(torch.randn(n, 2 * n) / n)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x @ self.w1
        b = a @ self.w2
        # softmax first: no in-place variant, so TorchAir's ACL reinplace cannot write ``a``
        # while ``b`` reads it (``dialects.torchair_modes.acl_reinplace_hazards``)
        c = torch.softmax(a, -1)
        for f in (torch.relu, torch.sigmoid, torch.tanh, torch.neg, torch.exp, torch.abs,
                  torch.sin) * 2:
            c = f(c)
        return c, b


def demo_model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model and its example input."""
    torch.manual_seed(0)
    return WideBeside().eval(), (torch.randn(64, 64),)


def demo_table(path: str | Path) -> Path:
    """Write the ``ascend910b`` table with this graph's op costs to ``path``."""
    import cost_models
    from autostream.cost.free import is_free_target
    from autostream.cost.signature import node_signature
    from autostream.cost.table import CostTable, Entry
    from autostream.fx.capture import capture_graphs

    base = CostTable.load(cost_models.table_path("ascend910b"))
    model, inputs = demo_model()
    entries = {}
    for gm in capture_graphs(model, inputs):
        for node in gm.graph.nodes:
            if node.op != "call_function" or is_free_target(node.target):
                continue
            sig = node_signature(node)
            name = str(sig.op)
            kind = name if name != "aten.mm.default" else (
                "wide" if "128" in sig.key else "aten.mm.default")
            us, share = COSTS.get(kind, COSTS["narrow"])
            entries[(sig.op, sig.key)] = Entry(
                op=sig.op, signature=sig.key, dtype="f32", flops=sig.flops, bytes=sig.bytes,
                median_us=us, spread_us=0.0, samples=1, share=share, provenance="profile")
    return replace(base, entries=tuple(entries.values())).save(path)
