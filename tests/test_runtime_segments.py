"""Stream segments as generated functions: where they split, that they stay exact, and that
nothing they make is shared between calls."""

from __future__ import annotations

import pytest
import torch

from autostream.runtime import SequentialRunner, ThreadsRunner, parse_program
from autostream.runtime.builder import DialectBuilder, fork_join, two_chains
from autostream.runtime.segments import Segment, split_segments
from tests.helpers import as_tuple

mm, tanh, add = torch.ops.aten.mm.default, torch.ops.aten.tanh.default, torch.ops.aten.add.Tensor
A = torch.ops.aten


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
def test_segments_give_the_ops_results_on_every_call(streams):
    gm, inputs = fork_join(streams=streams, size=16, depth=3)
    expected = SequentialRunner(gm)(*inputs)
    with ThreadsRunner(gm) as runner:
        assert segments_of(runner) and all(s.function for s in segments_of(runner))
        for _ in range(4):
            again = runner(*inputs)
            torch.testing.assert_close(as_tuple(again), as_tuple(expected), rtol=0, atol=0)


def test_segment_ops_never_go_through_the_interpreter_loop(monkeypatch):
    import autostream.runtime.threads as threads_module

    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm) as runner:
        in_segments = {n for s in segments_of(runner) for n in s.names}
        ran: list[str] = []
        real = threads_module.run_op
        monkeypatch.setattr(threads_module, "run_op",
                            lambda g, step, e: ran.append(step.node.name) or real(g, step, e))
        out = runner(*inputs)
    assert in_segments and ran and not in_segments & set(ran)
    torch.testing.assert_close(as_tuple(out), as_tuple(gm(*inputs)), rtol=0, atol=0)


def test_an_op_failing_in_a_segment_is_named_with_its_stream():
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm) as runner:
        runner(*inputs)
        bad = (*inputs[:1], torch.randn(4, 7), *inputs[2:])  # y: 7 columns, b0 wants 8
        with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied") as info:
            runner(*bad)
        assert any("op 'mm_default'" in n and "stream_1" in n for n in info.value.__notes__)
        torch.testing.assert_close(as_tuple(runner(*inputs)), as_tuple(gm(*inputs)),
                                   rtol=0, atol=0)  # still usable


def _graph_with(fn_name: str):
    """Main stream: x -> op -> tanh -> mm, side stream: y @ w twice; ``op`` given by name
    (``bernoulli`` takes a generator as a fourth input)."""
    b = DialectBuilder()
    x, y, w = b.input("x"), b.input("y"), b.input("w")
    generator = b.input("generator") if fn_name == "bernoulli" else None
    with b.stream(1):
        v = b.call(tanh, b.call(mm, y, w))
        token = b.record()
    if fn_name == "add_":
        u = b.call(A.add_.Tensor, x, x)  # writes its input
    else:
        u = b.call(A.bernoulli.p, x, 0.5, generator=generator)  # RNG: keeps program order
    u = b.call(mm, b.call(tanh, u), w)
    b.wait(token)
    return b.finish(b.call(add, u, v))


def test_a_segment_writing_its_input_writes_once_per_call():
    gm = _graph_with("add_")
    inputs = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4))
    with ThreadsRunner(gm) as runner:
        assert any("add__tensor" in s.names for s in segments_of(runner))
        x = inputs[0].clone()
        for calls in (1, 2, 3):
            runner(x, *inputs[1:])
            torch.testing.assert_close(x, inputs[0] * 2 ** calls, rtol=0, atol=0)


def test_a_segment_drawing_random_numbers_draws_as_the_graph_does():
    inputs = (torch.rand(4, 4), torch.randn(4, 4), torch.randn(4, 4))
    mine, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    gm = _graph_with("bernoulli")
    with ThreadsRunner(gm) as runner:
        for _ in range(3):
            torch.testing.assert_close(runner(*inputs, mine), gm(*inputs, theirs), rtol=0, atol=0)


def test_inputs_recording_autograd_history_get_gradients():
    gm, inputs = two_chains(depth=2, rows=4, width=8, streams=2)
    grads = []
    for runner in (ThreadsRunner(gm), gm):
        leaves = tuple(t.clone().requires_grad_() for t in inputs)
        as_tuple(runner(*leaves))[0].sum().backward()
        grads.append([t.grad for t in leaves])
        getattr(runner, "close", lambda: None)()
    assert grads[0][0] is not None
    for g, e in zip(*grads, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_non_tensor_outputs_leave_a_segment():
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
        assert any(s.stream == 1 for s in segments_of(runner))
    torch.testing.assert_close(as_tuple(out)[0], torch.tanh(torch.tanh(inputs[0])) * 5)


def test_segments_off_runs_every_op_through_the_loop():
    gm, inputs = two_chains(depth=3, rows=4, width=8, streams=2)
    with ThreadsRunner(gm, segments=False) as runner:
        out = runner(*inputs)
        assert segments_of(runner) == []
    torch.testing.assert_close(as_tuple(out), as_tuple(gm(*inputs)), rtol=0, atol=0)


def factory_graph() -> torch.fx.GraphModule:
    """A side stream making tensors with factory ops, then (after a record) writing most of
    them in place; everything returned.

    Inputs ``x`` (4x3), ``w`` (3x3), ``y`` (4x3), ``idx`` (4 rows of 0..3), a generator.
    """
    b = DialectBuilder()
    x, w, y, idx = b.input("x"), b.input("w"), b.input("y"), b.input("idx")
    generator = b.input("generator")
    f32 = {"dtype": torch.float32}
    with b.stream(1):
        zeros = b.call(A.zeros.default, [4, 3], **f32)
        ones = b.call(A.ones.default, [4, 3], **f32)
        scale = b.call(A.full.default, [4, 1], 2.0, **f32)
        ramp = b.call(A.view.default, b.call(A.arange.default, 12, **f32), [4, 3])
        made = b.record()  # the writes below are a segment of their own
        zeros = b.call(A.index_add_.default, zeros, 0, idx, y)
        ones = b.call(A.mul_.Scalar, ones, 3.0)
        ramp = b.call(A.add_.Tensor, ramp, y)
        filled = b.call(A.fill_.Scalar, b.call(A.empty.memory_format, [4, 3], **f32), 1.5)
        noise = b.call(A.mul_.Scalar, b.call(A.randn.generator, [4, 3], generator=generator), 2.0)
        token = b.record()
    u = b.call(tanh, b.call(mm, x, w))
    b.wait(made, token)
    return b.finish(b.call(A.mul.Tensor, u, scale), zeros, ones, scale, filled, ramp, noise)


def test_factory_ops_in_segments_make_fresh_tensors_on_every_call():
    """200 calls against the graph run op by op; the caller edits every output in between."""
    x, w, y = torch.randn(4, 3), torch.randn(3, 3), torch.randn(4, 3)
    idx = torch.tensor([0, 1, 1, 3])
    mine, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    gm = factory_graph()
    kept = []
    with ThreadsRunner(gm) as runner:
        side = [s for s in segments_of(runner) if s.stream == 1]
        assert [len(s.steps) for s in side] == [5, 7]  # every op is in a segment
        for call in range(200):
            got, expected = runner(x, w, y, idx, mine), gm(x, w, y, idx, theirs)
            for g, e in zip(got, expected, strict=True):
                assert torch.equal(g, e), f"call {call}"
            for out in got:
                out.add_(100.0)  # the caller edits what it was given
            kept.append((got, [t.clone() for t in got]))
    for call, (got, snapshot) in enumerate(kept):  # no later call wrote an earlier output
        assert all(torch.equal(g, s) for g, s in zip(got, snapshot, strict=True)), f"call {call}"
    storages = [t.untyped_storage().data_ptr() for got, _ in kept for t in got]
    assert len(set(storages)) == len(storages)  # all alive, so none reused
