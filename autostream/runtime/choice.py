"""Measured choice between equivalent callables: try each on the first real calls, keep the fastest.

A plan is a prediction; the machine has the last word.  ``MeasuredChoice`` gives
each candidate in turn a block of calls: one untimed warm-up call (first calls start
threads and allocate), then timed calls; ``rounds`` rounds of blocks, the order
reversed every other round (A B C, C B A) so that a machine slowly speeding up or
slowing down does not favour whoever came first; ``trials`` timed calls per
candidate in all.  Then it keeps the one with the smallest median time for every
later call.  Blocks, not alternation: right after a call that used every intra-op
thread, the OpenMP threads still spin for a while and would slow whichever
candidate came next.  Every candidate computes
the same outputs, so which one answers a given call never changes the result.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

log = logging.getLogger("autostream")


def synchronize_inputs(args: tuple[Any, ...]) -> None:
    """Wait for the accelerator the inputs live on (CPU: nothing to wait for)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            torch.accelerator.synchronize(a.device)
            return


class MeasuredChoice:
    """Time each candidate on blocks of real calls (``trials`` timed calls each), then call only the fastest.

    >>> import time
    >>> fast, slow = (lambda x: x + 1), (lambda x: (time.sleep(0.002), x + 1)[1])
    >>> choose = MeasuredChoice({"slow": slow, "fast": fast}, trials=3)
    >>> [choose(1) for _ in range(10)][-1], choose.choice
    (2, 'fast')
    """

    def __init__(
        self,
        candidates: Mapping[str, Callable[..., Any]],
        trials: int = 5,
        clock: Callable[[], float] = time.perf_counter,
        on_choice: Callable[[str, dict[str, float]], None] | None = None,
        rounds: int = 2,
    ) -> None:
        if not candidates:
            raise ValueError("MeasuredChoice needs at least one candidate")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.candidates = dict(candidates)
        self.trials = trials
        self._names = names = list(self.candidates)
        rounds = min(rounds, trials)
        #: (candidate, timed) for each measuring call, in order
        self.schedule: list[tuple[str, bool]] = []
        for r in range(rounds):
            timed = trials // rounds + (1 if r < trials % rounds else 0)
            for name in (names if r % 2 == 0 else names[::-1]):
                self.schedule += [(name, False)] + [(name, True)] * timed
        self.samples: dict[str, list[float]] = {name: [] for name in self.candidates}
        self.choice: str | None = next(iter(self.candidates)) if len(self.candidates) == 1 else None
        self._clock = clock
        self._on_choice = on_choice
        self._turn = 0
        self._lock = threading.Lock()

    @property
    def medians(self) -> dict[str, float]:
        return {n: statistics.median(s) for n, s in self.samples.items() if s}

    def __call__(self, *args: Any) -> Any:
        if self.choice is not None:
            return self.candidates[self.choice](*args)
        names = self._names
        with self._lock:
            name, timed = self.schedule[min(self._turn, len(self.schedule) - 1)]
            self._turn += 1
        synchronize_inputs(args)
        t0 = self._clock()
        out = self.candidates[name](*args)
        synchronize_inputs(args)
        elapsed = self._clock() - t0
        if timed:  # the first call of each block is a warm-up
            self.samples[name].append(elapsed)
        if all(len(s) >= self.trials for s in self.samples.values()):
            medians = self.medians
            self.choice = min(medians, key=lambda n: (medians[n], names.index(n)))
            log.info("autostream: measured %s; keeping %s",
                     ", ".join(f"{n} {m * 1e6:.0f} us" for n, m in medians.items()), self.choice)
            if self._on_choice is not None:
                self._on_choice(self.choice, medians)
        return out
