"""The seed article's worked example, through this project's dialect."""

import dataclasses

import torch

import autostream
from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.torchair import air_kind, air_ops
from autostream.dialects.verify import verify_rewrite
from autostream.fx.capture import capture
from autostream.models.zoo import article_model
from autostream.planning.plan import PlanOptions, plan_graph
from tests.helpers import UniformCosts


def article_pass(gm, example_inputs, config):
    """The article's hand-written pass, verbatim apart from the op handles."""
    ops = air_ops()
    fx_graph = gm.graph
    record_node = None
    for node in list(fx_graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.mm.default:
            with fx_graph.inserting_before(node):
                fx_graph.call_function(ops.scope_enter, args=(["_user_stream_label"], ["stream_1"]))
        if node.op == "call_function" and node.target == torch.ops.aten.abs.default:
            with fx_graph.inserting_after(node):
                record_node = fx_graph.call_function(ops.record, args=())
            with fx_graph.inserting_after(record_node):
                fx_graph.call_function(ops.scope_exit, args=())
        if node.op == "call_function" and node.target == torch.ops.aten.sub.Tensor:
            with fx_graph.inserting_before(node):
                fx_graph.call_function(ops.wait, args=([record_node],))
    gm.recompile()


def _sequence(gm):
    out = []
    for n in gm.graph.nodes:
        kind = air_kind(n)
        if kind:
            out.append(kind)
        elif n.op == "call_function":
            out.append(n.target._schema.name.split("::")[-1])
        else:
            out.append(n.op)
    return out


def test_hand_written_pass_yields_the_article_graph_and_runs():
    model, inputs = article_model()
    [captured] = capture(model, inputs)
    gm = captured.gm
    article_pass(gm, captured.args, None)
    assert _sequence(gm) == [
        "placeholder", "scope_enter", "mm", "abs", "record", "scope_exit", "add", "wait", "sub", "output",
    ]
    enter = next(n for n in gm.graph.nodes if air_kind(n) == "scope_enter")
    assert enter.args == (["_user_stream_label"], ["stream_1"])
    with torch.no_grad():
        for got, want in zip(gm(*captured.args), model(*inputs)):
            torch.testing.assert_close(got, want)


def test_verifier_flags_the_article_graphs_implicit_cross_stream_read():
    # In GE mode GE adds the event for abs -> add (a data edge); replayed in order with
    # explicit events (ACL graph) it is unordered. The verifier says so, naming the edge.
    model, inputs = article_model()
    [captured] = capture(model, inputs)
    gm = captured.gm
    plan = plan_graph(gm, PlanOptions(max_streams=2), UniformCosts())
    article_pass(gm, captured.args, None)
    problems = verify_rewrite(gm, plan.op_graph).problems
    abs_node = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.abs.default)
    add_node = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.add.Tensor)
    assert problems == [
        f"dependence {abs_node.name} -> {add_node.name} is not ordered (stream 1 -> stream 0)"
    ]


def test_automatic_pass_finds_the_article_models_parallelism():
    model, inputs = article_model()
    [captured] = capture(model, inputs)
    gm = captured.gm
    plan = plan_graph(gm, PlanOptions(max_streams=4, solver="heft"), UniformCosts())
    # After mm, the abs -> add chain and sub are independent: two streams, no more.
    assert plan.schedule.streams_used == 2
    assert plan.schedule.makespan < plan.single_stream_us
    rewrite_graph(gm, plan.schedule, plan.syncs)
    assert verify_rewrite(gm, plan.op_graph).ok
    kinds = [air_kind(n) for n in gm.graph.nodes]
    assert kinds.count("scope_enter") == 1 and kinds.count("wait") == len(
        {s.consumer for s in plan.syncs}
    )
    with torch.no_grad():
        for got, want in zip(gm(*captured.args), model(*inputs)):
            torch.testing.assert_close(got, want)


def test_pass_object_registers_in_one_line_like_torchair_expects():
    class Config:  # TorchAir's CompilerConfig accepts any callable here
        post_grad_custom_pre_pass = None

    config = Config()
    config.post_grad_custom_pre_pass = autostream.AutoStreamPass()
    assert callable(config.post_grad_custom_pre_pass)
    a, b = autostream.AutoStreamPass(max_streams=3), autostream.AutoStreamPass(max_streams=3)
    assert a.digest() == b.digest() and a.digest() != autostream.AutoStreamPass(max_streams=2).digest()


def test_every_plan_option_is_a_pass_option_and_part_of_its_identity():
    """The pass takes ``PlanOptions``' fields (no list of its own to fall behind): each one,
    set, reaches ``options()`` and changes the digest TorchAir and Inductor key their
    caches on, and all but the table (its content is in the digest) the ranks' key."""
    other = {"max_streams": 3, "solver": "heft", "cost_table": "h200", "time_limit": 2.0,
             "max_memory_increase": 0.1, "core_budgets": True}
    assert set(other) == {f.name for f in dataclasses.fields(PlanOptions)}
    base = autostream.AutoStreamPass()
    for name, value in other.items():
        p = autostream.AutoStreamPass(**{name: value})
        assert getattr(p.options(), name) == value and p != base
        assert p.digest() != base.digest()
        assert (p.key() == base.key()) == (name == "cost_table")
    as_text = autostream.AutoStreamPass(max_memory_increase="10%")
    assert as_text.digest() != autostream.AutoStreamPass(max_memory_increase=0.1).digest()
