"""Graph runtime: the plan's streams captured into one device graph, then replayed.

The interpreted streams runtime launches every op from Python, so a graph of small
kernels is host-bound and two streams cannot overlap what one thread issues in turn
(``docs/cuda.md``).  This runtime captures the whole multi-stream program once per input
shape (:mod:`autostream.runtime.capture_plan`: side streams fork from the capture stream
after capture begins and are joined before it ends) and replays it: the host issues
one graph launch, and the device runs the streams' kernels as the graph's edges allow.

**Inputs.**  A tensor input is used by address when it is a parameter (or a tensor Dynamo
marks static) that the graph does not write: the graph reads it where it lies, as a
parameter updated in place stays current.  Every other tensor input is copied into a
static buffer before each replay; an input the graph writes (a KV cache, running
statistics) is copied back after it.  Another address for a by-address input recaptures.

**Outputs.**  ``outputs="fresh"`` (the default): each call returns new tensors, copied
from the graph's static outputs after the replay, so a value a caller holds never changes
under it (an output that is a view of an input stays a view of the caller's input).
``outputs="reused"``: the graph's own output tensors, overwritten by the next replay (as
CUDA graph trees do); the caller clones what it keeps.

**Memory.**  A storage read on another stream is kept referenced until its allocating
stream has waited for every read (:mod:`autostream.memory.lifetimes`), during capture as
during an interpreted call: the block the allocator hands to a later kernel of that
stream is then ordered after the read by a graph edge.  ``record_stream`` was not used:
a block it marks during capture is not reused until the capture ends, which holds every
such intermediate for the whole graph (``docs/cuda.md``).

**Refusals.**  A graph that cannot be captured (:mod:`autostream.runtime.capturable`, or
torch raising during capture) runs as the streams runtime runs it, and ``refused`` says
why.  ``max_graphs`` input shapes are captured at most; further shapes run uncaptured,
counted in ``uncaptured_calls``.

>>> runner = GraphRunner.__new__(GraphRunner)  # built by make_runner(gm, "graph")
>>> GraphRunner.kind
'graph'
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from autostream.runtime.capturable import graph_refusal
from autostream.runtime.capture_plan import CaptureStep, capture_steps, check_capture
from autostream.runtime.execute import Env, collect_outputs, fetch_attr
from autostream.runtime.graph_api import GraphAPI, TorchGraphAPI
from autostream.runtime.program import ProgramError, StreamProgram, parse_program
from autostream.runtime.stream_pool import device_streams
from autostream.runtime.streams import (
    DeviceCall,
    StreamAPI,
    StreamsRunner,
    TorchStreamAPI,
    input_device,
)

__all__ = ["OUTPUT_POLICIES", "GraphRunner", "check_output_policy"]

log = logging.getLogger("autostream")

#: what a call returns: new tensors, or the graph's own (overwritten by the next replay)
OUTPUT_POLICIES = ("fresh", "reused")

#: input shapes captured at most per runner (more run uncaptured)
MAX_GRAPHS = 8
#: uncaptured runs before capture (lazy initialisation: cuBLAS handles, workspaces)
WARMUP = 3


def check_output_policy(outputs: str, name: str = "outputs") -> str:
    """``outputs`` if it is one of :data:`OUTPUT_POLICIES`, else a ``ValueError`` naming
    the option ``name`` and what each policy does."""
    if outputs not in OUTPUT_POLICIES:
        raise ValueError(f"{name} must be one of {', '.join(OUTPUT_POLICIES)}, got "
                         f"{outputs!r}: 'fresh' returns new tensors each call, 'reused' "
                         f"the graph's own (overwritten by the next call)")
    return outputs


class _CaptureCall(DeviceCall):
    """The steps of one capture (or warm-up) on real streams: the streams runtime's ops,
    records, waits and releases, with each side stream forked and joined on its own."""

    def run(self, steps: tuple[CaptureStep, ...]) -> None:
        for s in steps:
            if s.verb in ("op", "record", "wait"):
                getattr(self, s.verb)(s.step)
            elif s.verb == "release":
                self.release(s.values)
            elif s.verb in ("fork", "join"):
                getattr(self, s.verb)([self.streams[s.stream]])
            # begin and end: the graph API's, around the body


@dataclass
class _Output:
    """How one output leaf is returned after a replay."""

    how: str  # "value" (not a tensor), "static", "input_view", "clone"
    static: Any = None
    input_index: int = -1
    offset: int = 0


@dataclass
class _Captured:
    """One captured input shape: its graph, static inputs and how outputs come back."""

    graph: Any
    statics: list[Any]
    #: input index -> whether it is copied in before each replay (else used by address)
    copied: list[bool]
    written: list[int]
    outputs: list[_Output]
    spec: Any


def _by_address(x: Any) -> bool:
    return isinstance(x, torch.nn.Parameter) or hasattr(x, "_dynamo_static_input_type")


def _key(flat: list[Any]) -> tuple:
    """The shape key of one call: tensors by layout, everything else by value."""
    out = []
    for x in flat:
        if isinstance(x, torch.Tensor):
            out.append(("t", tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device),
                        x.requires_grad))
        else:
            out.append(("v", type(x).__name__, x))
    return tuple(out)


@dataclass
class GraphStats:
    """What a graph runner did so far."""

    captures: int = 0
    replays: int = 0
    recaptures: int = 0
    uncaptured_calls: int = 0
    shapes_over_cache: int = 0
    autograd_calls: int = 0
    other_device_calls: int = 0
    by_address_inputs: int = 0
    copied_inputs: int = 0
    checked: str = ""


class GraphRunner:
    """Run a rewritten GraphModule captured into device graphs (one per input shape).

    ``graph_api`` and ``stream_api`` build the device's graph and stream APIs (the
    torch ones by default; tests pass fakes); ``outputs`` is ``"fresh"`` or
    ``"reused"`` (see the module docstring); ``max_graphs`` bounds the shapes captured.
    """

    kind = "graph"

    def __init__(self, gm: torch.fx.GraphModule, program: StreamProgram | None = None, *,
                 graph_api: Callable[[torch.device], GraphAPI] = TorchGraphAPI,
                 stream_api: Callable[[torch.device], StreamAPI] = TorchStreamAPI,
                 outputs: str = "fresh", max_graphs: int = MAX_GRAPHS, warmup: int = WARMUP,
                 record_memory: bool = False):
        check_output_policy(outputs)
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an integer >= 1, got {max_graphs!r}")
        self.gm = gm
        self.program = program if program is not None else parse_program(gm)
        self.steps = capture_steps(self.program)
        check = check_capture(self.steps, self.program)
        if not check.ok:
            raise ProgramError(check.summary())
        self.stats = GraphStats(checked=check.summary())
        self.outputs = outputs
        self.max_graphs = max_graphs
        self.warmup = warmup
        self._make_graph_api = graph_api
        self._make_stream_api = stream_api
        self.fallback = StreamsRunner(gm, self.program, api=stream_api,
                                      record_memory=record_memory)
        #: why the graph runs uncaptured (``None``: it is captured)
        self.refused: str | None = None
        self._graphs: dict[tuple, _Captured] = {}
        #: the device, its graph and stream APIs, the capture stream and the side streams
        self._device: tuple[torch.device, GraphAPI, StreamAPI, Any, dict[int, Any]] | None = None
        self._written: set[str] | None = None
        self._effects_known = True

    # -- calls ---------------------------------------------------------------------------
    def __call__(self, *inputs: Any) -> Any:
        if self.refused is not None:
            return self._uncaptured(inputs)
        flat = self.gm.graph._codegen.process_inputs(*inputs)
        if len(flat) != len(self.program.placeholders):
            names = [p.name for p in self.program.placeholders]
            raise TypeError(f"graph expects {len(names)} inputs {names}, got {len(flat)}")
        if self._autograd(flat):  # this call only: a later no_grad call is captured
            self.stats.autograd_calls += 1
            return self._uncaptured(inputs)
        device = input_device(tuple(flat))
        if self._device is None:
            why = graph_refusal(self.gm.graph, device.type, flat)
            if why is None:
                try:
                    self._device = (device, *self._apis(device))
                except Exception as exc:  # noqa: BLE001 - no capture here: say why
                    why = str(exc)
            if why is not None:
                self.refuse(why)
                return self._uncaptured(inputs)
        elif device != self._device[0]:  # the streams and pools belong to the first device
            self.stats.other_device_calls += 1
            return self._uncaptured(inputs)
        key = _key(flat)
        entry = self._graphs.get(key)
        if entry is not None and not self._addresses_hold(entry, flat):
            self.stats.recaptures += 1
            del self._graphs[key]
            entry = None
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                self.stats.shapes_over_cache += 1
                return self._uncaptured(inputs)
            try:
                entry = self._capture(flat)
            except Exception as exc:  # noqa: BLE001 - torch refused: run as today, say why
                self.refuse(f"capture failed ({type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0][:200] if str(exc) else ''})")
                return self._uncaptured(inputs)
            self._graphs[key] = entry
        return self._replay(entry, flat)

    def refuse(self, why: str) -> None:
        """Run every later call uncaptured, and say why (once, in the log and ``refused``)."""
        if self.refused is None:
            self.refused = why
            log.info("autostream: graph runtime: %s; running the streams runtime instead", why)

    def _uncaptured(self, inputs: tuple[Any, ...]) -> Any:
        self.stats.uncaptured_calls += 1
        return self.fallback(*inputs)

    @staticmethod
    def _autograd(flat: list[Any]) -> bool:
        """Whether autograd would record this call (a captured graph records none)."""
        return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                               for x in flat)

    def describe(self) -> str:
        """What the runner did, in words."""
        s = self.stats
        if self.refused is not None and not s.captures:
            return f"not captured: {self.refused} ({s.uncaptured_calls} calls uncaptured)"
        if not s.captures and not s.uncaptured_calls:
            return "not called yet"
        parts = [f"captured {s.captures} graph{'s' * (s.captures != 1)}, {s.replays} "
                 f"replays, outputs {self.outputs}"]
        if s.captures:
            parts.append(f"{s.by_address_inputs} inputs by address, {s.copied_inputs} copied")
        if s.recaptures:
            parts.append(f"{s.recaptures} recaptures (an input moved)")
        if s.uncaptured_calls:
            whys = [f"{n} {what}" for n, what in (
                (s.shapes_over_cache, f"over the cache of {self.max_graphs} shapes"),
                (s.autograd_calls, "with inputs requiring grad"),
                (s.other_device_calls, "on another device than the first call's"))
                if n] or [self.refused or ""]
            parts.append(f"{s.uncaptured_calls} calls uncaptured ({', '.join(whys)})")
        return "; ".join(parts)

    def close(self) -> None:
        """Drop the captured graphs, their static buffers and pools."""
        self._graphs.clear()
        self.fallback.close()

    # -- capture -------------------------------------------------------------------------
    def _apis(self, device: torch.device) -> tuple[GraphAPI, StreamAPI, Any, dict[int, Any]]:
        graphs = self._make_graph_api(device)
        streams = self._make_stream_api(device)
        pool = device_streams(self._make_stream_api, device)  # the device's, process-wide
        capture_stream = pool.capture(graphs.new_stream)
        side = pool.side(self.program.side_streams, streams.new_stream)
        return graphs, streams, capture_stream, side

    def _written_inputs(self) -> set[str]:
        if self._written is None:
            from autostream.cost.incontext import written_placeholders
            from autostream.fx.call_effects import trace_call_effects

            written = written_placeholders(self.gm)
            try:
                written |= set(trace_call_effects(self.gm).written_inputs())
            except Exception:  # noqa: BLE001 - EffectsUnknown, or any failure: copy every input
                self._effects_known = False
            self._written = written
        return self._written

    def _capture(self, flat: list[Any]) -> _Captured:
        _, graphs, streams, capture_stream, side = self._device
        written_names = self._written_inputs()
        names = [p.name for p in self.program.placeholders]
        statics, copied = [], []
        for name, x in zip(names, flat, strict=True):
            if not isinstance(x, torch.Tensor):
                statics.append(x)
                copied.append(False)
            elif self._effects_known and name not in written_names and _by_address(x):
                statics.append(x)
                copied.append(False)
            else:
                buf = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                buf.copy_(x)
                statics.append(buf)
                copied.append(True)
        written = [i for i, name in enumerate(names) if name in written_names and copied[i]]
        snapshot = None if self._effects_known else [
            s.clone() if c else None for s, c in zip(statics, copied, strict=True)]

        def body() -> Any:
            env = self._bind(statics)
            _CaptureCall(self.gm, env, streams, capture_stream, side).run(self.steps)
            return collect_outputs(self.gm, self.program, env)

        user = streams.current_stream()
        streams.wait_stream(capture_stream, user)  # the copies above, made on the caller's
        streams.set_stream(capture_stream)
        try:
            for _ in range(self.warmup):
                body()
        finally:
            streams.set_stream(user)
        graphs.synchronize()
        if snapshot is not None:  # what a warm-up wrote, the graph writes
            written += [i for i, (s, before) in enumerate(zip(statics, snapshot, strict=True))
                        if before is not None and i not in written and not torch.equal(s, before)]
        graph = graphs.new_graph()
        out = graphs.capture(graph, body, capture_stream, graphs.new_pool())
        leaves, spec = tree_flatten(out)
        entry = _Captured(graph, statics, copied, sorted(written),
                          [self._output_rule(o, statics, copied) for o in leaves], spec)
        self.stats.captures += 1
        self.stats.by_address_inputs += sum(isinstance(x, torch.Tensor) and not c
                                             for x, c in zip(flat, copied, strict=True))
        self.stats.copied_inputs += sum(copied)
        return entry

    def _bind(self, statics: list[Any]) -> Env:
        env: Env = dict(zip(self.program.placeholders, statics, strict=True))
        for node in self.program.constants:
            env[node] = fetch_attr(self.gm, node.target)
        return env

    @staticmethod
    def _output_rule(out: Any, statics: list[Any], copied: list[bool]) -> _Output:
        if not isinstance(out, torch.Tensor):
            return _Output("value", out)
        storage = out.untyped_storage().data_ptr()
        for i, s in enumerate(statics):
            if isinstance(s, torch.Tensor) and s.untyped_storage().data_ptr() == storage:
                if not copied[i]:
                    return _Output("static", out)  # a view of the caller's own tensor
                return _Output("input_view", out, i, out.storage_offset() - s.storage_offset())
        return _Output("clone", out)

    # -- replay --------------------------------------------------------------------------
    @staticmethod
    def _addresses_hold(entry: _Captured, flat: list[Any]) -> bool:
        return all(c or not isinstance(x, torch.Tensor) or x.data_ptr() == s.data_ptr()
                   for x, s, c in zip(flat, entry.statics, entry.copied, strict=True))

    def _replay(self, entry: _Captured, flat: list[Any]) -> Any:
        graphs = self._device[1]
        for x, s, c in zip(flat, entry.statics, entry.copied, strict=True):
            if c:
                s.copy_(x)
        graphs.replay(entry.graph)
        for i in entry.written:
            flat[i].copy_(entry.statics[i])
        self.stats.replays += 1
        leaves = [self._returned(o, flat) for o in entry.outputs]
        return tree_unflatten(leaves, entry.spec)

    def _returned(self, o: _Output, flat: list[Any]) -> Any:
        if o.how == "value":
            return o.static
        if o.how == "static":  # a new view of the caller's tensor, as eager returns
            return o.static.as_strided(o.static.size(), o.static.stride(),
                                       o.static.storage_offset())
        if o.how == "input_view":
            x = flat[o.input_index]
            return x.as_strided(o.static.size(), o.static.stride(),
                                x.storage_offset() + o.offset)
        if self.outputs == "reused":
            return o.static
        return o.static.clone(memory_format=torch.preserve_format)
