"""The graph runtime: its capture sequence (a pure function of the plan, checked with
vector clocks, negative controls included), and the runner's contract (static inputs,
fresh outputs, written inputs, the shape cache, refusals) on a fake device."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autostream.dialects.rewrite import rewrite_graph
from autostream.fx.capture import capture
from autostream.models.zoo import moe_model, parallel_block
from autostream.planning.plan import PlanOptions, plan_graph
from autostream.runtime import make_runner, parse_program
from autostream.runtime.capturable import graph_refusal
from autostream.runtime.capture_plan import CaptureStep, capture_steps, check_capture
from autostream.runtime.graphed import GraphRunner
from autostream.runtime.sequential import SequentialRunner
from tests.fake_device import fake_device, patch_backend_to_fake_capture
from tests.helpers import UniformCosts, as_tuple


def planned(factory, streams: int = 2):
    """A zoo model's post-AOT graph, rewritten with a multi-stream plan, and its arguments."""
    model, inputs = factory()
    [c] = capture(model, inputs)
    plan = plan_graph(c.gm, PlanOptions(max_streams=streams, solver="heft"), UniformCosts())
    assert plan.schedule.streams_used > 1
    rewrite_graph(c.gm, plan.schedule, plan.syncs)
    return c.gm, c.args


@pytest.fixture(autouse=True)
def inference():
    """Graphs are captured for inference (parameters require grad)."""
    with torch.no_grad():
        yield


def fake_runner(gm, refuse=None, **options):
    streams, graphs = fake_device(refuse)
    runner = GraphRunner(gm, graph_api=lambda d: graphs, stream_api=lambda d: streams,
                         **options)
    return runner, streams, graphs


# -- the capture sequence ----------------------------------------------------------------

@pytest.mark.parametrize("factory", [moe_model, parallel_block])
def test_the_capture_sequence_of_a_plan_is_ordered_joined_and_releases_safely(factory):
    gm, _ = planned(factory, streams=3)
    program = parse_program(gm)
    steps = capture_steps(program)
    check = check_capture(steps, program)
    assert check.ok, check.summary()
    # it saw something: cross-stream reads, and releases of storages read across streams
    assert check.cross_reads > 0 and check.cross_releases > 0
    assert check.joins == len(program.side_streams) > 0 and check.outputs > 0
    verbs = [s.verb for s in steps]
    assert verbs[0] == "begin" and verbs[-1] == "end"
    first_op = {k: next(i for i, s in enumerate(steps) if s.stream == k and s.verb == "op")
                for k in program.side_streams}
    for k in program.side_streams:
        assert verbs.index("begin") < steps.index(CaptureStep("fork", k)) < first_op[k]
        last = max(i for i, s in enumerate(steps) if s.stream == k and s.verb != "join")
        assert last < steps.index(CaptureStep("join", k)) < len(steps) - 1


def test_the_capture_sequence_is_a_pure_function_of_the_plan():
    a = [str(s) for s in capture_steps(parse_program(planned(moe_model)[0]))]
    b = [str(s) for s in capture_steps(parse_program(planned(moe_model)[0]))]
    assert a == b and len(a) > 10


def test_a_dropped_join_is_caught():
    program = parse_program(planned(moe_model)[0])
    steps = [s for s in capture_steps(program) if s.verb != "join"]
    problems = check_capture(steps, program).problems
    assert problems == ["stream 1 is not joined before the capture ends"]


def test_a_fork_before_the_capture_begins_is_caught():
    program = parse_program(planned(moe_model)[0])
    steps = list(capture_steps(program))
    fork = steps.pop(1)
    steps.insert(0, fork)
    problems = check_capture(steps, program).problems
    assert any("runs outside the capture" in p for p in problems)


def test_an_early_release_is_caught():
    program = parse_program(planned(moe_model, streams=3)[0])
    steps = list(capture_steps(program))
    check = check_capture(steps, program)
    assert check.ok and check.cross_releases > 0
    # move a release of a matmul's result read on another stream right after the matmul
    def read_across(v):
        return v.target == torch.ops.aten.mm.default and any(
            program.stream_of.get(u, 0) != program.stream_of[v] for u in v.users)

    i = next(i for i, s in enumerate(steps) if s.verb == "release"
             and any(read_across(v) for v in s.values))
    release = steps.pop(i)
    producer = max(j for j, s in enumerate(steps[:i]) if s.verb == "op"
                   and s.step.node in release.values and read_across(s.step.node))
    steps.insert(producer + 1, release)
    problems = check_capture(steps, program).problems
    assert any("released before" in p for p in problems), problems


def test_a_dropped_wait_is_caught():
    program = parse_program(planned(parallel_block)[0])
    steps = list(capture_steps(program))
    waits = [i for i, s in enumerate(steps) if s.verb == "wait" and s.stream != 0]
    assert waits
    del steps[waits[0]]
    problems = check_capture(steps, program).problems
    assert any("with no wait ordering it after the write" in p for p in problems), problems


def test_the_fake_device_sees_the_capture_the_sequence_describes():
    gm, args = planned(moe_model)
    runner, streams, graphs = fake_runner(gm, warmup=1)
    runner(*args)
    calls = streams.log.calls
    begin = next(i for i, c in enumerate(calls) if c[0] == "begin")
    end = next(i for i, c in enumerate(calls) if c[0] == "end")
    capture_stream = calls[begin][2]
    inside = calls[begin + 1:end]
    sides = {c[1] for c in inside if c[0] == "set_stream"} - {capture_stream}
    assert sides
    for side in sides:
        forked = next(i for i, c in enumerate(inside) if c[0] == "wait_event" and c[1] == side)
        recorded = inside[forked][2]
        on = next(c[2] for c in inside[:forked] if c[0] == "record" and c[1] == recorded)
        assert on == capture_stream  # forked from the capture stream, after begin
        assert forked < next(i for i, c in enumerate(inside) if c == ("set_stream", side))
        joined = [i for i, c in enumerate(inside) if c == ("wait_stream", capture_stream, side)]
        uses = [i for i, c in enumerate(inside) if side in c[1:] and c[0] != "wait_stream"]
        assert joined and joined[-1] > max(uses)
    assert inside[-1][0] != "set_stream" or inside[-1][1] == capture_stream


# -- the runner's contract -----------------------------------------------------------------

@pytest.mark.parametrize("factory", [moe_model, parallel_block])
def test_replays_equal_the_sequential_runtime_bit_for_bit(factory):
    gm, args = planned(factory)
    runner, _, graphs = fake_runner(gm)
    want = as_tuple(SequentialRunner(gm)(*args))
    for _ in range(3):
        got = as_tuple(runner(*args))
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert graphs.captures == 1 and runner.stats.replays == 3 and runner.captured
    assert runner.refused is None and "captured 1 graph, 3 replays" in runner.describe()


def test_outputs_are_fresh_unless_reused_is_asked():
    gm, args = planned(moe_model)
    other = tuple(a + 1 if isinstance(a, torch.Tensor) and not isinstance(
        a, torch.nn.Parameter) else a for a in args)
    for policy in ("fresh", "reused"):
        runner, _, _ = fake_runner(gm, outputs=policy)
        first = as_tuple(runner(*args))[0]
        kept = first.clone()
        second = as_tuple(runner(*other))[0]
        assert not torch.equal(second, kept)
        assert torch.equal(first, kept) == (policy == "fresh")


def test_new_inputs_are_copied_in_and_parameters_read_where_they_lie():
    model, inputs = moe_model()
    [c] = capture(model, inputs)
    params = sum(isinstance(a, torch.nn.Parameter) for a in c.args)
    runner, _, _ = fake_runner(c.gm)
    assert c.args[0] is inputs[0]
    args2 = (torch.randn_like(inputs[0]), *c.args[1:])
    runner(*c.args)
    got = as_tuple(runner(*args2))
    assert all(torch.equal(g, w) for g, w in zip(got, as_tuple(c.gm(*args2)), strict=True))
    assert runner.stats.by_address_inputs == params > 0
    assert runner.stats.copied_inputs == len(c.args) - params
    # a parameter replaced by another tensor: captured again, never a stale read
    swapped = tuple(torch.nn.Parameter(a.detach() * 2) if isinstance(a, torch.nn.Parameter)
                    else a for a in c.args)
    got = as_tuple(runner(*swapped))
    assert all(torch.equal(g, w) for g, w in zip(got, as_tuple(c.gm(*swapped)), strict=True))
    assert runner.stats.recaptures == 1


@pytest.mark.parametrize("trace", ["make_fx", "symbolic_trace"])
def test_an_input_the_graph_writes_is_written_back_once_per_call(trace):
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(cache, x):
        cache.add_(x)
        return cache * 2, x + 1

    # make_fx: the write is in add_'s schema; symbolic_trace: no example values, so the
    # runner copies every input and finds the write by what the warm-up changed
    gm = (make_fx(step)(torch.zeros(3), torch.ones(3)) if trace == "make_fx"
          else torch.fx.symbolic_trace(step))
    runner, _, _ = fake_runner(gm)
    mine, theirs = torch.zeros(3), torch.zeros(3)
    for i in range(3):
        x = torch.full((3,), float(i + 1))
        got, want = runner(mine, x), step(theirs, x)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert torch.equal(mine, theirs) and torch.equal(mine, torch.full((3,), 6.0))


def test_an_output_that_views_an_input_views_the_callers_input():
    gm = torch.fx.symbolic_trace(lambda x, y: (x[1:], x * y))
    runner, _, _ = fake_runner(gm)
    x, y = torch.arange(4.0), torch.ones(4)
    view, prod = runner(x, y)
    assert view.data_ptr() == x[1:].data_ptr() and torch.equal(prod, x)
    x2 = torch.arange(4.0) + 10
    view2, _ = runner(x2, y)
    assert view2.data_ptr() == x2[1:].data_ptr() and torch.equal(view, x[1:])


def test_shapes_beyond_the_cache_run_uncaptured_and_are_counted():
    gm = torch.fx.symbolic_trace(lambda x: (x * 2).sum(0))
    runner, _, graphs = fake_runner(gm, max_graphs=1)
    for n in (2, 3, 2):
        assert torch.equal(runner(torch.ones(n, 2)), torch.full((2,), 2.0 * n))
    assert graphs.captures == 1 and runner.stats.shapes_over_cache == 1
    assert "1 calls uncaptured (1 over the cache of 1 shapes)" in runner.describe()


def test_what_torch_refuses_to_capture_runs_uncaptured_and_says_why():
    gm, args = planned(moe_model)
    runner, streams, _ = fake_runner(gm, refuse="operation not permitted when stream is capturing")
    streams_runner_out = as_tuple(SequentialRunner(gm)(*args))
    # the fallback is the streams runtime, here on the fake device's streams
    got = as_tuple(runner(*args))
    assert all(torch.equal(g, w) for g, w in zip(got, streams_runner_out, strict=True))
    assert "capture failed (RuntimeError: operation not permitted" in runner.refused
    assert runner.describe().startswith("not captured: capture failed")


def test_a_host_sync_is_refused_before_any_capture():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: x.nonzero().sum() + x.sum(), tracing_mode="symbolic")(torch.ones(3))
    runner, streams, graphs = fake_runner(gm)
    assert torch.equal(runner(torch.tensor([0.0, 2.0, 0.0])), torch.tensor(3.0))
    assert graphs.captures == 0 and "nonzero" in runner.refused
    assert "output size depends on data" in graph_refusal(gm.graph, "cuda")


def test_calls_under_autograd_run_uncaptured_and_later_ones_are_captured():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    runner, _, graphs = fake_runner(gm)
    x = torch.ones(2, requires_grad=True)
    with torch.enable_grad():
        assert runner(x).requires_grad  # autograd records it: uncaptured
    assert graphs.captures == 0 and runner.refused is None
    assert torch.equal(runner(x), torch.full((2,), 2.0)) and graphs.captures == 1
    assert "1 calls uncaptured (1 with inputs requiring grad)" in runner.describe()


def test_the_graph_runtime_needs_accelerator_inputs_and_names_the_fix():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(ValueError, match="'streams' runtime needs accelerator tensors"):
        make_runner(gm, "graph")(torch.ones(2))  # refused, then the streams fallback says so
    from autostream.runtime.select import check_runtime_device

    with pytest.raises(ValueError, match="runtime='graph' runs device streams, but the graph's "
                                         "inputs are on cpu; use runtime='threads'"):
        check_runtime_device("graph", "cpu")


def test_bad_options_name_the_fix():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(ValueError, match="outputs must be one of fresh, reused"):
        GraphRunner(gm, outputs="static")
    with pytest.raises(ValueError, match="max_graphs must be an integer >= 1"):
        GraphRunner(gm, max_graphs=0)


def test_a_bad_capture_sequence_is_refused_and_runs_on_one_stream():
    gm, args = planned(moe_model)
    program = parse_program(gm)
    bad = dataclasses.replace(program, steps=tuple(s for s in program.steps
                                                   if s.kind != "wait"))
    streams, graphs = fake_device()
    runner = GraphRunner(gm, bad, graph_api=lambda d: graphs, stream_api=lambda d: streams)
    got = as_tuple(runner(*args))  # no ProgramError inside the caller's first call
    want = as_tuple(SequentialRunner(gm)(*args))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert graphs.captures == 0 and not runner.captured
    assert "capture sequence is unsafe" in runner.refused
    assert "with no wait ordering it after the write" in runner.refused
    assert runner.describe().startswith("not captured: the plan's capture sequence is unsafe")
    assert not [c for c in streams.log.calls if c[0] == "set_stream"]  # one stream: no switch


# -- inputs: by address, copied, moved ------------------------------------------------------

def test_a_moved_parameter_is_captured_again():
    model, inputs = moe_model()
    [c] = capture(model, inputs)
    runner, _, graphs = fake_runner(c.gm)
    runner(*c.args)
    param = next(a for a in c.args if isinstance(a, torch.nn.Parameter))
    param.data = param.data * 2 + 1  # what Module.to and .half() do: a new storage
    got = as_tuple(runner(*c.args))
    assert all(torch.equal(g, w) for g, w in zip(got, as_tuple(c.gm(*c.args)), strict=True))
    assert runner.stats.recaptures == 1 and graphs.captures == 2
    assert "1 recaptures (an input moved)" in runner.describe()


def test_the_fake_device_replays_a_moved_tensor_from_its_old_address():
    """The fake device's own contract, which the test above relies on."""
    streams, graphs = fake_device()
    w = torch.nn.Parameter(torch.ones(2))
    graph = graphs.new_graph()
    out = graphs.capture(graph, lambda: w * 3, streams.new_stream(), graphs.new_pool())
    w.data = torch.full((2,), 5.0)
    graphs.replay(graph)
    assert torch.equal(out, torch.full((2,), 3.0))  # read where w lay at capture


def test_shapes_and_values_alternate_without_recapture():
    gm = torch.fx.symbolic_trace(lambda x, w, n: (x @ w) * n)
    runner, _, graphs = fake_runner(gm)
    w = torch.nn.Parameter(torch.randn(3, 3))
    for _ in range(2):
        for rows, n in ((2, 2), (4, 2), (2, 3)):
            x = torch.randn(rows, 3)
            assert torch.equal(runner(x, w, n), (x @ w) * n)
    assert graphs.captures == 3 and runner.stats.replays == 6
    assert runner.stats.recaptures == 0 and runner.captured


def test_parameters_are_read_by_address_even_when_effects_are_unknown():
    # symbolic_trace: no example values, so what the graph writes cannot be traced
    gm = torch.fx.symbolic_trace(lambda x, w: x @ w)
    runner, _, _ = fake_runner(gm)
    x, w = torch.randn(2, 3), torch.nn.Parameter(torch.randn(3, 3))
    for _ in range(2):
        assert torch.equal(runner(x, w), x @ w)
    assert runner.stats.by_address_inputs == 1 and runner.stats.copied_inputs == 1
    assert runner.stats.effects_unknown and runner.stats.snapshot_bytes == x.nbytes
    assert "effects unknown (" in runner.describe()


def test_a_parameter_a_schema_writes_is_copied_and_written_once_per_call():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(w, x):
        w.add_(x)
        return w * 2

    gm = make_fx(step)(torch.zeros(3), torch.ones(3))
    runner, _, _ = fake_runner(gm)
    w = torch.nn.Parameter(torch.zeros(3))
    for i in range(3):
        assert torch.equal(runner(w, torch.ones(3)), torch.full((3,), 2.0 * (i + 1)))
    assert torch.equal(w, torch.full((3,), 3.0))  # not written by the warm-up or capture
    assert runner.stats.by_address_inputs == 0 and runner.stats.copied_inputs == 2


def test_a_snapshot_over_the_budget_is_refused_with_its_reason():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)  # effects unknown: writes need a snapshot
    runner, _, graphs = fake_runner(gm, snapshot_bytes=8)
    x = torch.arange(3.0)  # 12 bytes
    assert torch.equal(runner(x), x * 2)
    assert graphs.captures == 0 and not runner.captured
    assert "would snapshot 12 bytes of copied inputs, over snapshot_bytes=8" in runner.refused
    assert "give the graph example values" in runner.refused


@pytest.mark.cuda
def test_on_a_real_gpu_the_plan_replays_equal_to_the_sequential_runtime():
    gm, args = planned(moe_model)
    gm = gm.cuda()
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    runner = make_runner(gm, "graph")
    want = as_tuple(SequentialRunner(gm)(*args))
    with torch.no_grad():
        for _ in range(3):
            got = as_tuple(runner(*args))
    assert runner.refused is None, runner.refused
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


# -- the backend on the graph runtime (a fake device standing in for CUDA) -------------------

@pytest.fixture
def fake_cuda(monkeypatch):
    """The backend as on a CUDA device that captures graphs, every graph on a fake device."""
    return patch_backend_to_fake_capture(monkeypatch)


@pytest.mark.slow
def test_the_backend_weighs_the_plans_graph_against_the_one_stream_graph(fake_cuda):
    import autostream

    model, inputs = moe_model()
    torch._dynamo.reset()
    be = autostream.backend(max_streams=2, cost_table="h200", measure=2, runtime="graph")
    compiled = torch.compile(model, backend=be)
    want = as_tuple(model(*inputs))
    for _ in range(14):  # 2 rounds of a warm-up and a timed call per candidate: 12
        got = as_tuple(compiled(*inputs))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    report = be.last_report
    torch._dynamo.reset()
    assert report.runtime == "graph" and report.plan.runtime == "graph"
    assert "on the graph runtime" in report.summary()
    choice = report.choice
    assert set(choice.candidates) == {"graph", "graph1", "eager"}
    assert choice.default == "graph1" and choice.choice is not None
    # both graph candidates were captured and replayed (on the fake device)
    assert len(fake_cuda) == 2 and all(g.captures == 1 for g in fake_cuda)
    assert sum("captured 1 graph" in line for line in report.runtime_lines()) == 2
    [fastest] = [line for line in report.summary().splitlines() if "fastest single stream" in line]
    assert "; graph " in fastest and "x as fast" in fastest  # the plan against the baseline


@pytest.mark.slow
def test_a_graph_that_cannot_be_captured_runs_on_streams_and_says_why(fake_cuda, monkeypatch):
    import importlib

    import autostream

    backend_module = importlib.import_module("autostream.backend")
    monkeypatch.setattr(backend_module, "capture_refusal",
                        lambda gm, device, inputs: "op 'nonzero' makes the host wait")
    monkeypatch.setattr(backend_module, "select_runtime", lambda kind, inputs: (
        "graph" if kind == "graph" else "threads"))
    model, inputs = moe_model()
    torch._dynamo.reset()
    be = autostream.backend(max_streams=2, cost_table="h200", measure=0, runtime="graph")
    compiled = torch.compile(model, backend=be)
    compiled(*inputs)
    report = be.last_report
    torch._dynamo.reset()
    assert report.runtime == "streams" and "nonzero" in report.capture_refused
    assert "runtime: streams (not captured: op 'nonzero'" in report.summary()
    assert report.plan.runtime == "streams" and not fake_cuda
    # one host thread issues every op: this small graph is host-bound on any stream count
    assert not report.applied and "is not faster than one stream" in report.reason, \
        report.summary()


def graph_backend_runs(model, inputs, streams_counts, calls):
    """Each stream count's outputs (the last of ``calls`` calls) and backend report, through
    ``backend(runtime="graph", measure=0)`` on the h200 table."""
    import autostream

    outs, reports = {}, {}
    for streams in streams_counts:
        torch._dynamo.reset()
        be = autostream.backend(runtime="graph", max_streams=streams, measure=0,
                                cost_table="h200")
        compiled = torch.compile(model, backend=be, dynamic=False)
        for _ in range(calls):
            outs[streams] = as_tuple(compiled(*inputs))
        reports[streams] = be.last_report
    torch._dynamo.reset()
    return outs, reports


@pytest.mark.cuda
def test_on_a_real_gpu_the_backends_graph_equals_the_one_stream_graph():
    model, inputs = moe_model()
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    outs, reports = graph_backend_runs(model, inputs, (1, 2), calls=3)
    assert all(r.runtime == "graph" and not r.capture_refused for r in reports.values())
    assert all(torch.equal(a, b) for a, b in zip(outs[1], outs[2], strict=True))


@pytest.mark.slow
def test_torchvisions_googlenet_plan_is_captured_and_equals_the_one_stream_graph(fake_cuda):
    """A model nobody here wrote (torchvision: installed beside torch 2.14 in CI)."""
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = models.googlenet(weights=None, aux_logits=False, init_weights=True).eval()
    x = torch.randn(1, 3, 224, 224)
    outs, reports = graph_backend_runs(model, (x,), (1, 4), calls=2)
    outs = {k: v[0] for k, v in outs.items()}
    assert all(r.runtime == "graph" and r.plan.runtime == "graph" for r in reports.values())
    report = reports[4]
    assert report.streams_used == 4 and report.applied, report.summary()
    assert "on the graph runtime" in report.summary()
    torch.testing.assert_close(outs[4], model(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[4], outs[1])  # the same kernels on one thread: bit for bit
    # every runner checked its capture sequence and captured once
    assert [g.captures for g in fake_cuda] == [1, 1]
    checked = [r.stats.checked for _, r in report.graph_runners]
    assert checked and "no problem" in checked[0] and "0 cross-stream reads" not in checked[0]
