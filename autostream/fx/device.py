"""The device type a graph runs on, read from its inputs."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx


def graph_device(graph: torch.fx.Graph, example_inputs: Any = None) -> str:
    """The device type of the graph's first tensor input (``"cpu"`` when none says).

    >>> g = torch.fx.Graph(); x = g.placeholder("x"); x.meta["val"] = torch.empty(1, device="meta")
    >>> graph_device(g)
    'meta'
    """
    for node in graph.find_nodes(op="placeholder"):
        value = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(value, torch.Tensor):
            return value.device.type
    for value in example_inputs or ():
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"
