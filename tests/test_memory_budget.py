"""The memory budget: parsing and bad input, the planner never applying a plan over it."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import autostream
from autostream.fx.capture import capture
from autostream.memory.budget import DEFAULT_MAX_MEMORY_INCREASE, MemoryBudget
from autostream.memory.predict import GraphMemory, predict_memory
from autostream.models.zoo import parallel_block
from autostream.planning import fit as planning_fit
from autostream.planning.evaluate import FitInputs, evaluate
from autostream.planning.fit import fit_plan
from autostream.planning.plan import PlanOptions, plan_graph
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.solvers import get_solver
from tests.factories import random_problem
from tests.helpers import as_tuple


@pytest.mark.parametrize("text, fraction, nbytes", [
    (0.1, 0.1, None), ("10%", 0.1, None), (0, 0.0, None), ("0", 0.0, None), ("512MiB", None, 512 * 2**20),
    ("1GB", None, 10**9), ("4096 B", None, 4096), ("10%,2MiB", 0.1, 2 * 2**20),
])
def test_budget_forms(text, fraction, nbytes):
    assert MemoryBudget.parse(text) == MemoryBudget(fraction, nbytes)


def test_budget_limits():
    assert MemoryBudget.parse(0).limit(1000) == 1000
    assert MemoryBudget.parse("10%,1KiB").limit(1000) == 1000 + 1024  # the larger allowance
    assert MemoryBudget.parse("10%,1KiB").limit(10**6) == 1_100_000
    assert MemoryBudget.parse(None) is None and MemoryBudget.parse("none") is None
    assert MemoryBudget.parse(DEFAULT_MAX_MEMORY_INCREASE).limit(10**9) == 1_100_000_000


@pytest.mark.parametrize("bad, why", [
    (-0.1, "must be >= 0"), ("-512MiB", "must be >= 0"), ("lots", "cannot read 'lots'"),
    ("12 parsecs", "cannot read"), (float("nan"), "must be >= 0"), (True, "must be a number"),
    (float("inf"), "use None for no budget"), ("10", "'10' is a bare number: write '10%'"),
    (10, "would allow +1000%; write '10%'"), ("0.1", "bare number"),
    ("10%,2MiB,3", "has 3 parts"), ("10%,20%", "gives two percentages"),
    ("1MiB,2MiB", "gives two sizes"),
])
def test_bad_budgets_name_the_option_at_construction(bad, why):
    for make in (lambda: autostream.AutoStreamPass(max_memory_increase=bad),
                 lambda: autostream.backend(max_memory_increase=bad),
                 lambda: PlanOptions(max_memory_increase=bad)):
        with pytest.raises(ValueError, match="max_memory_increase") as info:
            make()
        assert why in str(info.value)


@pytest.mark.slow
def test_bad_budget_on_the_command_line_names_the_flag():
    out = subprocess.run(
        [sys.executable, "-m", "autostream.cli", "plan", "autostream.models.zoo:article_model",
         "--max-memory-increase", "-1"], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "--max-memory-increase must be >= 0" in out.stderr


def test_budget_is_part_of_the_pass_identity():
    a, b = autostream.AutoStreamPass(), autostream.AutoStreamPass(max_memory_increase=0)
    assert a != b and a.digest() != b.digest()


def _random_problem(seed: int, n: int, streams: int):
    problem = random_problem(seed, n, streams=streams, max_parents=3)
    rng = random.Random(seed)
    sizes = {v: rng.choice([0, 1, 8, 64, 256, 1024]) for v in problem.graph}
    return problem, GraphMemory.from_sizes(problem.graph, sizes)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 24), streams=st.integers(2, 4),
       solver=st.sampled_from(["heft", "critical_path", "round_robin", "opara"]),
       fraction=st.sampled_from([0.0, 0.05, 0.25]))
def test_a_fitted_plan_never_exceeds_its_budget(seed, n, streams, solver, fraction):
    problem, memory = _random_problem(seed, n, streams)
    inputs = FitInputs(problem.graph, problem, memory, solver)
    single = evaluate(inputs, get_solver("single")(problem), problem)
    candidate = evaluate(inputs, get_solver(solver)(problem), problem, how=solver)
    limit = MemoryBudget(fraction).limit(single.memory.peak_bytes)
    chosen, notes = fit_plan(inputs, candidate, single, limit, 0.01)
    # checked again from scratch: its syncs order every dependence (and its ordering
    # edges), and no interleaving of its streams peaks above the budget
    timeline = simulate_plan(chosen.problem, chosen.schedule, chosen.syncs or None)
    again = predict_memory(memory, chosen.schedule, chosen.syncs, timeline)
    assert again.peak_bytes <= again.bound_bytes <= limit
    assert set(problem.graph.edges) <= set(chosen.problem.graph.edges)
    if candidate.memory.bound_bytes > limit:
        assert notes and "over the budget" in notes[0]
    else:
        assert chosen is candidate


@pytest.fixture(scope="module")
def fan_out():
    [graph] = capture(*parallel_block(tokens=256))
    return graph


def _plan(graph, streams, budget):
    return plan_graph(graph.gm, PlanOptions(max_streams=streams, solver="heft", cost_table="h200",
                                            max_memory_increase=budget))


def test_fan_out_model_keeps_most_of_its_speed_up_within_the_default_budget(fan_out,
                                                                            monkeypatch):
    free = _plan(fan_out, 2, None)
    assert free.memory.increase >= 0.30 and free.predicted_speedup > 1.3
    solves = []
    solve = planning_fit._solve
    monkeypatch.setattr(planning_fit, "_solve",
                        lambda name, *args: solves.append(name) or solve(name, *args))
    fitted = _plan(fan_out, 2, "10%,256KiB")
    m = fitted.memory
    assert m.peak_bytes <= m.bound_bytes <= m.limit_bytes < free.memory.peak_bytes
    assert fitted.schedule.streams_used == 2 and m.how != "as solved"
    kept = (fitted.predicted_speedup - 1) / (free.predicted_speedup - 1)
    assert kept > planning_fit.KEEP_GAIN
    assert solves == []  # the repair kept enough of the gain: nothing was solved again
    strict = _plan(fan_out, 2, 0)
    assert strict.memory.bound_bytes <= strict.memory.single_stream_peak_bytes


@pytest.mark.slow
def test_summary_and_json_carry_the_peaks(fan_out, tmp_path):
    s = _plan(fan_out, 2, 0).summary()
    assert s["peak_bound_bytes"] <= s["single_stream_peak_bytes"] == s["memory_limit_bytes"]
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "autostream.cli", "plan", "autostream.models.zoo:parallel_block",
         "--streams", "2", "--solver", "heft", "--cost-table", "h200",
         "--max-memory-increase", "0", "--json", str(out)],
        capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["peak_bytes"] <= data["peak_bound_bytes"] <= data["single_stream_peak_bytes"] > 0
    assert "peak memory" in done.stdout


def test_compiled_fan_out_within_budget_computes_what_the_model_computes():
    torch._dynamo.reset()
    model, inputs = parallel_block(tokens=256)
    be = autostream.backend(max_streams=3, solver="heft", cost_table="h200", measure=0,
                            max_memory_increase="10%,256KiB", sanitize=True)
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        expected, got = as_tuple(model(*inputs)), as_tuple(compiled(*inputs))
    torch._dynamo.reset()
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    report = be.autostream_pass.last_report
    assert report.applied and report.plan.memory.bound_bytes <= report.plan.memory.limit_bytes


@pytest.mark.parametrize("keep_gain, tried", [(0.0, False), (0.99, True)])
def test_a_repair_that_keeps_little_of_the_gain_also_tries_fewer_streams(fan_out, monkeypatch,
                                                                          keep_gain, tried):
    # 3 streams: what the first repairs keep is under 99% of the gain, never under 0%
    monkeypatch.setattr(planning_fit, "KEEP_GAIN", keep_gain)
    solves = []
    solve = planning_fit._solve
    monkeypatch.setattr(planning_fit, "_solve",
                        lambda name, problem, *args: solves.append((name, problem.streams))
                        or solve(name, problem, *args))
    fitted = _plan(fan_out, 3, "10%,256KiB")
    assert fitted.memory.bound_bytes <= fitted.memory.limit_bytes
    assert (("heft", 2) in solves) is tried, solves
