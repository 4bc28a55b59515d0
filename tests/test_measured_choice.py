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
    import importlib

    # the module itself: the package exports a function of its name
    backend_module = importlib.import_module("autostream.backend")

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


# -- fallback="inductor": the plan is never kept where Inductor measured faster -------------

#: one-stream graph 100 us; the plan 80 us every round; Inductor 78 us in the median but
#: noisy: its ratio plus spread (0.82) loses to the plan's (0.80), its median (0.78) wins
FLOOR_TIMES = {"graph1": [100e-6] * 5, "graph": [80e-6] * 5,
               "inductor": [70e-6, 86e-6, 78e-6, 74e-6, 82e-6], "eager": [150e-6] * 5}


def test_a_plan_slower_than_its_floor_is_not_kept():
    fns, clock, _ = _timed({n: _rounds(t[0], list(t)) for n, t in FLOOR_TIMES.items()})
    choose = MeasuredChoice(fns, trials=5, clock=clock, default="graph1", settle_s=0.0,
                            floors={"graph": "inductor"})
    for _ in range(40):
        choose(0)
    assert choose.choice == "inductor"
    assert "but graph is 0.97x as fast as inductor, its floor: inductor runs" in choose.reason
    # without the floor the plan's lower spread would have kept it, 2.6% slower
    fns, clock, _ = _timed({n: _rounds(t[0], list(t)) for n, t in FLOOR_TIMES.items()})
    plain = MeasuredChoice(fns, trials=5, clock=clock, default="graph1", settle_s=0.0)
    for _ in range(40):
        plain(0)
    assert plain.choice == "graph"


def test_floors_must_name_candidates():
    with pytest.raises(ValueError, match="floors name 'inductor', not a candidate"):
        MeasuredChoice({"graph": abs, "graph1": abs}, floors={"graph": "inductor"})


def test_on_the_graph_runtime_the_plan_is_weighed_against_inductor_reduce_overhead(
        monkeypatch):
    """The backend on a fake device that captures graphs, each candidate taking its
    ``FLOOR_TIMES`` on a fake clock: the plan, slower than Inductor, is not kept."""
    import importlib

    from autostream.models.zoo import moe_model
    from tests.fake_device import patch_backend_to_fake_capture

    backend_module = importlib.import_module("autostream.backend")
    patch_backend_to_fake_capture(monkeypatch)
    asked = []

    def inductor(gm, example_inputs, *args):
        asked.append(args)
        return gm.forward

    monkeypatch.setattr(backend_module, "_inductor", inductor)
    now = [0.0]

    class FakeClock(MeasuredChoice):
        def __init__(self, candidates, **options):
            times = {n: _rounds(t[0], list(t)) for n, t in FLOOR_TIMES.items()}

            def timed(name, fn):
                def run(*args):
                    now[0] += times[name].pop(0) if times[name] else 1e-4
                    return fn(*args)
                return run

            super().__init__({n: timed(n, f) for n, f in candidates.items()},
                             clock=lambda: now[0], settle_s=0.0, **options)

    monkeypatch.setattr(backend_module, "MeasuredChoice", FakeClock)
    model, inputs = moe_model()
    torch._dynamo.reset()
    be = autostream.backend(max_streams=2, cost_table="h200", measure=5, runtime="graph",
                            fallback="inductor")
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        want = model(*inputs)
        for _ in range(41):
            torch.testing.assert_close(compiled(*inputs), want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    choice = be.last_report.choice
    assert asked == [("reduce-overhead", "cpu", "fresh")]
    assert set(choice.candidates) == {"graph", "graph1", "eager", "inductor"}
    assert choice.floors == {"graph": "inductor"} and choice.choice == "inductor"


def test_inductor_reduce_overhead_captures_cuda_graphs_on_cuda_only(monkeypatch):
    import importlib

    import torch._inductor.compile_fx as compile_fx_module

    backend_module = importlib.import_module("autostream.backend")
    calls = []
    out = torch.ones(2)

    def compile_fx(gm, inputs, config_patches=None):
        calls.append(config_patches)
        return lambda *args: (out,)

    monkeypatch.setattr(compile_fx_module, "compile_fx", compile_fx)
    fresh = backend_module._inductor(None, [], "reduce-overhead", "cuda", "fresh")
    [got] = fresh()
    assert calls == [{"triton.cudagraphs": True}]
    assert torch.equal(got, out) and got is not out  # cloned: the trees overwrite theirs
    reused = backend_module._inductor(None, [], "reduce-overhead", "cuda", "reused")
    assert reused()[0] is out
    backend_module._inductor(None, [], "reduce-overhead", "cpu", "fresh")
    backend_module._inductor(None, [], "default", "cuda", "fresh")
    assert calls[2:] == [None, None]  # no CUDA graphs on the CPU, nor when not asked
