"""Minimal syncs: the transitive reduction equals brute force on small random graphs."""

import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.solvers import solve
from autostream.scheduling.sync import compute_syncs, group_waits, recorded_producers
from tests.factories import random_dag
from tests.helpers import minimum_sync_count


def _random_schedule(g: nx.DiGraph, streams: int, seed: int) -> Schedule:
    rng = random.Random(seed)
    stream_of = {n: rng.randrange(streams) for n in g}
    order = tuple(nx.lexicographical_topological_sort(g, key=lambda n: (rng.random(), n)))
    return Schedule("random", stream_of, order, {}, {}, 0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 8), p=st.floats(0.1, 0.6), streams=st.integers(2, 3))
def test_sync_count_matches_brute_force_minimum(seed, n, p, streams):
    g = random_dag(seed, n, edge_probability=p, max_duration=9)
    schedule = _random_schedule(g, streams, seed + 1)
    syncs = compute_syncs(g, schedule)
    assert len(syncs) == minimum_sync_count(g, schedule)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 9))
def test_syncs_of_heft_plans_are_minimal(seed, n):
    g = random_dag(seed, n, edge_probability=0.3, max_duration=9)
    schedule = solve(SchedulingProblem(g, streams=3), "heft")
    assert len(compute_syncs(g, schedule)) == minimum_sync_count(g, schedule)


def test_one_record_serves_many_waits():
    g = nx.DiGraph([("a", "b"), ("a", "c")])
    s = Schedule("x", {"a": 0, "b": 1, "c": 2}, ("a", "b", "c"), {}, {}, 0.0, 0.0)
    syncs = compute_syncs(g, s)
    assert syncs == [Sync("a", "b"), Sync("a", "c"), Sync("b", JOIN), Sync("c", JOIN)]
    assert recorded_producers(syncs) == ["a", "b", "c"]
    assert group_waits(syncs)[JOIN] == ["b", "c"]


def test_implied_dependence_gets_no_sync():
    # a -> c is implied by a -> b (stream 1 waits on a) and b -> c on stream 1.
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("a", "c")])
    s = Schedule("x", {"a": 0, "b": 1, "c": 1}, ("a", "b", "c"), {}, {}, 0.0, 0.0)
    assert compute_syncs(g, s) == [Sync("a", "b"), Sync("c", JOIN)]


def test_join_is_implied_when_main_already_waits_on_the_last_side_op():
    g = nx.DiGraph([("a", "b"), ("b", "c")])
    s = Schedule("x", {"a": 0, "b": 1, "c": 0}, ("a", "b", "c"), {}, {}, 0.0, 0.0)
    assert compute_syncs(g, s) == [Sync("a", "b"), Sync("b", "c")]


def test_order_violating_a_dependence_is_rejected():
    g = nx.DiGraph([("a", "b")])
    s = Schedule("x", {"a": 0, "b": 1}, ("b", "a"), {}, {}, 0.0, 0.0)
    with pytest.raises(ValueError, match="before its producer"):
        compute_syncs(g, s)
