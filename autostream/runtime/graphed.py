"""Graph runtime: the plan's streams captured into one device graph, then replayed.

The interpreted streams runtime launches every op from Python, so a graph of small
kernels is host-bound and two streams cannot overlap what one thread issues in turn
(``docs/cuda.md``).  This runtime captures the whole multi-stream program once per input
shape (:mod:`autostream.runtime.capture_plan`: side streams fork from the capture stream
after capture begins and are joined before it ends) and replays it: the host issues
one graph launch, and the device runs the streams' kernels as the graph's edges allow.

**Inputs.**  A tensor input is used by address when it is a parameter (or a tensor Dynamo
marks static) that no op's schema writes: the graph reads it where it lies, as a
parameter updated in place stays current.  Every other tensor input is copied into a
static buffer before each replay; an input the graph writes (a KV cache, running
statistics) is copied back after it.  Where what the graph writes cannot be established
(no example values), the writes to copied inputs are found by what the warm-up changed,
from a snapshot of them that may not exceed ``snapshot_bytes`` (else the graph is
refused).  A by-address input found at another address than the one recorded at capture
(``p.data = ...``, as ``Module.to`` does) is captured again, counted in ``recaptures``.

**Host cost of a call.**  A call is checked against the graph used last, then the others:
the copied inputs by layout, the other values by value, the by-address inputs by their
integer addresses (one tuple compare, as cudagraph trees check static inputs); nothing is
keyed or copied for a by-address input.  Its layout is not checked while its address
holds (Dynamo's guards recompile on a new shape).

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
torch raising during capture: the capture is undone in full and torch's own error is
reported) runs as the streams runtime runs it, and ``refused`` says why.  A capture
sequence :func:`~autostream.runtime.capture_plan.check_capture` rejects is refused too,
and runs on one stream (its streams are not ordered safely).  ``max_graphs`` input shapes
are captured at most; further shapes run uncaptured, counted in ``uncaptured_calls``.

>>> runner = GraphRunner.__new__(GraphRunner)  # built by make_runner(gm, "graph")
>>> GraphRunner.kind
'graph'
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from autostream.runtime.capturable import graph_refusal
from autostream.runtime.capture_plan import CaptureStep, capture_steps, check_capture
from autostream.runtime.execute import Env, collect_outputs, fetch_attr
from autostream.runtime.graph_api import GraphAPI, TorchGraphAPI
from autostream.runtime.program import StreamProgram, parse_program
from autostream.runtime.sequential import SequentialRunner
from autostream.runtime.stream_pool import device_streams
from autostream.runtime.streams import (
    DeviceCall,
    StreamAPI,
    StreamsRunner,
    TorchStreamAPI,
    input_device,
)

__all__ = ["OUTPUT_POLICIES", "SNAPSHOT_BYTES", "GraphRunner", "check_output_policy"]

log = logging.getLogger("autostream")

#: what a call returns: new tensors, or the graph's own (overwritten by the next replay)
OUTPUT_POLICIES = ("fresh", "reused")

#: input shapes captured at most per runner (more run uncaptured)
MAX_GRAPHS = 8
#: uncaptured runs before capture (lazy initialisation: cuBLAS handles, workspaces)
WARMUP = 3
#: the most bytes of copied inputs snapshotted to find what a graph of unknown effects
#: writes: a second copy alive during the warm-up, small beside a device's memory; an
#: input past it (a KV cache) would make the snapshot an out-of-memory error, so refused
SNAPSHOT_BYTES = 256 << 20

_DATA_PTR = torch.Tensor.data_ptr


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

    def __init__(self, *args: Any):
        super().__init__(*args)
        #: side streams forked so far (joined again if the body fails)
        self.forked: list[Any] = []

    def run(self, steps: tuple[CaptureStep, ...]) -> None:
        for s in steps:
            if s.verb in ("op", "record", "wait"):
                getattr(self, s.verb)(s.step)
            elif s.verb == "release":
                self.release(s.values)
            elif s.verb in ("fork", "join"):
                getattr(self, s.verb)([self.streams[s.stream]])
            # begin and end: the graph API's, around the body

    def fork(self, streams: Sequence[Any] | None = None) -> None:
        super().fork(streams)
        self.forked += list(self.side.values()) if streams is None else streams

    def join_forked(self) -> None:
        """Back on the capture stream, which waits for every side stream forked."""
        self.join(self.forked)


class _Refused(Exception):
    """This graph is not captured, for the reason given."""


@dataclass
class _Output:
    """How one output leaf is returned after a replay."""

    how: str  # "value" (not a tensor), "static", "input_view", "clone"
    static: Any = None
    input_index: int = -1
    offset: int = 0


def _picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], Iterable[Any]]:
    """The items of a sequence at ``indices``: slices of its runs of contiguous indices
    (Dynamo's lifted parameters are a few such runs), each copied in one C call.

    >>> [list(_picker(i)("abcde")) for i in ([4, 0], [1, 2, 4], [1], [])]
    [['e', 'a'], ['b', 'c', 'e'], ['b'], []]
    >>> "".join(_picker(range(0, 26, 2))("abcdefghijklmnopqrstuvwxyz"))  # 13 runs
    'acegikmoqsuwy'
    """
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    if len(runs) > 8:  # scattered: one index at a time
        return operator.itemgetter(*indices)
    first, *rest = [slice(a, b) for a, b in runs] or [slice(0, 0)]

    def pick(flat: Sequence[Any]) -> Sequence[Any]:
        out = flat[first]
        for s in rest:
            out = out + flat[s]
        return out

    return pick


@dataclass
class _Captured:
    """One captured input shape: its graph, static inputs, how outputs come back, and
    what a call must match to replay it."""

    graph: Any
    statics: list[Any]
    #: copied inputs written by the graph, copied back after each replay
    written: tuple[int, ...]
    outputs: list[_Output]
    spec: Any
    inputs: int
    #: (input index, static buffer) of the inputs copied in before each replay
    copies: tuple[tuple[int, torch.Tensor], ...]
    #: (input index, shape, stride, dtype, device) of the copied inputs
    layouts: tuple[tuple[int, torch.Size, tuple[int, ...], torch.dtype, torch.device], ...]
    #: (input index, type, value) of the inputs that are not tensors
    values: tuple[tuple[int, type, Any], ...]
    #: the by-address inputs of a call, and their addresses at capture
    addressed: Callable[[Sequence[Any]], Iterable[Any]]
    addresses: tuple[int, ...]

    def fits(self, flat: Sequence[Any]) -> bool:
        """Whether a call's copied inputs and values are this graph's."""
        if len(flat) != self.inputs:
            return False
        for i, shape, stride, dtype, device in self.layouts:
            x = flat[i]
            if not (isinstance(x, torch.Tensor) and x.shape == shape and x.stride() == stride
                    and x.dtype == dtype and x.device == device):
                return False
        for i, kind, value in self.values:
            x = flat[i]
            if type(x) is not kind or not (x is value or x == value):
                return False
        return True

    def holds(self, flat: Sequence[Any]) -> bool:
        """Whether a call's by-address inputs lie where they lay at capture."""
        try:
            return tuple(map(_DATA_PTR, self.addressed(flat))) == self.addresses
        except TypeError:  # a tensor input given as another kind of value
            return False


def _by_address(x: Any) -> bool:
    return isinstance(x, torch.nn.Parameter) or hasattr(x, "_dynamo_static_input_type")


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
    #: why what the graph writes is unknown ("" when it is known)
    effects_unknown: str = ""
    #: bytes of copied inputs snapshotted to find the writes of a graph of unknown effects
    snapshot_bytes: int = 0


@dataclass
class _Effects:
    """What the runner knows of the inputs the graph writes."""

    #: placeholders written: by schema, and by the trace where it ran
    written: set[str] = field(default_factory=set)
    #: why the trace could not run ("" when it did)
    unknown: str = ""


class GraphRunner:
    """Run a rewritten GraphModule captured into device graphs (one per input shape).

    ``graph_api`` and ``stream_api`` build the device's graph and stream APIs (the
    torch ones by default; tests pass fakes); ``outputs`` is ``"fresh"`` or
    ``"reused"`` (see the module docstring); ``max_graphs`` bounds the shapes captured;
    ``snapshot_bytes`` the snapshot of a graph of unknown effects.
    """

    kind = "graph"

    def __init__(self, gm: torch.fx.GraphModule, program: StreamProgram | None = None, *,
                 graph_api: Callable[[torch.device], GraphAPI] = TorchGraphAPI,
                 stream_api: Callable[[torch.device], StreamAPI] = TorchStreamAPI,
                 outputs: str = "fresh", max_graphs: int = MAX_GRAPHS, warmup: int = WARMUP,
                 record_memory: bool = False, snapshot_bytes: int = SNAPSHOT_BYTES):
        check_output_policy(outputs)
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an integer >= 1, got {max_graphs!r}")
        self.gm = gm
        self.program = program if program is not None else parse_program(gm)
        self.steps = capture_steps(self.program)
        check = check_capture(self.steps, self.program)
        self.stats = GraphStats(checked=check.summary())
        self.outputs = outputs
        self.max_graphs = max_graphs
        self.warmup = warmup
        self.snapshot_bytes = snapshot_bytes
        self._make_graph_api = graph_api
        self._make_stream_api = stream_api
        #: why the graph runs uncaptured (``None``: it is captured)
        self.refused: str | None = None
        self.fallback: Callable[..., Any]
        if check.ok:
            self.fallback = StreamsRunner(gm, self.program, api=stream_api,
                                          record_memory=record_memory)
        else:  # the plan's streams are not ordered safely: one stream is
            self.fallback = SequentialRunner(gm, self.program)
            self.refuse(f"the plan's capture sequence is unsafe, so it runs on one stream "
                        f"({check.summary()})")
        self._graphs: list[_Captured] = []
        self._last: _Captured | None = None
        self._plain_inputs = type(gm.graph._codegen) is torch.fx.graph.CodeGen
        #: the device, its graph and stream APIs, the capture stream and the side streams
        self._device: tuple[torch.device, GraphAPI, StreamAPI, Any, dict[int, Any]] | None = None
        self._effects: _Effects | None = None

    @property
    def captured(self) -> bool:
        """Whether calls replay: a graph was captured and nothing was refused since."""
        return self.stats.captures > 0 and self.refused is None

    # -- calls ---------------------------------------------------------------------------
    def __call__(self, *inputs: Any) -> Any:
        if self.refused is not None:
            return self._uncaptured(inputs)
        flat = inputs if self._plain_inputs else self.gm.graph._codegen.process_inputs(*inputs)
        if self._autograd(flat):
            # this call only: a later no_grad call is captured
            self.stats.autograd_calls += 1
            return self._uncaptured(inputs)
        last = self._last
        if last is not None and last.fits(flat) and last.holds(flat):
            return self._replay(last, flat)
        return self._find_or_capture(inputs, flat)

    def _find_or_capture(self, inputs: tuple[Any, ...], flat: Sequence[Any]) -> Any:
        if len(flat) != len(self.program.placeholders):
            names = [p.name for p in self.program.placeholders]
            raise TypeError(f"graph expects {len(names)} inputs {names}, got {len(flat)}")
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
        fitting = [e for e in self._graphs if e.fits(flat)]
        entry = next((e for e in fitting if e.holds(flat)), None)
        if entry is None and fitting:  # a by-address input moved: its graph reads stale memory
            self.stats.recaptures += 1
            self._graphs.remove(fitting[0])
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                self.stats.shapes_over_cache += 1
                return self._uncaptured(inputs)
            try:
                entry = self._capture(flat)
            except _Refused as exc:
                self.refuse(str(exc))
                return self._uncaptured(inputs)
            except Exception as exc:  # noqa: BLE001 - torch refused: run as today, say why
                self.refuse(f"capture failed ({type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0][:200] if str(exc) else ''})")
                return self._uncaptured(inputs)
            self._graphs.append(entry)
        return self._replay(entry, flat)

    def refuse(self, why: str) -> None:
        """Run every later call uncaptured, and say why (once, in the log and ``refused``)."""
        if self.refused is None:
            self.refused = why
            log.info("autostream: graph runtime: %s; running uncaptured instead", why)

    def _uncaptured(self, inputs: tuple[Any, ...]) -> Any:
        self.stats.uncaptured_calls += 1
        return self.fallback(*inputs)

    @staticmethod
    def _autograd(flat: Sequence[Any]) -> bool:
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
        if s.effects_unknown:
            parts.append(f"effects unknown ({s.effects_unknown}): writes found by the warm-up "
                         f"in a {s.snapshot_bytes}-byte snapshot")
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
        self._last = None
        self.fallback.close()

    # -- capture -------------------------------------------------------------------------
    def _apis(self, device: torch.device) -> tuple[GraphAPI, StreamAPI, Any, dict[int, Any]]:
        graphs = self._make_graph_api(device)
        streams = self._make_stream_api(device)
        pool = device_streams(self._make_stream_api, device)  # the device's, process-wide
        capture_stream = pool.capture(graphs.new_stream)
        side = pool.side(self.program.side_streams, streams.new_stream)
        return graphs, streams, capture_stream, side

    def _known_effects(self) -> _Effects:
        if self._effects is None:
            from autostream.cost.incontext import written_placeholders
            from autostream.fx.call_effects import trace_call_effects

            effects = _Effects(written_placeholders(self.gm))
            try:
                effects.written |= set(trace_call_effects(self.gm).written_inputs())
            except Exception as exc:  # noqa: BLE001 - EffectsUnknown, or any failure
                text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                effects.unknown = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            self._effects = effects
            self.stats.effects_unknown = effects.unknown
        return self._effects

    def _capture(self, flat: Sequence[Any]) -> _Captured:
        _, graphs, streams, capture_stream, side = self._device
        effects = self._known_effects()
        names = [p.name for p in self.program.placeholders]
        statics, copied = [], []
        for name, x in zip(names, flat, strict=True):
            if not isinstance(x, torch.Tensor) or (_by_address(x) and name not in effects.written):
                statics.append(x)
                copied.append(False)
            else:
                buf = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                buf.copy_(x)
                statics.append(buf)
                copied.append(True)
        written = [i for i, name in enumerate(names) if name in effects.written and copied[i]]
        snapshot = self._snapshot(statics, copied) if effects.unknown else None
        calls: list[_CaptureCall] = []

        def body() -> Any:
            call = _CaptureCall(self.gm, self._bind(statics), streams, capture_stream, side)
            calls.append(call)
            call.run(self.steps)
            return collect_outputs(self.gm, self.program, call.env)

        def join() -> None:
            if calls:
                calls[-1].join_forked()

        # another thread's kernels on the device's shared streams would land in this graph
        with device_streams(self._make_stream_api, self._device[0]).lock:
            self._warm_up(body, join)
            if snapshot is not None:  # what a warm-up wrote, the graph writes
                written += [i for i, (s, before) in enumerate(zip(statics, snapshot, strict=True))
                            if before is not None and i not in written
                            and not torch.equal(s, before)]
            graph = graphs.new_graph()
            calls.clear()
            out = graphs.capture(graph, body, capture_stream, graphs.new_pool(), join=join)
        entry = self._entry(graph, flat, statics, copied, written, out)
        self.stats.captures += 1
        self.stats.by_address_inputs += len(entry.addresses)
        self.stats.copied_inputs += len(entry.copies)
        return entry

    def _warm_up(self, body: Callable[[], Any], join: Callable[[], None]) -> None:
        _, graphs, streams, capture_stream, _ = self._device
        user = streams.current_stream()
        streams.wait_stream(capture_stream, user)  # the copies made on the caller's stream
        streams.set_stream(capture_stream)
        try:
            for _ in range(self.warmup):
                body()
        except BaseException:
            join()
            raise
        finally:
            streams.set_stream(user)
        graphs.synchronize()

    def _snapshot(self, statics: list[Any], copied: list[bool]) -> list[Any]:
        """The copied inputs before the warm-up, to find what it writes."""
        size = sum(s.nbytes for s, c in zip(statics, copied, strict=True) if c)
        if size > self.snapshot_bytes:
            raise _Refused(
                f"what the graph writes is unknown ({self.stats.effects_unknown}) and finding "
                f"it would snapshot {size} bytes of copied inputs, over snapshot_bytes="
                f"{self.snapshot_bytes}; give the graph example values (capture it with "
                f"Dynamo or make_fx) or raise snapshot_bytes")
        self.stats.snapshot_bytes = max(self.stats.snapshot_bytes, size)
        return [s.clone() if c else None for s, c in zip(statics, copied, strict=True)]

    def _entry(self, graph: Any, flat: Sequence[Any], statics: list[Any], copied: list[bool],
               written: list[int], out: Any) -> _Captured:
        leaves, spec = tree_flatten(out)
        tensors = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        addressed = [i for i in tensors if not copied[i]]
        return _Captured(
            graph, statics, tuple(sorted(written)),
            [self._output_rule(o, statics, copied) for o in leaves], spec, len(flat),
            copies=tuple((i, statics[i]) for i in tensors if copied[i]),
            layouts=tuple((i, flat[i].shape, flat[i].stride(), flat[i].dtype, flat[i].device)
                          for i in tensors if copied[i]),
            values=tuple((i, type(x), x) for i, x in enumerate(flat)
                         if not isinstance(x, torch.Tensor)),
            addressed=_picker(addressed),
            addresses=tuple(flat[i].data_ptr() for i in addressed))

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
    def _replay(self, entry: _Captured, flat: Sequence[Any]) -> Any:
        for i, buf in entry.copies:
            buf.copy_(flat[i])
        self._device[1].replay(entry.graph)
        for i in entry.written:
            flat[i].copy_(entry.statics[i])
        self.stats.replays += 1
        self._last = entry
        return tree_unflatten([self._returned(o, flat) for o in entry.outputs], entry.spec)

    def _returned(self, o: _Output, flat: Sequence[Any]) -> Any:
        if o.how == "clone":
            if self.outputs == "reused":
                return o.static
            return o.static.clone(memory_format=torch.preserve_format)
        if o.how == "value":
            return o.static
        if o.how == "static":  # a new view of the caller's tensor, as eager returns
            return o.static.as_strided(o.static.size(), o.static.stride(),
                                       o.static.storage_offset())
        x = flat[o.input_index]  # "input_view"
        return x.as_strided(o.static.size(), o.static.stride(), x.storage_offset() + o.offset)
