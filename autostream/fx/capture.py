"""Capture the post-AOT ATen graphs ``torch.compile`` produces for a model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from autostream.fx.call_effects import EffectsUnknown, aot_mutated_inputs


@dataclass(frozen=True)
class CapturedGraph:
    """A post-AOT graph and the real arguments it was first called with (lifted
    parameters included), so it can be run on its own; ``dynamo`` is the graph
    Dynamo captured, which AOTAutograd traced into ``gm``, and ``dynamo_args`` its
    real arguments."""

    gm: torch.fx.GraphModule
    args: tuple[object, ...]
    dynamo: torch.fx.GraphModule | None = None
    dynamo_args: tuple[object, ...] = ()
    #: the ``dynamo`` inputs AOTAutograd found mutated (``None``: unknown)
    mutated_inputs: frozenset[str] | None = None


def capture(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
            dynamic: bool | None = False) -> list[CapturedGraph]:
    """Compile ``model`` once and return each post-AOT graph with its real arguments.

    >>> [c] = capture(torch.nn.ReLU(), (torch.randn(2),))
    >>> [n.target for n in c.gm.graph.nodes if n.op == "call_function"]
    [<OpOverload(op='aten.relu', overload='default')>]
    """
    graphs: list[torch.fx.GraphModule] = []
    args_of: dict[int, tuple[object, ...]] = {}

    def keep(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]):
        index = len(graphs)
        graphs.append(gm)

        def run(*args):
            args_of.setdefault(index, tuple(args))
            return gm.forward(*args)

        return make_boxed_func(run)

    dynamo_graphs: list[tuple[torch.fx.GraphModule, tuple[object, ...]]] = []
    mutated: list[frozenset[str] | None] = []
    aot = aot_autograd(fw_compiler=keep)

    def backend(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]):
        dynamo_graphs.append((gm, tuple(inputs)))
        compiled = aot(gm, inputs)
        try:
            mutated.append(aot_mutated_inputs(gm))
        except EffectsUnknown:
            mutated.append(None)
        return compiled

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        compiled(*example_inputs)
    torch._dynamo.reset()
    # Under no_grad each Dynamo graph gives exactly one inference graph, in order.
    paired = len(dynamo_graphs) == len(graphs)
    return [CapturedGraph(gm, args_of.get(i, ()),
                          *((*dynamo_graphs[i], mutated[i]) if paired else (None, (), None)))
            for i, gm in enumerate(graphs)]


def capture_graphs(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                   dynamic: bool | None = False) -> list[torch.fx.GraphModule]:
    """The post-AOT ATen GraphModules (one per Dynamo graph) of ``model``."""
    return [c.gm for c in capture(model, example_inputs, dynamic)]
