"""Core budgets per side stream: the stretch model, the search against brute force on an
independent processor-sharing simulator, never slower than without, the bound, scope keys."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest

from autostream.core_budgets import LEVELS, budgeted, choose_budgets, scope_keys
from autostream.problem import SchedulingProblem


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


def random_case(seed: int, streams: int):
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    g = nx.gnp_random_graph(n, 0.3, seed=seed, directed=True)
    g = nx.DiGraph([(u, v) for u, v in g.edges if u < v])
    g.add_nodes_from(range(n))
    g = nx.relabel_nodes(g, {i: f"op{i}" for i in range(n)})
    for v in g.nodes:
        g.nodes[v].update(duration=float(rng.randint(1, 20)), share=rng.choice([0.0, 0.25, 0.5,
                                                                                0.8, 1.0]))
    order = [f"op{i}" for i in range(n)]
    stream_of = {v: rng.randrange(streams) for v in order}
    return g, stream_of, order


@pytest.mark.parametrize("seed", range(24))
def test_search_matches_brute_force_on_a_reference_simulator(seed):
    streams = 2 + seed % 3
    g, stream_of, order = random_case(seed, streams)
    problem = SchedulingProblem(g, streams)
    choice = choose_budgets(problem, stream_of, order)
    side = sorted({s for s in stream_of.values() if s > 0})
    brute = min(reference_makespan(g, stream_of, order, dict(zip(side, combo, strict=True)))
                for combo in itertools.product(LEVELS, repeat=len(side)))
    assert choice.with_us == pytest.approx(brute, rel=1e-9)
    assert choice.without_us == pytest.approx(reference_makespan(g, stream_of, order, {}))
    assert choice.with_us <= choice.without_us
    assert problem.lower_bound() <= choice.with_us + 1e-9  # the bound stays valid
    if choice.budgets:  # the chosen budgets give the predicted makespan
        assert reference_makespan(g, stream_of, order, choice.budgets) == pytest.approx(
            choice.with_us)


def test_budgets_stretch_only_ops_above_them():
    g = nx.DiGraph()
    g.add_node("wide", duration=10.0, share=1.0)
    g.add_node("narrow", duration=10.0, share=0.2)
    g.add_node("main", duration=10.0, share=1.0)
    p = budgeted(SchedulingProblem(g, 2), {"wide": 1, "narrow": 1, "main": 0}, {1: 0.25})
    assert (p.durations["wide"], p.shares["wide"]) == (40.0, 0.25)  # same work, a quarter wide
    assert (p.durations["narrow"], p.shares["narrow"]) == (10.0, 0.2)
    assert (p.durations["main"], p.shares["main"]) == (10.0, 1.0)  # the main stream is whole
    with pytest.raises(ValueError, match="stream 1's budget is 0"):
        budgeted(SchedulingProblem(g, 2), {"wide": 1}, {1: 0.0})


def test_no_contention_no_budget():
    g = nx.DiGraph()
    g.add_node("a", duration=5.0, share=0.4)
    g.add_node("b", duration=5.0, share=0.4)
    choice = choose_budgets(SchedulingProblem(g, 2), {"a": 0, "b": 1}, ["a", "b"])
    assert choice.budgets == {} and choice.with_us == choice.without_us == 5.0


def test_scope_keys_are_limit_core_nums():
    assert scope_keys(0.5, {"cube": 24, "vector": 48}) == {"_op_aicore_num": "12",
                                                           "_op_vectorcore_num": "24"}
    with pytest.raises(ValueError, match="no cube and vector core counts"):
        scope_keys(0.5, {"sm": 132})


def test_plan_command_reports_budgets_it_does_not_emit(tmp_path, capsys):
    import json

    from autostream.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "autostream.zoo:two_branch_gemv", "--cost-table", "ascend910b",
                 "--streams", "2", "--time-limit", "1", "--core-budgets", "--json", str(out)]) == 0
    b = json.loads(out.read_text())["core_budgets"]
    assert b["with_us"] <= b["without_us"] and set(b["budgets"].values()) <= set(LEVELS)
    assert set(b["scope_keys"]) == set(b["budgets"])  # ascend910b has core counts
    assert "core budgets" in capsys.readouterr().out
