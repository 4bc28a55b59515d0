"""Runs of ops compiled by Inductor, a candidate segment mechanism measured, not used (issue 26).

Each segment (``autostream.runtime.segments``) is compiled on its first call with
``torch._inductor.compile_fx`` and its C++ wrapper (``cpp_wrapper``: the whole run is
one native call, as TorchScript's traces were), for the shapes, strides and dtypes of
that call; other inputs, inputs recording autograd history and segments Inductor
refuses run as the runtime's generated functions.  ``experiments/overlap.py
--inductor`` times it beside them.  Why the package does not use it: compiling takes
seconds per segment, Inductor's fused kernels equal the ops only to rounding, and a
compiled function holds for the shapes it was compiled for (``docs/cpu-runtime.md``).

>>> from autostream.runtime.builder import two_chains
>>> gm, inputs = two_chains(depth=2, rows=4, width=8, streams=2)
>>> with inductor_runner(gm, cpp_wrapper=False) as runner:
...     _ = [runner(*inputs) for _ in range(2)]
...     len(runner.segments.compiled) > 0
True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from autostream.runtime import ThreadsRunner
from autostream.runtime.execute import Env
from autostream.runtime.segments import Segment, SegmentRunner
from experiments.torchscript_segments import _module  # a segment as its own FX module

#: Inductor's compilation is not thread-safe: streams compiling at once take turns
_COMPILE_LOCK = threading.Lock()


def _signature(args: Sequence[Any]) -> tuple | None:
    if not all(isinstance(a, torch.Tensor) for a in args):
        return None
    return tuple((a.shape, a.stride(), a.dtype, a.device) for a in args)


class InductorSegments:
    """Segments compiled by Inductor on their first call; the generated functions otherwise."""

    def __init__(self, gm: torch.fx.GraphModule, cpp_wrapper: bool = True):
        self.gm = gm
        self.cpp_wrapper = cpp_wrapper
        self.fallback = SegmentRunner(gm)
        #: id(segment) -> (signature compiled for, function or None when refused)
        self.compiled: dict[int, tuple[tuple | None, Any]] = {}
        self.compile_s = 0.0

    def prepare(self, seg: Segment) -> None:
        self.fallback.prepare(seg)

    def run(self, seg: Segment, env: Env, state: Any = None) -> None:
        args = [env.get(n) for n in seg.inputs]
        signature = _signature(args)
        grad = torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        if signature is None or grad or not seg.outputs:
            self.fallback.run(seg, env)
            return
        entry = self.compiled.get(id(seg))
        if entry is None:
            entry = self.compiled[id(seg)] = (signature, self._compile(seg, args))
        compiled_for, fn = entry
        if fn is None or compiled_for != signature:
            self.fallback.run(seg, env)
            return
        env.update(zip(seg.outputs, fn(*args), strict=True))

    def _compile(self, seg: Segment, args: list[torch.Tensor]) -> Any:
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx

        t0 = time.perf_counter()
        try:
            with _COMPILE_LOCK, config.patch(cpp_wrapper=self.cpp_wrapper):
                return compile_fx(_module(self.gm, seg), args)
        except Exception:  # noqa: BLE001 - a refused segment runs its generated function
            return None
        finally:
            self.compile_s += time.perf_counter() - t0


def inductor_runner(gm: torch.fx.GraphModule, cpp_wrapper: bool = True,
                    **options: Any) -> ThreadsRunner:
    """A threads runner whose segments Inductor compiles (for timing comparisons only)."""
    runner = ThreadsRunner(gm, **options)
    runner.segments = InductorSegments(gm, cpp_wrapper)
    for items in runner.plan_of.values():
        for item in items:
            if isinstance(item, Segment):
                runner.segments.prepare(item)
    return runner
