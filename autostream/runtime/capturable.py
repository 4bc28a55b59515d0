"""Whether a graph can be captured into a device graph, and if not, why (read from the graph).

A capture records kernels, not host work, so a graph is refused when it holds:

- **host syncs**: ops whose result the host reads (``.item()``, ``_local_scalar_dense``:
  ``Tag.data_dependent_output``) or whose output size depends on data (``nonzero``,
  ``masked_select``, boolean indexing, ``bincount``: their values carry *unbacked*
  symbolic sizes, or the op is tagged ``dynamic_output_shape``);
- **collectives**: every rank would have to capture, and replay, the same collectives at
  the same points; autostream never arranges that behind the program's back;
- **host tensors**: an op computing on the CPU, or a CPU tensor input, inside a graph for
  an accelerator (a 0-d CPU tensor is passed to kernels by value: capture bakes it in).

What only torch can tell (an op it refuses during capture) is caught by the runner,
which then runs the graph as the streams runtime does and says why.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
>>> capture_refusal(gm, "cpu")
'no graph capture on cpu: its device module has none of CUDAGraph, NPUGraph, XPUGraph'
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from autostream.comm import has_communication
from autostream.runtime.graph_api import TorchGraphAPI

__all__ = ["capture_refusal", "graph_refusal"]


def capture_refusal(gm: torch.fx.GraphModule, device_type: str,
                    example_inputs: Any = None) -> str | None:
    """Why ``gm`` cannot be captured on ``device_type`` (``None``: it can, as far as the
    graph tells).  ``example_inputs``: its inputs, checked for host tensors."""
    return (TorchGraphAPI.no_capture(torch.device(device_type))
            or graph_refusal(gm.graph, device_type, example_inputs))


def graph_refusal(graph: torch.fx.Graph, device_type: str, example_inputs: Any = None
                  ) -> str | None:
    """The graph-level reasons of :func:`capture_refusal`, device support aside.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: x.nonzero(), tracing_mode="symbolic")(torch.ones(3))
    >>> graph_refusal(gm.graph, "cuda")
    "op 'nonzero' (aten.nonzero.default) makes the host wait for the device (its output size depends on data); the graph runs uncaptured"
    """
    if has_communication(graph):
        return ("the graph communicates: a collective in a device graph must be captured and "
                "replayed by every rank at the same point, which autostream does not arrange; "
                "the graph runs uncaptured")
    for x in example_inputs or ():
        if isinstance(x, torch.Tensor) and x.device.type != device_type:
            return (f"an input is a {x.device.type} tensor ({tuple(x.shape)}): capture would "
                    f"bake its value into the graph; move it to {device_type}")
    for node in graph.nodes:
        why = _node_refusal(node, device_type)
        if why is not None:
            return f"op {node.name!r} ({_target(node)}) {why}; the graph runs uncaptured"
    return None


def _target(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return f".{t}()"
    return str(getattr(t, "__name__", t)) if not isinstance(t, torch._ops.OpOverload) else str(t)


def _node_refusal(node: torch.fx.Node, device_type: str) -> str | None:
    if node.op == "call_method" and node.target in ("item", "tolist", "cpu", "numpy"):
        return "reads a value on the host"
    if node.op not in ("call_function", "call_method", "call_module"):
        return None
    tags = getattr(node.target, "tags", ()) or ()
    if torch.Tag.data_dependent_output in tags:
        return "reads a value on the host"
    val = node.meta.get("val", node.meta.get("example_value"))
    if _unbacked(val) or (torch.Tag.dynamic_output_shape in tags and not _int_indexing(node)):
        return "makes the host wait for the device (its output size depends on data)"
    for t in tree_leaves(val):
        if isinstance(t, torch.Tensor) and t.device.type not in (device_type, "meta"):
            return (f"computes a {t.device.type} tensor inside a {device_type} graph (host "
                    f"work is not captured)")
    return None


def _unbacked(val: Any) -> bool:
    if val is None:
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(val))
    except Exception:  # noqa: BLE001 - an exotic value: no symbols to read
        return False


def _int_indexing(node: torch.fx.Node) -> bool:
    """``aten.index.Tensor`` with integer indices only: its output size is static (the
    ``dynamic_output_shape`` tag is there for boolean masks)."""
    if node.target is not torch.ops.aten.index.Tensor or len(node.args) < 2:
        return False
    for index in node.args[1]:
        if index is None:
            continue
        val = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dtype in (torch.bool, torch.uint8):
            return False
    return True
