"""The threads runtime's former segment mechanism, TorchScript traces, kept for comparison only.

Until issue 26 the threads runtime traced each run of ops between a stream's syncs
with ``torch.jit.trace`` on the first call and called the traced function from then
on, which runs the whole run without the GIL.  TorchScript records tensor-less
factory ops (``zeros``, ``full``) as constants, so from the third call on such a
segment returned one shared tensor: later in-place writes and callers' edits
accumulated in it.  The package no longer uses it; ``experiments/overlap.py`` runs it
beside the generated functions that replaced it, to measure what the change costs.
Never use it for results: see ``torchscript_runner``'s warning.

>>> from autostream.runtime.builder import two_chains
>>> gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
>>> with torchscript_runner(gm) as runner:
...     _ = [runner(*inputs) for _ in range(3)]
...     sorted({s.status for s in segments_of(runner)})
['traced']
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from autostream.fx.call_effects import EFFECTS_KEY
from autostream.fx.graph import op_effects, target_name, writes_inputs_by_name
from autostream.fx.thread_state import ThreadState
from autostream.runtime import ThreadsRunner
from autostream.runtime.execute import Env, load, run_op
from autostream.runtime.segments import Segment

#: ``warnings.catch_warnings`` edits the process-wide filters: streams tracing their
#: first segments at the same time take turns
_TRACE_LOCK = threading.Lock()


class _Traced:
    """What the old mechanism kept per segment."""

    def __init__(self) -> None:
        self.status = "pending"
        self.compiled: Any = None
        self.signature: list | None = None
        self.state: ThreadState | None = None


def _signature(args: Sequence[Any]) -> list[tuple[Any, Any]] | None:
    try:
        return [(a.shape, a.dtype) for a in args]
    except AttributeError:
        return None


def _records_autograd(args: Sequence[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(a.requires_grad for a in args)


def _unsafe_to_repeat(node: torch.fx.Node) -> str | None:
    if node.op == "call_module":
        return f"{node.name!r} calls a module"
    effects = op_effects(node)
    seen = node.meta.get(EFFECTS_KEY)
    if effects.writes or (seen.writes if seen else writes_inputs_by_name(node)):
        return f"{node.name!r} ({target_name(node)}) may write its inputs"
    if effects.ordered or (seen is not None and seen.ordered):
        return f"{node.name!r} ({target_name(node)}) keeps program order (RNG or side effect)"
    return None


def _module(gm: torch.fx.GraphModule, seg: Segment) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    remap = {n: graph.placeholder(f"in_{i}") for i, n in enumerate(seg.inputs)}
    for s in seg.steps:
        remap[s.node] = graph.node_copy(s.node, lambda n: remap[n])
    graph.output(tuple(remap[n] for n in seg.outputs))
    return torch.fx.GraphModule(gm, graph)


def _runs_to_optimise() -> int:
    try:
        return torch._C._jit_get_num_profiled_runs() + 1
    except AttributeError:
        return 2


def _identical(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
        and x.shape == y.shape and x.is_inference() == y.is_inference() and torch.equal(x, y)
        for x, y in zip(a, b, strict=True))


class TorchScriptSegments:
    """The former ``SegmentRunner``: op by op on the first call, traced afterwards."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.traced: dict[int, _Traced] = {}

    def prepare(self, seg: Segment) -> None:
        t = self.traced.setdefault(id(seg), _Traced())
        for s in seg.steps:
            why = _unsafe_to_repeat(s.node)
            if why:
                t.status = why
                return

    def run(self, seg: Segment, env: Env, state: ThreadState | None = None) -> None:
        t = self.traced[id(seg)]
        try:
            args = [env[n] for n in seg.inputs]
        except KeyError:
            args = [load(env, n, seg.steps[0].node) for n in seg.inputs]
        if t.compiled is not None:
            if _signature(args) != t.signature or state != t.state or _records_autograd(args):
                self._run_ops(seg, env)
            else:
                try:
                    values = t.compiled(*args)
                except Exception as exc:  # noqa: BLE001 - the ops decide
                    t.compiled, t.status = None, f"the traced function raised {type(exc).__name__}"
                    self._run_ops(seg, env)
                else:
                    env.update(zip(seg.outputs, values, strict=True))
        elif t.status == "pending":
            self._run_ops(seg, env)
            t.status = self._trace(seg, t, args, [env[n] for n in seg.outputs])
            t.state = state
        else:
            self._run_ops(seg, env)

    def _run_ops(self, seg: Segment, env: Env) -> None:
        for step in seg.steps:
            env[step.node] = run_op(self.gm, step, env)

    def _trace(self, seg: Segment, t: _Traced, args: list[Any], reference: list[Any]) -> str:
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
                traced = torch.jit.trace(lambda *a: module.forward(*a), tuple(args),
                                         check_trace=False, strict=False)
                runs = [traced(*args) for _ in range(_runs_to_optimise())]
        except Exception as exc:  # noqa: BLE001 - tracing is an optimisation only
            return f"torch.jit.trace refused it ({type(exc).__name__}: {str(exc).strip()[:150]})"
        for again in runs:
            again = list(again) if isinstance(again, (tuple, list)) else [again]
            if not _identical(again, reference):
                return "the traced function's outputs differ from the ops'"
        t.compiled, t.signature = traced, _signature(args)
        return "traced"


class _Status:
    def __init__(self, seg: Segment, t: _Traced):
        self.segment, self.status = seg, t.status


def torchscript_runner(gm: torch.fx.GraphModule, **options: Any) -> ThreadsRunner:
    """A threads runner whose segments are TorchScript traces, as before issue 26.

    For timing comparisons only: a segment with a factory op returns one shared
    tensor from the third call on (this module's docstring).
    """
    runner = ThreadsRunner(gm, **options)
    runner.segments = TorchScriptSegments(gm)
    for items in runner.plan_of.values():
        for item in items:
            if isinstance(item, Segment):
                runner.segments.prepare(item)
    return runner


def segments_of(runner: ThreadsRunner) -> list[_Status]:
    """Each segment of a ``torchscript_runner`` with its status (``"traced"`` or why not)."""
    table = runner.segments.traced
    return [_Status(item, table[id(item)]) for items in runner.plan_of.values()
            for item in items if isinstance(item, Segment)]
