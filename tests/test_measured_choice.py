"""The backend keeps whichever of plan and eager graph measured faster on the first calls."""

import itertools

import pytest
import torch

import autostream
from autostream.models.zoo import multihead_block
from autostream.runtime.choice import MeasuredChoice


def _fake_clock(durations):
    """A clock whose successive (start, stop) readings differ by the given durations."""
    readings = itertools.chain.from_iterable((0.0, d) for d in durations)
    return lambda: next(readings)


def test_keeps_the_candidate_with_the_smallest_median():
    calls = []
    a = lambda x: calls.append("a") or x  # noqa: E731
    b = lambda x: calls.append("b") or x  # noqa: E731
    # A block per candidate, its first call a warm-up (not counted): a takes 5, 5, 1
    # (median 5) after a 1; b takes 3, 3, 9 (median 3) after a 100.
    clock = _fake_clock([1, 5, 5, 1, 100, 3, 3, 9])
    choose = MeasuredChoice({"a": a, "b": b}, trials=3, clock=clock, rounds=1)
    for _ in range(8):
        assert choose(7) == 7
    assert choose.choice == "b" and calls == ["a"] * 4 + ["b"] * 4
    choose(7)
    assert calls[-1] == "b"


def test_rounds_reverse_the_order_so_drift_favours_nobody():
    calls = []
    fns = {name: (lambda x, name=name: calls.append(name) or x) for name in "abc"}
    choose = MeasuredChoice(fns, trials=4, clock=_fake_clock([1.0] * 24), rounds=2)
    for _ in range(18):
        choose(0)
    # two rounds: a b c, then c b a; each block a warm-up and 2 timed calls
    assert calls == [n for n in "abccba" for _ in range(3)]
    assert choose.choice == "a" and {k: len(v) for k, v in choose.samples.items()} == {
        "a": 4, "b": 4, "c": 4}


def test_by_default_each_block_has_one_timed_call():
    choose = MeasuredChoice({"a": abs, "b": abs}, trials=3, settle_s=0.0)
    # a b, b a, a b: a slow phase of the machine spans few samples of any candidate
    assert choose.schedule == [(n, timed) for n in "abbaab" for timed in (False, True)]


def test_each_block_warms_up_until_it_has_settled():
    calls = []
    fns = {name: (lambda x, name=name: calls.append(name) or x) for name in "ab"}
    # a: warm-ups of 0.004 s until 0.01 s have passed (3 calls), then 2 timed calls;
    # b: one warm-up of 0.5 s is enough, then 2 timed calls.
    clock = _fake_clock([0.004] * 3 + [1.0, 1.0] + [0.5] + [2.0, 2.0])
    choose = MeasuredChoice(fns, trials=2, clock=clock, rounds=1, settle_s=0.01)
    for _ in range(8):
        choose(0)
    assert calls == ["a"] * 5 + ["b"] * 3
    assert choose.samples == {"a": [1.0, 1.0], "b": [2.0, 2.0]} and choose.choice == "a"


def test_bad_options():
    with pytest.raises(ValueError, match="trials must be >= 1"):
        MeasuredChoice({"a": abs}, trials=0)
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        MeasuredChoice({"a": abs}, rounds=0)
    with pytest.raises(ValueError, match="settle_s must be >= 0"):
        MeasuredChoice({"a": abs}, settle_s=-1.0)
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
    choice, be = _measured_choice()
    assert be.autostream_pass.last_report.applied
    assert choice.choice in ("streams", "eager")
    assert {k: len(v) for k, v in choice.samples.items()} == {"streams": 2, "eager": 2}


@pytest.mark.slow
def test_inductor_fallback_is_measured_too_and_outputs_never_change():
    choice, _ = _measured_choice(fallback="inductor")
    assert {k: len(v) for k, v in choice.samples.items()} == {"streams": 2, "eager": 2, "inductor": 2}
    medians = choice.medians
    assert choice.choice == min(medians, key=medians.get)


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
