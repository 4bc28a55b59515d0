"""Baseline solvers: every plan is a valid timeline; each follows its published rule."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers import SOLVERS, check_solver_name, solve
from autostream.scheduling.solvers._graphs import transitive_reduction_edges
from autostream.scheduling.solvers.critical_path import deepest_path
from autostream.scheduling.solvers.nimble import nimble_streams
from autostream.scheduling.solvers.opara import opara_launch_order
from tests.factories import problems
from tests.helpers import BASELINES, assert_valid


@settings(max_examples=40, deadline=None)
@given(problems())
def test_every_baseline_plan_is_a_valid_timeline(problem):
    for name in BASELINES:
        s = solve(problem, name)
        assert s.solver == name
        assert_valid(problem, s)


def test_nimble_reaches_the_minimum_cover_where_its_two_matchings_fall_short():
    # found by the property test below: the reduced-edge matching fixes chains that
    # every 3-stream cover splits; Nimble's two matchings alone gave 4 streams
    g = nx.DiGraph([("n0", "n3"), ("n0", "n4"), ("n1", "n4"), ("n1", "n5"), ("n2", "n3"),
                    ("n2", "n4"), ("n3", "n4"), ("n3", "n6")])
    nx.set_node_attributes(g, 1.0, "duration")
    chains = nimble_streams(SchedulingProblem(g, streams=1))
    assert len(chains) == 3  # the widest antichain: n4, n5, n6
    closure = nx.transitive_closure_dag(g)
    assert sorted(n for c in chains for n in c) == sorted(g)
    assert all(closure.has_edge(a, b) for c in chains for a, b in itertools.pairwise(c))


@settings(max_examples=40, deadline=None)
@given(problems(shares=False))
def test_nimble_needs_as_many_streams_as_the_widest_antichain(problem):
    g = problem.graph
    closure = nx.transitive_closure_dag(g)
    width = max(
        (len(c) for r in range(1, len(g) + 1) for c in itertools.combinations(g, r)
         if not any(closure.has_edge(a, b) or closure.has_edge(b, a)
                    for a, b in itertools.combinations(c, 2))),
        default=0,
    )
    chains = nimble_streams(problem)
    assert len(chains) == width  # Dilworth: a minimum chain cover
    for chain in chains:  # every stream is a chain: consecutive ops are ordered
        for a, b in itertools.pairwise(chain):
            assert closure.has_edge(a, b)
    s = solve(problem, "nimble")
    assert s.stats.streams_needed == width
    assert s.streams_used <= problem.streams


@settings(max_examples=40, deadline=None)
@given(problems(shares=False))
def test_transitive_reduction_matches_networkx(problem):
    g = problem.graph
    ours = set(transitive_reduction_edges(g, problem.topo_order))
    assert ours == set(nx.transitive_reduction(g).edges)


def _problem(edges, nodes=(), streams=4, **durations) -> SchedulingProblem:
    g = nx.DiGraph(edges)
    g.add_nodes_from(nodes)
    for i, n in enumerate(sorted(g)):
        g.nodes[n].update(duration=durations.get(n, 1.0), share=0.0, order=i)
    return SchedulingProblem(g, streams=streams)


def test_round_robin_deals_ops_in_program_order():
    p = _problem([], nodes="abcde", streams=2)
    s = solve(p, "round_robin")
    assert [s.stream_of[n] for n in "abcde"] == [0, 1, 0, 1, 0]


def test_tf_greedy_inherits_only_through_fan_out_one():
    # a -> b -> c is a chain (fan-out 1): one stream; a -> {b, d}: d opens a stream
    p = _problem([("a", "b"), ("b", "c")], streams=4)
    assert solve(p, "tf_greedy").streams_used == 1
    p = _problem([("a", "b"), ("b", "c"), ("a", "d")], streams=4)
    s = solve(p, "tf_greedy")
    assert s.stream_of["c"] == s.stream_of["b"] != s.stream_of["a"]
    assert s.stats.virtual_streams == 3
    folded = solve(_problem([("a", "b"), ("b", "c"), ("a", "d")], streams=2), "tf_greedy")
    assert folded.streams_used == 2  # virtual stream 2 folds onto stream 0


def test_opara_first_user_inherits_and_launches_small_ops_first():
    p = _problem([("a", "b"), ("a", "c")], streams=4, b=5.0, c=1.0)
    s = solve(p, "opara")
    assert s.stream_of["b"] == s.stream_of["a"] != s.stream_of["c"]  # b is a's first user
    assert opara_launch_order(p) == ("a", "c", "b")  # c is smaller than b


def test_critical_path_keeps_the_deepest_path_on_the_main_stream():
    p = _problem([("a", "b"), ("b", "c"), ("c", "d"), ("a", "x"), ("a", "y")], streams=3,
                 x=50.0, y=50.0)
    assert deepest_path(p) == ["a", "b", "c", "d"]  # by depth, not by cost
    s = solve(p, "critical_path")
    assert {s.stream_of[n] for n in "abcd"} == {0}
    assert s.stream_of["x"] != s.stream_of["y"] and 0 not in (s.stream_of["x"], s.stream_of["y"])


def test_nimble_folds_and_reports_when_it_needs_more_streams():
    p = _problem([], nodes="abcde", streams=2)
    s = solve(p, "nimble")
    assert s.stats.streams_needed == 5
    assert s.streams_used == 2


def test_baselines_are_deterministic():
    p = _problem([("a", "b"), ("a", "c"), ("c", "d"), ("b", "d"), ("e", "d")], streams=3)
    for name in BASELINES:
        assert solve(p, name) == solve(p, name)


def test_unknown_solver_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown solver 'fastest'.*cpsat"):
        check_solver_name("fastest")
    with pytest.raises(ValueError, match="allowed"):
        solve(_problem([("a", "b")]), "fastest")
    assert set(BASELINES) | {"cpsat"} == set(SOLVERS)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.data())
def test_topological_order_is_the_lexicographic_one_by_program_order(n, data):
    # program order sometimes topological (the sorted fast path), sometimes not
    edges = data.draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))))
    g = nx.DiGraph((f"t{u}", f"t{v}") for u, v in edges if u < v)
    g.add_nodes_from(f"t{i}" for i in range(n))
    orders = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    nx.set_node_attributes(g, {f"t{i}": o for i, o in enumerate(orders)}, "order")
    nx.set_node_attributes(g, 1.0, "duration")
    key = {v: (g.nodes[v]["order"], v) for v in g}
    expected = tuple(nx.lexicographical_topological_sort(g, key=key.__getitem__))
    assert SchedulingProblem(g, streams=2).topo_order == expected


def test_bad_problems_are_rejected_with_the_reason():
    with pytest.raises(ValueError, match="streams must be an integer >= 1"):
        _problem([("a", "b")], streams=0)
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("c", "a")])
    nx.set_node_attributes(g, 1.0, "duration")
    with pytest.raises(ValueError, match="cycle: a -> b -> c -> a"):
        SchedulingProblem(g, streams=2)
    g = nx.DiGraph()
    g.add_node("a", duration=-1.0)
    with pytest.raises(ValueError, match="'a'.*duration"):
        SchedulingProblem(g, streams=2)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_a_misspelt_option_is_rejected_by_name(name):
    g = nx.DiGraph([("a", "b")])
    nx.set_node_attributes(g, 1.0, "duration")
    p = SchedulingProblem(g, streams=2)
    with pytest.raises(ValueError, match=rf"solver '{name}' has no option 'time_limt'"):
        solve(p, name, time_limt=1.0)
