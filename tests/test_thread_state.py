"""Side-stream threads run under the caller's grad, inference and autocast modes, or not at all."""

import contextlib
import logging
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import autostream.runtime.threads as threads_module
from autostream.fx.thread_state import ThreadState
from autostream.runtime import make_runner
from autostream.runtime.builder import DialectBuilder
from autostream.runtime.sanitizer import ThreadStateError

MODES = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "autocast_no_cache": lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False),
    "inference_autocast": lambda: _both(torch.inference_mode(),
                                        torch.autocast("cpu", dtype=torch.bfloat16)),
}


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def _branches(depth: int = 3):
    """``mm`` chains on stream 0 and stream 1, each returned as it is (no op mixes them)."""
    b = DialectBuilder()
    x, w = b.input("x"), b.input("w")
    with b.stream(1):
        v = x
        for _ in range(depth):
            v = b.call(torch.ops.aten.mm.default, v, w)
        token = b.record()
    u = x
    for _ in range(depth):
        u = b.call(torch.ops.aten.mm.default, u, w)
    b.wait(token)
    gen = torch.Generator().manual_seed(0)
    inputs = (torch.randn(4, 16, generator=gen), torch.randn(16, 16, generator=gen) / 4)
    return b.finish(u, v), inputs


def _same(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.is_inference() == e.is_inference()
        assert g.requires_grad == e.requires_grad
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_side_streams_compute_what_the_calling_thread_computes(mode):
    gm, inputs = _branches()
    reference = make_runner(gm, "sequential")
    # deterministic: every op with the calling thread's intra-op threads, so bit for bit
    with make_runner(gm, "threads", deterministic=True) as threads, MODES[mode]():
        expected = reference(*inputs)
        assert expected[0].dtype == (torch.bfloat16 if "autocast" in mode else torch.float32)
        for _ in range(3):
            _same(threads(*inputs), expected)


def test_grad_mode_is_carried_both_ways():
    gm, (x, w) = _branches()
    w = w.clone().requires_grad_()
    with make_runner(gm, "threads") as threads:
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                assert [o.requires_grad for o in threads(x, w)] == [grad, grad]


class _Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.threads: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.threads.add(threading.current_thread().name)
        return func(*args, **(kwargs or {}))


def test_a_state_no_worker_can_be_given_runs_on_the_calling_thread(caplog):
    gm, inputs = _branches()
    expected = make_runner(gm, "sequential")(*inputs)
    mode = _Counting()
    with make_runner(gm, "threads") as threads, caplog.at_level(logging.WARNING, "autostream"):
        with mode:
            got = threads(*inputs)
            threads(*inputs)
    _same(got, expected)
    assert mode.threads == {threading.current_thread().name}  # the mode saw every op
    [warning] = [r.getMessage() for r in caplog.records]  # once, not per call
    assert "one thread" in warning and "TorchDispatchMode" in warning


def test_the_sanitizer_compares_each_streams_state_with_the_callers(monkeypatch):
    gm, inputs = _branches()
    # a runtime that forgot to carry the state (and a probe that does not see it)
    monkeypatch.setattr(ThreadState, "carried", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(threads_module, "_state_carried_to_worker", lambda state: state)
    with make_runner(gm, "threads", sanitize=True) as threads:
        threads(*inputs)  # the default state: nothing to carry
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with pytest.raises(ThreadStateError, match="autocast"):
                threads(*inputs)


def test_a_state_the_probe_finds_uncarried_runs_on_the_calling_thread(monkeypatch, caplog):
    gm, inputs = _branches()
    monkeypatch.setattr(ThreadState, "carried", lambda self: contextlib.nullcontext())
    with make_runner(gm, "threads") as threads, caplog.at_level(logging.WARNING, "autostream"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = threads(*inputs)
    assert [g.dtype for g in got] == [torch.bfloat16, torch.bfloat16]
    assert "autocast" in caplog.text


def test_process_wide_settings_need_no_carrying():
    """The premise of what ``ThreadState`` leaves out: other threads see these settings."""
    seen = {}

    def read():
        seen.update(det=torch.are_deterministic_algorithms_enabled(),
                    anomaly=torch.is_anomaly_enabled(), dtype=torch.get_default_dtype())

    det, dtype = torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype()
    try:
        torch.use_deterministic_algorithms(True)
        torch.set_default_dtype(torch.float64)
        with torch.autograd.set_detect_anomaly(True):
            t = threading.Thread(target=read)
            t.start()
            t.join()
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_default_dtype(dtype)
    assert seen == {"det": True, "anomaly": True, "dtype": torch.float64}


def test_segments_of_a_lifted_plan_run_under_autocast_and_print_nothing(capfd):
    from autostream.fx.capture import capture
    from autostream.models.zoo import multihead_block
    from autostream.planning.lift import lift_plan
    from autostream.planning.plan import PlanOptions, plan_graph
    from autostream.runtime.segments import Segment

    from .helpers import UniformCosts, as_tuple

    model, inputs = multihead_block()
    [graph] = capture(model, inputs)
    lifted = lift_plan(graph.dynamo, plan_graph(graph.gm, PlanOptions(max_streams=2),
                                                UniformCosts()))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = as_tuple(model(*inputs))
        with make_runner(lifted.gm, "threads", deterministic=True) as threads:
            for _ in range(2):
                _same(as_tuple(threads(*graph.dynamo_args)), expected)
            segments = [item for items in threads.plan_of.values() for item in items
                        if isinstance(item, Segment)]
    assert segments and all(s.function is not None for s in segments)
    assert "Traceback" not in capfd.readouterr().err
