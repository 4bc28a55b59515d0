"""The race sanitizer: a removed wait is caught, correct plans never trip it."""

from __future__ import annotations

import pytest
import torch

from autostream.runtime import (
    RaceError,
    SanitizerConfig,
    ThreadsRunner,
    make_runner,
    unordered_dependences,
)
from autostream.runtime.builder import fork_join
from autostream.runtime.program import parse_program

RUNS_BROKEN = 50
RUNS_HELD = 20  # the delays-only test's runs, each held 50-100 ms
RUNS_CORRECT = 200


def _without(gm, wait_index: int):
    waits = [n for n in gm.graph.nodes if n.name.startswith("wait")]
    victim = waits[wait_index]
    gm.graph.erase_node(victim)
    gm.recompile()
    return gm


def _detections(runner, inputs, expected, runs: int) -> tuple[int, list[str]]:
    """Runs (of ``runs``) where the race showed: RaceError, a read of a missing value, or wrong
    output (compared bit for bit: the runners are deterministic, every op with eager's threads)."""
    detected, kinds = 0, []
    for _ in range(runs):
        try:
            out = runner(*inputs)
        except RaceError as exc:
            detected += 1
            kinds.extend(v.kind for v in exc.violations)
            continue
        except RuntimeError as exc:  # the op's own error: it read a value not yet produced
            assert "before it was produced" in str(exc)
            detected += 1
            kinds.append("missing value")
            continue
        if not torch.equal(out[0], expected[0]):
            detected += 1
            kinds.append("output")
    return detected, kinds


# wait 0: stream_1's fork wait; 1: stream_2's fork wait; 2: the main stream's join wait
@pytest.mark.parametrize("wait_index", [0, 1, 2])
def test_removed_wait_detected(wait_index):
    gm, inputs = fork_join(streams=3, depth=1, size=16)
    expected = gm(*inputs)
    broken = _without(gm, wait_index)
    assert unordered_dependences(parse_program(broken))
    with ThreadsRunner(broken, sanitize=SanitizerConfig(seed=wait_index),
                       deterministic=True) as runner:
        detected, kinds = _detections(runner, inputs, expected, RUNS_BROKEN)
    assert detected >= 0.95 * RUNS_BROKEN
    assert "unordered" in kinds


@pytest.mark.parametrize("wait_index", [0, 2])
def test_delays_alone_expose_the_race(wait_index):
    """Without the happens-before check, the injected delays still expose the race in >= 95%.

    The producer is held 50-100 ms, far above a thread's wake-up on a loaded machine
    (held 10-20 ms, 6 busy processes on 2 cores hid the race in 7 runs of 50; without
    delays it hides in 10 to 32 of 50 on an idle machine)."""
    gm, inputs = fork_join(streams=3, depth=1, size=16)
    expected = gm(*inputs)
    broken = _without(gm, wait_index)
    config = SanitizerConfig(seed=11, happens_before=False, hold_s=0.1)
    with ThreadsRunner(broken, sanitize=config, deterministic=True) as runner:
        detected, kinds = _detections(runner, inputs, expected, RUNS_HELD)
    assert detected >= 0.95 * RUNS_HELD, kinds
    assert set(kinds) <= {"early", "missing value", "output"}


@pytest.mark.slow
def test_correct_plan_never_flagged():
    gm, inputs = fork_join(streams=3, depth=2, size=16)
    expected = gm(*inputs)
    runs = RUNS_CORRECT  # (the zoo's rewritten graphs get more in test_runtime_exec.py)
    # deterministic: every op with eager's intra-op threads, so equal bit for bit
    with ThreadsRunner(gm, sanitize=SanitizerConfig(seed=3, max_delay_s=0.0003),
                       deterministic=True) as runner:
        for _ in range(runs):
            assert torch.equal(runner(*inputs)[0], expected[0])


def test_environment_variable_turns_sanitizer_on(monkeypatch):
    gm, inputs = fork_join(streams=2, depth=1, size=8)
    broken = _without(gm, 0)
    monkeypatch.setenv("AUTOSTREAM_SANITIZE", "1")
    runner = make_runner(broken, "threads")
    assert runner.sanitizer == SanitizerConfig(seed=0)
    with pytest.raises(RaceError, match="is not ordered after it by any record/wait"):
        runner(*inputs)
    runner.close()
    monkeypatch.setenv("AUTOSTREAM_SANITIZE", "0")
    assert make_runner(gm, "threads").sanitizer is None


def test_race_error_names_producer_and_consumer():
    gm, inputs = fork_join(streams=2, depth=1, size=8)
    broken = _without(gm, 1)  # the join wait
    with ThreadsRunner(broken, sanitize=True) as runner, pytest.raises(RaceError) as info:
        runner(*inputs)
    v = next(v for v in info.value.violations if v.kind == "unordered")
    assert (v.producer_stream, v.consumer_stream) == (1, 0)
    assert v.producer == parse_program(broken).ops(1)[-1]


def test_delays_are_seeded():
    from autostream.runtime.sanitizer import SanitizerRun

    program = parse_program(fork_join(streams=2)[0])
    draws = []
    for _ in range(2):
        run = SanitizerRun(SanitizerConfig(seed=9), program, call_index=4, orders={})
        draws.append([run.rngs[k].random() for k in (0, 1)])
    other = SanitizerRun(SanitizerConfig(seed=9), program, call_index=5, orders={})
    assert draws[0] == draws[1] != [other.rngs[k].random() for k in (0, 1)]


def test_environment_variable_leaves_other_runtimes_alone(monkeypatch):
    gm, inputs = fork_join(streams=2, depth=1, size=8)
    monkeypatch.setenv("AUTOSTREAM_SANITIZE", "1")
    expected = gm(*inputs)
    assert torch.equal(make_runner(gm, "sequential")(*inputs)[0], expected[0])
    with pytest.raises(ValueError, match="threads runtime"):
        make_runner(gm, "sequential", sanitize=True)
