"""Core budgets per side stream: the CP-SAT model against brute force, its answers checked
by an independent checker, replayed on an independent processor-sharing simulator (never
slower than without), the scopes the pass emits, and the bad inputs."""

from __future__ import annotations

import itertools
import json
import math
import random

import networkx as nx
import pytest
import torch

from autostream.scheduling.core_budgets import LEVELS, budgeted, plan_budgets, scope_keys
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.cpsat.core_resources import (
    CoreTasks,
    budget_cores,
    capped,
    serial_schedule,
    solve_cores,
)

CORES = (24, 48)


# ---- the integer model against brute force --------------------------------------------

def random_tasks(seed: int) -> CoreTasks:
    rng = random.Random(seed)
    streams = 2 + (seed % 4 == 3)
    n = rng.randint(3, 4 if streams == 3 else 5)
    preds = tuple(tuple(u for u in range(v) if rng.random() < 0.3) for v in range(n))
    blocks = tuple(rng.choice([(0, 0), (6, 12), (12, 24), (18, 36), (24, 48), (0, 48)])
                   for _ in range(n))
    return CoreTasks(tuple(rng.randint(1, 9) for _ in range(n)), blocks, preds, streams,
                     rng.choice([0, 0, 2]), CORES, (0.25, 0.5, 1.0))


def topological_orders(t: CoreTasks):
    n = len(t.durations)
    for order in itertools.permutations(range(n)):
        pos = {v: i for i, v in enumerate(order)}
        if all(pos[u] < pos[v] for v in range(n) for u in t.preds[v]):
            yield order


def brute_force(t: CoreTasks) -> int:
    """The best serial schedule over every stream assignment, side-stream budget tuple and
    topological order (the serial scheme over all orders reaches an optimum)."""
    n = len(t.durations)
    best = math.inf
    orders = list(topological_orders(t))
    for stream in itertools.product(range(t.streams), repeat=n):
        for side in itertools.product(t.levels, repeat=t.streams - 1):
            for order in orders:
                best = min(best, serial_schedule(t, stream, order, (1.0, *side)).makespan)
    return best


def check_solution(t: CoreTasks, sol) -> None:
    """Every constraint of the model, written out again: stretched durations, edges with
    latency, one task at a time per stream, cube and vector capacities."""
    n = len(t.durations)
    dur, dem = [], []
    for v in range(n):
        b = sol.budgets[sol.stream[v]] if sol.stream[v] > 0 else 1.0
        cap = (max(1, int(b * t.cores[0])), max(1, int(b * t.cores[1])))
        got = tuple(min(x, c) for x, c in zip(t.blocks[v], cap))
        ratio = max([x / g for x, g in zip(t.blocks[v], got) if x], default=1.0)
        dur.append(math.ceil(t.durations[v] * ratio - 1e-9))
        dem.append(got)
    assert sol.budgets[0] == 1.0 and set(sol.budgets) <= set(t.levels)
    for v in range(n):
        for u in t.preds[v]:
            lat = t.latency if sol.stream[u] != sol.stream[v] else 0
            assert sol.start[v] >= sol.start[u] + dur[u] + lat
    for u, v in itertools.combinations(range(n), 2):
        if sol.stream[u] == sol.stream[v] and dur[u] and dur[v]:
            assert (sol.start[u] + dur[u] <= sol.start[v]
                    or sol.start[v] + dur[v] <= sol.start[u])
    for time in range(sol.makespan):
        for k in (0, 1):
            load = sum(dem[v][k] for v in range(n)
                       if sol.start[v] <= time < sol.start[v] + dur[v])
            assert load <= t.cores[k]
    assert sol.makespan == max(sol.start[v] + dur[v] for v in range(n))


@pytest.mark.parametrize("seed", range(16))
def test_model_optimum_matches_brute_force(seed):
    t = random_tasks(seed)
    warm = list(range(len(t.durations)))
    sol = solve_cores(t, [0] * len(warm), warm, budget_s=5.0)
    assert sol.optimal
    check_solution(t, sol)
    assert sol.makespan == brute_force(t)
    without = CoreTasks(t.durations, t.blocks, t.preds, t.streams, t.latency, t.cores, (1.0,))
    plain = solve_cores(without, [0] * len(warm), warm, budget_s=5.0)
    assert plain.optimal and plain.makespan == brute_force(without) >= sol.makespan


def test_a_budget_lets_a_wide_side_op_run_beside_a_narrow_chain():
    # a (whole chip) -> c (a quarter, long); b (whole chip) needs a: capped, b fits beside
    # c instead of waiting for it
    t = CoreTasks((4, 12, 6), ((24, 48), (6, 12), (24, 48)), ((), (0,), (0,)), 2, 0, CORES,
                  LEVELS)
    sol = solve_cores(t, (0, 0, 0), (0, 1, 2), budget_s=5.0)
    # b on half (12 units) or three quarters (8 units) of the chip, beside c from 4 to 16
    assert sol.optimal and sol.makespan == 16 and sol.budgets[1] in (0.5, 0.75)
    assert sol.stream == (0, 0, 1) and sol.start[2] == 4
    assert serial_schedule(t, (0, 0, 0), (0, 1, 2)).makespan == 22  # one stream: 4 + 12 + 6


def test_stretch_and_caps():
    assert budget_cores(0.75, CORES) == (18, 36) and budget_cores(1.0, CORES) == CORES
    assert capped(10, (24, 48), (6, 12)) == (40, (6, 12))  # four waves of blocks
    assert capped(10, (24, 12), (12, 24)) == (20, (12, 12))  # the cube side decides
    assert capped(10, (0, 0), (1, 1)) == (10, (0, 0))
    with pytest.raises(ValueError, match="include 1.0"):
        CoreTasks((1,), ((1, 1),), ((),), 2, 0, CORES, (0.5,))


# ---- on the simulator: never slower than without ---------------------------------------

def reference_makespan(g: nx.DiGraph, stream_of: dict, order: list, budgets: dict) -> float:
    """Processor sharing written from the definition, budgets applied by hand: an op of
    share s on a stream of budget b < s has share b and needs s / b times its work;
    while the running shares sum to S > 1 each op with a share progresses at 1 / S.
    Streams run their ops in ``order``; an op starts when its stream's previous op and
    its predecessors are done (no sync latency)."""
    dur, share = {}, {}
    for n, d in g.nodes(data=True):
        b = budgets.get(stream_of[n], 1.0)
        s = d["share"]
        dur[n], share[n] = (d["duration"] * s / b, b) if s > b else (d["duration"], s)
    queues = {s: [n for n in order if stream_of[n] == s] for s in set(stream_of.values())}
    left, done, running, t = dict(dur), {}, set(), 0.0
    while len(done) < len(g):
        for q in queues.values():
            if q and q[0] not in running and all(p in done for p in g.predecessors(q[0])):
                running.add(q[0])
        load = sum(share[n] for n in running)
        rate = {n: (1.0 / load if load > 1 and share[n] > 0 else 1.0) for n in running}
        n_next = min(running, key=lambda n: (left[n] / rate[n], n))
        dt = left[n_next] / rate[n_next]
        t += dt
        for n in list(running):
            left[n] -= dt * rate[n]
            if left[n] <= 1e-9:
                running.discard(n)
                done[n] = t
                queues[stream_of[n]].pop(0)
    return max(done.values())


def random_problem(seed: int) -> SchedulingProblem:
    rng = random.Random(seed)
    n = rng.randint(4, 8)
    g = nx.gnp_random_graph(n, 0.3, seed=seed, directed=True)
    g = nx.DiGraph([(u, v) for u, v in g.edges if u < v])
    g.add_nodes_from(range(n))
    g = nx.relabel_nodes(g, {i: f"op{i}" for i in range(n)})
    for i, v in enumerate(sorted(g.nodes, key=lambda v: int(v[2:]))):
        g.nodes[v].update(duration=float(rng.randint(1, 20)), order=i,
                          share=rng.choice([0.0, 0.25, 0.5, 0.8, 1.0]))
    return SchedulingProblem(g, 2 + seed % 3)


@pytest.mark.parametrize("seed", range(12))
def test_budgets_are_never_predicted_slower_and_replay_on_a_reference(seed):
    problem = random_problem(seed)
    plain = solve(problem, "heft")
    choice = plan_budgets(problem, plain, {"cube": 24, "vector": 48}, time_s=2.0)
    g = problem.graph
    without = reference_makespan(g, dict(plain.stream_of), list(plain.order), {})
    assert choice.without_us == pytest.approx(without)
    assert choice.with_us <= choice.without_us
    assert choice.with_us <= choice.same_plan_without_us
    assert problem.lower_bound() <= choice.with_us + 1e-9  # the bound stays valid
    assert set(choice.budgets.values()) <= set(LEVELS) - {1.0} and 0 not in choice.budgets
    replay = reference_makespan(g, choice.stream_of, list(choice.order), choice.budgets)
    assert replay == pytest.approx(choice.with_us)
    if choice.budgets:
        assert choice.with_us < choice.same_plan_without_us == pytest.approx(
            reference_makespan(g, choice.stream_of, list(choice.order), {}))


def test_budgets_stretch_only_ops_above_them():
    g = nx.DiGraph()
    g.add_node("wide", duration=10.0, share=1.0)
    g.add_node("narrow", duration=10.0, share=0.2)
    g.add_node("main", duration=10.0, share=1.0)
    p = budgeted(SchedulingProblem(g, 2), {"wide": 1, "narrow": 1, "main": 0}, {1: 0.25})
    assert (p.durations["wide"], p.shares["wide"]) == (40.0, 0.25)  # same work, a quarter wide
    assert (p.durations["narrow"], p.shares["narrow"]) == (10.0, 0.2)
    assert (p.durations["main"], p.shares["main"]) == (10.0, 1.0)  # the main stream is whole
    assert p.graph.graph["core_budgets"] == {1: 0.25}
    with pytest.raises(ValueError, match="stream 1's budget is 0"):
        budgeted(SchedulingProblem(g, 2), {"wide": 1}, {1: 0.0})


def test_scope_keys_are_limit_core_nums():
    # torchair.scope.limit_core_num(a, v) emits [("_op_aicore_num", str(a)), ("_op_vectorcore_num", str(v))]
    assert scope_keys(0.5, {"cube": 24, "vector": 48}) == {"_op_aicore_num": "12",
                                                           "_op_vectorcore_num": "24"}
    with pytest.raises(ValueError, match="no cube and vector core counts"):
        scope_keys(0.5, {"sm": 132})


# ---- the pass and the plan command -----------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from experiments.core_budget_demo import demo_model, demo_table

    return demo_table(tmp_path_factory.mktemp("budgets") / "demo.json"), demo_model


def _pass(table, core_budgets):
    from autostream.passes import AutoStreamPass

    return AutoStreamPass(max_streams=2, cost_table=str(table), time_limit=2.0,
                          core_budgets=core_budgets)


def test_pass_emits_the_budget_inside_the_streams_scope(demo):
    from autostream.dialects.torchair import air_kind
    from autostream.fx.capture import capture

    table, factory = demo
    model, inputs = factory()
    plain = _pass(table, False).apply(capture(model, inputs)[0].gm)
    [graph] = capture(model, inputs)
    gm = graph.gm
    expected = gm(*graph.args)
    report = _pass(table, True).apply(gm)
    assert report.applied and report.plan.core_budgets == {1: 0.75}
    assert plain.plan.core_budgets == {}
    # 90 us without (the side matmul slows the chain), 85 us with (both fit)
    assert report.plan.predicted_us == pytest.approx(85.0)
    assert plain.plan.predicted_us == pytest.approx(90.0)
    scopes = [(n.args[0], n.args[1]) for n in gm.graph.nodes if air_kind(n) == "scope_enter"]
    assert scopes == [(["_user_stream_label"], ["stream_1"]),
                      (["_op_aicore_num", "_op_vectorcore_num"], ["18", "36"])]
    kinds = [air_kind(n) for n in gm.graph.nodes if air_kind(n) in ("scope_enter", "scope_exit")]
    assert kinds == ["scope_enter", "scope_enter", "scope_exit", "scope_exit"]
    assert _ops_in_scope(gm) == ["mm_1"]  # the wide matmul is the one capped
    got = gm(*graph.args)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def _ops_in_scope(gm):
    from autostream.dialects.torchair import air_kind

    depth, inside = 0, []
    for n in gm.graph.nodes:
        kind = air_kind(n)
        if kind == "scope_enter":
            depth += 1
        elif kind == "scope_exit":
            depth -= 1
        elif depth == 2 and kind is None:
            inside.append(n.name)
    return inside


def test_core_budgets_need_cpsat_and_core_counts():
    from autostream.fx.capture import capture_graphs
    from autostream.models.zoo import two_branch_gemv
    from autostream.passes import AutoStreamPass
    from autostream.planning.plan import PlanOptions

    with pytest.raises(ValueError, match="needs solver='cpsat'.*other solvers plan without"):
        PlanOptions(solver="heft", core_budgets=True)
    with pytest.raises(ValueError, match="cost_table='h200'.*no cube and vector core counts"):
        AutoStreamPass(cost_table="h200", core_budgets=True)
    # the default table of a CPU graph has no core counts: planned, and said so
    report = AutoStreamPass(core_budgets=True, time_limit=1.0).apply(
        capture_graphs(*two_branch_gemv())[0])
    assert report.plan.core_budgets == {}
    assert any("planned without core budgets" in n for n in report.plan.notes)
    assert AutoStreamPass(core_budgets=True).digest() != AutoStreamPass().digest()


def test_plan_command_emits_budgets_with_their_scope_keys(demo, tmp_path, capsys):
    from autostream.cli import main

    table, _ = demo
    out = tmp_path / "plan.json"
    assert main(["plan", "experiments.core_budget_demo:demo_model", "--cost-table", str(table),
                 "--streams", "2", "--time-limit", "2", "--core-budgets", "--json",
                 str(out)]) == 0
    b = json.loads(out.read_text())["core_budgets"]
    assert b == {"budgets": {"1": 0.75},
                 "scope_keys": {"1": {"_op_aicore_num": "18", "_op_vectorcore_num": "36"}}}
    assert "stream 1: 0.75 of the chip" in capsys.readouterr().out
    assert main(["plan", "experiments.core_budget_demo:demo_model", "--cost-table", str(table),
                 "--solver", "heft", "--core-budgets"]) != 0
    assert "needs solver='cpsat'" in capsys.readouterr().err
