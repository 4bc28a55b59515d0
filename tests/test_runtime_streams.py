"""The accelerator runtime: what it issues (checked on CPU with a recording stream API),
and a real-device run that only happens where an accelerator exists."""

from __future__ import annotations

import weakref

import pytest
import torch

from autostream.runtime import StreamsRunner, make_runner, parse_program
from autostream.runtime.builder import DialectBuilder, fork_join


class RecordingAPI:
    """A fake device: streams and events are ints, every call is logged.

    Ops run on the host immediately; the test then replays the log with the device's
    semantics (each stream in order, event waits) to check every dependence is ordered.
    """

    def __init__(self, device=None):
        self.log: list[tuple] = []
        self.main, self.current = "main", "main"
        self._streams = 0
        self._events = 0

    def current_stream(self):
        return self.main

    def new_stream(self):
        self._streams += 1
        return f"side{self._streams}"

    def new_event(self):
        self._events += 1
        return self._events

    def set_stream(self, stream):
        self.current = stream

    def record(self, event, stream):
        self.log.append(("record", stream, event))

    def wait_event(self, stream, event):
        self.log.append(("wait_event", stream, event))

    def wait_stream(self, stream, other):
        self.log.append(("wait_stream", stream, other))


def _probe_graph(api: RecordingAPI, join: bool = True):
    """main: a = f(x) -> fork; side: b = g(a); main: c = h(a); join; out = b + c."""

    def op(tag):
        def fn(*args):
            api.log.append(("op", api.current, tag))
            value = sum(args) + 1
            weakref.finalize(value, api.log.append, ("free", tag))
            return value
        fn.__name__ = tag
        return fn

    b = DialectBuilder()
    x = b.input("x")
    a = b.call(op("a"), x)
    fork = b.record()
    with b.stream(1):
        b.wait(fork)
        tmp = b.call(op("tmp"), a)  # used only on stream 1
        bb = b.call(op("b"), tmp)
        token = b.record()
    c = b.call(op("c"), a)
    if join:
        b.wait(token)
    return b.finish(b.call(op("out"), bb, c))


def _device_order(log):
    """Replay ``log`` as a device would: vector clock of each op when it runs."""
    clock: dict[str, dict[str, int]] = {}
    event_clock: dict[int, dict[str, int]] = {}
    op_clock: dict[str, tuple[str, int, dict[str, int]]] = {}

    def vc(stream):
        return clock.setdefault(stream, {})

    def merge(stream, other):
        for s, c in other.items():
            vc(stream)[s] = max(vc(stream).get(s, 0), c)

    for entry in log:
        kind = entry[0]
        if kind == "op":
            _, stream, tag = entry
            vc(stream)[stream] = vc(stream).get(stream, 0) + 1
            op_clock[tag] = (stream, vc(stream)[stream], dict(vc(stream)))
        elif kind == "record":
            event_clock[entry[2]] = dict(vc(entry[1]))
        elif kind == "wait_event":
            merge(entry[1], event_clock[entry[2]])
        elif kind == "wait_stream":
            merge(entry[1], vc(entry[2]))
    return op_clock, clock


def _ordered(op_clock, producer, consumer):
    ps, pc, _ = op_clock[producer]
    _, _, cvc = op_clock[consumer]
    return cvc.get(ps, 0) >= pc


def test_issued_syncs_order_every_dependence():
    api = RecordingAPI()
    gm = _probe_graph(api)
    runner = StreamsRunner(gm, api=lambda device: api)
    out = runner(torch.tensor(0.0))
    assert float(out[0]) == 6.0  # a=1, tmp=2, b=3, c=2, out=6
    op_clock, clock = _device_order(api.log)
    assert {op_clock[t][0] for t in ("tmp", "b")} == {"side1"}
    assert {op_clock[t][0] for t in ("a", "c", "out")} == {"main"}
    for producer, consumer in [("a", "tmp"), ("tmp", "b"), ("a", "c"), ("b", "out"), ("c", "out")]:
        assert _ordered(op_clock, producer, consumer), (producer, consumer)
    # joined: after the call the main stream has seen all of side1's work
    assert clock["main"].get("side1", 0) == op_clock["b"][1]
    # the side stream first waits for the main stream (the caller's pending work)
    first_side = next(e for e in api.log if "side1" in e[1:2])
    assert first_side[0] == "wait_event"
    assert api.current == "main"  # current stream restored


def test_replay_flags_a_missing_wait():
    """The replay check is not vacuous: without the join wait the final op is unordered."""
    api = RecordingAPI()
    gm = _probe_graph(api, join=False)
    StreamsRunner(gm, api=lambda device: api)(torch.tensor(0.0))
    op_clock, _ = _device_order(api.log)
    assert not _ordered(op_clock, "b", "out")


def test_cross_stream_values_live_until_the_join():
    api = RecordingAPI()
    gm = _probe_graph(api)
    runner = StreamsRunner(gm, api=lambda device: api)
    out = runner(torch.tensor(0.0))
    log = api.log
    last_join = max(i for i, e in enumerate(log) if e[0] == "wait_stream")
    freed = {e[1]: i for i, e in enumerate(log) if e[0] == "free"}
    # a: made on main, read on side1; b: made on side1, read on main -> held past the join
    assert freed["a"] > last_join and freed["b"] > last_join
    # tmp is used only on side1: released right after its last use, before the join
    assert freed["tmp"] < last_join
    assert {n.name for n in parse_program(gm).held} >= {"a", "b"}
    del out


def test_side_streams_created_once_per_device():
    made = []

    def factory(device):
        api = RecordingAPI()
        made.append(api)
        return api

    gm, inputs = fork_join(streams=3, depth=1, size=4)
    runner = StreamsRunner(gm, api=factory)
    expected = gm(*inputs)
    for _ in range(3):
        assert torch.equal(runner(*inputs)[0], expected[0])
    assert len(made) == 1 and made[0]._streams == 2


def test_exception_restores_current_stream_and_joins():
    api = RecordingAPI()

    def boom(x):
        raise RuntimeError("device fault")

    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(boom, x)
        t = b.record()
    b.wait(t)
    runner = StreamsRunner(b.finish(y), api=lambda device: api)
    with pytest.raises(RuntimeError, match="device fault") as info:
        runner(torch.ones(1))
    assert info.value.__notes__ == ["autostream: raised by op 'boom' (boom) on the stream_1"]
    assert api.current == "main"
    assert api.log[-1] == ("wait_stream", "main", "side1")


needs_accelerator = pytest.mark.skipif(
    not torch.accelerator.is_available(), reason="no accelerator (CUDA/NPU/XPU) here"
)


@needs_accelerator
@pytest.mark.parametrize("streams", [2, 3])
def test_real_device_streams_equal_sequential(streams):
    device = torch.accelerator.current_accelerator()
    gm, inputs = fork_join(streams=streams, depth=3, size=256)
    inputs = tuple(t.to(device) for t in inputs)
    expected = make_runner(gm, "sequential")(*inputs)
    runner = make_runner(gm, "auto")
    for _ in range(5):
        got = runner(*inputs)
        torch.testing.assert_close(got[0], expected[0])
    assert runner._runners.keys() == {"streams"}
