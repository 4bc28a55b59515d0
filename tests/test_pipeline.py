"""End to end on real models: torch.compile(backend=autostream.backend(...)) equals eager."""

import pytest
import torch

import autostream
from autostream.dialects.torchair import air_kind
from autostream.dialects.verify import verify_rewrite
from autostream.fx.capture import capture
from autostream.models.zoo import decoder_layer, inception_block, moe_model, multihead_block
from tests.helpers import compile_and_compare


@pytest.mark.parametrize(
    "factory, must_parallelise",
    [(decoder_layer, False), (moe_model, True), (inception_block, True), (multihead_block, True)],
    ids=["decoder", "moe", "inception", "multihead"],
)
def test_real_models_compile_to_verified_plans_equal_to_eager(factory, must_parallelise):
    model, inputs = factory()
    report = compile_and_compare(model, inputs, max_streams=4, cost_table="h200")
    assert report is not None and report.plan is not None
    if must_parallelise:
        assert report.applied, report.reason
        assert report.plan.schedule.streams_used > 1
        assert len(report.plan.syncs) >= 1


@pytest.mark.parametrize("factory", [moe_model, inception_block], ids=["moe", "inception"])
def test_rewritten_graph_passes_the_independent_verifier_and_runs(factory):
    model, inputs = factory()
    [captured] = capture(model, inputs)
    gm, args = captured.gm, captured.args
    with torch.no_grad():
        expected = gm(*args)
    stream_pass = autostream.AutoStreamPass(max_streams=3, cost_table="h200")
    stream_pass(gm, None, None)
    report = stream_pass.last_report
    assert report.applied, report.reason
    assert verify_rewrite(gm, report.plan.op_graph).ok
    kinds = [air_kind(n) for n in gm.graph.nodes]
    assert kinds.count("scope_enter") == kinds.count("scope_exit") > 0
    assert kinds.count("record") == len({s.producer for s in report.plan.syncs})
    # Every node kept its metadata (FakeTensor values for every real op).
    for n in gm.graph.nodes:
        if n.op == "call_function" and air_kind(n) is None:
            assert "val" in n.meta
    with torch.no_grad():
        got = gm(*args)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)


def test_entry_point_backend_name_works():
    model, inputs = moe_model()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="autostream")
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    torch._dynamo.reset()
