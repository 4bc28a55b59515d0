"""No state of the user's changed behind their back, nothing left running after they let
go of a model (issue 43): the threads runtime called from several Python threads at once.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch
import torch._dynamo
from torch import nn

import autostream
from autostream.runtime.builder import DialectBuilder
from autostream.runtime.threads import ThreadsRunner

USERS, CALLS = 4, 5


class TwoBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(512, 512), nn.Linear(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).relu() + self.b(x).sigmoid()


def _ours() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("autostream-")}


def _count_in_new_thread() -> int:
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def _users_call_one_model(default: int, before: set[threading.Thread]) -> None:
    """Compile the model, call it from ``USERS`` threads while others start threads, and
    check what they saw; everything made here is let go when this returns."""
    compiles: list[int] = []
    be = autostream.backend(max_streams=2, measure=0, runtime="threads")

    def counting(gm, example_inputs):
        compiles.append(len(gm.graph.nodes))
        return be(gm, example_inputs)

    model = torch.compile(TwoBranches(), backend=counting)
    x = torch.randn(256, 512)
    with torch.no_grad():
        expected = model(x)
    assert be.last_report.streams_used == 2  # the premise: a worker thread runs stream 1
    assert _ours() - before, "no worker thread was started"

    started: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def starter() -> None:  # threads the user starts while calls run
        while not stop.is_set():
            started.append(_count_in_new_thread())

    def user() -> None:
        try:
            with torch.no_grad():
                for _ in range(CALLS):
                    assert torch.equal(model(x), expected)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    watcher = threading.Thread(target=starter)
    watcher.start()
    users = [threading.Thread(target=user) for _ in range(USERS)]
    for t in users:
        t.start()
    for t in users:
        t.join()
    stop.set()
    watcher.join()

    assert errors == []
    assert len(compiles) == 1, "a thread-count change made Dynamo recompile"
    assert started and set(started) == {default}, f"{len(started)} threads started"
    assert _count_in_new_thread() == default and torch.get_num_threads() == default


def test_threads_runtime_from_four_user_threads_leaves_no_trace():
    torch._dynamo.reset()
    gc.collect()
    before = _ours()
    default = _count_in_new_thread()
    assert default == torch.get_num_threads()
    _users_call_one_model(default, before)
    torch._dynamo.reset()
    gc.collect()
    assert _ours() <= before, "worker threads outlived their model"


def _boom(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom")


@pytest.mark.parametrize("side_op", [torch.ops.aten.neg.default, _boom], ids=["runs", "raises"])
def test_a_collected_runner_stops_its_workers(side_op):
    """The worker's loop used to keep its last job, and through it the runner, alive;
    also when that job raised."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(side_op, x)
        token = b.record()
    z = b.call(torch.ops.aten.relu.default, x)
    b.wait(token)
    runner = ThreadsRunner(b.finish(y, z))
    worker = runner._workers[1].thread
    for _ in range(3):
        if side_op is _boom:
            with pytest.raises(ValueError, match="boom"):
                runner(torch.ones(4))
        else:
            runner(torch.ones(4))
    del runner
    gc.collect()
    worker.join(timeout=5.0)
    assert not worker.is_alive()
