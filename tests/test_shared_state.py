"""No state of the user's changed behind their back, nothing left running after they let
go of a model (issue 43): the threads runtime called from several Python threads at once.
"""

from __future__ import annotations

import gc
import threading

import torch
import torch._dynamo
from torch import nn

import autostream
from autostream.runtime.workers import WORKERS
from tests.helpers import HANG_S

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


def test_threads_runtime_from_four_user_threads_leaves_no_trace(monkeypatch):
    monkeypatch.setattr(WORKERS, "idle_s", 0.2)  # the pool's workers exit once idle
    torch._dynamo.reset()
    gc.collect()
    before = _ours()
    default = _count_in_new_thread()
    assert default == torch.get_num_threads()
    _users_call_one_model(default, before)
    torch._dynamo.reset()
    gc.collect()
    for t in _ours() - before:
        t.join(timeout=HANG_S)
    assert _ours() <= before, "worker threads outlived their model"
