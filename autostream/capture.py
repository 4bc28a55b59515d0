"""Capture the post-AOT ATen graphs ``torch.compile`` produces for a model."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func


def capture_graphs(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                   dynamic: bool | None = False) -> list[torch.fx.GraphModule]:
    """The post-AOT ATen GraphModules (one per Dynamo graph) of ``model`` on ``example_inputs``.

    >>> gms = capture_graphs(torch.nn.ReLU(), (torch.randn(2),))
    >>> [n.target for n in gms[0].graph.nodes if n.op == "call_function"]
    [<OpOverload(op='aten.relu', overload='default')>]
    """
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep), dynamic=dynamic)
    with torch.no_grad():
        compiled(*example_inputs)
    torch._dynamo.reset()
    return graphs
