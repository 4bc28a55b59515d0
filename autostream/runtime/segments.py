"""Straight runs of one stream's ops, compiled with TorchScript so the stream runs them without the GIL.

Why: each op called from Python takes the GIL back when it returns.  While another
stream also runs ops from Python, the two threads hand the GIL to each other around
every op, and each hand-over waits for a thread to wake up, as long as a small op:
two streams of small ops called from Python run slower than one, while the same ops
as traced TorchScript functions, which run their whole graph with the GIL released,
overlap (``docs/cpu-runtime.md``).

A **segment** is a maximal run of consecutive ops of one stream between two of its
syncs.  On its first call it runs op by op in Python (the reference), is traced with
``torch.jit.trace`` on those same inputs, and the traced function is run again and
compared with the reference, bit for bit: only a segment whose outputs are equal is
used in later calls.  It is run as many times as TorchScript's profiling executor
takes to reach its optimised graph (profiled runs, then one that optimises), each
run compared: the graph that later calls run is the one verified, and the first
measured calls (``runtime.choice``) do not pay for the optimisation, which makes the
first calls several times slower.  Never traced (they
run op by op): segments of fewer than ``min_ops`` ops, ops that may write their
inputs (running them twice would apply the write twice) or keep program order (RNG,
side effects), inputs or outputs that are not tensors, inputs recording autograd
history, and anything ``torch.jit.trace`` refuses.  Communication (collectives,
waits: ``autostream.comm``) is never part of a segment: it runs op by op, once per
call, in the order the plan fixed (a trace would issue a collective again).  Later
calls whose inputs differ in shape or dtype from the traced call's
run op by op too (a trace may have fixed what the ops computed from them).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.fx

from autostream.call_effects import EFFECTS_KEY
from autostream.comm import comm_op
from autostream.graph import op_effects, target_name, writes_inputs_by_name
from autostream.runtime.execute import Env, load, run_op
from autostream.runtime.program import Step, StreamProgram
from autostream.thread_state import ThreadState

log = logging.getLogger("autostream")

#: segments shorter than this run op by op (one op already releases the GIL itself)
MIN_SEGMENT_OPS = 2

#: ``warnings.catch_warnings`` edits the process-wide filters: streams tracing their
#: first segments at the same time take turns
_TRACE_LOCK = threading.Lock()


def _signature(args: Sequence[Any]) -> list[tuple[Any, Any]] | None:
    """Shape and dtype of each input (``None`` if one is not a tensor).

    Strides and devices are left out: a trace records ops, which take any strides, and
    the CPU runtime only sees CPU tensors.
    """
    try:
        return [(a.shape, a.dtype) for a in args]
    except AttributeError:
        return None


def _records_autograd(args: Sequence[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(a.requires_grad for a in args)


@dataclass
class Segment:
    """Consecutive ``op`` steps of one stream, run as one traced function once verified.

    ``inputs``: values the segment reads that are produced elsewhere; ``outputs``:
    values it produces that are read after it (or returned); ``release``: what the
    stream may drop once the segment has run.  ``status`` is ``"pending"`` before
    the first call, then ``"traced"`` or the reason it runs op by op.
    """

    #: the hook that runs it (:func:`autostream.runtime.interpret.interpret`)
    kind: ClassVar[str] = "segment"
    stream: int
    steps: tuple[Step, ...]
    inputs: tuple[torch.fx.Node, ...]
    outputs: tuple[torch.fx.Node, ...]
    release: tuple[torch.fx.Node, ...]
    status: str = "pending"
    compiled: Any = field(default=None, repr=False)
    #: shape and dtype of each input when traced: calls with other inputs, or inputs
    #: recording autograd history, run op by op
    signature: list | None = field(default=None, repr=False)
    #: the thread state (grad, inference, autocast) it was traced under
    state: ThreadState | None = field(default=None, repr=False)

    @property
    def names(self) -> list[str]:
        return [s.node.name for s in self.steps]


def _unsafe_to_repeat(node: torch.fx.Node) -> str | None:
    if node.op == "call_module":
        return f"{node.name!r} calls a module"
    effects = op_effects(node)
    seen = node.meta.get(EFFECTS_KEY)  # what the call was seen doing (lifted graphs)
    if effects.writes or (seen.writes if seen else writes_inputs_by_name(node)):
        return f"{node.name!r} ({target_name(node)}) may write its inputs"
    if effects.ordered or (seen is not None and seen.ordered):
        return f"{node.name!r} ({target_name(node)}) keeps program order (RNG or side effect)"
    return None


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


def _module(gm: torch.fx.GraphModule, seg: Segment) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    remap = {n: graph.placeholder(f"in_{i}") for i, n in enumerate(seg.inputs)}
    for s in seg.steps:
        remap[s.node] = graph.node_copy(s.node, lambda n: remap[n])
    graph.output(tuple(remap[n] for n in seg.outputs))
    return torch.fx.GraphModule(gm, graph)


def _runs_to_optimise() -> int:
    """Calls a traced function takes to reach its optimised graph (profiled runs + 1)."""
    try:
        return torch._C._jit_get_num_profiled_runs() + 1
    except AttributeError:  # private API: assume the default (one profiled run)
        return 2


def _identical(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
        and x.shape == y.shape and x.is_inference() == y.is_inference() and torch.equal(x, y)
        for x, y in zip(a, b, strict=True))


def _first_line(exc: BaseException) -> str:
    """An exception's first line (torch's messages may go on with a whole tensor)."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


class SegmentRunner:
    """Runs segments (of any stream): op by op on the first call, traced afterwards."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm

    def prepare(self, seg: Segment) -> None:
        """Decide, before any call, what rules tracing out."""
        for s in seg.steps:
            why = _unsafe_to_repeat(s.node)
            if why:
                seg.status = why
                return

    def run(self, seg: Segment, env: Env, state: ThreadState | None = None) -> None:
        """Run ``seg`` on ``env``; ``state`` is the thread state the call runs under
        (a function traced under one state runs only under that state).  What the
        segment frees (``seg.release``) is left to the caller's loop."""
        # Little Python between two segments: while this thread runs it, the other
        # stream's thread, back from its own segment, waits for the GIL.
        try:
            args = [env[n] for n in seg.inputs]
        except KeyError:
            args = [load(env, n, seg.steps[0].node) for n in seg.inputs]  # names the op
        compiled = seg.compiled
        if compiled is not None:
            if _signature(args) != seg.signature or state != seg.state \
                    or _records_autograd(args):
                self._run_ops(seg, env)  # traced for other inputs: a trace may have fixed them
            else:
                try:
                    values = compiled(*args)
                except Exception as exc:  # noqa: BLE001 - the ops themselves decide
                    # op by op from now on: an op that fails raises its own error
                    seg.compiled = None
                    seg.status = f"the traced function raised {type(exc).__name__}"
                    self._run_ops(seg, env)
                else:
                    env.update(zip(seg.outputs, values, strict=True))
        elif seg.status == "pending":
            self._first_call(seg, args, env, state)
        else:
            self._run_ops(seg, env)

    def _run_ops(self, seg: Segment, env: Env) -> None:
        for step in seg.steps:
            env[step.node] = run_op(self.gm, step, env)

    def _first_call(self, seg: Segment, args: list[Any], env: Env,
                    state: ThreadState | None) -> None:
        self._run_ops(seg, env)
        reference = [env[n] for n in seg.outputs]
        seg.status = self._trace(seg, args, reference)
        seg.state = state
        if seg.compiled is None:
            log.debug("autostream: segment %s runs op by op: %s", seg.names, seg.status)

    def _trace(self, seg: Segment, args: list[Any], reference: list[Any]) -> str:
        if not all(isinstance(a, torch.Tensor) for a in args):
            return "an input is not a tensor"
        if not reference or not all(isinstance(r, torch.Tensor) for r in reference):
            return "an output is not a tensor (or nothing is read after the segment)"
        if _records_autograd(args):
            return "an input requires grad"
        module = _module(self.gm, seg)
        try:
            with _TRACE_LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # a plain function, not the module: an FX module whose call fails prints
                # its generated code and the failing values to stderr
                traced = torch.jit.trace(lambda *a: module.forward(*a), tuple(args),
                                         check_trace=False, strict=False)
                runs = [traced(*args) for _ in range(_runs_to_optimise())]
        except Exception as exc:  # noqa: BLE001 - tracing is an optimisation only
            return f"torch.jit.trace refused it ({type(exc).__name__}: {_first_line(exc)})"
        for again in runs:
            again = list(again) if isinstance(again, (tuple, list)) else [again]
            if not _identical(again, reference):
                return "the traced function's outputs differ from the ops'"
        seg.compiled, seg.signature = traced, _signature(args)
        return "traced"
