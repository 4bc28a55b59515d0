"""An ACL graph's per-scope events are a cost the planner optimises (issue 27, item 3)."""

from __future__ import annotations

import dataclasses
import itertools

import networkx as nx
import pytest

from autostream.dialects.torchair import air_kind
from autostream.dialects.torchair_modes import acl_scope_overhead_us
from autostream.fx.capture import capture_graphs
from autostream.models import zoo
from autostream.planning.plan import PlanOptions, load_cost_model, plan_graph
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.scope_events import count_scopes, grouped_order, scope_latency_us
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.base import schedule_from_assignment
from autostream.scheduling.sync import compute_syncs

CUDA_LATENCY = 5.0
ACL_LATENCY = scope_latency_us(CUDA_LATENCY, acl_scope_overhead_us(CUDA_LATENCY))


def ladder(n: int = 4) -> nx.DiGraph:
    """A chain ``m1 -> m2 -> ...`` where ``s_i`` reads ``m_i`` and feeds ``m_{i+2}``: each
    ``s_i`` on another stream overlaps ``m_{i+1}`` but needs a round trip (a new scope)."""
    g = nx.DiGraph()
    for i in range(1, n + 1):
        g.add_node(f"m{i}", duration=10.0)
        g.add_node(f"s{i}", duration=8.0)
        if i > 1:
            g.add_edge(f"m{i - 1}", f"m{i}")
        g.add_edge(f"m{i}", f"s{i}")
        g.add_edge(f"s{i}", f"m{i + 2}" if i + 2 <= n else "z")
    g.add_edge(f"m{n}", "z")
    g.nodes["z"]["duration"] = 1.0
    for k, v in enumerate(nx.lexicographical_topological_sort(g)):
        g.nodes[v]["order"] = k
    return g


def scopes(problem: SchedulingProblem, schedule: Schedule) -> int:
    syncs = compute_syncs(problem.graph, schedule)
    return count_scopes(dataclasses.replace(
        schedule, order=grouped_order(schedule, syncs, problem.graph)))


def brute_force(problem: SchedulingProblem) -> float:
    """The best makespan over every assignment of the ops to two streams."""
    nodes = list(problem.topo_order)
    return min(schedule_from_assignment(problem, dict(zip(nodes, (0, *bits))), "bf").makespan
               for bits in itertools.product((0, 1), repeat=len(nodes) - 1))


def test_acl_cost_changes_the_optimum_not_only_its_evaluation():
    """Under CUDA the ladder's best plan takes two round trips (scopes); with each
    dependence charged an ACL scope's events the optimum keeps one, and each plan is
    worse than the other under the other's costs: the charge is in the objective."""
    g = ladder()
    cuda = SchedulingProblem(g, streams=2, sync_latency_us=CUDA_LATENCY)
    acl = SchedulingProblem(g, streams=2, sync_latency_us=ACL_LATENCY)
    cuda_plan = solve(cuda, "cpsat", cache=False)
    acl_plan = solve(acl, "cpsat", cache=False)
    assert scopes(acl, acl_plan) < scopes(cuda, cuda_plan)
    assert simulate_plan(acl, cuda_plan).makespan > acl_plan.makespan
    assert simulate_plan(cuda, acl_plan).makespan > cuda_plan.makespan
    assert acl_plan.makespan == brute_force(acl)  # optimal under the ACL charge
    assert acl_plan.makespan < solve(acl, "single").makespan  # and still worth two streams


def test_acl_lower_bound_stays_valid():
    """The bound of the charged problem is below every plan of it (brute force)."""
    for n in (3, 4):
        acl = SchedulingProblem(ladder(n), streams=2, sync_latency_us=ACL_LATENCY)
        plan = solve(acl, "cpsat", cache=False)
        assert plan.lower_bound <= brute_force(acl) <= plan.makespan


def test_grouped_order_keeps_the_timeline_and_merges_scopes():
    """The CUDA plan of a MoE block at four streams, launched grouped: same stream
    sequences and syncs, the same simulated makespan, fewer scopes."""
    model, inputs = zoo.moe_model()
    [gm] = capture_graphs(model, inputs)
    plan = plan_graph(gm, PlanOptions(max_streams=4), load_cost_model("ascend910b"))
    assert plan.schedule.streams_used > 1
    order = grouped_order(plan.schedule, plan.syncs, plan.op_graph)
    grouped = dataclasses.replace(plan.schedule, order=order)
    assert sorted(order) == sorted(plan.schedule.order)
    assert grouped.stream_sequences() == plan.schedule.stream_sequences()
    assert (simulate_plan(plan.problem, grouped, plan.syncs).makespan
            == simulate_plan(plan.problem, plan.schedule, plan.syncs).makespan)
    assert count_scopes(grouped) < count_scopes(plan.schedule)


def test_grouped_order_is_deterministic_and_names_a_cycle():
    zero = dict.fromkeys("abc", 0.0)
    s = Schedule("x", {"a": 0, "b": 1, "c": 0}, ("a", "b", "c"), zero, zero, 0.0, 0.0)
    g = nx.DiGraph([("a", "b"), ("b", "c")])
    assert grouped_order(s, [], g) == grouped_order(s, [], g) == ("a", "b", "c")
    with pytest.raises(ValueError, match="cycle"):
        grouped_order(s, [], nx.DiGraph([("c", "a")]))


def test_acl_plans_charge_the_events_in_the_problem_and_launch_grouped():
    """``plan_graph`` with an ACL scope cost solves a problem whose dependences pay it,
    gives the same plan twice, and its launch order opens no scope it can avoid."""
    model, inputs = zoo.moe_model()
    costs = load_cost_model("ascend910b")
    scope = acl_scope_overhead_us(costs.sync_latency_us)
    plans = []
    for _ in range(2):
        [gm] = capture_graphs(model, inputs)
        plans.append(plan_graph(gm, PlanOptions(max_streams=4), costs, scope_overhead_us=scope))
    plan = plans[0]
    assert plan.problem.sync_latency_us == costs.sync_latency_us + scope
    assert plan.schedule.streams_used > 1
    assert plan.schedule.order == plans[1].schedule.order
    assert plan.schedule.stream_of == plans[1].schedule.stream_of
    assert plan.schedule.order == grouped_order(plan.schedule, plan.syncs, plan.op_graph)
    assert plan.schedule.lower_bound <= plan.schedule.makespan


def test_acl_pass_emits_fewer_scopes_than_the_cuda_plan():
    """The rewritten graph has exactly the plan's scopes, fewer than the plan for CUDA
    events opens, and the MoE block still gets several streams under ACL (it kept one
    when the events were charged only after solving)."""
    from autostream import AutoStreamPass

    class Config:
        mode = "reduce-overhead"

    model, inputs = zoo.moe_model()
    emitted = {}
    for config in (None, Config()):
        [gm] = capture_graphs(model, inputs)
        autostream_pass = AutoStreamPass(max_streams=4, cost_table="ascend910b")
        autostream_pass(gm, inputs, config)
        report = autostream_pass.last_report
        assert report.applied, report.reason
        emitted[config is None] = sum(air_kind(n) == "scope_enter" for n in gm.graph.nodes)
    assert emitted[False] == count_scopes(report.plan.schedule)
    assert emitted[False] < emitted[True]
