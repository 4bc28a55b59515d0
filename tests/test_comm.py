"""Communication in one process: registry, dependences, link lanes, costs, verifier, agreement."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import torch
import torch.fx

from autostream.comm import CommRegistry, CommSpec, comm_op, register
from autostream.comm.groups import GroupInfo
from autostream.comm.inflight import most_in_flight, one_at_a_time
from autostream.comm.ops import launch_of_wait
from autostream.cost import CostModel, CostTable, TableCostModel
from autostream.cost.collectives import LinkFit
from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.verify import verify_rewrite
from autostream.fx import graph as graph_module
from autostream.fx.graph import build_op_graph, communicates, op_effects
from autostream.memory.predict import GraphMemory
from autostream.planning.agree import DictStore, check_through_store, graph_key, outcome_digest
from autostream.planning.evaluate import FitInputs, evaluate
from autostream.planning.plan import PlanOptions, plan_graph
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.solvers import solve
from autostream.scheduling.sync import compute_syncs
from autostream.scheduling.transfers import plan_transfers, transfer_task

C10D = torch.ops._c10d_functional
MM, TANH, ADD = torch.ops.aten.mm.default, torch.ops.aten.tanh.default, torch.ops.aten.add.Tensor


def _meta(node: torch.fx.Node, *shape: int) -> torch.fx.Node:
    node.meta["val"] = torch.empty(*shape)
    return node


def _call(g: torch.fx.Graph, name: str, target, args, *shape: int) -> torch.fx.Node:
    return _meta(g.create_node("call_function", target, args, name=name), *shape)


def two_allreduces(depth: int = 3, elements: int = 1 << 16, group: str | None = "0",
                   eager_waits: bool = False) -> torch.fx.GraphModule:
    """An all-reduce of ``big``, a chain of ``depth`` matmuls independent of it, and a
    second all-reduce of the chain's result; ``eager_waits`` puts each wait right after
    its launch, as Dynamo traces them."""
    g = torch.fx.Graph()
    a, b, w = (_meta(g.placeholder(n), 64, 64) for n in "abw")
    big = _meta(g.placeholder("big"), elements)
    y = _call(g, "all_reduce", C10D.all_reduce.default, (big, "sum", group), elements)
    if eager_waits:
        wy = _call(g, "wait_tensor", C10D.wait_tensor.default, (y,), elements)
    h = a
    for i in range(depth):
        h = _call(g, f"tanh{i}", TANH, (_call(g, f"mm{i}", MM, (h, w), 64, 64),), 64, 64)
    x = _call(g, "all_reduce_1", C10D.all_reduce.default, (h, "sum", group), 64, 64)
    if not eager_waits:
        wy = _call(g, "wait_tensor", C10D.wait_tensor.default, (y,), elements)
    wx = _call(g, "wait_tensor_1", C10D.wait_tensor.default, (x,), 64, 64)
    out = _call(g, "add", ADD, (wx, b), 64, 64)
    g.output((out, wy))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def gloo_table(alpha_us: float = 100.0, bandwidth: float = 1e9) -> CostModel:
    table = CostTable.load(TableCostModel.load("cpu").table.source)
    return TableCostModel(table.with_links([LinkFit("all_reduce", "gloo", 2, alpha_us, bandwidth)]))


# -- registry ----------------------------------------------------------------------------


def test_registry_knows_functional_legacy_and_vendor_ops():
    g = torch.fx.Graph()
    x = _meta(g.placeholder("x"), 4)
    ar = g.call_function(C10D.all_reduce.default, (x, "sum", "tp"))
    wait = g.call_function(C10D.wait_tensor.default, (ar,))
    packet = g.call_function(C10D.all_to_all_single, (x, None, None, "ep"))  # Dynamo's form
    assert (comm_op(ar).role, comm_op(ar).group) == ("collective", "tp")
    assert comm_op(wait).role == "wait"
    assert (comm_op(packet).collective, comm_op(packet).group) == ("all_to_all", "ep")
    from autostream.comm.registry import DEFAULT_REGISTRY

    assert DEFAULT_REGISTRY.spec("c10d::allreduce_").role == "blocking"
    assert DEFAULT_REGISTRY.spec("npu::npu_moe_distribute_dispatch").collective == "all_to_all"


@pytest.fixture(scope="module")
def lookalike():
    """A vendor-style op autostream's registry does not know: ``astest::my_alltoall_dispatch``."""
    lib = torch.library.Library("astest", "FRAGMENT")
    lib.define("my_alltoall_dispatch(Tensor x) -> Tensor")
    lib.impl("my_alltoall_dispatch", lambda x: x.clone(), "CompositeExplicitAutograd")
    yield torch.ops.astest.my_alltoall_dispatch.default
    del lib


def test_unregistered_lookalike_is_blocking_and_registration_names_it(lookalike):
    registry = CommRegistry()
    g = torch.fx.Graph()
    node = g.call_function(lookalike, (g.placeholder("x"),))
    found = comm_op(node, registry)
    assert (found.role, found.registered) == ("blocking", False)
    register("astest::my_alltoall_dispatch", "blocking", "all_to_all", registry=registry)
    assert comm_op(node, registry).registered and comm_op(node, registry).collective == "all_to_all"
    with pytest.raises(ValueError, match="namespace::name"):
        CommSpec("no_namespace", "blocking")


def test_an_unregistered_name_is_judged_once_per_registry(lookalike, monkeypatch):
    import autostream.comm.registry as registry_module

    judged = []
    real = registry_module.looks_like_communication
    monkeypatch.setattr(registry_module, "looks_like_communication",
                        lambda name: judged.append(name) or real(name))
    registry = CommRegistry()
    g = torch.fx.Graph()
    x = g.placeholder("x")
    nodes = [g.call_function(lookalike, (x,)) for _ in range(3)]
    nodes += [g.call_function(torch.ops.aten.relu.default, (x,)) for _ in range(3)]
    assert [comm_op(n, registry) is not None for n in nodes] == [True] * 3 + [False] * 3
    assert judged == ["astest::my_alltoall_dispatch", "aten::relu"]
    register("astest::my_alltoall_dispatch", "blocking", "all_to_all", registry=registry)
    assert comm_op(nodes[0], registry).collective == "all_to_all"


# -- dependences ---------------------------------------------------------------------------


def test_wait_writes_nothing_and_collectives_are_chained():
    gm = two_allreduces()
    g = build_op_graph(gm)
    waits = [n for n in gm.graph.nodes if n.name.startswith("wait_tensor")]
    assert all(op_effects(w) == op_effects(w).__class__((), False) for w in waits)
    assert g.edges["all_reduce", "all_reduce_1"]["kind"] == "comm"
    assert not g.has_edge("wait_tensor", "wait_tensor_1")  # no spurious effect edge


def test_communicates_says_what_op_effects_says(lookalike):
    gm = two_allreduces()
    node = gm.graph.call_function(lookalike, (next(iter(gm.graph.nodes)),))
    said = {n.name: communicates(n) for n in gm.graph.nodes}
    assert said == {n.name: op_effects(n).communicates for n in gm.graph.nodes}
    assert {n for n, c in said.items() if c} == {"all_reduce", "all_reduce_1", node.name}


def test_unregistered_lookalike_keeps_program_order_and_is_reported(lookalike):
    g = torch.fx.Graph()
    x = _meta(g.placeholder("x"), 64)
    ar = _call(g, "all_reduce", C10D.all_reduce.default, (x, "sum", "0"), 64)
    y = _call(g, "dispatch", lookalike, (_meta(g.placeholder("y"), 64),), 64)
    w = _call(g, "wait_tensor", C10D.wait_tensor.default, (ar,), 64)
    g.output((w, y))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert build_op_graph(gm).edges["all_reduce", "dispatch"]["kind"] == "comm"
    plan = plan_graph(gm, PlanOptions(max_streams=2, solver="heft"), gloo_table())
    assert any("astest::my_alltoall_dispatch looks like communication" in n
               and "autostream.comm.register" in n for n in plan.comm_notes)


# -- link lanes ----------------------------------------------------------------------------


def test_transfer_runs_on_its_link_beside_compute():
    plan = plan_graph(two_allreduces(), PlanOptions(max_streams=2, solver="heft"), gloo_table())
    problem = plan.problem
    big, small = transfer_task("all_reduce"), transfer_task("all_reduce_1")
    assert problem.lane(big) == "link:0" and problem.links == ("link:0",)
    assert [r.kind for r in problem.resources] == ["device", "streams", "link"]
    s = plan.schedule
    assert s.stream_of[big] < 0 and s.stream_of["all_reduce"] >= 0
    # a transfer starts when its launch ends and the link is free; its wait ends after it
    assert s.start[big] >= s.end["all_reduce"] - 1e-9
    assert s.end["wait_tensor"] >= s.end[big] - 1e-9
    assert s.start[small] >= s.end[big] - 1e-9  # one link: in launch order
    # the matmuls run while the big transfer is on the link
    mms = [n for n in s.order if n.startswith("mm")]
    assert all(s.start[big] <= s.start[m] < s.end[big] for m in mms)


def test_single_stream_plan_waits_for_every_transfer():
    cm = gloo_table(alpha_us=5000.0)  # a transfer far longer than the compute
    plan = plan_graph(two_allreduces(), PlanOptions(max_streams=1), cm)
    assert plan.single_stream_us >= 2 * 5000.0  # two transfers on one link, in order


def test_lower_bound_counts_the_link_but_not_as_stream_work():
    g = nx.DiGraph([("launch", "t"), ("t", "wait")])
    nx.set_node_attributes(g, {"launch": 1.0, "t": 100.0, "wait": 1.0, "c": 50.0}, "duration")
    g.add_node("c", duration=50.0)
    g.nodes["t"]["lane"] = "link:0"
    p = SchedulingProblem(g, streams=1)
    assert p.total_work() == 52.0 and p.lower_bound() == 102.0
    s = solve(p, "heft")
    assert s.makespan == pytest.approx(102.0)  # c runs beside the transfer on one stream
    assert simulate_plan(p, s).makespan == pytest.approx(s.makespan)
    with pytest.raises(ValueError, match="'single' solver"):
        p.single_stream_time()  # the sum of the stream work (52) would be wrong
    assert solve(p, "single").makespan == pytest.approx(152.0)  # program order: c after the wait


@pytest.mark.parametrize("solver", ["single", "round_robin", "tf_greedy", "opara", "nimble",
                                    "critical_path", "heft", "cpsat"])
def test_every_solver_puts_transfers_on_their_link(solver):
    plan = plan_graph(two_allreduces(), PlanOptions(max_streams=2, solver=solver,
                                                    time_limit=0.5), gloo_table())
    pinned = plan.problem.pinned
    assert all(plan.schedule.stream_of[t] == s for t, s in pinned.items())
    assert plan.schedule.makespan >= plan.problem.lane_work()


def test_a_wait_planned_on_another_stream_moves_to_its_launchs_stream():
    # a wait on another thread than its launch does not wait in torch before 2026 (the
    # work registry was per thread): every plan is checked with each wait on its launch's
    # stream, re-timed, before it can be applied
    gm = two_allreduces()
    plan = plan_graph(gm, PlanOptions(max_streams=2, solver="heft"), gloo_table())
    pairs = [(n.name, launch_of_wait(n).name) for n in gm.graph.nodes if launch_of_wait(n)]
    assert len(pairs) == 2
    waits = {wait for wait, _ in pairs}
    stream_of = {n: (1 if n in waits else s) for n, s in plan.schedule.stream_of.items()}
    scattered = dataclasses.replace(plan.schedule, stream_of=stream_of)
    fit = FitInputs(plan.op_graph, plan.problem, GraphMemory.from_graph(gm), "heft")
    checked = evaluate(fit, scattered, plan.problem).schedule
    assert all(checked.stream_of[w] == checked.stream_of[launch] == 0 for w, launch in pairs)
    assert checked.makespan >= plan.problem.lane_work()  # re-timed


def test_cpsat_is_deterministic_on_graphs_that_communicate(monkeypatch):
    import autostream.planning.plan as planning

    asked: dict = {}
    real = planning.get_solver

    def spy(name):
        solver = real(name)
        return lambda problem, **options: asked.update(options) or solver(problem, **options)

    monkeypatch.setattr(planning, "get_solver", spy)
    plan_graph(two_allreduces(), PlanOptions(max_streams=2, time_limit=0.3), gloo_table())
    assert asked["wall_clock"] is False
    problem = plan_graph(two_allreduces(), PlanOptions(max_streams=2, solver="heft"),
                         gloo_table()).problem
    first = solve(problem, "cpsat", time_limit=0.3, wall_clock=False, cache=False)
    assert first.stats.deterministic is True
    again = solve(problem, "cpsat", time_limit=0.3, wall_clock=False, cache=False)
    assert dict(again.stream_of) == dict(first.stream_of) and again.order == first.order


# -- costs ---------------------------------------------------------------------------------


def test_transfer_costs_say_their_source():
    cm = gloo_table(alpha_us=100.0, bandwidth=1e9)
    assert cm.transfer("all_reduce", 10**6, "gloo", 2).duration_us == pytest.approx(1100.0)
    other = cm.transfer("all_reduce", 10**6, "gloo", 4)
    assert other.source == "scaled" and "world size 2, the group has 4" in other.note
    nccl = TableCostModel.load("h200").transfer("all_reduce", 10**6, "nccl", 8)
    assert nccl.source == "exact"
    bare = TableCostModel(CostTable.from_profile()).transfer("all_reduce", 10**6, "gloo", 2)
    assert bare.source == "roofline" and "calibrate with" in bare.note


def test_plan_reports_what_it_could_not_identify(caplog):
    gm = two_allreduces(group=None)
    with caplog.at_level(logging.WARNING, logger="autostream"):
        plan = plan_graph(gm, PlanOptions(max_streams=2, solver="heft"),
                          TableCostModel(CostTable.from_profile()))
    text = " ".join(plan.comm_notes)
    assert "names no process group" in text and "link:?" in text
    assert "no link figures" in text
    assert plan.problem.links == ("link:?",)
    assert "names no process group" in caplog.text


def test_world_size_mismatch_is_a_note():
    g = torch.fx.Graph()
    x = _meta(g.placeholder("x"), 1024)
    ag = _call(g, "all_gather_into_tensor", C10D.all_gather_into_tensor.default, (x, 8, "dp"),
               8192)
    g.output((_call(g, "wait_tensor", C10D.wait_tensor.default, (ag,), 8192),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    op_graph = build_op_graph(gm)
    table = CostTable.from_profile().with_links([LinkFit("all_gather", "gloo", 2, 10.0, 1e9)])
    transfers, notes = plan_transfers(op_graph, TableCostModel(table))
    assert transfers["all_gather_into_tensor"].cost.source == "scaled"
    assert any("world size 2, the group has 8" in n for n in notes)


# -- verifier ------------------------------------------------------------------------------


def _rewritten(stream_of: dict[str, int], order: tuple[str, ...], drop_comm_edge: bool = False):
    gm = two_allreduces(depth=1)
    deps = build_op_graph(gm)
    sched_deps = deps.copy()
    if drop_comm_edge:  # a planner that did not know collectives must be ordered
        sched_deps.remove_edge("all_reduce", "all_reduce_1")
    s = Schedule("hand", stream_of, order, {}, {}, 0.0, 0.0)
    rewrite_graph(gm, s, compute_syncs(sched_deps, s))
    return gm, deps


def test_verifier_rejects_collectives_that_streams_could_race():
    order = ("mm0", "tanh0", "all_reduce", "all_reduce_1", "wait_tensor", "wait_tensor_1", "add")
    streams = {"mm0": 0, "tanh0": 0, "all_reduce": 0, "all_reduce_1": 1, "wait_tensor": 0,
               "wait_tensor_1": 1, "add": 0}
    gm, deps = _rewritten(streams, order, drop_comm_edge=True)
    result = verify_rewrite(gm, deps)
    assert any("collectives all_reduce (stream 0) and all_reduce_1 (stream 1) are not ordered"
               in p for p in result.problems)
    gm, deps = _rewritten(streams, order)  # with the comm edge, a sync orders them
    assert verify_rewrite(gm, deps).ok


def test_verifier_rejects_collectives_out_of_program_order():
    order = ("mm0", "tanh0", "all_reduce_1", "all_reduce", "wait_tensor", "wait_tensor_1", "add")
    gm, deps = _rewritten(dict.fromkeys(order, 0), order, drop_comm_edge=True)
    assert any("not in their program order" in p for p in verify_rewrite(gm, deps).problems)


def test_torchair_rewrite_keeps_collectives_in_order_inside_scopes():
    """Collectives on two streams, rewritten with TorchAir's (stand-in) ops: the second
    sits in stream_1's scope behind a wait on a record made after the first."""
    from autostream.dialects.torchair import air_kind, scope_label

    order = ("mm0", "tanh0", "all_reduce", "all_reduce_1", "wait_tensor", "wait_tensor_1", "add")
    streams = {"mm0": 1, "tanh0": 1, "all_reduce": 0, "all_reduce_1": 1, "wait_tensor": 0,
               "wait_tensor_1": 1, "add": 0}
    gm, deps = _rewritten(streams, order)
    assert verify_rewrite(gm, deps).ok
    nodes = list(gm.graph.nodes)
    issued = [n.name for n in nodes if n.name in ("all_reduce", "all_reduce_1")]
    assert issued == ["all_reduce", "all_reduce_1"]
    second = next(i for i, n in enumerate(nodes) if n.name == "all_reduce_1")
    enter = max(i for i, n in enumerate(nodes[:second]) if air_kind(n) == "scope_enter")
    assert scope_label(nodes[enter]) == "stream_1"
    waits = [n for n in nodes[enter:second] if air_kind(n) == "wait"]
    first = next(i for i, n in enumerate(nodes) if n.name == "all_reduce")
    assert any(air_kind(nodes[first + 1]) == "record" and nodes[first + 1] in w.args[0]
               for w in waits)


# -- agreement -----------------------------------------------------------------------------


def test_digest_changes_with_the_plan_and_disagreement_is_explained():
    s1 = Schedule("x", {"a": 0, "b": 1}, ("a", "b"), {}, {}, 0.0, 0.0)
    s2 = Schedule("x", {"a": 0, "b": 0}, ("a", "b"), {}, {}, 0.0, 0.0)
    d1, d2 = outcome_digest(["a", "b"], s1), outcome_digest(["a", "b"], s2)
    assert d1 != d2 and d1 == outcome_digest(["a", "b"], s1)
    assert outcome_digest(["a", "b"], None) not in (d1, d2)
    shared: dict = {}
    ranks = [DictStore(shared) for _ in range(3)]
    assert check_through_store("g", d1, 0, 3, store=ranks[0]) is None  # alone so far
    assert check_through_store("g", d1, 1, 3, store=ranks[1]) is None  # agrees with rank 0
    why = check_through_store("g", d2, 2, 3, store=ranks[2])
    assert why.startswith(f"ranks planned this graph differently: ranks [0, 1] digest "
                          f"{d1[:10]}, rank 2 digest {d2[:10]}")
    assert "Fix: give every rank the same cost_table" in why
    # another graph (its own key) is never compared with this one
    assert check_through_store("h", d2, 0, 3, store=ranks[0]) is None
    assert check_through_store("g", d1) is None  # one process: nothing to compare


def test_store_check_never_blocks_and_never_breaks_compiling():
    class Unreachable:
        def set(self, key, value):
            raise RuntimeError("connection reset by peer")

    class Waiting(DictStore):
        def get(self, key):  # a get on a missing key would block until the store's timeout
            assert key in self.data, f"get of {key} that no rank set: it would block"
            return super().get(key)

    assert check_through_store("g", "d", 1, 4, store=Unreachable()) is None
    assert check_through_store("g", "d", 1, 4, store=Waiting()) is None


def test_graph_key_sees_shapes_and_ops_not_the_object():
    def traced(rows, fn=torch.relu):
        gm = torch.fx.symbolic_trace(lambda x: fn(x) + 1)
        for node in gm.graph.nodes:
            node.meta["val"] = torch.empty(rows, 4)
        return gm.graph

    assert graph_key(traced(2)) == graph_key(traced(2))
    assert graph_key(traced(2)) != graph_key(traced(3))  # rank-dependent shapes
    assert graph_key(traced(2)) != graph_key(traced(2, torch.tanh))
    assert graph_key(traced(2), "cpsat|2") != graph_key(traced(2), "heft|2")


# -- calibration ---------------------------------------------------------------------------


def test_fit_recovers_alpha_and_bandwidth_from_noisy_runs():
    from autostream.cost.calibrate_collectives import Sample, fit_link

    # 3 of 8 runs per size hit by load (+5 ms): the lower quartile ignores them
    samples = [Sample("all_gather", b, (200.0 + b / 500.0,) * 5 + (5200.0,) * 3)
               for b in (4096, 65536, 1 << 20)]
    fit = fit_link(samples, "all_gather", "gloo", 2, share=0.25)
    assert fit.alpha_us == pytest.approx(200.0, rel=1e-6)
    assert fit.bandwidth == pytest.approx(0.5 * 500.0 * 1e6, rel=1e-6)  # traffic 1/2 at 2 ranks
    assert (fit.share, fit.origin, fit.samples, fit.sizes) == (0.25, "measured", 24, (4096, 1 << 20))


@pytest.mark.slow
def test_calibrate_collectives_command_writes_link_fits(tmp_path, capsys):
    from autostream.cli import main

    out = tmp_path / "cpu.json"
    code = main(["calibrate", "--collectives", "--backend", "gloo", "--nproc", "2", "--out",
                 str(out), "--sizes", "4096", "65536", "--warmup", "1", "--repeat", "3",
                 "--no-progress", "--link-share", "0.1"])
    assert code == 0
    table = CostTable.load(out)
    fits = {f.collective: f for f in table.links}
    assert set(fits) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
    assert all(f.backend == "gloo" and f.world_size == 2 and f.bandwidth > 0 and f.share == 0.1
               and f.provenance["nproc"] == 2 for f in fits.values())
    assert TableCostModel(table).transfer("all_reduce", 1 << 20, "gloo", 2).source == "exact"
    assert "link fits on gloo x2" in capsys.readouterr().out


def test_calibrate_collectives_rejects_bad_input(tmp_path):
    from autostream.cost.calibrate_collectives import calibrate_collectives

    with pytest.raises(ValueError, match="nproc must be >= 2"):
        calibrate_collectives("gloo", nproc=1)
    with pytest.raises(ValueError, match="multiples of 4 x nproc"):
        calibrate_collectives("gloo", nproc=2, sizes=(1001,))
    from autostream.cli import main

    assert main(["calibrate", "--collectives", "--backend", "nccl", "--out",
                 str(tmp_path / "none.json")]) == 2  # no cuda table to write into


@pytest.mark.parametrize("flags, named", [
    (["--runs", "3"], "--runs"), (["--isolated", "--threads", "1"], "--threads, --isolated"),
    (["--device", "cuda"], "--device cuda does not match --backend gloo"),
])
def test_calibrate_collectives_names_op_flags_it_cannot_honour(tmp_path, capsys, flags, named):
    from autostream.cli import main

    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--collectives", "--out", str(out), *flags]) == 2
    assert named in capsys.readouterr().err and not out.exists()


def test_table_link_fields_are_validated(tmp_path):
    import json

    from autostream.cost import TableError

    data = gloo_table().table.to_json()
    data["links"][0]["bandwidth"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TableError, match=r"links\[0\].bandwidth"):
        CostTable.load(path)
    data["links"][0]["bandwidth"] = 1e9
    data["links"].append(dict(data["links"][0]))
    path.write_text(json.dumps(data))
    with pytest.raises(TableError, match="duplicates links"):
        CostTable.load(path)


def test_reports_draw_links_as_lanes_of_their_own(tmp_path):
    from autostream.report.dot import graph_dot
    from autostream.report.gantt import gantt_png
    from autostream.report.trace import chrome_trace

    plan = plan_graph(two_allreduces(), PlanOptions(max_streams=2, solver="heft"), gloo_table())
    trace = chrome_trace(plan.problem, plan.schedule, plan.syncs)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert "link_1" in names
    assert "subgraph cluster_link_1 {" in graph_dot(plan.problem, plan.schedule, plan.syncs)
    gantt_png(tmp_path / "plan.png", plan.problem, plan.schedule, plan.syncs)
    assert (tmp_path / "plan.png").stat().st_size > 0


def test_communication_never_joins_a_segment():
    from autostream.runtime.program import parse_program
    from autostream.runtime.segments import Segment, split_segments

    order = ("all_reduce", "mm0", "tanh0", "all_reduce_1", "wait_tensor", "wait_tensor_1", "add")
    gm, _ = _rewritten(dict.fromkeys(order, 0), order)
    items = split_segments(parse_program(gm), 0)
    in_segments = [n for item in items if isinstance(item, Segment) for n in item.names]
    assert in_segments == ["mm0", "tanh0"]


@pytest.mark.parametrize("name", ["ep_moe", "fsdp", "probe", "two_allreduces"])
def test_parallel_zoo_inputs_differ_across_ranks_steps_and_arguments(name):
    from autostream.models.zoo_parallel import PARALLEL_ZOO

    inputs = [t for rank in (0, 1) for step in (0, 1) for t in PARALLEL_ZOO[name](rank, 2)[1](step)]
    assert not any(torch.equal(a, b) for i, a in enumerate(inputs) for b in inputs[i + 1:]
                   if a.shape == b.shape)  # tp_mlp's input is the same on every rank by design


def _fsdp_graph(prefetch: bool = False) -> torch.fx.GraphModule:
    """Three layers, each gathering its sharded weight on group "0", then a reduce-scatter.
    Dynamo's order (each wait right after its launch), or with ``prefetch`` the next
    gather launched before this layer's wait, as hand-written overlap does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, *shards):
        gathers = [C10D.all_gather_into_tensor(shards[0], 2, "0")]
        for i in range(len(shards)):
            if prefetch and i + 1 < len(shards):
                gathers.append(C10D.all_gather_into_tensor(shards[i + 1], 2, "0"))
            x = torch.tanh(x @ C10D.wait_tensor(gathers[i]))
            if not prefetch and i + 1 < len(shards):
                gathers.append(C10D.all_gather_into_tensor(shards[i + 1], 2, "0"))
        return C10D.wait_tensor(C10D.reduce_scatter_tensor(x, "sum", 2, "0"))

    return make_fx(fn, tracing_mode="fake")(torch.ones(8, 64), *(torch.ones(32, 64),) * 3)


def _comm_edges(g: nx.DiGraph) -> set[tuple[str, str]]:
    return {(u, v) for u, v, kind in g.edges(data="kind") if kind == "comm"}


def test_on_a_gloo_group_each_wait_precedes_the_next_launch():
    gm = _fsdp_graph()
    chain = _comm_edges(build_op_graph(gm, lambda group: False))
    serial = _comm_edges(build_op_graph(gm, lambda group: group == "0"))
    assert serial - chain == {("wait_tensor", "all_gather_into_tensor_1"),
                              ("wait_tensor_1", "all_gather_into_tensor_2"),
                              ("wait_tensor_2", "reduce_scatter_tensor")}
    assert _comm_edges(build_op_graph(gm, lambda group: group == "tp")) == chain
    assert one_at_a_time("0", GroupInfo("0", 2, "gloo"))
    assert not one_at_a_time("0", GroupInfo("0", 2, "nccl"))
    assert not one_at_a_time("0", GroupInfo("0", None, None))  # no process group here


def test_the_programs_own_overlap_of_collectives_is_kept():
    """Hand-written prefetch launches the next gather before this wait: no edge reverses it."""
    gm = _fsdp_graph(prefetch=True)
    assert most_in_flight(gm.graph.nodes) == {"0": 2}
    deps = build_op_graph(gm, lambda group: True)
    assert nx.is_directed_acyclic_graph(deps)
    assert all(deps.nodes[u]["order"] < deps.nodes[v]["order"] for u, v in _comm_edges(deps))
    assert ("wait_tensor", "all_gather_into_tensor_1") not in deps.edges


def test_plans_hold_no_more_gloo_collectives_in_flight_than_the_program(monkeypatch):
    """The fsdp scenario's plan on gloo launched all three gathers before the first wait;
    a rank then died now and then inside gloo (heap corruption, docs/distributed.md)."""
    gm = _fsdp_graph()
    assert most_in_flight(gm.graph.nodes) == {"0": 1}
    monkeypatch.setattr(graph_module, "gloo_one_at_a_time", lambda group: group == "0")
    plan = plan_graph(gm, PlanOptions(max_streams=2, cost_table="h200", time_limit=1.0))
    order = [plan.op_graph.nodes[n]["fx"] for n in plan.schedule.order if n in plan.op_graph]
    assert most_in_flight(order) == {"0": 1}
    # still an overlap: a gather launched before the previous layer's compute
    names = [n.name for n in order]
    assert plan.reorders and names.index("all_gather_into_tensor_1") < names.index("mm")


def test_calibrate_collectives_explains_a_rough_fit(monkeypatch, tmp_path, capsys):
    from autostream.cli import main
    from autostream.cost import calibrate_collectives as module
    from autostream.cost.collectives import LinkFit

    fits = [LinkFit("all_reduce", "gloo", 2, 400.0, 1e9, max_error=0.68),
            LinkFit("broadcast", "gloo", 2, 300.0, 2e9, max_error=0.05)]
    monkeypatch.setattr(module, "calibrate_collectives", lambda *a, **k: fits)
    assert main(["calibrate", "--collectives", "--backend", "gloo", "--out",
                 str(tmp_path / "links.json"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "max error 68%" in out and "max error 5%" in out
    assert out.rstrip().endswith(
        "max error: the fit's largest relative error over the message sizes; all_reduce over "
        "25%: their times do not follow one alpha + bytes / bandwidth line here (ranks sharing "
        "the CPU with other work, or a protocol change between sizes): rerun with a larger "
        "--repeat on a quiet machine, or take their predictions as rough")


def _rank_id(rank: int, world_size: int) -> int:
    """A rank that, as tqdm does, holds a multiprocessing lock (a semaphore the resource
    tracker follows) and takes a moment to exit."""
    import atexit
    import multiprocessing
    import time

    _rank_id.lock = multiprocessing.RLock()
    atexit.register(time.sleep, 0.5)
    return rank


@pytest.mark.slow
def test_running_ranks_leaks_no_semaphore():
    code = ("from autostream.comm.spawn import run_ranks\n"
            "from tests.test_comm import _rank_id\n"
            "print(run_ranks(_rank_id, 2, timeout_s=600))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=900, check=False, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[0, 1]"
    assert "leaked semaphore" not in done.stderr
