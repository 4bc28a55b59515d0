"""Running single FX nodes against an environment, shared by every runtime."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from autostream.dialects.torchair import stream_label
from autostream.runtime.program import Step

Env = dict[torch.fx.Node, Any]

#: tracebacks print ``__notes__`` (Python 3.11+)
_NOTES_SHOWN = sys.version_info >= (3, 11)


def where_note(node: torch.fx.Node, stream: int) -> str:
    """The note a runtime adds to the exception of an op that failed: the op and its stream.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> where_note(g.call_function(torch.neg, (x,)), 1)
    "autostream: raised by op 'neg' (neg) on the stream_1"
    """
    where = "main stream" if stream == 0 else stream_label(stream)
    return f"autostream: raised by op {node.name!r} ({_target_name(node)}) on the {where}"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+), once; on 3.10 ``__notes__`` is set by hand
    (the traceback shows it from 3.11 on; :func:`run_op` also chains it there)."""
    notes = getattr(exc, "__notes__", None)
    if notes is not None and not isinstance(notes, list):
        return  # replaced by its owner: ``add_note`` would raise instead of the op's error
    if notes is not None and note in notes:
        return
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*(notes or ()), note]


class OpLocation(Exception):
    """Where an op failed, chained to its exception where notes are not shown (Python 3.10)."""


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
    """The value of op ``step``.  An op that fails raises its own exception, the same
    object (``except IndexError`` still catches it, wherever the op ran), with a note
    naming the op and its stream (:func:`where_note`).

    >>> import torch, torch.fx
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.div, (x, "two"))
    >>> try:
    ...     run_op(torch.nn.Module(), Step("op", y, 1), {x: torch.tensor(2.0)})
    ... except TypeError as exc:
    ...     print(exc.__notes__)
    ["autostream: raised by op 'div' (div) on the stream_1"]
    """
    try:
        return run_node(gm, step.node, env)
    except Exception as exc:
        reraise_from_op(exc, step)


def reraise_from_op(exc: Exception, step: Step) -> None:
    """Raise ``exc`` again, the same object, with the note naming ``step``'s op and stream
    (chained as its cause where notes are not shown).  Call it inside ``except``."""
    note = where_note(step.node, step.stream)
    add_note(exc, note)
    if _NOTES_SHOWN or exc.__cause__ is not None or exc.__context__ is not None:
        raise exc
    raise exc from OpLocation(note)  # still ``exc``, with the note shown as its cause


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
