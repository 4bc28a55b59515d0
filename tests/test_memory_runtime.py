"""Measured memory: what the runtimes record per call, against the prediction."""

from __future__ import annotations

import pytest
import torch

from autostream.fx.capture import capture
from autostream.models.zoo import parallel_block
from autostream.passes import AutoStreamPass
from autostream.runtime import StreamsRunner, ThreadsRunner, make_runner
from autostream.runtime.builder import fork_join
from autostream.runtime.memory import LiveBytes, storage_bytes
from autostream.runtime.segments import Segment
from tests.test_runtime_streams import RecordingAPI


def _hf_llama():
    hf = pytest.importorskip("autostream.models.hf_zoo")
    if "llama" not in hf.available():
        pytest.skip("transformers has no Llama here")
    return hf.llama(cache="prefill")


MODELS = {"parallel": lambda: parallel_block(tokens=256), "llama_prefill": _hf_llama}


def _peaks(gm, args, calls=3):
    with ThreadsRunner(gm, record_memory=True) as runner, torch.no_grad():
        out = []
        for _ in range(calls):
            runner(*args)
            out.append(runner.last_memory)
    return out


def _planned(graph, streams, budget):
    """The memory of the plan HEFT makes for ``graph`` on the H200 table (applied in place)."""
    stream_pass = AutoStreamPass(max_streams=streams, solver="heft", cost_table="h200",
                                 max_memory_increase=budget)
    stream_pass(graph.gm)
    report = stream_pass.last_report
    assert report.applied, report.reason
    return report.plan.memory


@pytest.mark.parametrize("name", sorted(MODELS))
def test_measured_peak_agrees_with_the_prediction(name):
    [graph] = capture(*MODELS[name]())
    single = _peaks(graph.gm, graph.args)
    memory = _planned(graph, 2, None)
    assert all(m.peak_bytes == memory.single_stream_peak_bytes for m in single)
    for measured in _peaks(graph.gm, graph.args):
        assert abs(memory.peak_bytes / measured.peak_bytes - 1) <= 0.10
        assert measured.peak_bytes <= memory.bound_bytes
        assert measured.input_bytes == memory.profile.input_bytes


@pytest.mark.parametrize("budget", [None, "10%,256KiB"])
def test_no_run_holds_more_than_the_bound(budget):
    [graph] = capture(*parallel_block(tokens=256))
    memory = _planned(graph, 3, budget)
    assert memory.peak_bytes <= memory.bound_bytes
    if budget is not None:
        assert memory.bound_bytes <= memory.limit_bytes
    peaks = [m.peak_bytes for m in _peaks(graph.gm, graph.args, calls=20)]
    assert max(peaks) <= memory.bound_bytes, (peaks, memory.bound_bytes)


def test_live_bytes_counts_each_storage_once_and_keeps_inputs():
    clock = iter(float(i) for i in range(100)).__next__
    meter = LiveBytes(clock=clock)
    x = torch.zeros(64)  # 256 B input
    meter.pin([x, x[:4]])
    y = torch.zeros(32)  # 128 B
    meter.hold(y, start=meter.now())
    meter.hold(y.view(4, 8), start=meter.now())  # a view: no new bytes
    meter.drop(y)
    meter.drop(x)  # inputs stay: the caller holds them
    assert meter.result().peak_bytes == 256 + 128
    meter.drop(y.view(4, 8))
    meter.drop(torch.zeros(8))  # never held: ignored
    result = meter.result()
    assert result.input_bytes == 256 and result.curve[-1][1] == 256


def test_recording_is_off_by_default_and_keeps_segments():
    gm, inputs = fork_join(streams=2, depth=3, size=8)
    with ThreadsRunner(gm) as off, ThreadsRunner(gm, record_memory=True) as on:
        assert off(*inputs)[0].shape == on(*inputs)[0].shape
        assert off.last_memory is None and on.last_memory is not None
        assert any(isinstance(i, Segment) for items in off.plan_of.values() for i in items)
        assert not any(isinstance(i, Segment) for items in on.plan_of.values() for i in items)
        assert on.last_memory.peak_bytes >= storage_bytes(inputs)


class AllocatorAPI(RecordingAPI):
    """A recording device whose allocator reports a scripted 1000 B rise during the call."""

    def __init__(self, device=None):
        super().__init__(device)
        self.allocated, self.peak = 5000, 5000

    def memory_allocated(self):
        return self.allocated

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.log.append(("reset",))
        self.peak = self.allocated

    def set_stream(self, stream):
        super().set_stream(stream)
        self.peak = self.allocated + 1000


def test_streams_runtime_measures_with_the_allocator_statistics():
    gm, inputs = fork_join(streams=2, depth=1, size=4)
    api = AllocatorAPI()
    runner = StreamsRunner(gm, api=lambda device: api, record_memory=True)
    expected = make_runner(gm, "sequential")(*inputs)
    torch.testing.assert_close(runner(*inputs)[0], expected[0])
    first_stream_op = next(i for i, e in enumerate(api.log) if e[0] in ("record", "wait_event"))
    assert api.log.index(("reset",)) < first_stream_op  # reset before anything ran
    assert runner.last_memory.input_bytes == storage_bytes(inputs)
    assert runner.last_memory.peak_bytes == storage_bytes(inputs) + 1000
    assert StreamsRunner(gm, api=lambda device: RecordingAPI()).last_memory is None
