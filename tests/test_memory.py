"""Predicted peak memory: hand-computed graphs, aliases, lifetimes across streams, torch's estimator."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from autostream.fx.graph import build_op_graph
from autostream.memory.lifetimes import LaunchStep, plan_steps, release_points
from autostream.memory.predict import GraphMemory, launch_timeline, predict_memory
from autostream.models.zoo import ZOO
from autostream.runtime import parse_program
from autostream.runtime.builder import DialectBuilder
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.solvers import get_solver
from tests.factories import largest_graph

aten = torch.ops.aten


def _schedule(stream_of, order, times):
    start = {n: times[n][0] for n in order}
    end = {n: times[n][1] for n in order}
    return Schedule("hand", stream_of, tuple(order), start, end, max(end.values()), 0.0)


def _branches():
    """p1 (100 B) -> q1 (1 B) and p2 (100 B) -> q2 (1 B); q1 and q2 are returned."""
    deps = nx.DiGraph([("p1", "q1"), ("p2", "q2")])
    return deps, GraphMemory.from_sizes(deps, {"p1": 100, "q1": 1, "p2": 100, "q2": 1})


def test_one_stream_frees_a_branch_before_the_next():
    _, mem = _branches()
    order = ["p1", "q1", "p2", "q2"]
    s = _schedule(dict.fromkeys(order, 0), order,
                  {"p1": (0, 1), "q1": (1, 2), "p2": (2, 3), "q2": (3, 4)})
    profile = predict_memory(mem, s)
    # p1 dies with q1's end, before p2 is allocated: 100 + q1 + q2 at most
    assert profile.peak_bytes == 102
    assert profile.lives["p1"].freed_after == "q1" and profile.lives["p1"].end == 2


def test_two_streams_keep_both_branches_alive():
    _, mem = _branches()
    s = _schedule({"p1": 0, "q1": 0, "p2": 1, "q2": 1}, ["p1", "p2", "q1", "q2"],
                  {"p1": (0, 1), "p2": (0, 1), "q1": (1, 2), "q2": (1, 2)})
    profile = predict_memory(mem, s, [Sync("q2", JOIN)])
    assert profile.peak_bytes == 202 and profile.peak_us == 1
    assert set(profile.at_peak) == {"p1", "p2", "q1", "q2"}
    # per-stream pools: each stream keeps the most its own allocations needed
    assert profile.reserved_bytes == 101 + 101


def test_a_value_read_on_another_stream_lives_until_its_stream_waits():
    # a (100 B, stream 0) is read by b on stream 1 and by c on stream 0; stream 0 waits
    # for b before d.  a cannot die with c: only the wait before d orders b's read.
    deps = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    mem = GraphMemory.from_sizes(deps, {"a": 100, "b": 10, "c": 20, "d": 1})
    s = _schedule({"a": 0, "b": 1, "c": 0, "d": 0}, ["a", "b", "c", "d"],
                  {"a": (0, 1), "b": (1, 5), "c": (1, 2), "d": (5, 6)})
    syncs = [Sync("a", "b"), Sync("b", "d")]
    profile = predict_memory(mem, s, syncs)
    assert profile.lives["a"].freed_before == "d" and profile.lives["a"].end == 5
    assert profile.lives["c"].freed_after == "d"
    # b is made on stream 1 and read on stream 0; stream 1 never waits again: kept
    assert profile.lives["b"].end == float("inf")
    live_at_3 = [b for t, b in profile.curve if t <= 3][-1]
    assert live_at_3 == 100 + 10 + 20  # a still held between c's end and d's wait
    assert profile.peak_bytes == 130


def test_release_points_follow_the_waits_of_the_allocating_stream():
    steps = plan_steps(
        Schedule("x", {"a": 0, "b": 1, "c": 0, "d": 0}, ("a", "b", "c", "d"), {}, {}, 0, 0),
        [Sync("a", "b"), Sync("b", "d")], {"b": ("a",), "c": ("a",), "d": ("b", "c")})
    kinds = [(s.kind, s.name) for s in steps]
    assert kinds == [("op", "a"), ("record", "a"), ("wait", "b"), ("op", "b"), ("record", "b"),
                     ("op", "c"), ("wait", "d"), ("op", "d")]
    points = release_points(steps, (), {"d"}, {n: n for n in "abcd"})
    assert points == {"a": 6, "b": None, "c": 7, "d": None}
    # aliasing unknown: every value read on another stream is kept to the end
    assert release_points(steps, (), {"d"}, None)["a"] is None


def test_a_join_orders_the_last_reads():
    steps = [LaunchStep("op", "a", 0), LaunchStep("op", "b", 1, reads=("a",)),
             LaunchStep("record", "t", 1), LaunchStep("wait", JOIN, 0, tokens=("t",))]
    assert release_points(steps, (), {"b"}, {"a": "a", "b": "b"})["a"] == 3


def _fake_graph():
    """x (4x4 f32, 64 B) -> a = relu(x) -> v = a.t() (a view) -> s = v.sum(); returns s."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.relu.default, (x,))
    v = g.call_function(aten.t.default, (a,))
    s = g.call_function(aten.sum.default, (v,))
    g.output((s,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(torch.randn(4, 4)))
    return gm


def test_views_share_their_base_storage():
    gm = _fake_graph()
    mem = GraphMemory.from_graph(gm)
    assert mem.storages_of["t_default"] == mem.storages_of["relu_default"]
    assert mem.input_bytes == 64 and mem.group_of is not None
    order = ["relu_default", "t_default", "sum_default"]
    s = _schedule(dict.fromkeys(order, 0), order,
                  {n: (i, i + 1) for i, n in enumerate(order)})
    profile = predict_memory(mem, s)
    # input + relu's storage (its view keeps it until sum ends) + sum's 4 bytes
    assert profile.peak_bytes == 64 + 64 + 4
    assert profile.lives["relu_default"].freed_after == "sum_default"


def test_values_without_fake_tensors_are_counted_as_unknown():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    mem = GraphMemory.from_graph(gm)
    assert mem.group_of is None and len(mem.unsized) == 3


@pytest.mark.parametrize("name", sorted(ZOO))
def test_single_stream_peak_matches_torch_memory_estimator(name, monkeypatch):
    estimator = pytest.importorskip("torch._inductor.fx_passes.memory_estimator",
                                    reason="this torch has no memory estimator to compare with")

    monkeypatch.setattr(estimator, "device_filter", lambda device: True)
    gm = largest_graph(*ZOO[name]())
    deps = build_op_graph(gm)
    nx.set_node_attributes(deps, 1.0, "duration")
    single = get_solver("single")(SchedulingProblem(deps, 1))
    ours = predict_memory(GraphMemory.from_graph(gm), single).peak_bytes
    theirs = max(estimator.build_memory_profile(
        gm.graph, lambda n: n.op not in ("placeholder", "get_attr")))
    assert ours == theirs


def test_launch_order_timeline_counts_at_launch():
    _, mem = _branches()
    s = _schedule({"p1": 0, "q1": 0, "p2": 1, "q2": 1}, ["p1", "q1", "p2", "q2"],
                  {"p1": (0, 1), "p2": (0, 1), "q1": (1, 2), "q2": (1, 2)})
    # launched one after the other, p1 is gone (after q1) before p2 is allocated
    assert predict_memory(mem, s, [Sync("q2", JOIN)], launch_timeline(s)).peak_bytes == 102


def test_runtime_drops_at_the_same_steps_the_prediction_assumes():
    b = DialectBuilder()
    x = b.input("x")
    a = b.call(aten.neg.default, x)
    fork = b.record()
    with b.stream(1):
        b.wait(fork)
        side = b.call(aten.relu.default, a)
        token = b.record()
    c = b.call(aten.sin.default, x)
    b.wait(token)
    gm = b.finish(b.call(aten.add.Tensor, side, c))
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(torch.randn(4)))
    program = parse_program(gm)
    released = {s.node.name: [v.name for v in s.release] for s in program.steps}
    assert released["wait_default_1"] == ["neg_default"]  # main waited for the side read
    assert "relu_default" not in sum(released.values(), [])  # side stream never waits


def test_compare_reports_each_plans_peak_and_draws_its_curve():
    from autostream.report.compare import plan_solvers
    from autostream.report.gantt import gantt_figure
    from autostream.report.table import markdown_table

    deps, mem = _branches()
    nx.set_node_attributes(deps, 1.0, "duration")
    nx.set_node_attributes(deps, {"p1": 0, "q1": 1, "p2": 2, "q2": 3}, "order")
    problem = SchedulingProblem(deps, 2)
    results = plan_solvers(problem, ["single", "heft"], memory=mem)
    peaks = {r.solver: r.memory.peak_bytes for r in results}
    assert peaks == {"single": 102, "heft": 202}
    table = markdown_table(results)
    assert "peak memory |" in table.splitlines()[0] and "202 B (+98%)" in table
    heft = results[1]
    fig = gantt_figure(problem, heft.schedule, heft.syncs, memory=heft.memory)
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "live MiB"
    assert "peak memory" not in markdown_table(plan_solvers(problem, ["heft"]))
