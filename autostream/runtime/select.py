"""Choosing and building a runtime: ``make_runner(gm, "auto" | "threads" | "streams" | "graph" |
"sequential")``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from autostream.cost.runtime_target import DEVICE_RUNTIMES
from autostream.runtime.graph_api import TorchGraphAPI
from autostream.runtime.graphed import GraphRunner
from autostream.runtime.program import parse_program
from autostream.runtime.sanitizer import SanitizerConfig, sanitize_from_env
from autostream.runtime.sequential import SequentialRunner
from autostream.runtime.streams import StreamsRunner, input_device
from autostream.runtime.threads import ThreadsRunner

RUNTIMES = ("auto", "threads", "streams", "graph", "sequential")


def check_runtime_name(kind: str) -> str:
    """``kind`` if it names a runtime, else a ``ValueError`` listing them.

    >>> check_runtime_name("threads")
    'threads'
    """
    if kind not in RUNTIMES:
        raise ValueError(f"unknown runtime {kind!r}; choose one of {', '.join(RUNTIMES)}")
    return kind


def check_runtime_device(kind: str, device_type: str) -> str:
    """``kind`` if it can run a graph whose inputs are on ``device_type``, else a
    ``ValueError`` naming the fix (the streams runtime needs accelerator tensors).

    >>> check_runtime_device("streams", "cpu")
    Traceback (most recent call last):
    ...
    ValueError: runtime='streams' runs device streams, but the graph's inputs are on cpu; use runtime='threads' on CPU, or 'auto' (streams on accelerators, threads on CPU)
    """
    if kind in DEVICE_RUNTIMES and device_type in ("cpu", "meta"):
        raise ValueError(f"runtime={kind!r} runs device streams, but the graph's inputs are "
                         f"on {device_type}; use runtime='threads' on CPU, or 'auto' (streams "
                         f"on accelerators, threads on CPU)")
    return kind


def select_runtime(kind: str, example_inputs: Sequence[Any]) -> str:
    """The concrete runtime for ``kind``: ``"auto"`` -> threads on CPU; on an accelerator,
    ``graph`` where its device module captures graphs (CUDA, NPU), else ``streams``.

    >>> select_runtime("auto", [torch.zeros(2)])
    'threads'
    >>> select_runtime("sequential", [torch.zeros(2)])
    'sequential'
    """
    check_runtime_name(kind)
    if kind != "auto":
        return kind
    device = input_device(tuple(example_inputs))
    if device.type in ("cpu", "meta"):
        return "threads"
    return "graph" if TorchGraphAPI.graph_class_name(device) is not None else "streams"


class AutoRunner:
    """Picks the runtime from the first call's inputs (one runner per device type)."""

    kind = "auto"

    def __init__(self, build: Callable[[str], Callable[..., Any]]):
        self._build = build
        self._runners: dict[str, Callable[..., Any]] = {}

    def __call__(self, *inputs: Any) -> Any:
        kind = select_runtime("auto", inputs)
        if kind not in self._runners:
            self._runners[kind] = self._build(kind)
        return self._runners[kind](*inputs)

    def close(self) -> None:
        for r in self._runners.values():
            r.close()
        self._runners.clear()


def make_runner(gm: torch.fx.GraphModule, runtime: str = "auto",
                sanitize: bool | SanitizerConfig = False, seed: int = 0,
                deterministic: bool = False, **options: Any) -> Callable[..., Any]:
    """A callable running the rewritten ``gm`` like ``gm(*inputs)`` on the chosen runtime.

    The graph is validated here (:class:`~autostream.runtime.program.ProgramError`)
    before anything runs.  ``sanitize`` (or ``AUTOSTREAM_SANITIZE=1``) turns on the
    race sanitizer of the threads runtime; ``deterministic`` gives every op of the
    threads runtime eager's intra-op thread count (the other runtimes run every op on
    the calling thread already); ``options`` go to the runner
    (``wait_timeout_s``, ``intra_op_threads`` for threads; ``api`` for streams; ``api``,
    ``graph_api``, ``outputs`` and ``max_graphs`` for graph).

    >>> import torch, torch.fx
    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> make_runner(gm, "sequential")(torch.tensor([1.0]))
    tensor([2.])
    """
    check_runtime_name(runtime)
    program = parse_program(gm)
    asked = sanitize is not False and sanitize is not None
    if asked and runtime in (*DEVICE_RUNTIMES, "sequential"):
        raise ValueError(
            f"the race sanitizer runs in the threads runtime, not {runtime!r}; use "
            f"runtime='threads' (or 'auto' on CPU inputs)"
        )

    def build(kind: str) -> Callable[..., Any]:
        if kind == "sequential":
            return SequentialRunner(gm, program)
        if kind == "threads":
            # AUTOSTREAM_SANITIZE=1 applies here only: other runtimes ignore it.
            config = sanitize_from_env(sanitize, seed)
            return ThreadsRunner(gm, program, sanitize=config or False, seed=seed,
                                 deterministic=deterministic, **options)
        if asked:
            raise ValueError("the race sanitizer needs CPU inputs (threads runtime); got "
                             "accelerator inputs")
        if kind == "graph":
            graph_options = dict(options)
            if "api" in graph_options:
                graph_options["stream_api"] = graph_options.pop("api")
            return GraphRunner(gm, program, **graph_options)
        return StreamsRunner(gm, program, **options)

    return AutoRunner(build) if runtime == "auto" else build(runtime)
