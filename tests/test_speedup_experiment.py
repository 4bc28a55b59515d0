"""The plain-threads ceiling of ``experiments/speedup.py`` computes the probe's graph."""

from __future__ import annotations

import torch

from autostream.runtime.builder import two_chains
from experiments import speedup


def test_plain_threads_compute_both_chains_and_restore_the_callers_threads():
    gm, inputs = two_chains(depth=3, rows=4, width=16, streams=1)
    plain = speedup._PlainThreads(inputs, depth=3)
    threads = torch.get_num_threads()
    try:
        for _ in range(3):  # the worker is reused call after call
            torch.testing.assert_close(plain(), gm(*inputs)[0])
        assert torch.get_num_threads() == threads
    finally:
        plain.close()


def test_headlines_give_the_measured_choices_calls_to_a_decision():
    from experiments.speedup import Row, headlines

    def row(model: str, calls: int | None) -> Row:
        return Row(model, 2, 1.0, None, 1.0, 1.0, 1.0, "eager", 1.2, 1.1, 1.1, -0.08, "", "eager",
                   calls)

    rows = headlines([row("a", 20), row("b", 30), row("c", None)], "cpu")
    [calls] = [h for h in rows if h.what.startswith("measured choice")]
    assert (calls.what, calls.measured, calls.met) == (
        "measured choice: calls to a decision (2 models, cpu)", "20-30 (b)", None)
