"""Accelerator runtime: one device stream per plan stream, through the device-generic API.

The calling thread launches every op in the graph's linear order (kernels are
asynchronous, so launch order is all the host decides); before an op it switches
the current stream to the op's plan stream.  ``record`` is ``Event.record(stream)``,
``wait`` is ``stream.wait_event(event)``.  Side streams first wait for the caller's
current stream (the main stream), and the main stream waits for every side stream
before the outputs are returned, whatever the graph's own join waits say.

Cross-stream memory safety: the caching allocator only knows the stream a block
was allocated on, and reuses a freed block on that stream without any sync.  A
storage another stream reads is therefore kept referenced until its allocating
stream has waited for every read (``Step.release`` on a wait step, at the latest
the final join: :mod:`autostream.memory.lifetimes`), so its block cannot be handed to a new
allocation while another stream may still read it.  Values used only on their own
stream are dropped after their last use (stream-ordered reuse is safe there).
``record_stream`` was not chosen: it makes block reuse depend on event polling
(non-deterministic peak memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx

from autostream.runtime.execute import Env, bind_inputs, collect_outputs, run_op
from autostream.runtime.interpret import EnvHooks, interpret
from autostream.runtime.memory import MeasuredMemory, allocator_peak
from autostream.runtime.program import Step, StreamProgram, parse_program
from autostream.runtime.stream_pool import DeviceStreams, device_streams


class StreamAPI(Protocol):
    """The few stream operations the runtime needs (one device)."""

    def current_stream(self) -> Any: ...
    def new_stream(self) -> Any: ...
    def new_event(self) -> Any: ...
    def set_stream(self, stream: Any) -> None: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def wait_event(self, stream: Any, event: Any) -> None: ...
    def wait_stream(self, stream: Any, other: Any) -> None: ...


class TorchStreamAPI:
    """``torch.Stream`` / ``torch.Event`` / ``torch.accelerator`` for ``device`` (CUDA, NPU, XPU...)."""

    def __init__(self, device: torch.device):
        if device.type in ("cpu", "meta"):
            raise ValueError(
                f"the 'streams' runtime needs accelerator tensors, got inputs on {device}; "
                f"use runtime='threads' on CPU (or 'auto')"
            )
        self.device = device

    def current_stream(self) -> Any:
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "current_stream"):
            return torch.accelerator.current_stream(self.device)
        return torch.get_device_module(self.device).current_stream(self.device)  # torch < 2.6

    def new_stream(self) -> Any:
        return torch.Stream(device=self.device)

    def new_event(self) -> Any:
        return torch.Event(device=self.device)

    def set_stream(self, stream: Any) -> None:
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "set_stream"):
            torch.accelerator.set_stream(stream)
        else:  # torch < 2.6
            torch.get_device_module(self.device).set_stream(stream)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def wait_stream(self, stream: Any, other: Any) -> None:
        stream.wait_stream(other)

    def memory_allocated(self) -> int:
        return self._memory_stat("memory_allocated")(self.device)

    def max_memory_allocated(self) -> int:
        return self._memory_stat("max_memory_allocated")(self.device)

    def reset_peak_memory_stats(self) -> None:
        self._memory_stat("reset_peak_memory_stats")(self.device)

    def _memory_stat(self, name: str) -> Callable[[torch.device], Any]:
        """``torch.accelerator``'s allocator statistic, or the device module's (torch < 2.8)."""
        found = getattr(getattr(torch, "accelerator", None), name, None)
        return found if found is not None else getattr(torch.get_device_module(self.device), name)


def input_device(inputs: tuple[Any, ...]) -> torch.device:
    """Device of the first tensor input, else the current accelerator, else CPU.

    >>> input_device((1, torch.zeros(1)))
    device(type='cpu')
    """
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    accel = getattr(torch, "accelerator", None)
    acc = accel.current_accelerator() if accel is not None and accel.is_available() else None
    return acc if acc is not None else torch.device("cpu")


class StreamsRunner:
    """Run a rewritten GraphModule on device streams.

    ``api`` builds the :class:`StreamAPI` for a device (default
    :class:`TorchStreamAPI`); side stream ``k`` is the device's, shared by every graph
    in the process (:mod:`autostream.runtime.stream_pool`).
    ``record_memory``: each call's peak is measured with the allocator's statistics
    (the API's ``memory_allocated``, ``max_memory_allocated`` and
    ``reset_peak_memory_stats``) into ``last_memory``.
    """

    kind = "streams"

    def __init__(self, gm: torch.fx.GraphModule, program: StreamProgram | None = None, *,
                 api: Callable[[torch.device], StreamAPI] = TorchStreamAPI,
                 record_memory: bool = False):
        self.gm = gm
        self.program = program if program is not None else parse_program(gm)
        self._make_api = api
        self.record_memory = record_memory
        self.last_memory: MeasuredMemory | None = None
        #: device -> its stream API, its side streams and the pool they come from
        self._per_device: dict[torch.device, tuple[StreamAPI, dict[int, Any], DeviceStreams]] = {}

    def _streams_for(self, device: torch.device
                     ) -> tuple[StreamAPI, dict[int, Any], DeviceStreams]:
        if device not in self._per_device:
            api = self._make_api(device)
            pool = device_streams(self._make_api, device)
            self._per_device[device] = (api, pool.side(self.program.side_streams,
                                                       api.new_stream), pool)
        return self._per_device[device]

    def __call__(self, *inputs: Any) -> Any:
        env = bind_inputs(self.gm, self.program, inputs)
        device = input_device(tuple(env[p] for p in self.program.placeholders))
        api, side, pool = self._streams_for(device)
        if not self.record_memory:
            return self._run(env, api, side, pool)
        out, self.last_memory = allocator_peak(api, list(env.values()),
                                               lambda: self._run(env, api, side, pool))
        return out

    def _run(self, env: Env, api: StreamAPI, side: dict[int, Any], pool: DeviceStreams
             ) -> Any:
        call = DeviceCall(self.gm, env, api, api.current_stream(), side)
        # the side streams are the device's, shared: never launch on one another thread
        # is capturing (runtime/stream_pool.py)
        with pool.lock:
            call.fork()
            try:
                interpret(self.program.steps, call)
            finally:
                call.join()
        # Held cross-stream values die with ``env`` here, after the join.
        return collect_outputs(self.gm, self.program, env)

    def close(self) -> None:
        """Forget this runner's stream API (the device's side streams stay in its pool)."""
        self._per_device.clear()


class DeviceCall(EnvHooks):
    """Hooks of one call: each op launched on its plan stream, records and waits as events."""

    def __init__(self, gm: torch.fx.GraphModule, env: Env, api: StreamAPI, main: Any,
                 side: dict[int, Any]):
        super().__init__(gm, env)
        self.api, self.main, self.side, self.current = api, main, side, main
        self.streams = {0: main, **side}
        self.events: dict[str, Any] = {}

    def op(self, step: Step) -> None:
        stream = self.streams[step.stream]
        if stream is not self.current:
            self.api.set_stream(stream)
            self.current = stream
        self.env[step.node] = run_op(self.gm, step, self.env)

    def record(self, step: Step) -> None:
        event = self.api.new_event()
        self.api.record(event, self.streams[step.stream])
        self.events[step.node.name] = event
        super().record(step)

    def wait(self, step: Step) -> None:
        stream = self.streams[step.stream]
        for token in step.tokens:
            self.api.wait_event(stream, self.events[token])

    def fork(self, streams: Sequence[Any] | None = None) -> None:
        """Every side stream (or each of ``streams``) waits for the main stream (the
        caller's work so far)."""
        streams = list(self.side.values()) if streams is None else streams
        if streams:
            event = self.api.new_event()
            self.api.record(event, self.main)
            for s in streams:
                self.api.wait_event(s, event)

    def join(self, streams: Sequence[Any] | None = None) -> None:
        """Back on the main stream, which waits for every side stream (or each of
        ``streams``)."""
        if self.current is not self.main:
            self.api.set_stream(self.main)
            self.current = self.main
        for s in self.side.values() if streams is None else streams:
            self.api.wait_stream(self.main, s)
