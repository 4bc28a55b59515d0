"""The persistent plan cache: a hit is exactly the plan a solve gives, keyed by content."""

from __future__ import annotations

import dataclasses
import json

import networkx as nx
import pytest

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.cpsat import ladder
from autostream.scheduling.solvers.cpsat.cache import ENV, FORMAT, PlanCache
from tests.factories import layers_with_weights


def _entries(tmp_path) -> list:
    return sorted((tmp_path / "plans").rglob("*.json"))


def _same(a, b) -> None:
    assert dict(a.stream_of) == dict(b.stream_of)
    assert a.order == b.order
    assert (a.makespan, a.lower_bound, a.optimal) == (b.makespan, b.lower_bound, b.optimal)
    assert dict(a.start) == dict(b.start) and dict(a.end) == dict(b.end)


def test_a_hit_returns_exactly_the_plan_the_solve_returned(tmp_path):
    p = layers_with_weights(5)
    first = solve(p, "cpsat", time_limit=1.0)
    assert len(_entries(tmp_path)) == 1 and not first.stats.cache_hit
    again = solve(p, "cpsat", time_limit=1.0)
    assert again.stats.cache_hit
    _same(first, again)
    assert dataclasses.replace(again.stats, cache_hit=False, plan_seconds=0) == \
        dataclasses.replace(first.stats, plan_seconds=0)


def test_a_hit_is_not_simulated_again_and_the_key_is_hashed_once(tmp_path, monkeypatch):
    import autostream.scheduling.simulate
    from autostream.scheduling.solvers.cpsat import cache

    hashed = []
    real = cache.digest
    monkeypatch.setattr(cache, "digest", lambda *a: hashed.append(1) or real(*a))
    p = layers_with_weights(4)
    first = solve(p, "cpsat", time_limit=1.0)
    assert len(hashed) == 1  # a miss: looked up and stored under one key
    monkeypatch.setattr(autostream.scheduling.simulate, "run_events", None)  # any simulation fails
    again = solve(p, "cpsat", time_limit=1.0)
    assert again.stats.cache_hit and len(hashed) == 2
    _same(first, again)


def test_a_renamed_graph_hits_and_gets_the_plan_under_its_own_names(tmp_path):
    p = layers_with_weights(4)
    first = solve(p, "cpsat", time_limit=1.0)
    renamed = nx.relabel_nodes(p.graph, {v: f"node{i}" for i, v in enumerate(p.topo_order)})
    q = SchedulingProblem(renamed, p.streams, p.sync_latency_us)
    hit = solve(q, "cpsat", time_limit=1.0)
    assert hit.stats.cache_hit
    name = {v: f"node{i}" for i, v in enumerate(p.topo_order)}
    assert {name[v]: s for v, s in first.stream_of.items()} == dict(hit.stream_of)
    assert tuple(name[v] for v in first.order) == hit.order


def test_other_options_costs_or_streams_miss(tmp_path):
    p = layers_with_weights(3)
    solve(p, "cpsat", time_limit=1.0)
    assert not solve(p, "cpsat", time_limit=2.0).stats.cache_hit
    slower = p.graph.copy()
    slower.nodes["L0.a.mm"]["duration"] = 4.5
    assert not solve(SchedulingProblem(slower, 2, 1.0), "cpsat", time_limit=1.0).stats.cache_hit
    assert not solve(SchedulingProblem(p.graph, 3, 1.0), "cpsat", time_limit=1.0).stats.cache_hit
    assert len(_entries(tmp_path)) == 4


def test_the_cache_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "off")
    p = layers_with_weights(3)
    solve(p, "cpsat", time_limit=1.0)
    assert not solve(p, "cpsat", time_limit=1.0).stats.cache_hit
    assert _entries(tmp_path) == []
    monkeypatch.setenv(ENV, str(tmp_path))  # on, but this solve declines it
    solve(p, "cpsat", time_limit=1.0, cache=False)
    assert not solve(p, "cpsat", time_limit=1.0, cache=False).stats.cache_hit
    assert _entries(tmp_path) == []


def test_a_damaged_entry_is_a_miss_and_is_replaced(tmp_path):
    p = layers_with_weights(3)
    first = solve(p, "cpsat", time_limit=1.0)
    [entry] = _entries(tmp_path)
    entry.write_text("{not json")
    again = solve(p, "cpsat", time_limit=1.0)
    assert not again.stats.cache_hit
    _same(first, again)
    assert json.loads(entry.read_text())["format"] == FORMAT


@pytest.mark.parametrize("damage", ["order reversed", "stream -1", "stream too high",
                                    "an op twice"])
def test_an_entry_that_parses_but_is_no_plan_is_a_miss(tmp_path, damage):
    p = layers_with_weights(3)
    first = solve(p, "cpsat", time_limit=1.0)
    assert first.streams_used > 1  # the premise: some op is off stream 0
    [entry] = _entries(tmp_path)
    data = json.loads(entry.read_text())
    if damage == "order reversed":
        data["order"] = data["order"][::-1]
    elif damage == "an op twice":
        data["order"][-1] = data["order"][0]
    else:
        side = next(i for i, s in enumerate(data["stream"]) if s > 0)
        data["stream"][side] = -1 if damage == "stream -1" else p.streams
    entry.write_text(json.dumps(data))
    again = solve(p, "cpsat", time_limit=1.0)
    assert not again.stats.cache_hit
    _same(first, again)
    # replaced by the solve's plan
    assert json.loads(entry.read_text())["order"] == [p.topo_index[v] for v in first.order]


def test_a_plan_the_wall_clock_cut_is_not_stored(tmp_path, monkeypatch):
    real = ladder.plan_tasks
    monkeypatch.setattr(ladder, "plan_tasks",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), deterministic=False))
    s = solve(layers_with_weights(3), "cpsat", time_limit=1.0)
    assert s.stats.deterministic is False
    assert _entries(tmp_path) == []


def test_the_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert PlanCache.from_environment().root == tmp_path / "xdg" / "autostream" / "plans"


@pytest.mark.parametrize("where", ["0", "OFF", "none"])
def test_every_off_word_switches_it_off(monkeypatch, where):
    monkeypatch.setenv(ENV, where)
    assert PlanCache.from_environment() is None
