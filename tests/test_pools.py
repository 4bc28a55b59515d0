"""One pool per process (issue 48; issue 51 item 2): worker threads bounded by the calls
running at once, device streams bounded by the plan's stream count, whatever the number of
graphs; two user threads calling at once; nothing left running after Dynamo lets go."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import pytest
import torch
import torch._dynamo
from torch import nn

import autostream
from autostream.runtime import workers as workers_module
from autostream.runtime.builder import DialectBuilder, fork_join
from autostream.runtime.graphed import GraphRunner
from autostream.runtime.sequential import SequentialRunner
from autostream.runtime.stream_pool import device_streams
from autostream.runtime.streams import StreamsRunner
from autostream.runtime.threads import ThreadsRunner
from autostream.runtime.workers import WorkerPool
from tests import graph_break_helper
from tests.fake_device import fake_device
from tests.helpers import HANG_S, as_tuple

GRAPHS = 24
#: the plans' stream counts, in turn over the graphs
STREAMS = (2, 3, 4)
USERS = 4


def _graphs() -> list[tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]]:
    return [fork_join(streams=STREAMS[i % len(STREAMS)], size=16, seed=i) for i in range(GRAPHS)]


def _ours() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("autostream-")}


def _until(condition, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``HANG_S`` (a hang, not a timing)."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} after {HANG_S:g} s")
        time.sleep(0.02)


def _same(got, expected) -> bool:
    got, expected = as_tuple(got), as_tuple(expected)
    return len(got) == len(expected) and all(
        torch.equal(g, e) for g, e in zip(got, expected, strict=True))


# -- worker threads ----------------------------------------------------------------------
def _in_two_threads(user) -> list[BaseException]:
    """Run ``user(0)`` and ``user(1)`` in two threads at once; what they raised (a thread
    still running after ``2 * HANG_S`` fails the test: its calls hung)."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            user(k)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    users = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in users:
        t.start()
    for t in users:
        t.join(timeout=2 * HANG_S)
    assert not any(t.is_alive() for t in users), "a user's calls hung"
    return errors


def test_idle_workers_exit_and_a_bad_timeout_is_refused():
    pool = WorkerPool(idle_s=0.05, name="autostream-test-idle")
    assert [pool.submit(lambda i=i: i * i) for i in range(3)][2].result(timeout=HANG_S) == 4
    assert pool.started >= 1
    _until(lambda: pool.alive() == 0, "an idle worker did not exit")
    assert not any(t.name.startswith("autostream-test-idle") for t in threading.enumerate())
    assert pool.submit(lambda: "again").result(timeout=HANG_S) == "again"  # starts anew
    with pytest.raises(ValueError, match="idle_s must be > 0"):
        WorkerPool(idle_s=0)


def test_workers_are_bounded_by_the_calls_running_not_by_the_graphs():
    """24 graphs of 2-4 streams: in turn they use the side streams of the widest (3
    workers); from 4 user threads at once at most 4 x 3. Outputs equal the sequential
    runtime's bit for bit (every stream on the caller's thread count)."""
    pool = WorkerPool(idle_s=HANG_S, name="autostream-test-bound")
    graphs = _graphs()
    runners = [ThreadsRunner(gm, workers=pool, deterministic=True) for gm, _ in graphs]
    expected = [SequentialRunner(gm)(*inputs) for gm, inputs in graphs]
    try:
        for _ in range(2):
            for r, (_, inputs), e in zip(runners, graphs, expected, strict=True):
                assert _same(r(*inputs), e)
        assert pool.started == max(STREAMS) - 1 == pool.alive()

        errors: list[BaseException] = []

        def user(offset: int) -> None:
            try:
                for i in range(2 * GRAPHS):
                    j = (i + offset) % GRAPHS
                    assert _same(runners[j](*graphs[j][1]), expected[j])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        users = [threading.Thread(target=user, args=(k * 5,)) for k in range(USERS)]
        for t in users:
            t.start()
        for t in users:
            t.join(timeout=HANG_S)
        assert not any(t.is_alive() for t in users), "a user's calls hung"
        assert errors == []
        assert pool.started <= USERS * (max(STREAMS) - 1)
    finally:
        pool.trim()
    _until(lambda: pool.alive() == 0, "trimmed workers did not exit")


def test_two_user_threads_run_their_side_streams_at_once():
    """Each graph's side stream waits, inside its op, for the other graph's: the pool must
    give the two calls two workers at once (one shared worker would hang), and each call's
    outputs are its own."""
    meet = threading.Barrier(2, timeout=HANG_S)

    def met(x: torch.Tensor) -> torch.Tensor:
        meet.wait()
        return x * 2

    def graph() -> torch.fx.GraphModule:
        b = DialectBuilder()
        x = b.input("x")
        with b.stream(1):
            y = b.call(met, x)
            token = b.record()
        z = b.call(torch.ops.aten.neg.default, x)
        b.wait(token)
        return b.finish(b.call(torch.ops.aten.add.Tensor, y, z))

    pool = WorkerPool(idle_s=HANG_S, name="autostream-test-meet")
    runners = [ThreadsRunner(graph(), workers=pool) for _ in range(2)]
    got: dict[int, list[torch.Tensor]] = {0: [], 1: []}

    def user(k: int) -> None:
        for i in range(5):
            got[k].append(runners[k](torch.full((3,), float(10 * k + i))))

    errors = _in_two_threads(user)
    pool.trim()
    assert errors == []
    for k in range(2):  # 2x - x
        assert [v[0].tolist() for v in got[k]] == [[float(10 * k + i)] * 3 for i in range(5)]
    assert pool.started == 2


def test_a_collected_runner_is_not_kept_by_a_worker():
    """The worker's loop used to keep its last job, and through it the runner, alive;
    also when that job raised."""

    def boom(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")

    pool = WorkerPool(idle_s=HANG_S, name="autostream-test-collect")
    for side_op in (torch.ops.aten.neg.default, boom):
        b = DialectBuilder()
        x = b.input("x")
        with b.stream(1):
            y = b.call(side_op, x)
            token = b.record()
        z = b.call(torch.ops.aten.relu.default, x)
        b.wait(token)
        runner = ThreadsRunner(b.finish(y, z), workers=pool)
        for _ in range(3):
            if side_op is boom:
                with pytest.raises(ValueError, match="boom"):
                    runner(torch.ones(4))
            else:
                runner(torch.ones(4))
        collected = weakref.ref(runner)
        del runner
        gc.collect()
        assert collected() is None, "a worker kept the runner alive"
    assert pool.alive() == pool.idle() == 1  # one worker served both runners
    pool.trim()
    _until(lambda: pool.alive() == 0, "a trimmed worker did not exit")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_forked_child_starts_with_an_empty_pool():
    pool = WorkerPool(idle_s=HANG_S, name="autostream-test-fork")
    pool.submit(lambda: None).result(timeout=HANG_S)
    assert pool.alive() == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its pool lists no worker, and starts one that runs
        try:
            ok = pool.alive() == 0 and pool.submit(lambda: 7).result(timeout=HANG_S) == 7
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        answer = r.read()
    os.waitpid(pid, 0)
    pool.trim()
    assert answer == b"1", "the child saw its parent's workers, or none ran"


# -- device streams ----------------------------------------------------------------------
def test_graph_runners_share_one_capture_stream_and_the_side_streams():
    """24 graphs of 2-4 streams on one (fake) device: 3 side streams and one capture
    stream in all, side stream k the same object in every graph."""
    streams, graphs = fake_device()

    def stream_api(device: torch.device):
        return streams

    built = _graphs()
    runners = [GraphRunner(gm, graph_api=lambda d: graphs, stream_api=stream_api)
               for gm, _ in built]
    with torch.no_grad():
        for r, (gm, inputs) in zip(runners, built, strict=True):
            assert _same(r(*inputs), SequentialRunner(gm)(*inputs))
            assert r.stats.captures == 1, r.describe()
    assert streams._streams - 1 == (max(STREAMS) - 1) + 1  # s0 is the device's default
    pool = device_streams(stream_api, torch.device("cpu"))
    assert pool.count() == max(STREAMS)
    # the uncaptured runtime on that device takes the same side streams
    streams_runner = StreamsRunner(built[2][0], api=stream_api)
    streams_runner(*built[2][1])
    assert streams._streams - 1 == max(STREAMS)
    side = pool.side((1, 2, 3), lambda: pytest.fail("a side stream made again"))
    assert streams_runner._per_device[torch.device("cpu")][1] == side


# -- issue 51 item 2 ---------------------------------------------------------------------
class _Tower(nn.Module):
    """Two branches, then a helper in another module whose graph break (``tolist``)
    makes Dynamo keep a compiled function in that module's globals."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(512, 512), nn.Linear(512, 512)

    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        h = self.a(x).relu() + self.b(x).sigmoid()
        return graph_break_helper.scaled_by_sizes(h, sizes)


def test_no_worker_outlives_a_graph_break_inside_a_helper(monkeypatch):
    monkeypatch.setattr(workers_module.WORKERS, "idle_s", 0.2)
    torch._dynamo.reset()
    gc.collect()
    be = autostream.backend(max_streams=2, measure=0, runtime="threads")
    model = torch.compile(_Tower(), backend=be)
    with torch.no_grad():
        model(torch.randn(256, 512), torch.tensor([1, 2]))
    kept = [k for k in vars(graph_break_helper) if k.startswith("__compiled_fn")]
    assert kept, "the premise: Dynamo keeps a compiled function in the helper's globals"
    assert be.last_report.streams_used == 2 and _ours(), "the premise: a worker ran"
    del model, be
    torch._dynamo.reset()
    gc.collect()
    _until(lambda: not _ours(), f"worker threads {sorted(t.name for t in _ours())} alive")


class _Wide(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).relu() + self.b(x).sigmoid()


def test_two_user_threads_calling_compiled_models_at_once():
    """Two models compiled for two streams, each called by its own user thread at once:
    both finish, and every output equals the sequential runtime's bit for bit (one
    intra-op thread everywhere, so no op's reduction splits differently)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        modules = [_Wide(512), _Wide(384)]
        inputs = [torch.randn(256, 512), torch.randn(256, 384)]
        reports, plain = [], []
        for m, x in zip(modules, inputs, strict=True):
            be = autostream.backend(max_streams=2, measure=0, runtime="threads")
            reports.append(be)
            compiled = torch.compile(m, backend=be)
            sequential = torch.compile(
                m, backend=autostream.backend(max_streams=2, measure=0, runtime="sequential"))
            with torch.no_grad():
                plain.append((compiled, sequential(x)))
                compiled(x)  # compiled here: Dynamo does not compile in two threads at once

        def user(k: int) -> None:
            compiled, expected = plain[k]
            with torch.no_grad():
                for _ in range(20):
                    assert torch.equal(compiled(inputs[k]), expected)

        assert _in_two_threads(user) == []
        assert [be.last_report.streams_used for be in reports] == [2, 2]
    finally:
        torch.set_num_threads(old)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_forked_child_makes_its_own_device_streams():
    made = iter(range(10))

    def factory(device: torch.device) -> None:
        return None

    parent = device_streams(factory, torch.device("cpu")).side((1,), lambda: next(made))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            child = device_streams(factory, torch.device("cpu")).side((1,), lambda: next(made))
            os.write(write, str(child[1]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        answer = r.read()
    os.waitpid(pid, 0)
    assert parent == {1: 0} and answer == b"1", "the child reused its parent's stream"


def test_no_other_thread_launches_on_the_shared_streams_during_a_capture():
    """A capture holds its device's stream lock from warm-up to end: another thread's
    uncaptured call on the same (shared) streams waits for it instead of landing in the
    graph.  Checked from inside the fake capture: another thread cannot take the lock."""
    streams, graphs = fake_device()

    def stream_api(device: torch.device):
        return streams

    gm, inputs = _graphs()[1]
    pool = device_streams(stream_api, torch.device("cpu"))
    held_during_capture: list[bool] = []
    capture = graphs.capture

    def observed(graph, body, stream, mem_pool, join=None):
        got: list[bool] = []
        probe = threading.Thread(target=lambda: got.append(pool.lock.acquire(blocking=False)))
        probe.start()
        probe.join(HANG_S)
        if got and got[0]:
            pool.lock.release()
        held_during_capture.append(got == [False])
        return capture(graph, body, stream, mem_pool, join=join)

    graphs.capture = observed
    runner = GraphRunner(gm, graph_api=lambda d: graphs, stream_api=stream_api)
    with torch.no_grad():
        assert _same(runner(*inputs), SequentialRunner(gm)(*inputs))
    assert runner.stats.captures == 1 and held_during_capture == [True]
    # and an uncaptured call on those streams takes the same lock
    entered: list[bool] = []
    with pool.lock:
        caller = threading.Thread(target=lambda: entered.append(
            _same(StreamsRunner(gm, api=stream_api)(*inputs), SequentialRunner(gm)(*inputs))))
        caller.start()
        caller.join(0.3)
        assert caller.is_alive() and not entered  # waits while the lock is held
    caller.join(HANG_S)
    assert entered == [True]
