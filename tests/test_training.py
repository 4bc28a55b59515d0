"""Training graphs: the pass plans forward and backward graphs; gradients equal eager."""

import torch

import autostream
from autostream.zoo import multihead_block


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
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    for g, e in zip(got[2], expected[2]):
        torch.testing.assert_close(g, e)
    reports = be.autostream_pass.reports
    assert len(reports) == 2, "one forward and one backward graph"
    assert all(r.applied for r in reports), [r.reason for r in reports]
