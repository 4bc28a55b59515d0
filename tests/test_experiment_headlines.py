"""Each experiment's headline rows: ``met`` follows from the figures the script measured."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from experiments import (
    compare_solvers,
    cost_accuracy,
    distributed,
    memory,
    overlap,
    scale_benchmark,
    speedup,
    stg_benchmark,
    zoo_benchmark,
)


def _met(rows) -> list[bool | None]:
    return [r.met for r in rows]


def test_stg_rows_per_set_and_stream_count_and_one_for_the_planning_time():
    def case(graph_set, streams, gap, seconds, solver="cpsat"):
        return {"set": graph_set, "streams": streams, "solver": solver, "gap": gap,
                "seconds": seconds}

    rows = [case("50", 2, 0.0, 0.2), case("50", 2, 0.0, 0.4), case("100", 2, 0.0, 0.3),
            case("100", 2, 0.02, 6.0), case("100", 2, 0.5, 0.1, solver="heft")]
    lines = stg_benchmark.headlines(rows)
    assert [r.measured for r in lines] == ["0.00% (2/2)", "1.00% (1/2)", "0.35 s / 6.00 s"]
    assert _met(lines) == [True, False, False]  # one instance off the best; one over 5 s
    assert "STG 100 tasks, 2 streams" in lines[1].what


def test_scale_rows_hold_small_graphs_to_time_and_gap_and_large_ones_to_time():
    assert scale_benchmark.headline(32, 5032, 6.0, 0.02).met is True
    assert scale_benchmark.headline(32, 5032, 6.0, 0.04).met is False
    assert scale_benchmark.headline(32, 5032, 10.5, 0.0).met is False
    with_collectives = scale_benchmark.headline(32, 5416, 6.0, 0.029, over_heft=1.11)
    assert with_collectives.met is True and "collectives" in with_collectives.what
    assert "1.11x over HEFT" in with_collectives.measured
    large = scale_benchmark.headline(128, 20_216, 19.0, 0.2)
    assert large.met is True and large.target == "<= 20 s" and "20,216 ops" in large.what


def test_zoo_rows_count_the_cases_within_each_target():
    def case(ops, seconds, gap=0.0, again=0.1, same=True, proven=False):
        return zoo_benchmark.Case("m", ops, "h200", 2, seconds, seconds / 2, again, same,
                                  (1 + gap) * 100.0, 120.0, 100.0, proven, 3)

    good = [case(4000, 4.0), case(6000, 15.0, gap=0.01)]
    assert _met(zoo_benchmark.headlines(good, 32, [(40, 0.2), (300, 2.0)])) == [True] * 4
    bad = [case(4000, 6.0, gap=0.05, again=0.7), case(6000, 15.0, same=False)]
    assert _met(zoo_benchmark.headlines(bad, 32, [(40, 0.6)])) == [False] * 4
    assert zoo_benchmark.headlines([], 32, [(300, 2.0)]) == []  # no small graph under 100 ops


def test_solver_comparison_rows():
    assert _met(compare_solvers.Versus(4, (), 2).headlines()) == [True, True]
    assert _met(compare_solvers.Versus(5, ("moe",), 2).headlines()) == [False, False]


def test_cost_accuracy_rows_judge_the_raw_median():
    pairs = [(10.0, 10.0), (12.0, 10.0), (10.0, 8.0)]  # errors 0%, 20%, 25%
    row = cost_accuracy.headline("ops", pairs, 1.0, 0.30)
    assert (row.met, row.measured.split(" ")[0]) == (True, "20.0%")
    assert cost_accuracy.headline("ops", pairs, 0.5, 0.10).met is False
    assert cost_accuracy.headline("ops", [], 1.0, 0.10).met is None


def _speedup_row(model, streams, measured, predicted, error):
    return speedup.Row(model, streams, 1.0, None, 1.0, 1.0, 1.0, "eager", predicted, measured,
                       measured, error, "")


def test_speedup_rows_skip_the_probes_and_judge_gemv_floor_and_prediction():
    rows = [_speedup_row("probe_gemv_2x8", 2, 0.5, float("nan"), float("nan")),
            _speedup_row(speedup.GEMV, 2, 1.45, 1.5, -0.03),
            _speedup_row("moe", 1, 0.98, 1.0, -0.02)]
    lines = speedup.headlines(rows, "cpu")
    assert [r.measured for r in lines][:2] == ["1.45x", "0.98x (moe)"]
    assert _met(lines) == [True, True, True]
    rows[1] = _speedup_row(speedup.GEMV, 2, 1.2, 1.6, -0.25)
    assert _met(speedup.headlines(rows, "cpu")) == [False, True, False]


def test_overlap_rows_only_inform():
    row = overlap.Row("moe", 40, 1.0, 1.2, 1.4, 1.6)
    [line] = overlap.headlines([row])
    assert line.met is None and line.measured == (
        "1.40x segments, 1.20x ops from Python, 1.60x former TorchScript segments")


def test_distributed_rows_hold_autostream_to_the_compiled_ceiling_only_where_it_gains():
    def row(name, single, auto, ceiling, wrong=0, predicted=1.5, eager_ceiling=None):
        # the graphs called directly skip Dynamo's frame: 0.2 ms a call here
        ms = {"eager": single, "single": single, "single graph": single - 0.2,
              "autostream": auto, "autostream graph": auto - 0.2, "chosen": auto,
              "ceiling": ceiling if eager_ceiling is None else eager_ceiling,
              "ceiling compiled": ceiling, "functional": single}
        return distributed.Row(name, ms, wrong, predicted, 1.0, "lifted plan")

    rows = [row("fsdp", 3.0, 2.0, 1.8, eager_ceiling=1.5),  # 1.5x of 1.67x: 75% of its gain
            row("probe", 1.0, 1.0, 0.95)]  # ceiling 1.05x: no target
    lines = distributed.headlines(rows, "gloo")
    assert _met(lines) == [False, None, True, False]  # 75% < 80%; ...; 0 wrong; probe 1.0 vs 1.5
    assert lines[0].measured == ("75% (1.50x vs 1.67x; of the eager overlap's 2.00x: 50%; "
                                 "graphs called without Dynamo's frame: 64%, the frame 200 us "
                                 "a call)")
    # judged against the compiled overlap, however far the eager one is
    lines = distributed.headlines([row("fsdp", 3.0, 1.9, 1.8, predicted=1.6,
                                       eager_ceiling=1.0)], "gloo")
    assert _met(lines) == [True, True, True]


def test_distributed_share_is_judged_only_where_the_rounds_resolve_it():
    """With each round's times, the share's bootstrap interval decides: a target inside
    the interval is unresolved (no verdict), an interval wholly below it a miss."""
    def row(auto_rounds):
        n = len(auto_rounds)
        rounds = {v: (3.0,) * n for v in distributed.VARIANTS}
        rounds["ceiling compiled"] = (2.0,) * n  # 1.5x
        rounds["autostream"] = tuple(auto_rounds)
        ms = {v: statistics.median(t) for v, t in rounds.items()}
        return distributed.Row("probe", ms, 0, 1.5, 1.0, "lifted plan", {}, rounds)

    noisy = row([1.7, 2.4] * 15)  # 1.76x or 1.25x a round: 153% or 50% of the gain
    lo, hi = noisy.share_interval()
    assert lo < distributed.SHARE < hi
    line = distributed.headlines([noisy], "gloo")[0]
    assert line.met is None and "do not resolve" in line.measured
    steady = row([2.4] * 30)  # 1.25x every round: 50%
    assert steady.share_interval() == pytest.approx((0.5, 0.5))
    assert distributed.headlines([steady], "gloo")[0].met is False
    assert distributed.headlines([row([1.9, 2.0] * 15)], "gloo")[0].met is True


def test_memory_rows_judge_the_prediction_the_default_budget_and_budget_zero():
    def row(predicted, measured, single=100, bound=None):
        return memory.Row("m", 2, single, single, predicted, [measured],
                          predicted if bound is None else bound)

    def plan(limit):
        return SimpleNamespace(memory=SimpleNamespace(limit_bytes=limit))

    default = memory.DEFAULT_MAX_MEMORY_INCREASE
    budgeted = [memory.Budgeted(default, 2, row(110, 110), plan(120), 0.9),
                memory.Budgeted(0, 2, row(100, 100), plan(100), 0.0)]
    lines = memory.headlines([row(105, 100), row(100, 100)], budgeted)
    assert _met(lines) == [True, True, True, True]
    budgeted = [memory.Budgeted(default, 2, row(110, 130), plan(120), 0.9),
                memory.Budgeted(0, 2, row(100, 101), plan(100), 0.0)]
    lines = memory.headlines([row(120, 100, bound=99)], budgeted)
    assert _met(lines) == [False, False, False, False]  # error 20%; measured above the bound
