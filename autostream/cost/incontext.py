"""In-graph op timing: run a whole captured graph with a clock mark after every op.

An op inside its graph meets a colder cache (its weights were evicted by the ops
before it) and a different allocator state than the same op in a tight loop, and
runs measurably slower there.  Timing each node
between two marks of an instrumented copy of the graph measures what the planner
will actually see.  CPU marks are ``time.perf_counter_ns``; accelerator marks are
device events recorded on the current stream.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: (x @ x).relu(), tracing_mode="fake")(torch.ones(8, 8))
>>> times = time_graph_ops(gm, torch.device("cpu"), warmup=1, runs=3)
>>> sorted(times), len(times["mm"])
(['mm', 'relu'], 3)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from autostream.cost.inputs import make_tensor
from autostream.cost.signature import symint_hint, tensor_spec
from autostream.stages import collector_paused


def graph_inputs(gm: torch.fx.GraphModule, device: torch.device, seed: int = 0) -> list[Any]:
    """Random inputs for ``gm``'s placeholders, from their ``meta["val"]``."""

    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            out.append(make_tensor(tensor_spec(val), device, gen))
        elif isinstance(val, torch.SymInt):
            out.append(symint_hint(val))
        else:
            out.append(val)
    return out


def written_placeholders(gm: torch.fx.GraphModule) -> set[str]:
    """Names of the placeholders some op of ``gm`` writes in place (its schema says so)."""
    written: set[str] = set()
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, torch.fx.Node) and v.op == "placeholder":
                    written.add(v.name)
    return written


def own_inputs(gm: torch.fx.GraphModule, args: Sequence[Any], device: torch.device) -> list[Any]:
    """``args`` (a graph's real arguments) on ``device``, the ones ``gm`` writes cloned, so
    that timing the graph on its own data leaves the caller's tensors (a KV cache, running
    statistics) as they were.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda c, x: c.add_(x))(torch.zeros(2), torch.ones(2))
    >>> cache = torch.zeros(2)
    >>> args = own_inputs(gm, [cache, torch.ones(2)], torch.device("cpu"))
    >>> _ = gm(*args); cache.tolist(), args[0].tolist()
    ([0.0, 0.0], [1.0, 1.0])
    """
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise ValueError(f"the graph has {len(placeholders)} placeholders but {len(args)} "
                         "arguments were given")
    written = written_placeholders(gm)
    out: list[Any] = []
    for name, a in zip(placeholders, args):
        if isinstance(a, torch.Tensor):
            a = a.detach().to(device, copy=name in written)
        out.append(a)
    return out


def _marker(device: torch.device) -> Callable[[], Any]:
    if device.type == "cpu":
        return time.perf_counter_ns

    def mark() -> torch.Event:
        e = torch.Event(device=device, enable_timing=True)
        e.record()
        return e

    return mark


def instrument(gm: torch.fx.GraphModule, mark: Callable[[], Any]
               ) -> tuple[torch.fx.GraphModule, list[str]]:
    """A copy of ``gm`` returning ``(outputs, marks)``: one mark before the first op and
    one after each ``call_function`` node; also the names of the timed nodes."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    marks: list[torch.fx.Node] = []
    names: list[str] = []
    out_value = None
    for node in gm.graph.nodes:
        if node.op == "output":
            out_value = torch.fx.map_arg(node.args[0], lambda n: env[n])
            continue
        if node.op == "call_function" and not marks:
            marks.append(graph.call_function(mark))
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node.op == "call_function":
            marks.append(graph.call_function(mark))
            names.append(node.name)
    graph.output((out_value, marks))
    return torch.fx.GraphModule(gm, graph), names


class GraphTimer:
    """An instrumented copy of one graph with its inputs (default: fixed random ones), run on
    demand."""

    def __init__(self, gm: torch.fx.GraphModule, device: torch.device,
                 inputs: list[Any] | None = None, seed: int = 0) -> None:
        self.device = device
        self.timed, self.names = instrument(gm, _marker(device))
        self.args = graph_inputs(gm, device, seed) if inputs is None else inputs

    def run(self, warmup: int, runs: int) -> dict[str, list[float]]:
        """Per-node times (us) over ``runs`` runs after ``warmup`` untimed ones."""
        out: dict[str, list[float]] = {n: [] for n in self.names}
        with torch.no_grad():
            for _ in range(warmup):
                self.timed(*self.args)
            with collector_paused():
                results = [self.timed(*self.args)[1] for _ in range(runs)]
        if self.device.type != "cpu":
            torch.accelerator.synchronize(self.device)
        for marks in results:
            for i, name in enumerate(self.names):
                a, b = marks[i], marks[i + 1]
                out[name].append((b - a) / 1e3 if isinstance(a, int) else a.elapsed_time(b) * 1e3)
        return out


def time_graph_ops(gm: torch.fx.GraphModule, device: torch.device, warmup: int = 3,
                   runs: int = 20, inputs: list[Any] | None = None
                   ) -> dict[str, list[float]]:
    """Per-node times (us) over ``runs`` runs of the whole graph on ``inputs`` (default:
    random ones)."""
    return GraphTimer(gm, device, inputs).run(warmup, runs)

