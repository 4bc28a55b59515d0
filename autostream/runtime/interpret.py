"""The interpreter loop every runtime shares: walk a stream's steps, call the runtime's hooks.

A runtime supplies :class:`Hooks`, one method per kind of step: ``op``, ``record``,
``wait``, ``segment`` (a run of ops the threads runtime runs as one function:
:mod:`autostream.runtime.segments`) and ``release``, called after a step with the values
it frees (``Step.release``, :mod:`autostream.memory.lifetimes`).  What differs between runtimes
(events, device streams, worker threads, the sanitizer, spans, memory accounting) lives
in their hooks; the order of the calls is decided here only.

>>> import torch
>>> from autostream.runtime.builder import DialectBuilder
>>> from autostream.runtime.program import parse_program
>>> b = DialectBuilder(); x = b.input("x")
>>> y = b.call(torch.ops.aten.neg.default, x)
>>> gm = b.finish(y)
>>> hooks = EnvHooks(gm, {parse_program(gm).placeholders[0]: torch.tensor(2.0)})
>>> interpret(parse_program(gm).steps, hooks)
>>> list(hooks.env.values())
[tensor(-2.)]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.fx

from autostream.runtime.execute import Env, run_op
from autostream.runtime.program import Step

__all__ = ["EnvHooks", "Hooks", "Item", "interpret"]


class Item(Protocol):
    """A step or a segment: ``kind`` picks its hook, ``release`` what it frees."""

    kind: str
    release: tuple[torch.fx.Node, ...]


class Hooks(Protocol):
    """What a runtime does for each kind of step (one object per call, holding its state)."""

    def op(self, step: Step) -> None: ...
    def record(self, step: Step) -> None: ...
    def wait(self, step: Step) -> None: ...
    def segment(self, segment: Any) -> None: ...
    def release(self, values: tuple[torch.fx.Node, ...]) -> None: ...


def interpret(items: Iterable[Item], hooks: Hooks) -> None:
    """Run ``items`` in order: the hook of each item's kind, then ``release`` if it frees values."""
    handlers = {"op": hooks.op, "record": hooks.record, "wait": hooks.wait,
                "segment": hooks.segment}
    release = hooks.release
    for item in items:
        handlers[item.kind](item)
        if item.release:
            release(item.release)


class EnvHooks:
    """Hooks of a runtime that runs everything on the calling thread, in one environment.

    Ops store their value in ``env``, records an empty token value, waits do nothing
    (program order already satisfies them), segments run op by op, released values
    are dropped from ``env``.
    """

    def __init__(self, gm: torch.fx.GraphModule, env: Env):
        self.gm = gm
        self.env = env

    def op(self, step: Step) -> None:
        self.env[step.node] = run_op(self.gm, step, self.env)

    def record(self, step: Step) -> None:
        self.env[step.node] = torch.empty(0)

    def wait(self, step: Step) -> None:
        """Nothing to wait for: every step before it has run."""

    def segment(self, segment: Any) -> None:
        for step in segment.steps:
            self.op(step)

    def release(self, values: tuple[torch.fx.Node, ...]) -> None:
        env = self.env
        for value in values:
            env.pop(value, None)
