"""The pass never breaks a graph: unchanged, with a reason, whenever it cannot help."""

import importlib
import logging
import re

import pytest
import torch
import torch.fx

import autostream
from autostream.dialects.torchair import air_ops
from autostream.fx.capture import capture
from autostream.models.zoo import moe_model, multihead_block
from autostream.passes import Outcome
from tests.helpers import compile_and_compare


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _code(gm):
    return [(n.op, str(n.target), n.name) for n in gm.graph.nodes]


def test_graph_without_parallelism_comes_back_unchanged():
    [c] = capture(Chain(), (torch.randn(4, 32),))
    before = _code(c.gm)
    p = autostream.AutoStreamPass(max_streams=4)
    p(c.gm, None, None)
    assert _code(c.gm) == before
    assert not p.last_report.applied and "left unchanged" in p.last_report.reason


def test_hand_tagged_graph_is_left_alone_with_a_warning(caplog):
    [c] = capture(Chain(), (torch.randn(4, 32),))
    ops = air_ops()
    first = next(n for n in c.gm.graph.nodes if n.op == "call_function")
    with c.gm.graph.inserting_before(first):
        c.gm.graph.call_function(ops.scope_enter, (["_user_stream_label"], ["stream_1"]))
    with c.gm.graph.inserting_after(first):
        c.gm.graph.call_function(ops.scope_exit, ())
    before = _code(c.gm)
    p = autostream.AutoStreamPass()
    with caplog.at_level(logging.WARNING, logger="autostream"):
        p(c.gm, None, None)
    assert _code(c.gm) == before
    assert "already contains stream op" in p.last_report.reason
    assert p.last_report.outcome is Outcome.HAND_TAGGED
    assert any("already contains stream op" in r.getMessage() for r in caplog.records)


def test_empty_graph():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((x,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    p = autostream.AutoStreamPass()
    p(gm, None, None)
    assert "no ops" in p.last_report.reason and not p.last_report.applied
    assert len(gm.graph.nodes) == 2


def test_symbolic_shapes_compile_and_match_eager():
    model, _ = moe_model()
    torch._dynamo.reset()
    be = autostream.backend(max_streams=3, cost_table="h200")
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for tokens in (5, 9):
            x = torch.randn(tokens, 256)
            torch.testing.assert_close(compiled(x), model(x))
    torch._dynamo.reset()
    report = be.autostream_pass.last_report
    assert report is not None and report.plan is not None
    fx_graph = next(iter(report.plan.op_graph.nodes(data=True)))[1]["fx"].graph
    assert any(isinstance(n.meta.get("val"), torch.SymInt) for n in fx_graph.find_nodes(op="placeholder"))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_max_streams_names_the_allowed_values(bad):
    with pytest.raises(ValueError, match="max_streams must be an integer >= 1"):
        autostream.AutoStreamPass(max_streams=bad)


def test_unknown_solver_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"unknown solver 'fast'; allowed: .*cpsat.*heft.*single"):
        autostream.backend(solver="fast")


def test_unknown_runtime_names_the_allowed_values():
    with pytest.raises(ValueError, match="unknown runtime .gpu.; choose one of auto, threads, streams, graph, sequential"):
        autostream.backend(runtime="gpu")


def _explode(*args, **kwargs):
    raise RuntimeError("planner bug")


def test_planning_failure_leaves_graph_unchanged_and_compiles(monkeypatch, caplog):
    monkeypatch.delenv("AUTOSTREAM_STRICT")
    monkeypatch.setattr("autostream.passes.plan_graph", _explode)
    model, inputs = moe_model()
    with caplog.at_level(logging.WARNING, logger="autostream"):
        report = compile_and_compare(model, inputs, max_streams=2)
    assert report.outcome is Outcome.PLANNING_FAILED and "planner bug" in report.reason
    assert "planner bug" in caplog.text  # not the user's fault, but visible


def test_strict_mode_raises_a_planning_failure(monkeypatch):
    monkeypatch.setattr("autostream.passes.plan_graph", _explode)
    [c] = capture(Chain(), (torch.randn(4, 32),))
    before = _code(c.gm)
    with pytest.raises(RuntimeError, match="planner bug"):
        autostream.AutoStreamPass()(c.gm)
    assert _code(c.gm) == before


@pytest.mark.parametrize("strict", [False, True])
def test_rewrite_rejected_by_verifier_restores_the_original_graph(monkeypatch, strict):
    # Drop every sync of the plan: the verifier must catch the unordered dependences.
    import dataclasses

    import autostream.passes as passes

    if not strict:
        monkeypatch.delenv("AUTOSTREAM_STRICT")
    planned = passes.plan_graph
    monkeypatch.setattr(passes, "plan_graph", lambda gm, options, *costs: dataclasses.replace(
        planned(gm, options, *costs), syncs=()))
    model, inputs = moe_model()
    [c] = capture(model, inputs)
    before = _code(c.gm)
    p = autostream.AutoStreamPass(max_streams=3, cost_table="h200")
    if strict:
        with pytest.raises(Exception, match="not ordered"):
            p(c.gm, None, None)
    else:
        p(c.gm, None, None)
        assert p.last_report.outcome is Outcome.REWRITE_REJECTED
        assert "rewrite rejected" in p.last_report.reason and "not ordered" in p.last_report.reason
    assert _code(c.gm) == before
    with torch.no_grad():
        torch.testing.assert_close(c.gm(*c.args)[0], model(*inputs))


def test_runtime_overhead_per_node_can_make_one_stream_the_better_plan():
    from autostream.planning.plan import PlanOptions, plan_graph
    from tests.helpers import UniformCosts

    class SlowRuntime(UniformCosts):
        runtime_op_us = 1_000.0  # far more than any gain from overlap

    model, inputs = moe_model()
    [c] = capture(model, inputs)
    free = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), UniformCosts())
    assert free.schedule.streams_used > 1
    slow = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), SlowRuntime())
    assert slow.schedule.streams_used == 1 and not slow.syncs
    assert "runtime overhead of 0 us per call, 0 us per segment and 1000.0 us per node " \
        "included" in slow.notes[0]


def test_runtime_overhead_per_segment_prefers_plans_with_fewer_syncs():
    from autostream.planning.plan import PlanOptions, plan_graph
    from autostream.scheduling.simulate import segment_leaders
    from tests.helpers import UniformCosts

    model, inputs = moe_model()
    [c] = capture(model, inputs)
    free = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), UniformCosts())
    leaders = len(segment_leaders(free.schedule, free.syncs))
    gain = free.single_stream_us - free.predicted_us
    assert free.schedule.streams_used > 1 and leaders > free.schedule.streams_used

    class CostlySegments(UniformCosts):
        def __init__(self, segment_us):
            super().__init__()
            self.runtime_segment_us = segment_us

    # each segment costs more than the whole gain spread over them: one stream wins
    above = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"),
                       CostlySegments(gain / free.schedule.streams_used + 1.0))
    assert above.schedule.streams_used == 1 and not above.syncs
    assert "us per segment" in above.notes[0]
    small = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), CostlySegments(0.01))
    assert small.schedule.streams_used > 1
    assert free.predicted_us < small.predicted_us <= free.predicted_us + 0.01 * leaders + 1e-9


def test_runtime_overhead_per_call_can_make_one_stream_the_better_plan():
    from autostream.planning.plan import PlanOptions, plan_graph
    from tests.helpers import UniformCosts

    model, inputs = moe_model()
    [c] = capture(model, inputs)
    free = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), UniformCosts())
    gain = free.single_stream_us - free.predicted_us
    assert gain > 0

    class CostlyCall(UniformCosts):
        def __init__(self, call_us):
            super().__init__()
            self.runtime_call_us = call_us

    below = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), CostlyCall(0.5 * gain))
    assert below.schedule.streams_used > 1
    assert below.predicted_us == pytest.approx(free.predicted_us + 0.5 * gain)
    above = plan_graph(c.gm, PlanOptions(max_streams=3, solver="heft"), CostlyCall(1.5 * gain))
    assert above.schedule.streams_used == 1 and not above.syncs
    assert "per call" in above.notes[0]


def test_ops_slower_on_a_split_device_can_make_one_stream_the_better_plan():
    from dataclasses import replace

    from autostream.planning.plan import PlanOptions, plan_graph
    from tests.helpers import UniformCosts

    class HalfSpeedWhenSplit(UniformCosts):
        def estimate(self, node):
            return replace(super().estimate(node), split=2.5)  # 2.5x slower per stream

    model, inputs = multihead_block()
    [c] = capture(model, inputs)
    assert plan_graph(c.gm, PlanOptions(max_streams=2, solver="heft"), UniformCosts()) \
        .schedule.streams_used > 1
    slow = plan_graph(c.gm, PlanOptions(max_streams=2, solver="heft"), HalfSpeedWhenSplit())
    assert slow.schedule.streams_used == 1
    assert slow.problem.graph.nodes[next(iter(slow.op_graph))]["duration"] in (0.0, 10.0)


@pytest.mark.parametrize("option,value,message", [
    ("cost_table", 123, r"cost_table must be a shipped table's name or the path of a table "
                        r"file .*got int 123"),
    ("time_limit", "abc", r"time_limit must be a number of seconds > 0 .*got str 'abc'"),
    ("time_limit", True, r"time_limit must be a number of seconds > 0 .*got bool True"),
    ("sanitize", "yes", r"sanitize must be True or False, got str 'yes'"),
    ("deterministic", 1, r"deterministic must be True or False, got int 1"),
])
def test_a_bad_option_fails_where_it_is_written_naming_it(option, value, message):
    with pytest.raises(ValueError, match=message):
        autostream.backend(**{option: value})
    if option in ("cost_table", "time_limit"):  # pass options fail in the pass too
        with pytest.raises(ValueError, match=message):
            autostream.AutoStreamPass(**{option: value})


def _compile_error(model, x, **compile_kwargs) -> BaseException:
    """The error of the first call (when ``torch.compile`` calls the backend)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, **compile_kwargs)
    try:
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
            compiled(x)
    finally:
        torch._dynamo.reset()
    return info.value.inner_exception


def test_torch_compile_options_reach_the_backend(monkeypatch):
    backend_module = importlib.import_module("autostream.backend")  # the module, not the function
    built = []
    real = backend_module.backend

    def spy(**options):
        built.append(options)
        return real(**options)

    monkeypatch.setattr(backend_module, "backend", spy)
    model, (x,) = multihead_block(tokens=4, hidden=32, out=8, heads=2, depth=1)
    options = {"max_streams": 2, "cost_table": "h200", "measure": 0, "runtime": "sequential"}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="autostream", options=dict(options))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    assert built and all(b == options for b in built)


@pytest.mark.parametrize("kwargs,message", [
    ({"options": {"max_streams": 2, "speed": "max"}}, r"unknown option speed; backend\(\) takes"),
    ({"options": {"solver": "magic"}}, r"unknown solver 'magic'"),
    ({"mode": "max-autotune"}, r"mode='max-autotune'\): autostream has no modes .* "
                               r"backend=autostream\.backend\(\.\.\.\)"),
])
def test_torch_compile_options_and_mode_fail_naming_the_fix(kwargs, message):
    error = _compile_error(Chain(), torch.randn(4, 32), backend="autostream", **kwargs)
    assert isinstance(error, ValueError) and re.search(message, str(error)), error


def test_streams_runtime_with_cpu_inputs_fails_when_the_graph_compiles():
    # Chain has no parallelism: the plan is one stream, which used to run without the
    # streams runtime, so the mistake only showed on a model with parallelism
    error = _compile_error(Chain(), torch.randn(4, 32),
                           backend=autostream.backend(runtime="streams"))
    assert isinstance(error, ValueError)
    assert "runtime='streams' runs device streams, but the graph's inputs are on cpu; use " \
        "runtime='threads'" in str(error)
