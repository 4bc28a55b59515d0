"""Training graphs: the pass plans forward and backward graphs; gradients equal eager."""

import torch

import autostream
from autostream.models.zoo import multihead_block, two_branch_gemv


def test_forward_and_backward_graphs_are_planned_and_gradients_match():
    model, (x,) = multihead_block(tokens=4, hidden=64, out=16, heads=3, depth=1)
    model.train()
    x = x.clone().requires_grad_(True)
    torch._dynamo.reset()
    be = autostream.backend(max_streams=3, cost_table="h200", solver="heft")
    compiled = torch.compile(model, backend=be)

    def loss_and_grads(fn):
        model.zero_grad()
        xi = x.detach().clone().requires_grad_(True)
        loss = sum(o.square().sum() for o in fn(xi))
        loss.backward()
        return loss.detach(), xi.grad, [p.grad.clone() for p in model.parameters()]

    expected = loss_and_grads(model)
    got = loss_and_grads(compiled)
    torch._dynamo.reset()
    # within rounding, not bit for bit: AOTAutograd's graphs differ from eager in the last
    # bits (aot_eager alone does), and side streams use fewer intra-op threads
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    for g, e in zip(got[2], expected[2]):
        torch.testing.assert_close(g, e)
    reports = be.autostream_pass.reports
    assert len(reports) == 2, "one forward and one backward graph"
    assert all(r.applied for r in reports), [r.reason for r in reports]


def test_deterministic_threads_compute_the_sequential_runtimes_gradients_bit_for_bit():
    """The same ATen graphs, each op with eager's intra-op threads: the streams change no bit.
    (Without ``deterministic``, a side stream's matmuls run on one thread of two and three
    of these gradients differ in their last bits.)"""
    model, inputs = two_branch_gemv(depth=2)
    model.train()
    old = torch.get_num_threads()
    torch.set_num_threads(2)

    def grads(runtime: str, **options) -> list[torch.Tensor]:
        torch._dynamo.reset()
        be = autostream.backend(max_streams=2, cost_table="h200", solver="heft", measure=0,
                                runtime=runtime, **options)
        compiled = torch.compile(model, backend=be)
        model.zero_grad()
        xs = [x.detach().clone().requires_grad_(True) for x in inputs]
        outs = compiled(*xs)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        sum(o.square().sum() for o in outs).backward()
        assert [r.applied for r in be.autostream_pass.reports] == [True, True]
        return [*outs, *(x.grad for x in xs), *(p.grad.clone() for p in model.parameters())]

    try:
        reference = grads("sequential")
        got = grads("threads", deterministic=True)
    finally:
        torch.set_num_threads(old)
        torch._dynamo.reset()
    assert all(torch.equal(g, e) for g, e in zip(got, reference, strict=True))
