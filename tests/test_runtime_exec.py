"""Executing rewritten graphs: equality with eager, errors, timeouts, threads, the zoo."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from autostream.dialects.rewrite import rewrite_graph
from autostream.fx.capture import capture
from autostream.models.zoo import ZOO, random_dag_model
from autostream.planning.plan import PlanOptions, plan_graph
from autostream.runtime import (
    RUNTIMES,
    SanitizerConfig,
    StreamWaitTimeout,
    ThreadsRunner,
    make_runner,
    parse_program,
    select_runtime,
)
from autostream.runtime.builder import DialectBuilder, fork_join, two_chains
from tests.helpers import HANG_S, UniformCosts, as_tuple

CPU_RUNTIMES = ("sequential", "threads", "auto")


def _assert_same(got, expected, what: str = ""):
    got, expected = as_tuple(got), as_tuple(expected)
    assert len(got) == len(expected), what
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", CPU_RUNTIMES)
def test_fork_join_equals_graph_module(kind, streams):
    gm, inputs = fork_join(streams=streams)
    runner = make_runner(gm, kind)
    expected = gm(*inputs)
    for _ in range(3):
        _assert_same(runner(*inputs), expected)


def test_two_chains_threads_equal_single_stream():
    gm1, inputs = two_chains(depth=4, rows=4, width=64, streams=1)
    gm2, _ = two_chains(depth=4, rows=4, width=64, streams=2)
    with make_runner(gm2, "threads") as runner:
        _assert_same(runner(*inputs), make_runner(gm1, "sequential")(*inputs))


def _zoo_graphs():
    cases = [(name, factory) for name, factory in ZOO.items()]
    cases += [(f"random_dag_{s}", lambda s=s: random_dag_model(s)) for s in (1, 2)]
    return cases


@pytest.fixture(scope="module")
def rewritten_zoo():
    """Each zoo model's post-AOT graph, rewritten on up to 3 streams with uniform costs."""
    out = {}
    for name, factory in _zoo_graphs():
        model, inputs = factory()
        [captured] = capture(model, inputs)
        with torch.no_grad():
            expected = as_tuple(model(*inputs))
        gm = captured.gm
        plan = plan_graph(gm, PlanOptions(max_streams=3), UniformCosts())
        if not plan.is_single_stream:
            rewrite_graph(gm, plan.schedule, plan.syncs)
        out[name] = (gm, captured.args, expected, plan.schedule.streams_used)
    return out


def test_zoo_is_mostly_multistream(rewritten_zoo):
    multi = [n for n, (_, _, _, used) in rewritten_zoo.items() if used > 1]
    assert len(multi) >= len(rewritten_zoo) - 2, multi


@pytest.mark.parametrize("kind", CPU_RUNTIMES)
def test_zoo_outputs_equal_eager(rewritten_zoo, kind):
    for name, (gm, args, expected, _) in rewritten_zoo.items():
        runner = make_runner(gm, kind)
        for _ in range(2):  # a second call: nothing of the first may be reused
            got = runner(*args)
            _assert_same(got[: len(expected)] if isinstance(got, (list, tuple)) else got,
                         expected, name)


@pytest.mark.slow
def test_zoo_sanitized_threads_find_no_race(rewritten_zoo):
    """Correct plans: no race flagged and identical outputs over 15 sanitized runs per model."""
    config = SanitizerConfig(seed=7, max_delay_s=0.0002, hold_s=0.001)
    # the reference runs under the same intra-op thread split as the sanitized runs
    # (a matmul on one thread and on two differ in their last bits)
    reference = {}
    for name, (gm, args, _, _) in rewritten_zoo.items():
        with ThreadsRunner(gm, segments=False) as runner:
            reference[name] = runner(*args)
    for name, (gm, args, _, _) in rewritten_zoo.items():
        with ThreadsRunner(gm, sanitize=config) as runner:
            for _ in range(15):
                got = runner(*args)
                assert all(torch.equal(g, e) for g, e in
                           zip(got, reference[name], strict=True)), name


class NeedsTwoArgs(Exception):
    """An exception whose constructor cannot be called with a message alone."""

    def __init__(self, code: int, detail: str):
        super().__init__(f"code {code}: {detail}")
        self.code = code


def _failing_graph(stream_of_failure: int, error: BaseException | None = None):
    def boom(x):
        raise error if error is not None else IndexError("boom")

    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        a = b.call(torch.ops.aten.relu.default, x)
        if stream_of_failure == 1:
            a = b.call(boom, a)
        ta = b.record()
    c = b.call(torch.ops.aten.neg.default, x)
    if stream_of_failure == 0:
        c = b.call(boom, c)
    b.wait(ta)
    return b.finish(b.call(torch.ops.aten.add.Tensor, a, c))


@pytest.mark.parametrize("stream", [0, 1])
@pytest.mark.parametrize("kind", CPU_RUNTIMES)
def test_an_ops_own_exception_reaches_the_caller_naming_op_and_stream(kind, stream):
    runner = make_runner(_failing_graph(stream), kind)
    where = "main stream" if stream == 0 else "stream_1"
    try:
        runner(torch.ones(3))
    except IndexError as exc:  # the op's own type: the caller's handler still catches it
        assert type(exc) is IndexError and str(exc) == "boom"
        assert exc.__notes__ == [f"autostream: raised by op 'boom' (boom) on the {where}"]
    else:
        pytest.fail("the op's IndexError did not reach the caller")
    # the runner stays usable after a failure (workers alive, no stale state)
    with pytest.raises(IndexError, match="boom"):
        runner(torch.ones(3))


@pytest.mark.parametrize("stream", [0, 1])
def test_the_same_exception_object_is_raised_whatever_its_constructor(stream):
    error = NeedsTwoArgs(7, "no such expert")
    with make_runner(_failing_graph(stream, error), "threads") as runner:
        with pytest.raises(NeedsTwoArgs) as info:
            runner(torch.ones(3))
        assert info.value is error and info.value.code == 7
        # raised again by the next call: one note per op, not one per raise
        with pytest.raises(NeedsTwoArgs):
            runner(torch.ones(3))
    assert len(error.__notes__) == 1


def test_without_notes_the_op_and_stream_are_chained(monkeypatch):
    """Python 3.10 does not print notes: the same exception, with its place as its cause."""
    import autostream.runtime.execute as execute_module

    monkeypatch.setattr(execute_module, "_NOTES_SHOWN", False)
    with make_runner(_failing_graph(1), "threads") as runner:
        with pytest.raises(IndexError, match="boom") as info:
            runner(torch.ones(3))
    assert isinstance(info.value.__cause__, execute_module.OpLocation)
    assert "op 'boom' (boom) on the stream_1" in str(info.value.__cause__)


def test_wait_timeout_names_token_and_op():
    release = threading.Event()

    def slow(x):
        release.wait()  # until the main stream's wait has timed out
        return x

    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        s = b.call(slow, x)
        token = b.record()
    b.wait(token)
    out = b.call(torch.ops.aten.neg.default, s)
    # a clock 60 s later at each reading: the wait times out at its second poll however
    # slow the machine (the worker's first answer may take up to wait_timeout_s, real time)
    ticks = itertools.count(0.0, 60.0)
    runner = ThreadsRunner(b.finish(out), wait_timeout_s=60.0, clock=lambda: next(ticks))
    try:
        with pytest.raises(StreamWaitTimeout, match=r"waited 60 s .* token 'record_default' "
                                                     r"\(recorded on the stream_1 after 'slow'\) "
                                                     r"before running op 'neg_default'"):
            runner(torch.ones(2))
    finally:
        release.set()
        runner.close()


def test_workers_persist_across_calls():
    idents = []

    def where(x):
        idents.append(threading.get_ident())
        return x

    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(where, x)
        token = b.record()
    b.wait(token)
    runner = ThreadsRunner(b.finish(y))
    runner(torch.ones(1))
    before = threading.active_count()
    for _ in range(5):
        runner(torch.ones(1))
    assert len(set(idents)) == 1 and idents[0] != threading.get_ident()
    assert threading.active_count() == before
    [worker] = [t for t in threading.enumerate() if t.ident == idents[0]]
    runner.close()  # stops the pool's idle workers now
    worker.join(timeout=HANG_S)
    assert not worker.is_alive()


def _concurrent_thread_counts(started: dict[str, int] | None = None, **options):
    """Each stream's intra-op threads while both run; with ``started``, also the count a
    thread started by each stream then gets."""
    barrier = threading.Barrier(2, timeout=HANG_S)
    seen = {}

    def probe(x, tag):
        barrier.wait()  # both streams are running now, with their counts set
        seen[tag] = torch.get_num_threads()
        if started is not None:
            t = threading.Thread(target=lambda: started.update({tag: torch.get_num_threads()}))
            t.start()
            t.join()
        return x

    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(probe, x, "side")
        token = b.record()
    z = b.call(probe, x, "main")
    b.wait(token)
    runner = ThreadsRunner(b.finish(y, z), **options)
    runner(torch.ones(1))
    runner.close()
    return seen


def test_intra_op_threads_divided_and_restored():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        # Divided by the plan's streams; side-stream workers never exceed one thread.
        assert _concurrent_thread_counts() == {"side": 1, "main": 2}
        assert torch.get_num_threads() == 4
        assert _concurrent_thread_counts(intra_op_threads=1) == {"side": 1, "main": 1}
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(old)


def test_a_thread_started_during_a_call_gets_the_process_default():
    """Streams set their own threads' counts only: torch.set_num_threads would also set
    the default every thread started meanwhile takes (and Dynamo's guards read)."""
    old = torch.get_num_threads()
    started: dict[str, int] = {}
    try:
        torch.set_num_threads(4)
        # the premise: counts were divided
        assert _concurrent_thread_counts(started) == {"side": 1, "main": 2}
        assert started == {"side": 4, "main": 4}
    finally:
        torch.set_num_threads(old)


def test_deterministic_gives_every_stream_the_callers_threads():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        assert _concurrent_thread_counts(deterministic=True) == {"side": 4, "main": 4}
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(old)
    with pytest.raises(ValueError, match="leave intra_op_threads out"):
        ThreadsRunner(fork_join(streams=2)[0], deterministic=True, intra_op_threads=1)


def _two_sums():
    """A full reduction on each stream: ATen splits it into one chunk per intra-op thread."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        side = b.call(torch.ops.aten.sum.default, x)
        token = b.record()
    main = b.call(torch.ops.aten.sum.default, b.call(torch.ops.aten.mul.Tensor, x, x))
    b.wait(token)
    return b.finish(side, main)


def test_deterministic_reductions_equal_eager_bit_for_bit():
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = x.sum()
        torch.set_num_threads(2)
        eager = (x.sum(), (x * x).sum())
        # the premise: on one thread this sum's last bits differ from two threads'
        assert not torch.equal(one_thread, eager[0])
        with ThreadsRunner(_two_sums(), deterministic=True) as runner:
            for _ in range(3):  # op by op, then the traced segments
                got = runner(x)
                assert all(torch.equal(g, e) for g, e in zip(got, eager, strict=True))
    finally:
        torch.set_num_threads(old)


def test_thread_division_is_fixed_for_the_whole_call():
    """Prefix, concurrent part and suffix all run with budget // streams on the main
    stream: changing counts mid-call left idle OpenMP teams competing for cores."""
    old = torch.get_num_threads()
    seen = {}

    def probe(x, tag):
        seen[tag] = torch.get_num_threads()
        return x

    b = DialectBuilder()
    x = b.input("x")
    pre = b.call(probe, x, "prefix")
    fork = b.record()
    with b.stream(1):
        b.wait(fork)
        y = b.call(probe, pre, "side")
        token = b.record()
    z = b.call(probe, pre, "main")
    b.wait(token)
    try:
        torch.set_num_threads(4)
        with ThreadsRunner(b.finish(y, z)) as runner:
            for _ in range(3):
                runner(torch.ones(1))
                assert seen == {"prefix": 2, "side": 1, "main": 2}
                assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(old)


def test_inputs_count_checked():
    gm, inputs = fork_join(streams=2)
    with pytest.raises(TypeError, match="expects 4 inputs"):
        make_runner(gm, "threads")(*inputs[:2])


def test_select_runtime():
    assert select_runtime("auto", [torch.zeros(1)]) == "threads"
    assert select_runtime("auto", [1, torch.zeros(1, device="meta")]) == "threads"
    assert select_runtime("streams", [torch.zeros(1)]) == "streams"
    with pytest.raises(ValueError, match="unknown runtime 'gpu'"):
        select_runtime("gpu", [])
    assert set(RUNTIMES) == {"auto", "threads", "streams", "graph", "sequential"}


def test_auto_picks_the_graph_runtime_where_the_device_captures_graphs(monkeypatch):
    from autostream.runtime import graph_api

    class Capturing:  # a device whose module has a graph class, as CUDA's and NPU's do
        graph = object()
        CUDAGraph = object

    class Streaming:  # one with streams but no graph capture
        pass

    meta = [torch.zeros(1, device="meta")]
    for module, kind in ((Capturing, "graph"), (Streaming, "streams")):
        monkeypatch.setattr(graph_api.torch, "get_device_module", lambda d, m=module: m)
        monkeypatch.setattr("autostream.runtime.select.input_device",
                            lambda inputs: torch.device("cuda"))
        assert select_runtime("auto", meta) == kind


def test_streams_runtime_rejects_cpu_inputs():
    gm, inputs = fork_join(streams=2)
    with pytest.raises(ValueError, match="needs accelerator tensors"):
        make_runner(gm, "streams")(*inputs)


def test_sanitize_only_for_threads():
    gm, _ = fork_join(streams=2)
    with pytest.raises(ValueError, match="threads runtime"):
        make_runner(gm, "sequential", sanitize=True)
    assert parse_program(gm).side_streams == (1,)


def test_side_streams_run_in_the_callers_grad_mode(monkeypatch):
    import autostream.runtime.execute as execute_module

    seen: list[tuple[str, bool]] = []
    real_run_node = execute_module.run_node

    def spy(gm, node, env):
        seen.append((threading.current_thread().name, torch.is_grad_enabled()))
        return real_run_node(gm, node, env)

    # every op run through execute.run_op (segments off: their functions would hide the
    # ops from the spy; the outputs' requires_grad checks them)
    monkeypatch.setattr(execute_module, "run_node", spy)
    gm, inputs = two_chains(depth=2, rows=4, width=8, streams=2)
    inputs = tuple(t.requires_grad_() for t in inputs)
    with make_runner(gm, "threads", segments=False) as runner:
        for grad in (False, True):
            seen.clear()
            with torch.set_grad_enabled(grad):
                out = runner(*inputs)
            assert all(o.requires_grad == grad for o in as_tuple(out))
            workers = {name for name, _ in seen if name != threading.current_thread().name}
            assert workers, "no op ran on a side stream"
            assert {mode for _, mode in seen} == {grad}
