"""Property tests on random DAG-shaped models: same outputs, verified, minimal syncs."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.verify import verify_rewrite
from autostream.fx.capture import capture
from autostream.models.zoo import random_dag_model
from autostream.planning.plan import PlanOptions, plan_graph
from tests.helpers import UniformCosts, as_tuple, minimum_sync_count


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), ops=st.integers(3, 9), streams=st.integers(2, 4))
def test_random_models_rewrite_to_verified_equal_graphs_with_minimal_syncs(seed, ops, streams):
    model, inputs = random_dag_model(seed, ops=ops, width=16, rows=4)
    [c] = capture(model, inputs)
    with torch.no_grad():
        expected = as_tuple(model(*inputs))
    plan = plan_graph(c.gm, PlanOptions(max_streams=streams), UniformCosts())
    assert plan.schedule.streams_used <= streams
    rewrite_graph(c.gm, plan.schedule, plan.syncs)
    result = verify_rewrite(c.gm, plan.op_graph)
    assert result.ok, result.problems
    with torch.no_grad():
        got = as_tuple(c.gm(*c.args))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    cross = sum(
        1 for u, v in plan.op_graph.edges if plan.schedule.stream_of[u] != plan.schedule.stream_of[v]
    )
    if cross <= 12:  # brute force is exponential in the number of cross-stream edges
        assert len(plan.syncs) == minimum_sync_count(plan.op_graph, plan.schedule)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_plans_are_deterministic(seed):
    model, inputs = random_dag_model(seed, ops=8, width=16, rows=4)
    [c] = capture(model, inputs)
    a = plan_graph(c.gm, PlanOptions(max_streams=3), UniformCosts())
    b = plan_graph(c.gm, PlanOptions(max_streams=3), UniformCosts())
    assert a.schedule.order == b.schedule.order
    assert dict(a.schedule.stream_of) == dict(b.schedule.stream_of)
    assert a.syncs == b.syncs
