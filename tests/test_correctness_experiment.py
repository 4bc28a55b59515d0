"""``experiments/correctness.py`` counts what it runs and lists every mismatch."""

from __future__ import annotations

import pytest

from autostream.equivalence import Check, check_against_eager
from experiments import correctness, headline


def test_the_report_counts_cases_and_names_each_mismatch():
    case = correctness.Case
    results = [
        correctness.Result(case("m", "heft", "threads", "no_grad"),
                           Check(True, True, bitwise=True)),
        correctness.Result(case("m", "heft", "threads", "inference_mode"),
                           Check(True, True, mismatch="call 0 output 1: dtype x != y")),
        correctness.Result(case("m", "heft", "threads", "training"),
                           Check(True, False, not_lifted=("Dynamo node 'a' (f) changes it",))),
        correctness.Result(case("m", "heft", "threads", "autocast_bf16"),
                           Check(False, False, skipped="eager raised RuntimeError: no")),
    ]
    text = correctness.report(results, 1.0)
    # 3 ran: 1 mismatch, 1 bitwise, 1 within rounding only (the training case)
    assert "| m | 3 | 1 | 1 | 1 | 3 | 2 | 1 |" in text
    assert "- m / threads: 1 cases" in text.split("**Within rounding only")[1]
    assert "- m / heft / threads / inference_mode: call 0 output 1: dtype x != y" in text
    assert "- 1 x Dynamo node '...' (f) changes it" in text
    assert "- m / autocast_bf16: eager raised RuntimeError: no (1 cases)" in text


def test_one_real_case_runs_matches_and_records_its_headline_rows(capsys, tmp_path):
    code = correctness.main(["--models", "running_stats", "--solvers", "heft", "--modes",
                             "no_grad", "--runtimes", "threads", "--deterministic"])
    out = capsys.readouterr().out
    assert code == 0
    # deterministic=True: equal to eager bit for bit
    assert "| running_stats | 1 | 0 | 1 | 0 | 1 | 1 | 0 |" in out
    assert "deterministic=True" in out
    # the suite points AUTOSTREAM_HEADLINES at the test's directory (conftest.py)
    mismatches, exact, applied = headline.load(tmp_path / "headlines" / "correctness.json")
    assert (mismatches.measured, mismatches.met) == ("0", True)
    assert exact.measured == "1 / 0 of 1"
    assert (applied.measured, applied.met) == ("1 / 1 of 1", None)


@pytest.mark.slow
def test_the_sweep_catches_segments_that_hand_out_one_tensor_on_every_call(monkeypatch):
    """``fresh_tensors`` with outputs edited between calls: exact on the runtime, a mismatch
    on the former TorchScript segments (kept in ``experiments/`` for timing only)."""
    import autostream.runtime.threads as threads_module
    from experiments.torchscript_segments import TorchScriptSegments

    def check() -> Check:
        return check_against_eager(correctness.fresh_tensors, "no_grad",
                                   calls=correctness.CALLS, edit_outputs=True, max_streams=2,
                                   cost_table="h200", measure=0, runtime="threads",
                                   solver="cpsat", time_limit=2.0)

    exact = check()
    assert exact.applied and exact.mismatch == ""
    monkeypatch.setattr(threads_module, "SegmentRunner", TorchScriptSegments)
    assert check().mismatch.startswith("call 2 output")
