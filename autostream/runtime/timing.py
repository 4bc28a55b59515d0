"""One way to time variants side by side, shared by ``autostream demo`` and the experiments.

Every variant is called in turn, round by round; each timed call follows untimed calls of
the same variant for at least ``settle_s`` (at least one), so no variant is timed while the
previous variant's OpenMP threads still spin (several ms after a 2-thread call:
``autostream.runtime.choice``).  The figure of a variant is its median over the rounds.
Every output that prints such figures names the machine and its load while they were
timed (``runtime.machine``), and marks them unreliable when it was busy.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from autostream.runtime.choice import SETTLE_S


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type != "cpu":
        torch.accelerator.synchronize()


def method(runs: int, warmup: int, settle_s: float = SETTLE_S) -> str:
    """The method in words, for every output that prints figures timed this way.

    >>> method(20, 5)
    'median of 20 interleaved rounds after 5 warm-up rounds, one timed call of each variant per round after 20 ms of its own untimed calls'
    """
    return (f"median of {runs} interleaved rounds after {warmup} warm-up rounds, one timed "
            f"call of each variant per round after {settle_s * 1e3:g} ms of its own untimed "
            f"calls")


def time_alternating(variants: dict[str, Callable[[], Any]], runs: int, warmup: int,
                     device: torch.device | None = None, settle_s: float = SETTLE_S,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds of one call of each variant, the variants interleaved round by round
    (see the module docstring), timed by ``clock``.

    On a clock that only ``b``'s calls advance (by 1 ms each):

    >>> now = [0.0]
    >>> def b(): now[0] += 0.001
    >>> time_alternating({"a": lambda: None, "b": b}, 3, 1, settle_s=0.0, clock=lambda: now[0])
    {'a': 0.0, 'b': 0.001}
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(warmup + runs):
        for name, fn in variants.items():
            start = clock()
            fn()
            _sync(device)
            while clock() - start < settle_s:
                fn()
                _sync(device)
            t0 = clock()
            fn()
            _sync(device)
            dt = clock() - t0
            if i >= warmup:
                samples[name].append(dt)
    return {name: statistics.median(v) for name, v in samples.items()}
