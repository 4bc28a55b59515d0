"""The memory bound over every interleaving, exact against enumeration (what real runs hold:
``test_memory_runtime``)."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import cache

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from autostream.memory.lifetimes import plan_steps
from autostream.memory.predict import GraphMemory, MemoryProfile, launch_timeline, predict_memory
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.solvers import get_solver
from autostream.scheduling.sync import compute_syncs
from tests.factories import random_problem


def _random_plan(seed: int, n: int, streams: int, solver: str):
    problem = random_problem(seed, n, streams=streams, max_parents=2)
    rng = random.Random(seed)
    memory = GraphMemory.from_sizes(problem.graph, {v: rng.choice([0, 1, 8, 64, 256])
                                                    for v in problem.graph})
    schedule = get_solver(solver)(problem)
    return memory, schedule, compute_syncs(problem.graph, schedule)


def _worst_by_enumeration(memory: GraphMemory, schedule: Schedule, syncs, profile: MemoryProfile
                          ) -> int:
    """The most bytes live over every reachable state of the streams' threads (brute force).

    A thread runs its steps in order, an op as a start then an end; a wait blocks until
    every token it waits for is recorded.  Storages come and go as ``profile.lives`` says.
    """
    per_stream: dict[int, list[tuple[str, str]]] = {}
    for step in plan_steps(schedule, syncs, memory.reads):
        events = per_stream.setdefault(step.stream, [])
        if step.kind == "op":
            events += [("start", step.name), ("end", step.name)]
        elif step.kind == "record":
            events.append(("record", step.name))
        else:
            events.append(("wait", step.name))
    tokens = {step.name: set(step.tokens) for step in plan_steps(schedule, syncs, memory.reads)
              if step.kind == "wait"}
    streams = sorted(per_stream)

    def delta(event: tuple[str, str]) -> int:
        kind, name = event
        out = 0
        for life in profile.lives.values():
            if kind == "start" and life.allocated_by == name:
                out += life.nbytes
            if (kind == "end" and life.freed_after == name) or (
                    kind == "wait" and name != JOIN and life.freed_before == name):
                out -= life.nbytes
        return out

    @cache
    def worst(positions: tuple[int, ...], live: int) -> int:
        done = {e for s, p in zip(streams, positions, strict=True) for e in per_stream[s][:p]}
        recorded = {name for kind, name in done if kind == "record"}
        best = live
        for i, s in enumerate(streams):
            if positions[i] == len(per_stream[s]):
                continue
            event = per_stream[s][positions[i]]
            if event[0] == "wait" and not tokens[event[1]] <= recorded:
                continue
            step = (*positions[:i], positions[i] + 1, *positions[i + 1:])
            best = max(best, worst(step, live + delta(event)))
        return best

    return profile.input_bytes + worst(tuple(0 for _ in streams), 0)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 9), streams=st.integers(2, 3),
       solver=st.sampled_from(["heft", "round_robin", "critical_path"]))
def test_the_bound_is_the_worst_interleaving(seed, n, streams, solver):
    memory, schedule, syncs = _random_plan(seed, n, streams, solver)
    profile = predict_memory(memory, schedule, syncs)
    assert profile.peak_bytes <= profile.bound_bytes
    assert profile.bound_bytes == _worst_by_enumeration(memory, schedule, syncs, profile)


def test_one_stream_and_accelerators_have_one_interleaving():
    memory, schedule, syncs = _random_plan(5, 12, 3, "round_robin")
    threads = predict_memory(memory, schedule, syncs)
    assert schedule.streams_used > 1 and threads.bound_bytes > threads.peak_bytes
    launched = predict_memory(replace(memory, device_type="cuda"), schedule, syncs,
                              launch_timeline(schedule))
    assert launched.bound_bytes == launched.peak_bytes
    single = replace(schedule, stream_of=dict.fromkeys(schedule.order, 0))
    one = predict_memory(memory, single, (), launch_timeline(single))
    assert one.bound_bytes == one.peak_bytes


def test_a_sync_lowers_the_bound():
    # two independent chains: without a sync the first allocations of both may coexist
    deps = nx.DiGraph([("a", "b"), ("c", "d")])
    memory = GraphMemory.from_sizes(deps, {"a": 100, "b": 1, "c": 100, "d": 1})
    s = Schedule("x", {"a": 0, "b": 0, "c": 1, "d": 1}, ("a", "b", "c", "d"),
                 {"a": 0, "b": 1, "c": 2, "d": 3}, {"a": 1, "b": 2, "c": 3, "d": 4}, 4.0, 4.0)
    free = predict_memory(memory, s)
    ordered = predict_memory(memory, s, [Sync("b", "c")])
    assert free.bound_bytes == 202 and set(free.bound_at) == {"a", "b", "c", "d"}
    assert ordered.bound_bytes == 102 == ordered.peak_bytes
