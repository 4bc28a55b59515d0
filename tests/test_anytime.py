"""Anytime planning in the backend (issue 50): a fast plan at compile, CP-SAT's plan from a
background thread, switched between calls; the plan cache, fork, exit, ranks, strict mode.

The suite plans synchronously (``conftest.py``); these tests turn background planning on,
and wait for the background plan where a test needs it finished (never on a timing).
"""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import autostream
from autostream.models.zoo import ZOO, multihead_block, two_branch_gemv
from autostream.passes import AutoStreamPass
from autostream.planning.anytime import ANYTIME_ENV, BackgroundPlan
from autostream.runtime.switch import PlanSwitch
from tests.factories import largest_graph
from tests.helpers import as_tuple
from tests.test_comm import two_allreduces

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def anytime(monkeypatch):
    monkeypatch.setenv(ANYTIME_ENV, "on")


def _compile(model, inputs, **options):
    torch._dynamo.reset()
    fn = autostream.backend(**options)
    compiled = torch.compile(model, backend=fn)
    return fn, compiled


def _streams(report) -> dict:
    return dict(report.plan.schedule.stream_of)


def _synchronous(model, inputs, monkeypatch, **options):
    """The report of a synchronous compile (its plan kept out of the plan cache)."""
    with monkeypatch.context() as m:
        m.setenv(ANYTIME_ENV, "off")
        m.setenv("AUTOSTREAM_PLAN_CACHE", "off")
        fn, compiled = _compile(model, inputs, **options)
        with torch.no_grad():
            compiled(*inputs)
    return fn.last_report


def test_compile_returns_the_fast_plan_and_switches_between_calls(monkeypatch):
    model, inputs = multihead_block()
    sync = _synchronous(model, inputs, monkeypatch, measure=0, deterministic=True)
    fn, compiled = _compile(model, inputs, measure=0, deterministic=True)
    with torch.no_grad():
        expected = model(*inputs)
        first = compiled(*inputs)
        report = fn.last_report
        fast = report.plan
        assert report.applied and fast.schedule.solver != "cpsat"
        assert fast.predicted_us > sync.plan.predicted_us  # CP-SAT's is better here
        assert report.anytime.job.state == "waiting"  # starts at a later call
        compiled(*inputs)
        assert report.anytime.wait(120)
        assert report.plan is fast  # finished, not yet switched
        third = compiled(*inputs)
    assert report.plan.schedule.solver == "cpsat"
    assert _streams(report) == _streams(sync) and report.plan.predicted_us == sync.plan.predicted_us
    segments = report.anytime.segments
    assert [(s.first, s.last) for s in segments] == [(1, 2), (3, None)]
    assert "CP-SAT's plan from call 3" in report.summary()
    assert report.plan.schedule.streams_used == 2 and report.streams_used == 2
    for out in (first, third):
        assert all(torch.equal(a, b) for a, b in zip(as_tuple(out), as_tuple(expected),
                                                      strict=True))


def test_a_call_in_flight_finishes_on_the_plan_it_started_with():
    started, release, ran = threading.Event(), threading.Event(), []

    def old(x):
        if x == 2:  # the call in flight
            started.set()
            release.wait(10)
        ran.append(("old", x))
        return x

    class Job:
        state, finished, seconds = "waiting", False, 0.0

        def start(self):
            self.state = "running"

        def cancel(self):
            pass

    job = Job()
    switch = PlanSwitch(old, job, lambda j: (lambda x: ran.append(("new", x)) or x, "better"),
                        "fast", "new")
    switch(0)
    switch(1)  # starts the job
    job.state, job.finished = "running", False
    caller = threading.Thread(target=switch, args=(2,))
    caller.start()
    assert started.wait(10)
    job.state, job.finished = "done", True  # the plan finishes while call 3 runs
    switch(4)  # the next call's entry switches (the lock is not held during a call)
    release.set()
    caller.join(10)
    assert ("old", 2) in ran and ("new", 4) in ran and ("new", 2) not in ran


def test_the_measured_choice_measures_the_new_plan_alone(monkeypatch):
    model, inputs = multihead_block()
    fn, compiled = _compile(model, inputs, measure=2)
    with torch.no_grad():
        compiled(*inputs)
        report = fn.last_report
        first = report.choice
        assert report.anytime.wait(120)
        while first.measuring:  # no switch while the first decision is measured
            compiled(*inputs)
        fast = report.plan
        assert fast.schedule.solver != "cpsat" and "streams" in first.candidates
        before = {n: list(s) for n, s in first.samples.items() if n != "streams"}
        old = first.candidates["streams"]
        compiled(*inputs)  # the switch, at this call's entry
        assert report.plan.schedule.solver == "cpsat"
        assert report.choice is first and first.measuring
        while first.measuring:
            compiled(*inputs)
    assert first.candidates["streams"] is not old and len(first.samples["streams"]) == 2
    assert {n: s for n, s in first.samples.items() if n != "streams"} == before  # not re-timed


def test_the_background_plan_fills_the_plan_cache_for_the_next_compile(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOSTREAM_PLAN_CACHE", str(tmp_path / "plans"))
    model, inputs = two_branch_gemv()
    fn, compiled = _compile(model, inputs, measure=0)
    with torch.no_grad():
        compiled(*inputs)
        fn.last_report.anytime.wait(120)
        compiled(*inputs)
    background = fn.last_report
    assert list((tmp_path / "plans").rglob("*.json"))
    again, compiled = _compile(model, inputs, measure=0)  # as a new process would
    with torch.no_grad():
        compiled(*inputs)
    report = again.last_report
    assert report.anytime is None  # every solve answered by the cache: nothing to improve
    assert report.plan.schedule.solver == "cpsat" and _streams(report) == _streams(background)


def test_graphs_that_communicate_plan_synchronously():
    anytime = AutoStreamPass(max_streams=2).apply(two_allreduces(), anytime=True)
    assert anytime.background is None and anytime.plan.schedule.solver != "heft"
    model, inputs = two_branch_gemv()  # the same call without communication: fast plan
    report = AutoStreamPass(max_streams=2).apply(largest_graph(model, inputs), inputs,
                                                 anytime=True)
    assert isinstance(report.background, BackgroundPlan)


def test_an_explicit_time_limit_plans_synchronously():
    model, inputs = two_branch_gemv()
    fn, compiled = _compile(model, inputs, measure=0, time_limit=0.5)
    with torch.no_grad():
        compiled(*inputs)
    assert fn.last_report.anytime is None
    assert fn.last_report.plan.schedule.solver == "cpsat"


def _failing(monkeypatch):
    def boom(self, gm, example_inputs, runtime):
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(AutoStreamPass, "_plan_in_thread", boom)


def test_strict_mode_raises_a_background_failure_at_the_next_call(monkeypatch):
    _failing(monkeypatch)
    model, inputs = two_branch_gemv()
    fn, compiled = _compile(model, inputs, measure=0)
    with torch.no_grad():
        compiled(*inputs)
        fn.last_report.anytime.wait(60)
        with pytest.raises(Exception, match="background CP-SAT plan failed: solver exploded"):
            compiled(*inputs)


def test_without_strict_a_background_failure_keeps_the_fast_plan(monkeypatch, caplog):
    monkeypatch.setenv("AUTOSTREAM_STRICT", "0")
    _failing(monkeypatch)
    model, inputs = two_branch_gemv()
    fn, compiled = _compile(model, inputs, measure=0, deterministic=True)
    with torch.no_grad():
        expected = model(*inputs)
        compiled(*inputs)
        fn.last_report.anytime.wait(60)
        out = compiled(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(out, expected, strict=True))
    assert "solver exploded" in fn.last_report.anytime.describe()
    assert "the fast plan stays" in caplog.text


def test_dropping_the_graph_cancels_its_background_plan():
    model, inputs = multihead_block()
    fn, compiled = _compile(model, inputs, measure=0)
    with torch.no_grad():
        compiled(*inputs)
    job = fn.last_report.anytime.job
    del compiled
    torch._dynamo.reset()
    gc.collect()
    assert job.state == "cancelled"


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, ANYTIME_ENV: "on", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_process_that_exits_while_cp_sat_plans_does_not_hang():
    out = _run("""
        import atexit, torch
        jobs = []
        atexit.register(lambda: print("at exit:", jobs[0].state))  # runs after autostream's
        import autostream
        from autostream.models.zoo import parallel_block
        model, inputs = parallel_block()
        fn = autostream.backend(measure=0)
        compiled = torch.compile(model, backend=fn)
        with torch.no_grad():
            compiled(*inputs)
            jobs.append(fn.last_report.anytime.job)
            jobs[0].start()  # CP-SAT in the background (about a second of search)
        print(jobs[0].state)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["running", "at", "exit:", "cancelled"], out.stdout


@pytest.mark.slow
def test_a_forked_child_runs_the_fast_plan_and_does_not_wait():
    out = _run("""
        import os, torch, autostream
        from autostream.models.zoo import parallel_block
        model, inputs = parallel_block()
        fn = autostream.backend(measure=0)
        compiled = torch.compile(model, backend=fn)
        with torch.no_grad():
            expected = model(*inputs)
            compiled(*inputs)
            fn.last_report.anytime.job.start()  # CP-SAT in the background
            pid = os.fork()
            if pid == 0:  # a DataLoader worker, say (one intra-op thread, as it sets)
                torch.set_num_threads(1)
                job = fn.last_report.anytime.job
                ok = job.state == "forked" and not job.wait(0.1)
                ok = ok and all(torch.equal(compiled(*inputs), expected) for _ in range(3))
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("name", ["multihead", "parallel", "two_branch_gemv"])
def test_the_final_plan_is_the_synchronous_plan(name, monkeypatch):
    model, inputs = ZOO[name]()
    sync = _synchronous(model, inputs, monkeypatch, measure=0)
    fn, compiled = _compile(model, inputs, measure=0)
    with torch.no_grad():
        compiled(*inputs)
        fn.last_report.anytime.wait(120)
        compiled(*inputs)
    report = fn.last_report
    assert report.plan.predicted_us == sync.plan.predicted_us
    if "predicted no faster" not in report.anytime.outcome:  # else a tie: no switch
        assert _streams(report) == _streams(sync)


def test_the_torchair_pass_plans_synchronously_and_names_its_time_limit():
    model, inputs = two_branch_gemv()
    gm = largest_graph(model, inputs)
    report = AutoStreamPass(max_streams=2).run(gm, inputs, mode="max-autotune")
    assert report.background is None and report.plan.schedule.solver == "cpsat"
    assert "search budget 0.03 s (by the graph's size: no time_limit)" in report.summary()


@pytest.mark.slow
def test_on_the_graph_runtime_the_new_plan_is_captured_anew(monkeypatch):
    from tests.fake_device import patch_backend_to_fake_capture

    graphs = patch_backend_to_fake_capture(monkeypatch)
    model, inputs = multihead_block()
    fn, compiled = _compile(model, inputs, cost_table="cpu", measure=2, runtime="graph")
    with torch.no_grad():
        want = as_tuple(model(*inputs))
        compiled(*inputs)
        report = fn.last_report
        fast = report.plan
        assert report.anytime.wait(120)
        for _ in range(200):  # the switch, then the new plan's measurement
            got = as_tuple(compiled(*inputs))
            if report.plan is not fast and not report.choice.measuring:
                break
        assert report.plan is not fast, report.anytime.describe()
        assert report.plan.predicted_us < fast.predicted_us  # only a faster plan switches
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert report.runtime == "graph" and report.plan.schedule.solver == "cpsat"
    labels = [label for label, _ in report.graph_runners]
    assert labels.count("new plan") == 1 and len(graphs) == labels.count("plan") + 2
    lines = report.runtime_lines()
    assert any("plan: " in line and "replaced by the new plan" in line for line in lines)
    assert any("new plan: captured 1 graph" in line for line in lines)


def test_a_background_plan_predicted_no_faster_does_not_switch(monkeypatch):
    """Switching costs a measurement (and a capture on the graph runtime): CP-SAT's plan
    takes over only where it is predicted faster than the fast plan."""
    backend_module = importlib.import_module("autostream.backend")
    model, inputs = multihead_block()
    monkeypatch.setattr(backend_module, "_predicted", lambda report: 1.0)  # a tie
    fn, compiled = _compile(model, inputs, measure=0, deterministic=True)
    with torch.no_grad():
        compiled(*inputs)
        fast = fn.last_report.plan
        compiled(*inputs)
        assert fn.last_report.anytime.wait(120)
        compiled(*inputs)
    report = fn.last_report
    assert report.plan is fast and fast.schedule.solver != "cpsat"
    assert [(s.first, s.last) for s in report.anytime.segments] == [(1, None)]
    assert "predicted no faster (1.0 us, the fast plan 1.0 us)" in report.anytime.outcome
