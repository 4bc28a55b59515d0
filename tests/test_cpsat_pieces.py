"""CP-SAT on layered graphs: cuts, loose ops, exact merges, bounds that are bounds, reuse."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.base import schedule_from_assignment
from autostream.scheduling.solvers.cpsat.bounds import graham_by_pieces, graham_by_pieces_at
from autostream.scheduling.solvers.cpsat.local_search import improve
from autostream.scheduling.solvers.cpsat.pieces import cut_into_pieces, piece_problem
from autostream.scheduling.solvers.cpsat.tasks import build_tasks, task_groups
from tests.factories import layers_with_weights, model_problem, problems
from tests.helpers import assert_valid


def test_ops_that_wait_only_for_inputs_move_and_leave_the_layers_cut():
    p = layers_with_weights(6)
    assert len(cut_into_pieces(p, strict=True)) == 1  # the transposes cross every layer
    pieces = cut_into_pieces(p)
    heads = [x.head for x in pieces]
    assert [f"L{k}.add" for k in range(5)] == [h for h in heads if h and h.endswith(".add")]
    # every transpose moved into its own layer's piece, as a loose op
    for x in pieces:
        assert all(v.split(".")[0] == x.tail.split(".")[0] for v in x.loose if x.tail)
    assert sorted(v for x in pieces for v in x.own) == sorted(p.graph)
    assert all(x.tail == y.head for x, y in itertools.pairwise(pieces))


def test_repeated_layers_are_solved_once_and_the_plan_meets_its_bound():
    p = layers_with_weights(8)
    s = solve(p, "cpsat", time_limit=2.0, cache=False, wall_clock=False)
    assert_valid(p, s)
    assert s.stats.pieces_solved < s.stats.pieces / 3
    assert s.lower_bound <= s.makespan + 1e-9
    assert s.makespan < solve(p, "heft").makespan + 1e-9
    assert s.stats.proven and s.optimal


def test_a_loose_op_may_start_with_the_head_and_does_not_precede_the_cut():
    p = layers_with_weights(3)
    piece = next(x for x in cut_into_pieces(p) if x.head == "L0.add")
    sub = piece_problem(p, piece)
    for v in piece.loose:
        assert not nx.has_path(sub.graph, piece.head, v)  # free to run beside the head
        assert nx.has_path(sub.graph, v, piece.tail)


def _optimum(problem: SchedulingProblem) -> float:
    """The best simulated makespan over every stream assignment and launch order."""
    ops = list(problem.topo_order)
    orders = [o for o in itertools.permutations(ops)
              if all(o.index(u) < o.index(v) for u, v in problem.graph.edges)]
    best = float("inf")
    for streams in itertools.product(range(problem.streams), repeat=len(ops)):
        stream_of = dict(zip(ops, streams, strict=True))
        for order in orders:
            best = min(best, schedule_from_assignment(problem, stream_of, "x",
                                                      order=order).makespan)
    return best


@settings(max_examples=20, deadline=None)
@given(problems(max_nodes=5, shares=True), st.sampled_from([0.5, 1.5, 3.0]))
def test_the_reported_bound_never_exceeds_the_optimum(problem, latency):
    # fractional durations: the integer model rounds them down
    g = problem.graph.copy()
    for v in g:
        g.nodes[v]["duration"] = g.nodes[v]["duration"] * 1.37
    p = SchedulingProblem(g, streams=min(problem.streams, 2), sync_latency_us=latency)
    s = solve(p, "cpsat", time_limit=1.0, cache=False, wall_clock=False)
    best = _optimum(p)
    assert graham_by_pieces(p) <= best + 1e-6
    assert s.lower_bound <= best + 1e-6
    assert s.makespan >= best - 1e-6
    if s.optimal:
        assert s.makespan <= best + 1e-3


@settings(max_examples=40, deadline=None)
@given(problems(max_nodes=9))
def test_zero_duration_ops_merge_into_tasks_without_cycles(problem):
    tg = build_tasks(problem)
    members = [n for group in tg.members for n in group]
    assert sorted(members) == sorted(problem.graph)
    assert all(u < v for u, v in tg.edges)  # task ids are a topological order
    for group in tg.members:  # only zero-duration ops join another op's task
        assert sum(problem.duration(n) > 0 for n in group) <= 1
    index = {n: k for k, group in enumerate(tg.members) for n in group}
    for u, v in problem.graph.edges:  # every dependence survives between tasks
        assert index[u] == index[v] or nx.has_path(nx.DiGraph(tg.edges), index[u], index[v])


def test_zero_duration_ops_join_their_producer():
    g = nx.DiGraph([("mm", "view"), ("view", "a"), ("view", "b"), ("t", "mm2"), ("a", "mm2")])
    nx.set_node_attributes(g, {"mm": 3.0, "view": 0.0, "a": 1.0, "b": 1.0, "t": 0.0,
                               "mm2": 2.0}, "duration")
    groups = task_groups(SchedulingProblem(g, streams=2), collapse_chains=False)
    assert ["mm", "view"] in groups  # a view runs right after its producer
    assert ["t", "mm2"] in groups  # a weight transpose right before its consumer


@settings(max_examples=15, deadline=None)
@given(problems(max_nodes=8))
def test_local_search_never_makes_a_plan_slower_and_is_reproducible(problem):
    start = solve(problem, "round_robin")
    a, b = improve(problem, start, 30), improve(problem, start, 30)
    assert a.makespan <= start.makespan + 1e-9
    assert (dict(a.stream_of), a.order) == (dict(b.stream_of), b.order)
    assert_valid(problem, a)


def test_renamed_graphs_get_the_same_plan():
    p = layers_with_weights(4)
    renamed = nx.relabel_nodes(p.graph, {v: f"x_{v}" for v in p.graph})
    q = SchedulingProblem(renamed, p.streams, p.sync_latency_us)
    a = solve(p, "cpsat", time_limit=1.0, cache=False, wall_clock=False)
    b = solve(q, "cpsat", time_limit=1.0, cache=False, wall_clock=False)
    assert a.stats.deterministic and b.stats.deterministic
    assert {f"x_{v}": k for v, k in a.stream_of.items()} == dict(b.stream_of)
    assert tuple(f"x_{v}" for v in a.order) == b.order


def _hf_problem(layers: int) -> SchedulingProblem:
    from autostream.models import hf_zoo
    from autostream.planning.plan import load_cost_model

    return model_problem(*hf_zoo.qwen3_moe(layers=layers), load_cost_model("ascend910b"), 4)


@pytest.mark.slow
def test_a_transformers_model_is_cut_at_its_layers_and_a_deeper_one_adds_only_copies():
    pytest.importorskip("transformers")
    two, three = _hf_problem(2), _hf_problem(3)
    a = solve(two, "cpsat", time_limit=5.0, cache=False, wall_clock=False)
    b = solve(three, "cpsat", time_limit=5.0, cache=False, wall_clock=False)
    assert b.stats.pieces > a.stats.pieces > 20  # cut at every norm and residual add
    assert b.stats.pieces_solved == a.stats.pieces_solved  # the new layer is a copy
    for p, s in ((two, a), (three, b)):
        assert_valid(p, s)
        assert s.lower_bound <= s.makespan + 1e-9
        assert s.makespan < solve(p, "heft").makespan
        assert s.gap < 0.03


@settings(max_examples=30, deadline=None)
@given(problems(max_nodes=9, shares=True))
def test_graham_by_pieces_at_several_capacities_is_each_scaled_problems(problem):
    g = problem.graph
    factors = (1.0, 1.5, math.inf)
    scaled = [graham_by_pieces(SchedulingProblem(g, problem.streams, problem.sync_latency_us,
                                                 problem.capacity * f)) for f in factors]
    assert graham_by_pieces_at(problem, factors) == tuple(scaled)
