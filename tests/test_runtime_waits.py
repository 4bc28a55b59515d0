"""The threads runtime's waits: no deadline by default, and time in communication never counts.

A stream inside a collective waits for its peers as long as the process group lets
it (issue 26: a healthy rank failed with ``StreamWaitTimeout`` while a peer saved a
checkpoint); a stream that fails still ends every wait at once with its own error.
The waits here count on a :class:`~tests.helpers.SteppedClock` that the held ops move
on by ``HELD_S`` while the waiting streams poll it, so no outcome depends on the
machine's speed.  The multi-rank cases are in ``tests/test_distributed_patterns.py``.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from autostream.runtime import StreamWaitTimeout, ThreadsRunner
from autostream.runtime.builder import DialectBuilder
from tests.helpers import HANG_S, SteppedClock

LIMIT_S = 60.0  # the waits' limit (on the stepped clock: it alone moves time)
HELD_S = 3 * LIMIT_S  # how far the held ops move the clock while a stream waits for them
#: the clock the held ops move (each test sets its own)
CLOCK = SteppedClock()


@pytest.fixture
def clock(monkeypatch):
    def make(readers: int = 1) -> SteppedClock:
        fresh = SteppedClock(readers=readers)
        monkeypatch.setattr(sys.modules[__name__], "CLOCK", fresh)
        return fresh
    return make


@torch.library.custom_op("autostream_test::held_all_reduce", mutates_args=())
def held_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """A collective whose peer is late: ``HELD_S`` pass while it runs (a name the
    communication registry recognises, ``comm.registry.looks_like_communication``)."""
    CLOCK.advance(HELD_S)
    return x * 2


def _slow_local(x: torch.Tensor) -> torch.Tensor:
    CLOCK.advance(HELD_S)
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
def test_a_wait_on_a_stream_in_communication_outlasts_wait_timeout(chained, clock):
    held = clock(readers=2 if chained else 1)  # the main stream, and the second side stream
    runner = ThreadsRunner(_producer_graph(torch.ops.autostream_test.held_all_reduce.default,
                                           chained), wait_timeout_s=LIMIT_S, clock=held)
    try:
        out = runner(torch.ones(2))
        assert held() >= HELD_S > 2 * LIMIT_S
        want = -2.0 + 1.0 if chained else 2.0 + 1.0
        assert torch.equal(out[0], torch.full((2,), want))
    finally:
        runner.close()


def test_a_wait_on_local_work_still_times_out_under_an_explicit_limit(clock):
    runner = ThreadsRunner(_producer_graph(_slow_local), wait_timeout_s=LIMIT_S, clock=clock())
    try:
        with pytest.raises(StreamWaitTimeout, match="outside communication"):
            runner(torch.ones(2))
    finally:
        runner.close()


def test_joining_a_stream_in_communication_outlasts_wait_timeout(clock):
    """The main stream does not wait for the side stream's last op; the join does."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(torch.ops.aten.neg.default, x)
        token = b.record()
        b.call(torch.ops.autostream_test.held_all_reduce.default, x)
    b.wait(token)
    held = clock()
    runner = ThreadsRunner(b.finish(y), wait_timeout_s=LIMIT_S, clock=held)
    try:
        assert torch.equal(runner(torch.ones(2))[0], -torch.ones(2))
        assert torch.equal(runner(torch.ones(2))[0], -torch.ones(2))  # not marked broken
        assert held() >= 2 * HELD_S
    finally:
        runner.close()


def _raises(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("peer closed the connection")


def test_waits_have_no_deadline_by_default_but_a_failing_producer_ends_them():
    runner = ThreadsRunner(_producer_graph(_raises))
    assert runner.wait_timeout_s is None
    raised: list[BaseException] = []

    def call() -> None:
        try:
            runner(torch.ones(2))
        except BaseException as exc:  # noqa: BLE001 - checked below
            raised.append(exc)

    # without a deadline, only the producer's failure can end the main stream's wait
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(HANG_S)
    try:
        assert not caller.is_alive(), "the wait outlived its producer's failure"
        [error] = raised
        assert isinstance(error, ValueError) and "peer closed the connection" in str(error)
        assert any("stream_1" in n for n in error.__notes__)  # the producer's own error
    finally:
        runner.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_wait_timeout_must_be_positive_or_none(bad):
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(ValueError, match="wait_timeout_s must be > 0 seconds"):
        ThreadsRunner(gm, wait_timeout_s=bad)
