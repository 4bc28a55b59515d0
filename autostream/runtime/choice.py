"""Measured choice between equivalent callables: try each on the first real calls, keep the fastest.

A plan is a prediction; the machine has the last word.  ``MeasuredChoice`` gives
each candidate in turn a block of calls: untimed warm-up calls (first calls start
threads and allocate) until they have taken ``settle_s`` in all (at least one), then
timed calls; ``rounds`` rounds of blocks, the order reversed every other round
(A B C, C B A) so that a machine slowly speeding up or slowing down does not favour
whoever came first; ``trials`` timed calls per candidate in all.  Then it keeps the
one with the smallest median time for every later call.

By default every block has one timed call (``rounds = trials``): a shared machine
has slow phases lasting several calls, and with blocks of several timed calls one
such phase can take most of one candidate's samples and pick the wrong candidate.

Why a settling time and not one warm-up call: after a call that used every intra-op
thread, the idle OpenMP threads spin for several milliseconds and take a core from
whatever runs next, so a candidate timed right after another would pay for its
predecessor, which repeated calls of one model never do (``docs/cpu-runtime.md``).
Every candidate computes the same outputs, so which one answers a given call never
changes the result.
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

#: Untimed warm-up per block, in seconds (see the module docstring).
SETTLE_S = 0.02


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
    >>> choose = MeasuredChoice({"slow": slow, "fast": fast}, trials=3, settle_s=0.0)
    >>> [choose(1) for _ in range(20)][-1], choose.choice
    (2, 'fast')
    """

    def __init__(
        self,
        candidates: Mapping[str, Callable[..., Any]],
        trials: int = 5,
        clock: Callable[[], float] = time.perf_counter,
        on_choice: Callable[[str, dict[str, float]], None] | None = None,
        rounds: int | None = None,
        settle_s: float = SETTLE_S,
    ) -> None:
        if not candidates:
            raise ValueError("MeasuredChoice needs at least one candidate")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        rounds = trials if rounds is None else rounds
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if not settle_s >= 0:
            raise ValueError(f"settle_s must be >= 0 seconds, got {settle_s}")
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
        self._settle_s = settle_s
        self._settled = 0.0  # untimed seconds spent in the current block's warm-up
        self._lock = threading.Lock()

    @property
    def medians(self) -> dict[str, float]:
        return {n: statistics.median(s) for n, s in self.samples.items() if s}

    def __call__(self, *args: Any) -> Any:
        if self.choice is not None:
            return self.candidates[self.choice](*args)
        names = self._names
        with self._lock:
            turn = min(self._turn, len(self.schedule) - 1)
            name, timed = self.schedule[turn]
        synchronize_inputs(args)
        t0 = self._clock()
        out = self.candidates[name](*args)
        synchronize_inputs(args)
        elapsed = self._clock() - t0
        with self._lock:
            if timed:
                self.samples[name].append(elapsed)
                self._turn = turn + 1
            else:  # warm-up: stay on it until the block has settled
                self._settled += elapsed
                if self._settled >= self._settle_s:
                    self._settled = 0.0
                    self._turn = turn + 1
        if all(len(s) >= self.trials for s in self.samples.values()):
            medians = self.medians
            self.choice = min(medians, key=lambda n: (medians[n], names.index(n)))
            log.info("autostream: measured %s; keeping %s",
                     ", ".join(f"{n} {m * 1e6:.0f} us" for n, m in medians.items()), self.choice)
            if self._on_choice is not None:
                self._on_choice(self.choice, medians)
        return out
