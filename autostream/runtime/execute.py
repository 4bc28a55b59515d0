"""Running single FX nodes against an environment, shared by every runtime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from autostream.dialects.torchair import stream_label
from autostream.runtime.program import Step

Env = dict[torch.fx.Node, Any]


class StreamRuntimeError(RuntimeError):
    """An op failed while a runtime executed it; names the op and its stream.

    The original exception is chained as ``__cause__``.
    """

    def __init__(self, node: torch.fx.Node, stream: int, cause: BaseException):
        where = "main stream" if stream == 0 else stream_label(stream)
        super().__init__(
            f"op {node.name!r} ({_target_name(node)}) on the {where} raised "
            f"{type(cause).__name__}: {cause}"
        )
        self.node_name = node.name
        self.stream = stream


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


def load(env: Env, node: torch.fx.Node, consumer: torch.fx.Node) -> Any:
    try:
        return env[node]
    except KeyError:
        raise RuntimeError(
            f"{consumer.name!r} read {node.name!r} before it was produced "
            f"(missing record/wait between their streams?)"
        ) from None


def run_node(gm: torch.nn.Module, node: torch.fx.Node, env: Env) -> Any:
    """Run one ``call_function`` / ``call_method`` / ``call_module`` node.

    >>> import torch, torch.fx
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.neg, (x,))
    >>> run_node(torch.nn.Module(), y, {x: torch.tensor(2.0)})
    tensor(-2.)
    """
    try:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
    except KeyError:  # again, to name the value read before it was produced
        args, kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda n: load(env, n, node))
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        self_obj, *rest = args
        return getattr(self_obj, node.target)(*rest, **kwargs)
    if node.op == "call_module":
        return gm.get_submodule(node.target)(*args, **kwargs)
    raise ValueError(f"cannot run node {node.name!r} of kind {node.op!r}")


def run_op(gm: torch.nn.Module, step: Step, env: Env) -> Any:
    """The value of op ``step``; a failure is a :class:`StreamRuntimeError` naming the op
    and its stream.

    >>> import torch, torch.fx
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.div, (x, "two"))
    >>> run_op(torch.nn.Module(), Step("op", y, 1), {x: torch.tensor(2.0)})
    Traceback (most recent call last):
    ...
    autostream.runtime.execute.StreamRuntimeError: op 'div' (div) on the stream_1 raised TypeError: ...
    """
    try:
        return run_node(gm, step.node, env)
    except Exception as exc:
        raise StreamRuntimeError(step.node, step.stream, exc) from exc


def fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def bind_inputs(gm: torch.fx.GraphModule, program, inputs: tuple[Any, ...]) -> Env:
    """Environment with placeholders bound to ``inputs`` and ``get_attr`` constants."""
    flat = gm.graph._codegen.process_inputs(*inputs)
    if len(flat) != len(program.placeholders):
        names = [p.name for p in program.placeholders]
        raise TypeError(
            f"graph expects {len(names)} inputs {names}, got {len(flat)}"
        )
    env: Env = dict(zip(program.placeholders, flat, strict=True))
    for node in program.constants:
        env[node] = fetch_attr(gm, node.target)
    return env


def collect_outputs(gm: torch.fx.GraphModule, program, env: Env) -> Any:
    out = torch.fx.node.map_arg(program.output.args[0], lambda n: load(env, n, program.output))
    return gm.graph._codegen.process_outputs(out)


Runner = Callable[..., Any]
