"""The backend keeps whichever of plan and eager graph measured faster on the first calls."""

import statistics

import pytest
import torch

import autostream
from autostream.models.zoo import multihead_block
from autostream.runtime.baseline import eager_candidates
from autostream.runtime.choice import MeasuredChoice


def _timed(durations: dict[str, list[float]]):
    """Candidates that advance a fake clock by their next duration, and the clock: each
    candidate's durations are consumed in call order (warm-up calls included)."""
    now = [0.0]
    calls: list[str] = []

    def candidate(name):
        def run(x):
            calls.append(name)
            now[0] += durations[name].pop(0) if durations[name] else 1e-4
            return x
        return run

    return {name: candidate(name) for name in durations}, (lambda: now[0]), calls


def _rounds(warm: float, timed: list[float]) -> list[float]:
    """A candidate's durations over the rounds: a warm-up call, then a timed call, per round."""
    return [d for t in timed for d in (warm, t)]


def test_interleaved_rounds_one_warm_up_and_one_timed_call_per_block():
    choose = MeasuredChoice({"a": abs, "b": abs, "c": abs}, trials=2, settle_s=0.0)
    assert choose.schedule == [(n, timed) for n in "abccba" for timed in (False, True)]


def test_a_stall_in_one_round_does_not_flip_the_choice():
    # eager 200 us, the plan 390 us; in round 3 the machine stalls during eager's timed
    # call (60 ms), which would make the plan look 150x faster in that round
    fns, clock, calls = _timed({
        "streams": _rounds(400e-6, [390e-6] * 5),
        "eager": _rounds(200e-6, [200e-6, 200e-6, 60e-3, 200e-6, 200e-6])})
    choose = MeasuredChoice(fns, trials=5, clock=clock, default="eager", settle_s=0.0)
    for _ in range(20):
        choose(0)
    assert choose.choice == "eager" and choose.calls_to_decision == 20
    assert "streams 0.51x as fast as eager" in choose.reason
    # and the kept candidate answers every later call
    calls.clear()
    choose(0)
    assert calls == ["eager"]


def test_a_stall_does_not_flip_a_clear_win_either():
    fns, clock, _ = _timed({
        "streams": _rounds(1e-4, [100e-6, 100e-6, 100e-6, 50e-3, 100e-6]),
        "eager": _rounds(2e-4, [200e-6] * 5)})
    choose = MeasuredChoice(fns, trials=5, clock=clock, default="eager", settle_s=0.0)
    for _ in range(20):
        choose(0)
    assert choose.choice == "streams" and "clears the 5% margin" in choose.reason
    assert str(choose.timings["streams"]) == "100 us +- 0"


def test_a_close_race_keeps_the_default():
    fns, clock, _ = _timed({"streams": _rounds(1e-4, [97e-6] * 5),
                            "eager": _rounds(1e-4, [100e-6] * 5)})
    choose = MeasuredChoice(fns, trials=5, clock=clock, default="eager", settle_s=0.0)
    for _ in range(20):
        choose(0)
    assert choose.choice == "eager"
    assert choose.reason.endswith("does not clear the 5% margin")
    assert choose.describe().endswith("; runs eager: streams 1.03x as fast as eager (1.03x "
                                      "less the spread of 5 rounds) does not clear the 5% "
                                      "margin")


def test_every_figure_of_a_decision_is_a_speed_up_over_the_default_and_it_says_what_runs():
    # eager on one thread 3x as fast as eager (the default), the plan a bit slower than eager
    fns, clock, _ = _timed({"streams": _rounds(1e-4, [240e-6] * 3),
                            "eager": _rounds(1e-4, [200e-6] * 3),
                            "eager (1 thread)": _rounds(1e-4, [68e-6] * 3)})
    choose = MeasuredChoice(fns, trials=3, clock=clock, default="eager", settle_s=0.0)
    for _ in range(18):
        choose(0)
    text = choose.describe()
    assert text.endswith("; runs eager (1 thread): eager (1 thread) 2.94x as fast as eager "
                         "(2.94x less the spread of 3 rounds) clears the 5% margin")
    assert " of eager" not in text and "kept" not in text


def test_the_decision_takes_a_bounded_number_of_calls_however_short_they_are():
    # 0.2 ms calls: the choice comes after 2 calls per candidate and round, and each
    # block waits at most settle_s (here on a fake sleep) instead of calling more
    slept = []
    fns, clock, _ = _timed({"streams": [150e-6] * 10, "eager": [200e-6] * 10})
    choose = MeasuredChoice(fns, trials=5, clock=clock, default="eager", settle_s=0.02,
                            sleep=slept.append)
    for _ in range(20):
        choose(0)
    assert choose.calls_to_decision == 20 and choose.choice == "streams"
    # a wait at each change of candidate (a b | b a | a b ...: 5 changes), none longer
    # than the settling time
    assert len(slept) == 5 and all(0 < s <= 0.02 for s in slept)


def test_a_re_check_switches_when_the_kept_candidate_has_become_slower():
    durations = {"streams": _rounds(1e-4, [100e-6] * 5), "eager": _rounds(2e-4, [200e-6] * 5)}
    fns, clock, calls = _timed(durations)
    choose = MeasuredChoice(fns, trials=5, clock=clock, default="eager", settle_s=0.0,
                            recheck_after=10)
    for _ in range(20):
        choose(0)
    assert choose.choice == "streams"
    # the machine changes: the plan now takes 400 us, eager still 200 us
    durations["streams"] += [400e-6] * 100
    durations["eager"] += [200e-6] * 100
    calls.clear()
    for _ in range(9 + 12):  # 9 calls to the re-check, then 3 rounds of 2 blocks of 2 calls
        choose(0)
    assert calls[:9] == ["streams"] * 9 and calls.count("eager") == 6
    assert choose.choice == "eager" and choose.rechecks == 1 and choose.switches == 1
    assert choose.reason.startswith("re-check against streams: eager 2.00x as fast as streams")


def test_a_re_check_that_confirms_the_choice_doubles_the_interval():
    fns, clock, calls = _timed({"streams": [100e-6] * 200, "eager": [200e-6] * 200})
    choose = MeasuredChoice(fns, trials=3, clock=clock, default="eager", settle_s=0.0,
                            recheck_after=5)
    for _ in range(40):
        choose(0)
    # the decision at call 12; the first re-check at call 17 (5 more), 12 calls; the
    # next one 10 calls later, at call 38: its first eager call is call 40
    assert calls[16:28].count("eager") == 6 and calls[28:39] == ["streams"] * 11
    assert calls[39] == "eager"
    assert choose.choice == "streams" and choose.rechecks == 1
    assert choose.describe().endswith("re-checked 1 times, 0 switches")


def test_bad_options():
    with pytest.raises(ValueError, match="trials must be >= 1"):
        MeasuredChoice({"a": abs}, trials=0)
    with pytest.raises(ValueError, match="settle_s must be >= 0"):
        MeasuredChoice({"a": abs}, settle_s=-1.0)
    with pytest.raises(ValueError, match="margin must be in"):
        MeasuredChoice({"a": abs}, margin=1.5)
    with pytest.raises(ValueError, match="default 'x' is not a candidate"):
        MeasuredChoice({"a": abs}, default="x")
    with pytest.raises(ValueError, match="measure must be >= 0"):
        autostream.backend(measure=-1)


def _measured_choice(**options) -> tuple[MeasuredChoice, object]:
    """Compile the heads block with ``options``, call it until the backend has chosen
    (each block settles for ``SETTLE_S``), checking every output against eager, and
    return the backend's one measured choice and the backend."""
    model, inputs = multihead_block(tokens=2, hidden=32, out=8, heads=3, depth=1)
    torch._dynamo.reset()
    be = autostream.backend(max_streams=3, cost_table="h200", measure=2, **options)
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        expected = model(*inputs)
        for _ in range(5000):
            for got, want in zip(compiled(*inputs), expected):
                torch.testing.assert_close(got, want)
            if be.measured_choices[0].choice is not None:
                break
        for got, want in zip(compiled(*inputs), expected):  # the kept candidate
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    [choice] = be.measured_choices
    return choice, be


def test_backend_measures_plan_against_eager_and_outputs_never_change():
    threads = torch.get_num_threads()
    choice, be = _measured_choice()
    assert be.autostream_pass.last_report.applied
    # eager at the caller's count, and at every other count the plan could use instead
    report = be.last_report
    others = eager_candidates(abs, "threads", report.streams_used)
    assert choice.choice in ("streams", "eager", *others)
    assert {k: len(v) for k, v in choice.samples.items()} == {
        "streams": 2, "eager": 2, **{k: 2 for k in others}}
    assert torch.get_num_threads() == threads  # each candidate restored the caller's count
    # the report names the fastest single stream, its threads, and the machine's load
    name, count = report.baseline
    assert name in ("eager", *others) and count == (threads if name == "eager" else
                                                    choice.candidates[name].intra_op_threads)
    assert f"fastest single stream: {name}" in report.summary()
    assert (name == "eager") is (f"{name} (the caller's {count} intra-op thread" in report.summary())
    assert choice.load is not None and "load average" in report.summary()
    figures = report.figures()
    assert (figures["baseline"], figures["baseline_threads"]) == (name, count)
    assert figures["load"]["cores"] == choice.load.cores


def test_deterministic_adds_no_thread_count_candidate():
    # eager's bits are promised: an eager candidate at another count could differ in them
    choice, _ = _measured_choice(deterministic=True, runtime="threads")
    assert set(choice.samples) == {"streams", "eager"}


@pytest.mark.slow
def test_inductor_fallback_is_measured_too_and_outputs_never_change():
    choice, be = _measured_choice(fallback="inductor")
    others = {k: 2 for k in eager_candidates(abs, "threads", be.last_report.streams_used)}
    assert {k: len(v) for k, v in choice.samples.items()} == {
        "streams": 2, "eager": 2, **others, "inductor": 2}
    # the default (Inductor) is kept unless another candidate clears the margin against it
    assert choice.default == "inductor"
    if choice.choice != choice.default:
        ratios = [t / b for t, b in zip(choice.samples[choice.choice],
                                        choice.samples[choice.default])]
        assert statistics.median(ratios) < 1 - choice.margin


def test_unknown_fallback_names_the_choices():
    with pytest.raises(ValueError, match="unknown fallback 'tvm'; choose one of eager, inductor"):
        autostream.backend(fallback="tvm")


def test_inductor_is_not_compiled_when_nothing_measures_it(monkeypatch):
    import sys

    backend_module = sys.modules["autostream.backend"]  # the package exports the function

    def no_inductor(*args):
        raise AssertionError("Inductor compiled although the plan is trusted unmeasured")

    monkeypatch.setattr(backend_module, "_inductor", no_inductor)
    model, inputs = multihead_block(tokens=2, hidden=32, out=8, heads=3, depth=1)
    torch._dynamo.reset()
    be = autostream.backend(max_streams=3, cost_table="h200", measure=0, fallback="inductor")
    with torch.no_grad():
        for got, want in zip(torch.compile(model, backend=be)(*inputs), model(*inputs)):
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    assert be.autostream_pass.last_report.applied and not be.measured_choices
