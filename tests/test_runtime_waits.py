"""The threads runtime's waits: no deadline by default, and time in communication never counts.

A stream inside a collective waits for its peers as long as the process group lets
it (issue 26: a healthy rank failed with ``StreamWaitTimeout`` while a peer saved a
checkpoint); a stream that fails still ends every wait at once with its own error.
The multi-rank cases are in ``tests/test_distributed_patterns.py``.
"""

from __future__ import annotations

import time

import pytest
import torch

from autostream.runtime import StreamWaitTimeout, ThreadsRunner
from autostream.runtime.builder import DialectBuilder

HELD_S = 2.0  # how long the stand-in collective blocks; the waits' limit is far below
LIMIT_S = 0.5  # above thread start-up on a loaded machine (counted: no communication yet)


@torch.library.custom_op("autostream_test::held_all_reduce", mutates_args=())
def held_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """A collective whose peer is late: blocks ``HELD_S``, then returns (a name the
    communication registry recognises, ``comm.registry.looks_like_communication``)."""
    time.sleep(HELD_S)
    return x * 2


def _slow_local(x: torch.Tensor) -> torch.Tensor:
    time.sleep(HELD_S)
    return x * 2


def _producer_graph(op, chained: bool = False) -> torch.fx.GraphModule:
    """``op`` on a side stream, waited for by the main stream; ``chained``: through a
    second side stream that waits for the first."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(op, x)
        token = b.record()
    if chained:
        with b.stream(2):
            b.wait(token)
            y = b.call(torch.ops.aten.neg.default, y)
            token = b.record()
    b.wait(token)
    return b.finish(b.call(torch.ops.aten.add.Tensor, y, x))


@pytest.mark.parametrize("chained", [False, True])
def test_a_wait_on_a_stream_in_communication_outlasts_wait_timeout(chained):
    runner = ThreadsRunner(_producer_graph(torch.ops.autostream_test.held_all_reduce.default,
                                           chained), wait_timeout_s=LIMIT_S)
    try:
        t0 = time.monotonic()
        out = runner(torch.ones(2))
        assert time.monotonic() - t0 >= HELD_S > 3 * LIMIT_S
        want = -2.0 + 1.0 if chained else 2.0 + 1.0
        assert torch.equal(out[0], torch.full((2,), want))
    finally:
        runner.close()


def test_a_wait_on_local_work_still_times_out_under_an_explicit_limit():
    runner = ThreadsRunner(_producer_graph(_slow_local), wait_timeout_s=LIMIT_S)
    try:
        with pytest.raises(StreamWaitTimeout, match="outside communication"):
            runner(torch.ones(2))
    finally:
        time.sleep(HELD_S)  # let the worker finish before closing
        runner.close()


def test_joining_a_stream_in_communication_outlasts_wait_timeout():
    """The main stream does not wait for the side stream's last op; the join does."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(torch.ops.aten.neg.default, x)
        token = b.record()
        b.call(torch.ops.autostream_test.held_all_reduce.default, x)
    b.wait(token)
    runner = ThreadsRunner(b.finish(y), wait_timeout_s=LIMIT_S)
    try:
        assert torch.equal(runner(torch.ones(2))[0], -torch.ones(2))
        assert torch.equal(runner(torch.ones(2))[0], -torch.ones(2))  # not marked broken
    finally:
        runner.close()


def _raises_late(x: torch.Tensor) -> torch.Tensor:
    time.sleep(0.2)
    raise ValueError("peer closed the connection")


def test_waits_have_no_deadline_by_default_but_a_failing_producer_ends_them_at_once():
    runner = ThreadsRunner(_producer_graph(_raises_late))
    assert runner.wait_timeout_s is None
    try:
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="peer closed the connection") as info:
            runner(torch.ones(2))
        assert time.monotonic() - t0 < 5.0
        assert any("stream_1" in n for n in info.value.__notes__)  # the producer's own error
    finally:
        runner.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_wait_timeout_must_be_positive_or_none(bad):
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(ValueError, match="wait_timeout_s must be > 0 seconds"):
        ThreadsRunner(gm, wait_timeout_s=bad)
