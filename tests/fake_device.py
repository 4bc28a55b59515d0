"""A fake accelerator for CPU tests of graph capture: streams, events and graphs that log
every call, with the semantics that matter to a captured runtime.

- ``FakeStreams`` implements ``autostream.runtime.streams.StreamAPI``: streams and
  events are plain objects named ``s0``, ``s1``..., ``e0``...; every call is logged.
- ``FakeGraphs`` implements ``autostream.runtime.graph_api.GraphAPI``. ``capture`` runs
  the body once on the CPU (to get the static outputs) and then overwrites every floating
  output with NaN and every integer one with -1, as a real capture computes nothing:
  a runner that reads outputs without replaying sees garbage.  ``replay`` runs the body
  again on the same static inputs and copies its results into the static outputs; a
  tensor the capture read is read where it lay at capture (a device graph holds
  addresses): after ``p.data = other``, a replay still reads ``p``'s old storage.
  ``refuse`` makes ``capture`` raise, as torch does for an op that cannot be captured.
- ``FakeTorchCuda``: torch 2.11's ``torch.cuda`` as ``TorchGraphAPI`` uses it, on a
  ``FakeStreams``: ``CUDAGraph.capture_begin`` routes the pool's allocations
  (``open_pools``) and begins the capture on the current stream; a side stream joins it
  by waiting on an event recorded in it; ``capture_end`` raises unless it runs on the
  capture stream, ends the capture, raises "unjoined" if a side stream's work was not
  joined (skipping the allocator's ``endAllocateToPool``, as torch's ``AT_CUDA_CHECK``
  does), else ends the routing.  ``graph`` is torch 2.11's context manager
  (``capture_end`` before the stream is restored).  ``install_fake_cuda`` puts it where
  ``TorchGraphAPI(torch.device("cuda"))`` looks, with ``torch._C``'s allocator calls.
- ``FakeStreams.fail_on(verb, stream)`` makes the first such call during a capture raise
  (``"op"``: an op launched on that stream, under ``LoggedOps``).

- ``LoggedOps`` (a dispatch mode) logs every ATen op run while it is active as
  ``("op", name, stream)``, the stream being the fake's current one: inside a capture or a
  replay (which reruns the body) too.
- ``FakeDeviceTimer`` times the log as a device would run it (``FakeCosts``): each logged
  op takes its time on its stream, in stream order and after the events it waits for, and
  ops running at once share the device by processor sharing (shares summing to ``S > 1``
  each progress at ``1 / S``, as ``autostream.scheduling.simulate`` models it); each wait
  costs ``sync_us``; its host clock adds ``call_us`` for each replay.  It implements
  ``autostream.cost.replay.ReplayTimer`` without a wall clock.

Limits: the body's in-place writes to tensors outside the graph's own buffers (a
parameter, a running statistic) happen at capture too, which a real capture never does.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map


@dataclass(eq=False)
class FakeStream:
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False)
class FakeEvent:
    name: str
    recorded_on: FakeStream | None = None
    #: the work of ``recorded_on`` it covers, when recorded during a capture
    stamp: int = 0

    def __repr__(self) -> str:
        return self.name


@dataclass
class FakeCapture:
    """A capture under way: its stream, the side streams that joined it by waiting on
    one of its events, each one's work so far and how much of it the capture stream
    has waited for."""

    stream: FakeStream
    work: dict[FakeStream, int] = field(default_factory=dict)
    joined: dict[FakeStream, int] = field(default_factory=dict)

    def holds(self, stream: FakeStream | None) -> bool:
        return stream is self.stream or stream in self.work

    def unjoined(self) -> list[FakeStream]:
        return [s for s, n in self.work.items() if self.joined.get(s, 0) < n]


@dataclass
class FakeLog:
    """Every call, in order: ``(verb, *names)``."""

    calls: list[tuple[str, ...]] = field(default_factory=list)

    def add(self, *entry: Any) -> None:
        self.calls.append(tuple(str(x) for x in entry))

    def verbs(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeStreams:
    """The stream API of one fake device."""

    def __init__(self, log: FakeLog | None = None):
        self.log = log or FakeLog()
        self.default = FakeStream("s0")
        self.current = self.default
        self._streams = 1
        self._events = 0
        #: the capture under way (``FakeTorchCuda``'s graphs)
        self.capture: FakeCapture | None = None
        self._failure: tuple[str, str] | None = None

    def fail_on(self, verb: str, stream: str) -> None:
        """The first ``verb`` (``"op"``, ``"record"``, ``"wait_event"``, ``"set_stream"``)
        on ``stream`` during a capture raises, as torch does for what capture forbids."""
        self._failure = (verb, stream)

    def check(self, verb: str, stream: FakeStream) -> None:
        if self.capture is not None and self._failure == (verb, stream.name):
            self._failure = None
            raise RuntimeError(f"operation not permitted when stream is capturing "
                               f"(injected: {verb} on {stream})")

    def current_stream(self) -> FakeStream:
        return self.current

    def new_stream(self) -> FakeStream:
        s = FakeStream(f"s{self._streams}")
        self._streams += 1
        return s

    def new_event(self) -> FakeEvent:
        e = FakeEvent(f"e{self._events}")
        self._events += 1
        return e

    def set_stream(self, stream: FakeStream) -> None:
        self.check("set_stream", stream)
        self.current = stream
        self.log.add("set_stream", stream)
        if self.capture is not None and stream in self.capture.work:
            self.capture.work[stream] += 1  # work may follow

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        self.check("record", stream)
        event.recorded_on = stream
        event.stamp = self.capture.work.get(stream, 0) if self.capture is not None else 0
        self.log.add("record", event, stream)

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        if event.recorded_on is None:
            raise RuntimeError(f"wait on {event}, never recorded")
        self.check("wait_event", stream)
        self.log.add("wait_event", stream, event)
        self._waited(stream, event.recorded_on, event.stamp)

    def wait_stream(self, stream: FakeStream, other: FakeStream) -> None:
        self.log.add("wait_stream", stream, other)
        cap = self.capture
        self._waited(stream, other, cap.work.get(other, 0) if cap is not None else 0)

    def _waited(self, stream: FakeStream, on: FakeStream, stamp: int) -> None:
        cap = self.capture
        if cap is None or not cap.holds(on):
            return
        if stream is cap.stream:
            if on in cap.work:
                cap.joined[on] = max(cap.joined.get(on, 0), stamp)
        else:  # forks into the capture (or waits within it): a wait node is work
            cap.work[stream] = cap.work.get(stream, 0) + 1

    # allocator statistics (``record_memory``): nothing to count on the CPU
    def memory_allocated(self) -> int:
        return 0

    def max_memory_allocated(self) -> int:
        return 0

    def reset_peak_memory_stats(self) -> None:
        pass


@dataclass(eq=False)
class FakeGraph:
    name: str
    body: Callable[[], Any] | None = None
    outputs: Any = None
    replays: int = 0
    #: what the capture read: id of each tensor -> (the tensor, weakly; its storage then)
    reads: dict[int, tuple[weakref.ref, torch.Tensor]] = field(default_factory=dict)


def _garbage(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-1)


class _Reads(TorchDispatchMode):
    """While active, remembers each tensor an op reads and the storage it has then."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and id(t) not in self.reads:
                with _disable_current_modes():  # an alias, not an op of the body's
                    self.reads[id(t)] = (weakref.ref(t), t.detach())
        return func(*args, **(kwargs or {}))

    def alive(self) -> dict[int, tuple[weakref.ref, torch.Tensor]]:
        return {k: v for k, v in self.reads.items() if v[0]() is not None}


class _AtCaptureAddresses(TorchDispatchMode):
    """While active, a tensor the capture read is read at the storage it had then."""

    def __init__(self, reads: dict[int, tuple[weakref.ref, torch.Tensor]]):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(self._at_capture, (args, kwargs or {}))
        return func(*args, **kwargs)

    def _at_capture(self, t: Any) -> Any:
        read = self.reads.get(id(t)) if isinstance(t, torch.Tensor) else None
        if read is None or read[0]() is not t or t.data_ptr() == read[1].data_ptr():
            return t
        return read[1]  # moved since (``p.data = ...``): the graph reads the old address


class FakeGraphs:
    """The graph API of one fake device (shares the streams' log)."""

    def __init__(self, streams: FakeStreams, refuse: str | None = None):
        self.streams = streams
        self.log = streams.log
        self.refuse = refuse
        self.graphs: list[FakeGraph] = []
        self.captures = 0
        self._pools = 0

    def new_graph(self) -> FakeGraph:
        g = FakeGraph(f"g{len(self.graphs)}")
        self.graphs.append(g)
        return g

    def new_stream(self) -> FakeStream:
        return self.streams.new_stream()

    def new_pool(self) -> str:
        self._pools += 1
        return f"pool{self._pools}"

    def capture(self, graph: FakeGraph, body: Callable[[], Any], stream: FakeStream,
                pool: Any, join: Callable[[], None] | None = None) -> Any:
        before = self.streams.current
        self.streams.current = stream
        self.log.add("begin", graph.name, stream)
        reads = _Reads()
        try:
            if self.refuse:
                raise RuntimeError(self.refuse)
            try:
                with reads:
                    out = body()
            except BaseException:
                self.streams.current = stream
                if join is not None:
                    join()
                raise
            if self.streams.current is not stream:
                raise RuntimeError(f"capture ended on {self.streams.current}, not on its "
                                   f"capture stream {stream}")
        finally:
            self.log.add("end", graph.name)
            self.streams.current = before
        self.captures += 1
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                _garbage(t)
        graph.body, graph.outputs, graph.reads = body, out, reads.alive()
        return out

    def replay(self, graph: FakeGraph) -> None:
        if graph.body is None:
            raise RuntimeError(f"replay of {graph.name}, never captured")
        self.log.add("replay", graph.name)
        graph.replays += 1
        before = self.streams.current
        with _AtCaptureAddresses(graph.reads):
            fresh = graph.body()
        self.streams.current = before
        for static, value in zip(tree_leaves(graph.outputs), tree_leaves(fresh), strict=True):
            if isinstance(static, torch.Tensor) and static is not value:
                static.copy_(value)

    def synchronize(self) -> None:
        self.log.add("synchronize")


class _FakeCudaGraph:
    """torch 2.11's ``torch.cuda.CUDAGraph`` on the fake device (replay: logged only)."""

    def __init__(self, cuda: FakeTorchCuda):
        self.cuda = cuda
        self.name = f"g{len(cuda.graphs)}"
        cuda.graphs.append(self)
        self._pool: Any = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        streams = self.cuda.streams
        if streams.capture is not None:
            raise RuntimeError("a capture is already under way")
        self._pool = pool if pool is not None else self.cuda.graph_pool_handle()
        self.cuda.open_pools.add(self._pool)  # beginAllocateToPool, then the stream's capture
        streams.capture = FakeCapture(streams.current)
        self.cuda.log.add("begin", self.name, streams.current)

    def capture_end(self) -> None:
        streams = self.cuda.streams
        if streams.current is not streams.capture.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        unjoined = streams.capture.unjoined()
        streams.capture = None  # cudaStreamEndCapture ends it, whatever it returns
        self.cuda.log.add("end", self.name)
        if unjoined:  # AT_CUDA_CHECK raises: endAllocateToPool is skipped
            raise RuntimeError(f"CUDA error: capture sequence contains a fork that was not "
                               f"joined to the primary stream (unjoined: "
                               f"{', '.join(map(str, unjoined))})")
        self.cuda._cuda_endAllocateToPool(0, self._pool)

    def pool(self) -> Any:
        return self._pool

    def replay(self) -> None:
        self.cuda.log.add("replay", self.name)


class _FakeStreamContext:
    """``torch.cuda.stream(s)``: ``s`` current inside, the stream before restored after."""

    def __init__(self, streams: FakeStreams, stream: FakeStream):
        self.streams, self.stream, self.before = streams, stream, None

    def __enter__(self) -> None:
        self.before = self.streams.current
        self.streams.set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        self.streams.set_stream(self.before)


class _FakeGraphContext:
    """torch 2.11's ``torch.cuda.graph``, line for line as to order (``__exit__`` calls
    ``capture_end`` before it restores the stream)."""

    def __init__(self, cuda: FakeTorchCuda, cuda_graph: _FakeCudaGraph, pool: Any = None,
                 stream: FakeStream | None = None, capture_error_mode: str = "global"):
        self.cuda, self.cuda_graph = cuda, cuda_graph
        self.pool = () if pool is None else (pool,)
        self.stream_ctx = cuda.stream(stream if stream is not None else cuda.Stream())

    def __enter__(self) -> None:
        self.cuda.synchronize()
        self.cuda.empty_cache()
        self.stream_ctx.__enter__()
        self.cuda_graph.capture_begin(*self.pool)

    def __exit__(self, *args: object) -> None:
        self.cuda_graph.capture_end()
        self.stream_ctx.__exit__(*args)


class FakeTorchCuda:
    """torch 2.11's ``torch.cuda`` (and ``torch._C``'s allocator calls) as far as
    ``TorchGraphAPI`` uses them, on ``streams``."""

    def __init__(self, streams: FakeStreams):
        self.streams = streams
        self.log = streams.log
        self.graphs: list[_FakeCudaGraph] = []
        #: pools whose allocations the allocator routes to a capture (not ended yet)
        self.open_pools: set[Any] = set()
        self.released: list[Any] = []
        self._pools = 0

    def CUDAGraph(self) -> _FakeCudaGraph:  # noqa: N802 - torch's name
        return _FakeCudaGraph(self)

    def graph(self, cuda_graph: _FakeCudaGraph, pool: Any = None,
              stream: FakeStream | None = None) -> _FakeGraphContext:
        return _FakeGraphContext(self, cuda_graph, pool, stream)

    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802 - torch's name
        return self.streams.new_stream()

    def stream(self, stream: FakeStream) -> _FakeStreamContext:
        return _FakeStreamContext(self.streams, stream)

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.streams.current

    def set_stream(self, stream: FakeStream) -> None:
        self.streams.set_stream(stream)

    def graph_pool_handle(self) -> tuple[int, int]:
        self._pools += 1
        return (0, self._pools)

    def synchronize(self, device: Any = None) -> None:
        self.log.add("synchronize")

    def empty_cache(self) -> None:
        pass

    def current_device(self) -> int:
        return 0

    # torch._C's
    def _cuda_endAllocateToPool(self, device: int, pool: Any) -> None:  # noqa: N802
        if pool not in self.open_pools:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.open_pools.discard(pool)

    def _cuda_releasePool(self, device: int, pool: Any) -> None:  # noqa: N802
        self.released.append(pool)

    def _cuda_clearCublasWorkspaces(self) -> None:  # noqa: N802
        self.log.add("clear_workspaces")


def install_fake_cuda(monkeypatch: Any, streams: FakeStreams) -> FakeTorchCuda:
    """``streams``' ``FakeTorchCuda``, where ``TorchGraphAPI(torch.device("cuda"))`` finds
    its module and ``torch._C``'s allocator calls."""
    cuda = FakeTorchCuda(streams)
    real = torch.get_device_module
    monkeypatch.setattr(torch, "get_device_module", lambda device=None: (
        cuda if device is not None and torch.device(device).type == "cuda" else real(device)))
    for name in ("_cuda_endAllocateToPool", "_cuda_releasePool", "_cuda_clearCublasWorkspaces"):
        monkeypatch.setattr(torch._C, name, getattr(cuda, name), raising=False)
    return cuda


def fake_device(refuse: str | None = None) -> tuple[FakeStreams, FakeGraphs]:
    """A fake device's stream and graph APIs, sharing one log."""
    streams = FakeStreams()
    return streams, FakeGraphs(streams, refuse)


def patch_backend_to_fake_capture(monkeypatch: Any) -> list[FakeGraphs]:
    """The backend as on an accelerator that captures graphs, every graph runner on a fake
    device (CPU tensors); returns the fake devices as runners are built."""
    import importlib

    from autostream.runtime import select
    from autostream.runtime.graphed import GraphRunner

    # the module itself: the package exports a function of its name
    backend_module = importlib.import_module("autostream.backend")
    devices: list[FakeGraphs] = []

    def make_runner(gm: Any, kind: str, **options: Any) -> Any:
        if kind != "graph":
            return select.make_runner(gm, kind, **options)
        streams, graphs = fake_device()
        devices.append(graphs)
        return GraphRunner(gm, graph_api=lambda d: graphs, stream_api=lambda d: streams,
                           **options)

    monkeypatch.setattr(backend_module, "make_runner", make_runner)
    monkeypatch.setattr(backend_module, "check_runtime_device", lambda kind, device: kind)
    monkeypatch.setattr(backend_module, "select_runtime", lambda kind, inputs: "graph")
    monkeypatch.setattr(backend_module, "capture_refusal", lambda gm, device, inputs: None)
    return devices


class LoggedOps(TorchDispatchMode):
    """While active, every ATen op is logged as ``("op", name, current fake stream)``."""

    def __init__(self, streams: FakeStreams):
        super().__init__()
        self.streams = streams

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.streams.check("op", self.streams.current)
        self.streams.log.add("op", func, self.streams.current)
        return func(*args, **(kwargs or {}))


@dataclass
class FakeCosts:
    """Device time (us) and device share of each op by name (others: free), the cost of a
    wait between streams, and the host's cost of one replay call."""

    op_us: dict[str, float]
    share: dict[str, float] = field(default_factory=dict)
    sync_us: float = 0.0
    call_us: float = 0.0


def device_time(calls: list[tuple[str, ...]], costs: FakeCosts) -> float:
    """Makespan of the logged ops under stream order, waits and processor sharing."""
    durations: list[float] = []
    shares: list[float] = []
    deps: list[list[int]] = []
    last: dict[str, int] = {}
    recorded: dict[str, int | None] = {}

    def task(stream: str, us: float, share: float, after: list[int | None]) -> None:
        durations.append(us)
        shares.append(share)
        deps.append([d for d in (last.get(stream), *after) if d is not None])
        last[stream] = len(durations) - 1

    for verb, *rest in calls:
        if verb == "op":
            name, stream = rest
            task(stream, costs.op_us.get(name, 0.0), costs.share.get(name, 1.0), [])
        elif verb == "record":
            recorded[rest[0]] = last.get(rest[1])
        elif verb == "wait_event":
            task(rest[0], costs.sync_us, 0.0, [recorded.get(rest[1])])
        elif verb == "wait_stream":
            task(rest[0], costs.sync_us, 0.0, [last.get(rest[1])])
    remaining = list(durations)
    done: set[int] = set()
    now = 0.0
    while len(done) < len(durations):
        running = [i for i in range(len(durations))
                   if i not in done and all(d in done for d in deps[i])]
        load = sum(shares[i] for i in running)
        rate = {i: 1.0 / load if load > 1.0 and shares[i] > 0 else 1.0 for i in running}
        step = min(remaining[i] / rate[i] for i in running)
        now += step
        for i in running:
            remaining[i] -= step * rate[i]
            if remaining[i] <= 1e-9:
                done.add(i)
    return now


class FakeDeviceTimer:
    """``ReplayTimer`` of the fake device: marks are positions in the log."""

    def __init__(self, streams: FakeStreams, costs: FakeCosts):
        self.log = streams.log
        self.costs = costs
        self._seen = 0
        self._clock = 0.0

    def mark(self) -> int:
        return len(self.log.calls)

    def elapsed_us(self, start: int, end: int) -> float:
        return device_time(self.log.calls[start:end], self.costs)

    def now_us(self) -> float:
        calls = self.log.calls[self._seen:]
        self._seen = len(self.log.calls)
        replays = sum(1 for c in calls if c[0] == "replay")
        self._clock += device_time(calls, self.costs) + self.costs.call_us * replays
        return self._clock
