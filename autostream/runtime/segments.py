"""Straight runs of one stream's ops, each run as one generated Python function.

A **segment** is a maximal run of consecutive ops of one stream between two of its
syncs.  Before the first call, each segment becomes a straight-line Python function
(:func:`segment_source`): one line per op calling its target, pre-resolved (an ATen
``OpOverload`` as its C++ function), with the node's constant arguments bound once.
A call reads the segment's inputs from the environment, runs every op once, in
program order, and stores the values read after it; intermediate values are dropped
after their last use.  Compared with the op-by-op loop it skips, per op, the
interpreter's hook dispatch, ``map_arg`` over the node's arguments and the
environment's look-ups (``docs/cpu-runtime.md`` measures what that buys).

Nothing is kept between calls but the program: every op runs on every call, so a
factory op (``zeros``, ``full``, ``arange``, ``randn``) makes a fresh tensor each call
and an op that writes its inputs writes once.  This replaces TorchScript tracing,
which recorded tensor-less factory ops as constants: from the third call on, a
traced segment returned one shared tensor, which later in-place writes and callers'
edits accumulated in.  Communication (collectives, waits: ``autostream.comm``) is
never part of a segment: it runs op by op, in the order the plan fixed.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, ClassVar

import torch
import torch.fx

from autostream.comm import comm_op
from autostream.runtime.execute import Env, load, reraise_from_op
from autostream.runtime.program import Step, StreamProgram

#: segments shorter than this run op by op (one op gains nothing from a function)
MIN_SEGMENT_OPS = 2


@dataclass
class Segment:
    """Consecutive ``op`` steps of one stream, run as one generated function.

    ``inputs``: values the segment reads that are produced elsewhere; ``outputs``:
    values it produces that are read after it (or returned); ``release``: what the
    stream may drop once the segment has run.  ``function`` (set by
    :meth:`SegmentRunner.prepare`) takes the environment and stores the outputs in it.
    """

    #: the hook that runs it (:func:`autostream.runtime.interpret.interpret`)
    kind: ClassVar[str] = "segment"
    stream: int
    steps: tuple[Step, ...]
    inputs: tuple[torch.fx.Node, ...]
    outputs: tuple[torch.fx.Node, ...]
    release: tuple[torch.fx.Node, ...]
    function: Callable[[Env], None] | None = field(default=None, repr=False)
    #: source line of the generated function -> the step it runs (``None``: an input read)
    lines: dict[int, Step | None] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return [s.node.name for s in self.steps]


def _segment(stream: int, steps: list[Step]) -> Segment:
    nodes = {s.node for s in steps}
    inputs: dict[torch.fx.Node, None] = {}
    for s in steps:
        for n in s.node.all_input_nodes:
            if n not in nodes:
                inputs.setdefault(n)
    outputs = tuple(s.node for s in steps if any(u not in nodes for u in s.node.users))
    release = tuple(dict.fromkeys(v for s in steps for v in s.release))
    return Segment(stream, tuple(steps), tuple(inputs), outputs, release)


def split_segments(program: StreamProgram, stream: int, min_ops: int = MIN_SEGMENT_OPS
                   ) -> list[Step | Segment]:
    """``program.streams[stream]`` with each run of at least ``min_ops`` ops as a ``Segment``.

    >>> from autostream.runtime.builder import two_chains
    >>> from autostream.runtime.program import parse_program
    >>> gm, _ = two_chains(depth=3, streams=2)
    >>> [type(x).__name__ for x in split_segments(parse_program(gm), 1)]
    ['Segment', 'Step']
    """
    items: list[Step | Segment] = []
    run: list[Step] = []

    def close() -> None:
        if len(run) >= min_ops:
            items.append(_segment(stream, run))
        else:
            items.extend(run)
        run.clear()

    for step in program.streams[stream]:
        if step.kind == "op" and comm_op(step.node) is None:
            run.append(step)
        else:
            close()
            items.append(step)
    close()
    return items


def count_segments(program: StreamProgram) -> int:
    """Runs of consecutive ops over all streams (a single op between syncs counts too).

    >>> from autostream.runtime.builder import striped_chains
    >>> from autostream.runtime.program import parse_program
    >>> count_segments(parse_program(striped_chains(depth=8, segments=4)[0]))
    9
    """
    return sum(isinstance(item, Segment) for k in program.streams
               for item in split_segments(program, k, min_ops=1))


def _reads_nodes(arg: Any) -> bool:
    found = []
    torch.fx.node.map_arg(arg, found.append)
    return bool(found)


class _Source:
    """The lines and global names of one generated function."""

    def __init__(self) -> None:
        self.names: dict[torch.fx.Node, str] = {}
        self.globals: dict[str, Any] = {}
        self.bound = 0

    def bind(self, value: Any) -> str:
        """A global name holding ``value`` (the very object the node holds)."""
        name, self.bound = f"c{self.bound}", self.bound + 1
        self.globals[name] = value
        return name

    def expr(self, arg: Any) -> str:
        """``arg`` as an expression: nodes by their local, containers of nodes rebuilt each call."""
        if isinstance(arg, torch.fx.Node):
            return self.names[arg]
        if isinstance(arg, (list, tuple, dict, slice)) and not _reads_nodes(arg):
            # what ``map_arg`` would rebuild, minus the nodes: immutable, bound once
            return self.bind(torch.fx.node.map_aggregate(arg, lambda a: a))
        if isinstance(arg, tuple) and hasattr(arg, "_fields"):  # a named tuple
            return f"{self.bind(type(arg))}({''.join(f'{self.expr(a)}, ' for a in arg)})"
        if isinstance(arg, (list, tuple)):
            items = "".join(f"{self.expr(a)}, " for a in arg)
            return f"[{items}]" if isinstance(arg, list) else f"({items})"
        if isinstance(arg, dict):
            return "{" + "".join(f"{self.bind(k)}: {self.expr(v)}, " for k, v in arg.items()) + "}"
        if isinstance(arg, slice):
            return f"slice({self.expr(arg.start)}, {self.expr(arg.stop)}, {self.expr(arg.step)})"
        return self.bind(arg)

    def call(self, node: torch.fx.Node) -> str:
        args = [self.expr(a) for a in node.args]
        args += [f"{k}={self.expr(v)}" if k.isidentifier() and not keyword.iskeyword(k)
                 else f"**{{{self.bind(k)}: {self.expr(v)}}}" for k, v in node.kwargs.items()]
        if node.op == "call_function":
            target = node.target
            # OpOverload.__call__ only forwards to its C++ function: call that directly
            fn = target._op if type(target) is torch._ops.OpOverload else target
            return f"{self.bind(fn)}({', '.join(args)})"
        if node.op == "call_method":
            self_arg, *rest = args
            return f"getattr({self_arg}, {self.bind(node.target)})({', '.join(rest)})"
        if node.op == "call_module":
            return f"get_submodule({self.bind(node.target)})({', '.join(args)})"
        raise ValueError(f"cannot run node {node.name!r} of kind {node.op!r}")


def segment_source(seg: Segment) -> tuple[str, dict[str, Any], dict[int, Step | None]]:
    """The generated function's source, its globals, and which step each line runs.

    >>> from autostream.runtime.builder import two_chains
    >>> from autostream.runtime.program import parse_program
    >>> gm, _ = two_chains(depth=2, streams=2)
    >>> seg = split_segments(parse_program(gm), 1)[0]
    >>> print(segment_source(seg)[0])
    def segment(env):
        v0 = env[i0]
        v1 = env[i1]
        v2 = env[i2]
        v3 = c0(v0, v1); v0 = None; v1 = None
        v4 = c1(v3, v2); v3 = None; v2 = None
        env[o0] = v4
    """
    src = _Source()
    lines = ["def segment(env):"]
    where: dict[int, Step | None] = {}
    for i, node in enumerate(seg.inputs):
        src.names[node] = f"v{i}"
        src.globals[f"i{i}"] = node
        where[len(lines) + 1] = None
        lines.append(f"    v{i} = env[i{i}]")
    last_read: dict[torch.fx.Node, int] = {}
    for j, step in enumerate(seg.steps):
        for n in step.node.all_input_nodes:
            last_read[n] = j
    kept = set(seg.outputs)
    for j, step in enumerate(seg.steps):
        node = step.node
        line = f"    {src.names.setdefault(node, f'v{len(src.names)}')} = {src.call(node)}"
        if node not in kept and node not in last_read:
            line += f"; {src.names[node]} = None"  # nothing reads it
        line += "".join(f"; {src.names[n]} = None" for n in node.all_input_nodes
                        if last_read[n] == j and n not in kept)
        where[len(lines) + 1] = step
        lines.append(line)
    for i, node in enumerate(seg.outputs):
        src.globals[f"o{i}"] = node
        lines.append(f"    env[o{i}] = {src.names[node]}")
    return "\n".join(lines), src.globals, where


def _failed_line(exc: BaseException, code: CodeType) -> int | None:
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class SegmentRunner:
    """Runs segments (of any stream) as their generated functions.

    >>> from autostream.runtime.builder import two_chains
    >>> from autostream.runtime.execute import bind_inputs
    >>> from autostream.runtime.program import parse_program
    >>> gm, inputs = two_chains(depth=2, streams=2)
    >>> program = parse_program(gm)
    >>> seg = split_segments(program, 1)[0]
    >>> runner = SegmentRunner(gm); runner.prepare(seg)
    >>> env = bind_inputs(gm, program, inputs); runner.run(seg, env)
    >>> [n.name for n in seg.outputs if n in env] == [seg.steps[-1].node.name]
    True
    """

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm

    def prepare(self, seg: Segment) -> None:
        """Generate ``seg``'s function (before any call: it reads no values)."""
        source, scope, seg.lines = segment_source(seg)
        scope["get_submodule"] = self.gm.get_submodule
        filename = f"<autostream segment {seg.names[0]}..{seg.names[-1]}>"
        exec(compile(source, filename, "exec"), scope)  # noqa: S102 - our own generated code
        seg.function = scope["segment"]

    def run(self, seg: Segment, env: Env, state: Any = None) -> None:
        """Run ``seg`` on ``env`` (``state``: the call's thread state, already in force).

        What the segment frees (``seg.release``) is left to the caller's loop.  An op
        that fails raises its own exception, with a note naming it and its stream
        (:func:`~autostream.runtime.execute.run_op`).
        """
        if seg.function is None:
            self.prepare(seg)
        try:
            seg.function(env)
        except Exception as exc:
            line = _failed_line(exc, seg.function.__code__)
            if line not in seg.lines:
                raise
            step = seg.lines[line]
            if step is None:  # an input not produced yet: name it and its reader
                for node in seg.inputs:
                    load(env, node, next(s.node for s in seg.steps
                                         if node in s.node.all_input_nodes))
                raise
            reraise_from_op(exc, step)
