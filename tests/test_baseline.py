"""Eager at its best intra-op thread count (``autostream.runtime.baseline``): the candidates
a plan is compared with, and the caller's thread count kept."""

from __future__ import annotations

import pytest
import torch

from autostream.backend import BackendReport
from autostream.runtime.baseline import (
    at_threads,
    baseline_text,
    eager_candidates,
    label,
    plan_threads,
    thread_counts,
)
from autostream.runtime.choice import MeasuredChoice
from autostream.runtime.machine import BUSY_SHARE, Reading


@pytest.fixture()
def two_threads():
    """The caller on 2 intra-op threads, its own count restored after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_candidate_runs_at_its_count_and_restores_the_callers_also_when_it_raises(two_threads):
    seen = []
    run = at_threads(lambda x: seen.append(torch.get_num_threads()) or x + 1, 1)
    assert run(1) == 2 and seen == [1] and torch.get_num_threads() == 2

    def boom(x):
        seen.append(torch.get_num_threads())
        raise IndexError("op failed")

    with pytest.raises(IndexError, match="op failed"):
        at_threads(boom, 1)(0)
    assert seen == [1, 1] and torch.get_num_threads() == 2
    assert at_threads(boom, 1).intra_op_threads == 1


def test_a_measured_choice_over_thread_counts_leaves_the_callers_count(two_threads):
    x = torch.randn(8, 64)
    w = torch.randn(64, 64)
    candidates = {"eager": lambda: x @ w, **eager_candidates(lambda: x @ w, "threads", 2,
                                                             cores=2)}
    assert list(candidates) == ["eager", "eager (1 thread)"]
    now = [0.0]
    choice = MeasuredChoice(candidates, trials=3, settle_s=0.0,
                            clock=lambda: now.__setitem__(0, now[0] + 1e-4) or now[0])
    for _ in range(20):
        torch.testing.assert_close(choice(), x @ w)  # within rounding: another count
        assert torch.get_num_threads() == 2


def test_counts_run_from_one_to_what_the_plan_uses_without_the_callers_or_beyond_the_cores():
    assert plan_threads(2, 2) == 2  # 1 + 1: the 2-core machine
    assert thread_counts(plan_threads(2, 2), 2, cores=2) == [1]
    # a caller on one thread: none (more threads than the caller chose, and eager's bits,
    # which the plan gives that caller, would no longer be the kept candidate's)
    assert thread_counts(plan_threads(2, 1), 1, cores=2) == []
    for cores in (1, 2, 3, 8, 64, 192):
        for caller in (1, 2, cores):
            for streams in (1, 2, 4):
                counts = thread_counts(plan_threads(streams, caller), caller, cores)
                assert caller not in counts and all(1 <= k <= min(cores, caller)
                                                    for k in counts)
                assert counts == sorted(set(counts)) and len(counts) <= 4 + cores.bit_length()
                assert caller == 1 or counts[0] == 1


def test_only_the_threads_runtime_without_deterministic_gets_candidates():
    assert list(eager_candidates(abs, "threads", 2, caller=2, cores=2)) == [label(1)]
    assert eager_candidates(abs, "threads", 2, deterministic=True, caller=2, cores=2) == {}
    assert eager_candidates(abs, "streams", 2, caller=2, cores=2) == {}
    assert eager_candidates(abs, "sequential", 2, caller=2, cores=2) == {}


def _decided(durations: dict[str, float], reading_end: Reading) -> MeasuredChoice:
    """A measured choice over fake candidates taking ``durations`` seconds each, decided."""
    now = [0.0]
    readings = iter([Reading(0.0, 0.3, 0.0, 0.0), reading_end])

    def taking(seconds):
        def run(x):
            now[0] += seconds
            return x
        return run

    candidates = {"streams": taking(durations["streams"]), "eager": taking(durations["eager"]),
                  label(1): at_threads(taking(durations[label(1)]), 1)}
    choice = MeasuredChoice(candidates, trials=3, clock=lambda: now[0], settle_s=0.0,
                            default="eager", read_machine=lambda: next(readings))
    for _ in range(18):
        choice(0)
    assert choice.choice is not None
    return choice


def test_the_report_names_the_fastest_single_stream_its_threads_and_the_load():
    choice = _decided({"streams": 1.5e-3, "eager": 12e-3, label(1): 1.4e-3},
                      Reading(10.0, 3.1, 12.0, 8.0))
    report = BackendReport(10, "cpu", False, choice=choice, baselines=("eager", label(1)),
                           caller_threads=2)
    assert report.baseline == (label(1), 1)
    assert choice.choice == label(1)  # eager at 1 thread cleared the margin against eager
    assert baseline_text(choice, report.baselines, 2).startswith(
        "fastest single stream: eager (1 thread); streams 0.93x as fast as it; load average 0.3 "
        "-> 3.1")
    # 12 busy core-seconds in 10 s, 8 of them ours: others kept 0.4 cores busy
    figures = report.figures()
    assert (figures["baseline"], figures["baseline_threads"]) == (label(1), 1)
    assert figures["load"]["others_cores"] == pytest.approx(0.4)
    assert figures["load"]["busy"] is (0.4 > BUSY_SHARE * figures["load"]["cores"])


def test_a_choice_measured_while_busy_is_reported_unreliable():
    choice = _decided({"streams": 1.5e-3, "eager": 12e-3, label(1): 1.4e-3},
                      Reading(10.0, 3.1, 10.0 + 10.0 * 64, 0.0))  # others on every core
    report = BackendReport(10, "cpu", False, choice=choice, baselines=("eager", label(1)),
                           caller_threads=2)
    line = report.measured_line()
    assert line.startswith(f"unreliable (busy: other processes kept {choice.load.cores:.2f} of "
                           f"{choice.load.cores} cores busy during the timing (load average 0.3 "
                           f"-> 3.1 on {choice.load.cores} cores)): measured over 3")
    assert report.figures()["load"]["busy"] is True


def test_a_busy_machine_does_not_blame_the_cost_table(monkeypatch, caplog):
    import logging
    from types import SimpleNamespace

    from autostream.backend import _chosen

    monkeypatch.setattr(BackendReport, "prediction_check",
                        lambda self: ("one stream predicted 9625 us, measured 555255 us", True))
    for others_s, warned in ((10.0 * 64, False), (0.0, True)):  # busy, then quiet
        choice = _decided({"streams": 1.5e-3, "eager": 12e-3, label(1): 1.4e-3},
                          Reading(10.0, 0.3, others_s, 0.0))
        report = BackendReport(10, "cpu", False, choice=choice, baselines=("eager", label(1)),
                               passes=[SimpleNamespace(applied=True, cost_table="'cpu'")])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="autostream"):
            _chosen(report)
        assert any("is far from this machine" in r.message for r in caplog.records) is warned
