"""CP-SAT window by window (issue 43): every window's greedy plan satisfies the window's
model, the checker reads the model as CP-SAT does, a window leaves the next one a
boundary it can satisfy, and a plan never fails for want of a hint."""

from __future__ import annotations

import contextlib
import itertools
import logging

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.cpsat import task_plan
from autostream.scheduling.solvers.cpsat.model import feasible, stream_model, violation
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.solvers.cpsat.tasks import TaskGraph, build_tasks
from autostream.scheduling.solvers.cpsat.windows import (
    Placed,
    Window,
    cut_windows,
    greedy_window,
    upward_rank,
)
from tests.factories import comm_problems, problems
from tests.helpers import assert_valid

HINTLESS = "solved without a hint"
Plan = tuple[dict[int, int], dict[int, int]]


def greedy_windows(tg: TaskGraph, streams: int, size: int):
    """Each window of ``tg`` (``size`` tasks at most) with its greedy plan, every earlier
    window placed by its own greedy plan: ``(window, (stream, start))``."""
    rank = upward_rank(tg, streams)
    placed = Placed()
    for tasks in cut_windows(tg, size):
        win = Window.make(tg, tasks, placed, streams)
        stream, start = greedy_window(tg, win, streams, rank)
        yield win, (stream, start)
        for v in tasks:
            placed.put(v, stream[v], start[v], tg.duration[v])


def cp_sat_accepts(tg: TaskGraph, win: Window, streams: int, plan: Plan, at: dict[int, int]
                   ) -> bool:
    """Does CP-SAT's stream model of ``win`` hold ``plan``'s streams at the times ``at``?"""
    stream, start = plan
    horizon = max(max(t, start[v]) + tg.duration[v] for v, t in at.items())
    m, starts, x, *_ = stream_model(tg, win, streams, horizon, 0, plan)
    for v in win.tasks:
        m.add(starts[v] == at[v])
        for s, lit in x.get(v, {}).items():
            m.add(lit == (s == stream[v]))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    return solver.solve(m) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def _with_latency(problem: SchedulingProblem, latency: float) -> SchedulingProblem:
    return SchedulingProblem(problem.graph, problem.streams, latency, problem.capacity)


@settings(max_examples=60, deadline=None)
@given(st.one_of(problems(max_nodes=12), comm_problems()), st.integers(2, 4),
       st.sampled_from([0.0, 2.0]))
def test_every_windows_greedy_plan_satisfies_its_cp_sat_model(problem, size, latency):
    problem = _with_latency(problem, latency)
    tg = build_tasks(problem)
    for win, plan in greedy_windows(tg, problem.streams, size):
        assert violation(tg, win, *plan) is None
        assert cp_sat_accepts(tg, win, problem.streams, plan, plan[1])


@settings(max_examples=60, deadline=None)
@given(problems(max_nodes=10), st.integers(2, 4), st.data())
def test_the_checker_reads_the_model_as_cp_sat_does(problem, size, data):
    tg = build_tasks(problem)
    for win, (stream, start) in greedy_windows(tg, problem.streams, size):
        moved = {v: max(win.lo, t + data.draw(st.sampled_from([0, 0, -3, -1, 1, 4])))
                 for v, t in start.items()}
        assert feasible(tg, win, stream, moved) == cp_sat_accepts(
            tg, win, problem.streams, (stream, start), moved)


def _busy_origin() -> SchedulingProblem:
    """``z`` (zero duration, two readers) opens the second window of two tasks, whose
    origin ``b``'s end precedes ``long``'s: stream 0 is still busy there."""
    g = nx.DiGraph()
    for i, (n, d) in enumerate([("long", 100.0), ("b", 1.0), ("z", 0.0), ("c1", 1.0),
                                ("c2", 1.0)]):
        g.add_node(n, duration=d, share=0.0, order=i)
    g.add_edges_from([("z", "c1"), ("z", "c2"), ("b", "c1")])
    return SchedulingProblem(g, streams=2)


def test_a_zero_duration_task_may_open_a_window_on_a_stream_still_busy():
    p = _busy_origin()
    tg = build_tasks(p)
    second, plan = list(greedy_windows(tg, 2, 2))[1]
    z = tg.members.index(("z",))
    assert z in second.tasks and second.free[0] > second.lo
    assert (plan[0][z], plan[1][z]) == (0, second.lo)  # on stream 0, still busy with long
    assert feasible(tg, second, *plan)  # CP-SAT's no-overlap lets it touch the busy interval
    s = solve(p, "cpsat", window=2, time_limit=0.5, cache=False, wall_clock=False)
    assert_valid(p, s)
    assert s.stats.windows == 3 and s.makespan == pytest.approx(100.0)


def test_no_task_is_placed_over_a_zero_duration_task_of_its_stream():
    # n4 (zero duration, a join) lands on stream 0 at 6 before n5, of lower rank, looks for
    # a gap there: [5, 10) would hold it strictly inside, which CP-SAT's no-overlap refuses
    g = nx.DiGraph([("n0", "n5"), ("n1", "n2"), ("n1", "n3"), ("n2", "n4"), ("n3", "n4"),
                    ("n4", "n6")])
    for i, d in enumerate([5.0, 0.0, 3.0, 3.0, 0.0, 5.0, 5.0]):
        g.add_node(f"n{i}", duration=d, share=0.0, order=i)
    p = SchedulingProblem(g, streams=2)
    tg = build_tasks(p, merge_zero=False)
    [(win, plan)] = greedy_windows(tg, 2, 150)
    assert violation(tg, win, *plan) is None
    assert cp_sat_accepts(tg, win, 2, plan, plan[1])


def _overloaded_boundary() -> TaskGraph:
    """Shares that the 1.5x ladder model lets overlap: re-timed with the sync latency and
    without the capacity, its first window left the next one a device over capacity."""
    g = nx.DiGraph()
    for i, (d, r) in enumerate([(5.0, 0.6), (2.0, 0.6), (2.0, 0.0), (1.0, 1.0), (4.0, 1.0)]):
        g.add_node(f"n{i}", duration=d, share=r, order=i)
    g.add_edges_from([("n1", "n3"), ("n2", "n4")])
    return build_tasks(SchedulingProblem(g, 2, sync_latency_us=1.0), capacity_factor=1.5,
                       merge_zero=False)


def test_an_approximate_window_leaves_the_next_a_device_within_its_capacity(caplog):
    caplog.set_level(logging.DEBUG, logger="autostream")
    plan = task_plan.plan_tasks(_overloaded_boundary(), 2, 0.2,
                                CpsatOptions(window=2, wall_clock=False, workers=1),
                                approximate=True)
    assert plan.found and plan.windows == 3
    assert HINTLESS not in caplog.text


@settings(max_examples=40, deadline=None)
@given(problems(max_nodes=12), st.integers(2, 4), st.booleans(), st.sampled_from([1.0, 1.5]))
def test_every_window_of_a_plan_gets_a_hint_and_a_solution(problem, size, approximate, factor):
    problem = _with_latency(problem, 1.0)
    tg = build_tasks(problem, capacity_factor=factor, merge_zero=not approximate)
    with _debug_log() as records:  # caplog is per test, not per example
        plan = task_plan.plan_tasks(tg, problem.streams, 0.05,
                                    CpsatOptions(window=size, wall_clock=False, workers=1),
                                    approximate=approximate)
    assert plan.found, plan.status
    assert not [r for r in records if HINTLESS in r.getMessage()]


@contextlib.contextmanager
def _debug_log():
    """The records ``autostream`` logs, debug included, while in the block."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("autostream")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_window_no_hint_fits_is_solved_without_one_and_says_why(monkeypatch, caplog):
    def broken(tg, win, streams, rank):  # every task at the origin on stream 0: overlaps
        return {v: 0 for v in win.tasks}, {v: win.lo for v in win.tasks}

    monkeypatch.setattr(task_plan, "greedy_window", broken)
    caplog.set_level(logging.DEBUG, logger="autostream")
    p = _busy_origin()
    tg = build_tasks(p)
    plan = task_plan.plan_tasks(tg, 2, 0.5, CpsatOptions(window=2, wall_clock=False, workers=1))
    assert plan.found and plan.windows == 3
    assert f"{HINTLESS}: no candidate satisfies the model (greedy: tasks" in caplog.text
    spans: dict[int, list[tuple[int, int]]] = {}
    for v in range(len(tg)):
        spans.setdefault(plan.stream[v], []).append((plan.start[v], plan.start[v] + tg.duration[v]))
    for ivs in spans.values():  # CP-SAT's own plan, not the broken one
        busy = sorted(iv for iv in ivs if iv[1] > iv[0])
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(busy))
