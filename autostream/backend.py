"""``torch.compile`` backends: ``backend="autostream"`` and ``autostream.backend(**options)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from autostream.passes import AutoStreamPass

RUNTIMES = ("auto", "threads", "streams", "sequential")


def _runner(gm: torch.fx.GraphModule, runtime: str, example_inputs: Sequence[Any]) -> Callable:
    if runtime == "sequential":
        return gm.forward
    try:
        from autostream.runtime import make_runner, select_runtime
    except ImportError:
        return gm.forward
    kind = select_runtime(runtime, example_inputs)
    return make_runner(gm, kind)


def backend(runtime: str = "auto", **options: Any) -> Callable:
    """A ``torch.compile`` backend that plans streams and runs the rewritten graph.

    ``options`` are ``AutoStreamPass`` options (``max_streams``, ``solver``,
    ``cost_table``, ``time_limit``).  The pass object is available as
    ``backend(...).autostream_pass`` for its reports.

    >>> model = torch.nn.Linear(4, 4)
    >>> compiled = torch.compile(model, backend=backend(max_streams=2))
    >>> compiled(torch.randn(2, 4)).shape
    torch.Size([2, 4])
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; allowed: {', '.join(RUNTIMES)}")
    stream_pass = AutoStreamPass(**options)

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        stream_pass(gm, example_inputs, None)
        return make_boxed_func(_runner(gm, runtime, example_inputs))

    compile_fn = aot_autograd(fw_compiler=compiler, bw_compiler=compiler, inference_compiler=compiler)
    compile_fn.autostream_pass = stream_pass
    return compile_fn


def autostream_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
    """The ``"autostream"`` entry point: default options."""
    return backend()(gm, example_inputs)
