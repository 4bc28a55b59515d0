"""A capture that fails is undone in full, and cuBLAS workspaces are cleared around each
capture: ``TorchGraphAPI`` itself, on a fake of torch 2.11's ``torch.cuda`` whose
``graph.__exit__`` calls ``capture_end`` before it restores the stream
(``tests/fake_device.py``)."""

from __future__ import annotations

import pytest
import torch

from autostream.models.zoo import moe_model
from autostream.runtime.graph_api import TorchGraphAPI
from autostream.runtime.graphed import GraphRunner
from autostream.runtime.sequential import SequentialRunner
from tests.fake_device import FakeStreams, LoggedOps, install_fake_cuda
from tests.helpers import as_tuple
from tests.test_runtime_graph import planned


@pytest.fixture(autouse=True)
def inference():
    with torch.no_grad():
        yield


@pytest.fixture
def cuda(monkeypatch):
    """Installs a fake device's streams, and torch 2.11's ``torch.cuda`` on them (after
    Dynamo has traced what the test runs: it looks ``torch.get_device_module`` up)."""
    def install():
        streams = FakeStreams()
        return streams, install_fake_cuda(monkeypatch, streams)

    return install


def torch_runner(gm, streams):
    """A graph runner on ``TorchGraphAPI`` (the fake ``torch.cuda``), its streams fake."""
    return GraphRunner(gm, graph_api=lambda d: TorchGraphAPI(torch.device("cuda")),
                       stream_api=lambda d: streams, warmup=1)


def nothing_left_open(streams, fake):
    """The caller's stream is current, no capture is under way, the allocator routes no
    allocation to a capture's pool."""
    return streams.current is streams.default and streams.capture is None and not fake.open_pools


# the runner's capture stream is s1, its side stream s2 (the order the runner makes them)
@pytest.mark.parametrize("verb, stream", [
    ("record", "s1"),  # before the fork: the fork's event cannot be recorded
    ("op", "s1"),      # after the fork, on the capture stream
    ("op", "s2"),      # on the side stream
], ids=["before-fork", "after-fork", "on-side-stream"])
def test_a_capture_that_fails_is_undone_in_full(cuda, verb, stream):
    gm, args = planned(moe_model)
    streams, fake = cuda()
    runner = torch_runner(gm, streams)
    streams.fail_on(verb, stream)
    with LoggedOps(streams):
        got = as_tuple(runner(*args))
    want = as_tuple(SequentialRunner(gm)(*args))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))  # run uncaptured
    begins = [c for c in streams.log.calls if c[0] == "begin"]
    assert [c[2] for c in begins] == ["s1"] and ("end", "g0") in streams.log.calls
    assert nothing_left_open(streams, fake)
    # torch's own error, not what a capture left unjoined would raise after it
    assert runner.refused == (f"capture failed (RuntimeError: operation not permitted when "
                              f"stream is capturing (injected: {verb} on {stream}))")
    assert not runner.captured and runner.stats.uncaptured_calls == 1


def test_a_failed_capture_without_a_join_still_ends_and_frees_its_pool(cuda):
    """The calibration's captures pass no join: ``capture_end`` then raises "unjoined",
    and the pool's allocation is ended (and the pool released) all the same."""
    streams, fake = cuda()
    api = TorchGraphAPI(torch.device("cuda"))
    stream, side = api.new_stream(), streams.new_stream()

    def body():
        fork = streams.new_event()
        streams.record(fork, stream)
        streams.wait_event(side, fork)
        streams.set_stream(side)
        raise ValueError("the body's own error")

    graph, pool = api.new_graph(), api.new_pool()
    with pytest.raises(ValueError, match="the body's own error"):
        api.capture(graph, body, stream, pool)
    assert nothing_left_open(streams, fake) and fake.released == [pool]


def test_a_capture_end_that_fails_after_a_clean_body_leaves_nothing(cuda):
    streams, fake = cuda()
    api = TorchGraphAPI(torch.device("cuda"))
    stream, side = api.new_stream(), streams.new_stream()

    def body():  # forks and never joins: capture_end's error is the one to report
        fork = streams.new_event()
        streams.record(fork, stream)
        streams.wait_event(side, fork)

    graph, pool = api.new_graph(), api.new_pool()
    with pytest.raises(RuntimeError, match="not joined to the primary stream"):
        api.capture(graph, body, stream, pool)
    assert nothing_left_open(streams, fake) and fake.released == [pool]


def test_workspaces_are_cleared_right_before_and_after_capture(cuda):
    gm, args = planned(moe_model)
    streams, fake = cuda()
    runner = torch_runner(gm, streams)
    runner(*args)
    marks = [c[0] for c in streams.log.calls if c[0] in ("clear_workspaces", "begin", "end")]
    assert marks == ["clear_workspaces", "begin", "end", "clear_workspaces"]
    calls = streams.log.calls
    begin = next(i for i, c in enumerate(calls) if c[0] == "begin")
    cleared = max(i for i, c in enumerate(calls[:begin]) if c[0] == "clear_workspaces")
    assert not [c for c in calls[cleared:begin] if c[0] == "op"]  # nothing allocated between
    assert runner.captured and nothing_left_open(streams, fake) and not fake.released
