"""The verifier catches what a broken rewrite would do."""

from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.torchair import air_kind
from autostream.dialects.verify import check_scopes, verify_rewrite
from autostream.fx.capture import capture
from autostream.models.zoo import multihead_block
from autostream.planning.plan import PlanOptions, plan_graph
from tests.helpers import UniformCosts


def _rewritten():
    model, inputs = multihead_block(tokens=2, hidden=16, out=8, heads=3, depth=1)
    [c] = capture(model, inputs)
    plan = plan_graph(c.gm, PlanOptions(max_streams=3), UniformCosts())
    rewrite_graph(c.gm, plan.schedule, plan.syncs)
    assert verify_rewrite(c.gm, plan.op_graph).ok
    return c.gm, plan


def test_missing_wait_is_an_unordered_dependence():
    gm, plan = _rewritten()
    wait = next(n for n in gm.graph.nodes if air_kind(n) == "wait")
    gm.graph.erase_node(wait)
    problems = verify_rewrite(gm, plan.op_graph).problems
    assert any("not ordered" in p or "not joined" in p for p in problems)


def test_missing_join_is_reported():
    gm, plan = _rewritten()
    output = next(n for n in gm.graph.nodes if n.op == "output")
    join = output.prev
    assert air_kind(join) == "wait"
    gm.graph.erase_node(join)
    assert any("not joined" in p for p in verify_rewrite(gm, plan.op_graph).problems)


def test_unbalanced_scopes_are_reported_like_torchair():
    gm, plan = _rewritten()
    exit_node = next(n for n in gm.graph.nodes if air_kind(n) == "scope_exit")
    gm.graph.erase_node(exit_node)
    assert check_scopes(gm.graph) == ["1 scope_enter node(s) are never exited"]


def test_op_missing_from_the_rewrite_is_reported():
    gm, plan = _rewritten()
    plan.op_graph.add_node("ghost")
    problems = verify_rewrite(gm, plan.op_graph).problems
    assert "op ghost is scheduled 0 times, expected once" in problems


def test_wait_on_a_token_recorded_later_is_reported():
    gm, plan = _rewritten()
    first_wait = next(n for n in gm.graph.nodes if air_kind(n) == "wait")
    # Move the first wait to the very front, before any record.
    first_real = next(n for n in gm.graph.nodes if n.op != "placeholder")
    first_real.prepend(first_wait)
    problems = verify_rewrite(gm, plan.op_graph).problems
    assert any("not recorded before it" in p for p in problems)
