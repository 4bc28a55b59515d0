"""A fake accelerator for CPU tests of graph capture: streams, events and graphs that log
every call, with the semantics that matter to a captured runtime.

- ``FakeStreams`` implements ``autostream.runtime.streams.StreamAPI``: streams and
  events are plain objects named ``s0``, ``s1``..., ``e0``...; every call is logged.
- ``FakeGraphs`` implements ``autostream.runtime.graph_api.GraphAPI``. ``capture`` runs
  the body once on the CPU (to get the static outputs) and then overwrites every floating
  output with NaN and every integer one with -1, as a real capture computes nothing:
  a runner that reads outputs without replaying sees garbage.  ``replay`` runs the body
  again on the same static inputs and copies its results into the static outputs.
  ``refuse`` makes ``capture`` raise, as torch does for an op that cannot be captured.

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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(eq=False)
class FakeStream:
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False)
class FakeEvent:
    name: str
    recorded_on: FakeStream | None = None

    def __repr__(self) -> str:
        return self.name


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
        self.current = stream
        self.log.add("set_stream", stream)

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        event.recorded_on = stream
        self.log.add("record", event, stream)

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        if event.recorded_on is None:
            raise RuntimeError(f"wait on {event}, never recorded")
        self.log.add("wait_event", stream, event)

    def wait_stream(self, stream: FakeStream, other: FakeStream) -> None:
        self.log.add("wait_stream", stream, other)

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


def _garbage(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-1)


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
                pool: Any) -> Any:
        before = self.streams.current
        self.streams.current = stream
        self.log.add("begin", graph.name, stream)
        try:
            if self.refuse:
                raise RuntimeError(self.refuse)
            out = body()
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
        graph.body, graph.outputs = body, out
        return out

    def replay(self, graph: FakeGraph) -> None:
        if graph.body is None:
            raise RuntimeError(f"replay of {graph.name}, never captured")
        self.log.add("replay", graph.name)
        graph.replays += 1
        before = self.streams.current
        fresh = graph.body()
        self.streams.current = before
        for static, value in zip(tree_leaves(graph.outputs), tree_leaves(fresh), strict=True):
            if isinstance(static, torch.Tensor) and static is not value:
                static.copy_(value)

    def synchronize(self) -> None:
        self.log.add("synchronize")


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
