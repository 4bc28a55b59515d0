"""Traced stream segments: where they split, that they stay exact, and what is never traced."""

from __future__ import annotations

import pytest
import torch

from autostream.runtime import SequentialRunner, ThreadsRunner, parse_program
from autostream.runtime.builder import DialectBuilder, fork_join, two_chains
from autostream.runtime.segments import Segment, split_segments
from tests.helpers import as_tuple

mm, tanh, add = torch.ops.aten.mm.default, torch.ops.aten.tanh.default, torch.ops.aten.add.Tensor


def segments_of(runner: ThreadsRunner) -> list[Segment]:
    return [s for items in runner.plan_of.values() for s in items if isinstance(s, Segment)]


def test_segments_are_the_op_runs_between_syncs_with_their_live_values():
    gm, _ = fork_join(streams=2, size=8, depth=2)
    program = parse_program(gm)
    main = split_segments(program, 0)
    side = split_segments(program, 1)
    # main: [mm, relu] record [mm, tanh, mm, tanh] wait add (one op: not a segment)
    assert [type(x).__name__ for x in main] == ["Segment", "Step", "Segment", "Step", "Step"]
    assert [type(x).__name__ for x in side] == ["Step", "Segment", "Step"]
    fork_seg, branch = main[0], side[1]
    assert len(fork_seg.steps) == 2 and len(branch.steps) == 4
    # the branch reads h (made on the main stream) and its weight; only its last value leaves it
    assert fork_seg.outputs == (fork_seg.steps[-1].node,)
    assert fork_seg.steps[-1].node in branch.inputs
    assert [n.op for n in branch.inputs].count("placeholder") == 1
    assert branch.outputs == (branch.steps[-1].node,)
    assert len(split_segments(program, 1, min_ops=5)) == 3 + 3  # wait, 4 ops, record


@pytest.mark.parametrize("streams", [2, 3])
def test_traced_segments_give_the_ops_results_on_every_call(streams):
    gm, inputs = fork_join(streams=streams, size=16, depth=3)
    expected = SequentialRunner(gm)(*inputs)
    with ThreadsRunner(gm) as runner:
        first = runner(*inputs)
        segs = segments_of(runner)
        assert segs and all(s.status == "traced" for s in segs), [s.status for s in segs]
        for _ in range(3):
            again = runner(*inputs)
            torch.testing.assert_close(as_tuple(again), as_tuple(expected), rtol=0, atol=0)
    torch.testing.assert_close(as_tuple(first), as_tuple(expected), rtol=0, atol=0)


def _record_ops_run_from_python(monkeypatch) -> list[str]:
    """Names of the segment ops run op by op from now on (a traced segment runs none)."""
    import autostream.runtime.segments as segments_module

    ran: list[str] = []
    real = segments_module.run_op
    monkeypatch.setattr(segments_module, "run_op",
                        lambda g, step, e: ran.append(step.node.name) or real(g, step, e))
    return ran


def test_traced_function_is_what_runs_after_the_first_call(monkeypatch):
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm) as runner:
        runner(*inputs)
        ran = _record_ops_run_from_python(monkeypatch)
        out = runner(*inputs)
    assert ran == []  # no op of a segment went through Python
    torch.testing.assert_close(as_tuple(out), as_tuple(gm(*inputs)), rtol=0, atol=0)


def test_new_shapes_run_op_by_op_and_stay_correct(monkeypatch):
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    wider = (torch.randn(5, 8), torch.randn(5, 8), *inputs[2:])
    with ThreadsRunner(gm) as runner:
        runner(*inputs)
        ran = _record_ops_run_from_python(monkeypatch)
        out = runner(*wider)
        traced_ops = {n for s in segments_of(runner) for n in s.names}
    assert traced_ops and traced_ops <= set(ran)  # every op of every segment, from Python
    torch.testing.assert_close(as_tuple(out), as_tuple(gm(*wider)), rtol=0, atol=0)


def test_ops_of_a_failing_traced_segment_rerun_and_name_the_op_that_fails():
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm) as runner:
        runner(*inputs)
        seg = next(s for s in segments_of(runner) if s.stream == 1)

        def broken(*args):
            raise RuntimeError("traced function broke")

        seg.compiled = broken
        out = runner(*inputs)  # the ops themselves still work
        torch.testing.assert_close(as_tuple(out), as_tuple(gm(*inputs)), rtol=0, atol=0)
        assert seg.compiled is None and "raised RuntimeError" in seg.status
        bad = (*inputs[:1], torch.randn(4, 7), *inputs[2:])  # y: 7 columns, b0 wants 8
        with pytest.raises(RuntimeError, match=r"op 'mm_default'.*stream_1"):  # its note
            runner(*bad)


def test_every_run_up_to_the_optimised_graph_is_verified(monkeypatch):
    """TorchScript optimises a traced graph on a later call; that graph must match too."""
    from autostream.runtime import segments as segments_module

    real_trace = torch.jit.trace

    def trace_whose_optimised_run_is_wrong(module, args, **kwargs):
        traced = real_trace(module, args, **kwargs)
        calls = []

        def run(*a):
            calls.append(1)
            out = traced(*a)
            return out if len(calls) < segments_module._runs_to_optimise() else out * 2

        run.forward = run
        return run

    monkeypatch.setattr(segments_module.torch.jit, "trace", trace_whose_optimised_run_is_wrong)
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm) as runner:
        out = runner(*inputs)
        torch.testing.assert_close(as_tuple(out), as_tuple(gm(*inputs)), rtol=0, atol=0)
        assert segments_module._runs_to_optimise() >= 2
        statuses = {s.status for s in segments_of(runner)}
        assert statuses == {"the traced function's outputs differ from the ops'"}, statuses
        assert all(s.compiled is None for s in segments_of(runner))


def _graph_with(fn_name: str):
    """Main stream: x -> op -> tanh -> mm, side stream: y @ w twice; ``op`` given by name."""
    b = DialectBuilder()
    x, y, w = b.input("x"), b.input("y"), b.input("w")
    with b.stream(1):
        v = b.call(tanh, b.call(mm, y, w))
        token = b.record()
    if fn_name == "add_":
        u = b.call(torch.ops.aten.add_.Tensor, x, x)  # writes its input
    elif fn_name == "dropout":
        u = b.call(torch.ops.aten.bernoulli.p, x, 0.5)  # RNG: keeps program order
    else:
        u = b.call(torch.ops.aten.neg.default, x)
    u = b.call(mm, b.call(tanh, u), w)
    b.wait(token)
    return b.finish(b.call(add, u, v))


@pytest.mark.parametrize("op, why", [("add_", "may write its inputs"),
                                     ("dropout", "keeps program order")])
def test_segments_with_writes_or_rng_run_op_by_op(op, why):
    gm = _graph_with(op)
    inputs = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4))
    with ThreadsRunner(gm) as runner:
        main = next(s for s in segments_of(runner) if s.stream == 0)
        assert why in main.status  # decided before any call
        side = next(s for s in segments_of(runner) if s.stream == 1)
        if op == "add_":
            x = inputs[0].clone()
            runner(x, *inputs[1:])
            torch.testing.assert_close(x, inputs[0] * 2)  # written once, not twice
        else:
            runner(*inputs)
        assert side.status == "traced"


def test_inputs_recording_autograd_history_are_never_traced():
    gm, inputs = two_chains(depth=2, rows=4, width=8, streams=2)
    inputs = tuple(t.clone().requires_grad_() for t in inputs)
    with ThreadsRunner(gm) as runner:
        out = runner(*inputs)
        assert {s.status for s in segments_of(runner)} == {"an input requires grad"}
    as_tuple(out)[0].sum().backward()
    assert inputs[0].grad is not None


def test_non_tensor_outputs_are_not_traced():
    b = DialectBuilder()
    x, y = b.input("x"), b.input("y")
    with b.stream(1):
        n = b.call(torch.ops.aten.sym_size.int, b.call(tanh, y), 0)
        token = b.record()
    u = b.call(tanh, b.call(tanh, x))
    b.wait(token)
    gm = b.finish(b.call(torch.ops.aten.mul.Tensor, u, n))
    inputs = (torch.randn(3, 3), torch.randn(5, 3))
    with ThreadsRunner(gm) as runner:
        out = runner(*inputs)
        side = next(s for s in segments_of(runner) if s.stream == 1)
        assert "not a tensor" in side.status
    torch.testing.assert_close(as_tuple(out)[0], torch.tanh(torch.tanh(inputs[0])) * 5)


def test_trace_segments_off_runs_every_op_from_python():
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm, trace_segments=False) as runner:
        out = runner(*inputs)
        assert segments_of(runner) == []
    torch.testing.assert_close(as_tuple(out), as_tuple(gm(*inputs)), rtol=0, atol=0)
