"""Measured choice between equivalent callables: time them on the first real calls, keep
the fastest only when it clearly is, and check now and then that it still is.

A plan is a prediction; the machine has the last word.  ``MeasuredChoice`` runs
``trials`` interleaved **rounds**: in each, every candidate gets a block of one untimed
warm-up call and one timed call, the order reversed every other round (A B, B A) so
that a machine slowly speeding up or slowing down favours nobody.  The decision takes
**a bounded number of calls**: ``2 * trials`` per candidate (20 calls for the plan
against eager with ``trials=5``), however short the calls are.

Each candidate's times give a median and a spread (the median absolute deviation).
The decision compares each candidate with the ``default`` (the single-stream graph)
round by round: a candidate replaces the default only when the median of its per-round
time ratios, plus their spread, is below ``1 - margin`` (``MARGIN``: 5% faster).  Every
figure in words is a speed-up over the default (its time over the candidate's).  A
stall of the machine spoils one round's ratio, not the median (with 3 rounds or more:
fewer rounds trust every one), and a close race keeps the default.  ``floors`` bound a
candidate by another (the plan by Inductor with ``fallback="inductor"``): a candidate
that measured slower than its floor (the median of their per-round ratios above 1) is
never kept; its floor is, even where the floor alone would not have cleared the margin.

**Re-checks.**  After ``recheck_after`` calls (then twice as many, up to
``RECHECK_MAX``) the kept candidate is timed again against the runner-up, in
``RECHECK_ROUNDS`` rounds with the kept one as the default; the runner-up takes over
only when it clears the margin.  A re-check costs ``RECHECK_ROUNDS`` calls of the
runner-up (about 1% of the calls at the first interval, less later).

**Settling.**  After a call that used every intra-op thread, the idle OpenMP threads
spin for several milliseconds and take a core from whatever runs next, so a candidate
timed right after another would pay for its predecessor, which repeated calls of one
model never do (``docs/cpu-runtime.md``).  Before a block of another candidate than
the last call's, the choice waits until ``settle_s`` have passed since that call ended
(at most ``settle_s`` per block; a caller's own pauses count).  Every candidate
computes the same outputs, so which one answers a given call never changes the result.

**Load.**  Given ``read_machine`` (``runtime.machine.read``), the choice reads the machine
before its first measuring call and at its first decision: ``load`` then says how busy
the machine was meanwhile (``Load.busy``: the figures are unreliable).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from autostream.runtime.machine import Load, Reading

log = logging.getLogger("autostream")

#: Seconds since another candidate's call before a block starts (see the module docstring).
SETTLE_S = 0.02
#: How much faster than the default (the single-stream graph) a candidate must measure.
MARGIN = 0.05
#: Calls after a decision before the first re-check; the interval then doubles up to
#: ``RECHECK_MAX`` while the choice stands.
RECHECK_AFTER = 500
RECHECK_MAX = 64_000
#: Rounds of a re-check (kept candidate against the runner-up).
RECHECK_ROUNDS = 3


def synchronize_inputs(args: tuple[Any, ...]) -> None:
    """Wait for the accelerator the inputs live on (CPU: nothing to wait for)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            torch.accelerator.synchronize(a.device)
            return


@dataclass(frozen=True)
class Timing:
    """One candidate's timed calls: median and spread (median absolute deviation), seconds."""

    median: float
    spread: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: list[float]) -> Timing:
        """
        >>> Timing.of([1.0, 2.0, 9.0])
        Timing(median=2.0, spread=1.0, samples=(1.0, 2.0, 9.0))
        """
        median = statistics.median(samples)
        return cls(median, statistics.median(abs(s - median) for s in samples), tuple(samples))

    def __str__(self) -> str:
        return f"{self.median * 1e6:.0f} us +- {self.spread * 1e6:.0f}"


def rounds_schedule(names: list[str], rounds: int) -> list[tuple[str, bool]]:
    """``(candidate, timed)`` for each measuring call: per round a warm-up and a timed call
    per candidate, the order reversed every other round.

    >>> rounds_schedule(["a", "b"], 2)
    [('a', False), ('a', True), ('b', False), ('b', True), ('b', False), ('b', True), ('a', False), ('a', True)]
    """
    out: list[tuple[str, bool]] = []
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out += [(name, False), (name, True)]
    return out


def decide(samples: Mapping[str, list[float]], default: str, margin: float,
           floors: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The candidate to keep and why, from per-round samples (round ``i`` is every
    candidate's ``i``-th sample): the default unless another's median per-round ratio to it,
    plus the ratios' spread, is below ``1 - margin``; a candidate kept that measured slower
    than its floor (``floors[name]``, when measured too) gives way to the floor.  The reason gives that candidate's
    speed-up over the default (the default's time over its own: above 1 is faster), and
    the speed-up less the rounds' spread, which is what must clear the margin.

    >>> decide({"eager": [200, 200, 60000], "streams": [150, 150, 150]}, "eager", 0.05)
    ('streams', 'streams 1.33x as fast as eager (1.33x less the spread of 3 rounds) clears the 5% margin')
    >>> decide({"eager": [200, 60000, 200], "streams": [390, 390, 390]}, "eager", 0.05)
    ('eager', 'streams 0.51x as fast as eager (0.51x less the spread of 3 rounds) does not clear the 5% margin')
    >>> decide({"g1": [100] * 3, "graph": [80] * 3, "inductor": [70, 90, 78]}, "g1", 0.05,
    ...        floors={"graph": "inductor"})[1].split("; ")[1]
    'but graph is 0.98x as fast as inductor, its floor: inductor runs'
    """
    choice, why = _decide(samples, default, margin)
    floor = (floors or {}).get(choice)
    if floor is None or floor not in samples or floor == choice:
        return choice, why
    ratios = [t / f for t, f in zip(samples[choice], samples[floor]) if f > 0]
    if ratios and statistics.median(ratios) > 1:
        return floor, (f"{why}; but {choice} is {speedup(statistics.median(ratios)):.2f}x as "
                       f"fast as {floor}, its floor: {floor} runs")
    return choice, why


def _decide(samples: Mapping[str, list[float]], default: str, margin: float
            ) -> tuple[str, str]:
    base = samples[default]
    scored = []  # (median ratio + spread, median ratio, spread, name)
    for name, times in samples.items():
        ratios = [t / b for t, b in zip(times, base) if b > 0]
        if name != default and ratios:
            ratio = statistics.median(ratios)
            spread = statistics.median(abs(r - ratio) for r in ratios)
            scored.append((ratio + spread, ratio, spread, name))
    if not scored:
        return default, f"nothing measured against {default}"
    _, best_ratio, best_spread, best = min(scored)
    how = (f"{best} {speedup(best_ratio):.2f}x as fast as {default} "
           f"({speedup(best_ratio + best_spread):.2f}x less the spread of {len(base)} rounds)")
    if best_ratio + best_spread < 1 - margin:
        return best, f"{how} clears the {100 * margin:.0f}% margin"
    return default, f"{how} does not clear the {100 * margin:.0f}% margin"


def speedup(ratio: float) -> float:
    """A time ratio (candidate over default) as a speed-up over the default.

    >>> speedup(0.8), speedup(0.0)
    (1.25, inf)
    """
    return 1 / ratio if ratio > 0 else float("inf")


class MeasuredChoice:
    """Time each candidate in ``trials`` interleaved rounds, then call only the one kept
    (the ``default`` unless another clearly wins); re-check it now and then.

    On a clock that only ``slow``'s calls advance:

    >>> now = [0.0]
    >>> def slow(x): now[0] += 0.002; return x + 1
    >>> fast = lambda x: x + 1
    >>> choose = MeasuredChoice({"slow": slow, "fast": fast}, trials=3, settle_s=0.0,
    ...                         clock=lambda: now[0])
    >>> [choose(1) for _ in range(12)][-1], choose.choice, choose.calls_to_decision
    (2, 'fast', 12)
    """

    def __init__(
        self,
        candidates: Mapping[str, Callable[..., Any]],
        trials: int = 5,
        clock: Callable[[], float] = time.perf_counter,
        on_choice: Callable[[str, dict[str, float]], None] | None = None,
        settle_s: float = SETTLE_S,
        *,
        default: str | None = None,
        margin: float = MARGIN,
        recheck_after: int | None = RECHECK_AFTER,
        sleep: Callable[[float], None] = time.sleep,
        read_machine: Callable[[], Reading] | None = None,
        floors: Mapping[str, str] | None = None,
    ) -> None:
        if not candidates:
            raise ValueError("MeasuredChoice needs at least one candidate")
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ValueError(f"trials must be >= 1 (rounds of timed calls), got {trials!r}")
        if not settle_s >= 0:
            raise ValueError(f"settle_s must be >= 0 seconds, got {settle_s}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1) (a fraction of the default's time), "
                             f"got {margin}")
        if recheck_after is not None and recheck_after < 1:
            raise ValueError(f"recheck_after must be >= 1 call (or None: never), got "
                             f"{recheck_after}")
        self.candidates = dict(candidates)
        self.trials = trials
        self._names = list(self.candidates)
        self.default = self._names[0] if default is None else default
        if self.default not in self.candidates:
            raise ValueError(f"default {self.default!r} is not a candidate "
                             f"({', '.join(self._names)})")
        self.margin = margin
        #: a candidate is never kept where it measured slower than its floor (``decide``)
        self.floors = dict(floors or {})
        bad = [n for pair in self.floors.items() for n in pair if n not in self.candidates]
        if bad:
            raise ValueError(f"floors name {', '.join(map(repr, bad))}, not a candidate "
                             f"({', '.join(self._names)})")
        #: (candidate, timed) for each call of the current measuring phase, in order
        self.schedule: list[tuple[str, bool]] = rounds_schedule(self._names, trials)
        self.samples: dict[str, list[float]] = {name: [] for name in self.candidates}
        self.choice: str | None = self.default if len(self.candidates) == 1 else None
        #: why the choice was made, in words ("" until it is)
        self.reason = "single candidate" if self.choice else ""
        #: calls until the first decision (``None`` until it is made)
        self.calls_to_decision: int | None = None
        self.rechecks = 0
        self.switches = 0
        self._clock = clock
        self._sleep = sleep
        self._on_choice = on_choice
        self._settle_s = settle_s
        self._recheck_after = recheck_after
        self._interval = recheck_after
        self._calls = 0  # every call
        self._since = 0  # calls since the last decision
        self._turn = 0
        self._phase: dict[str, list[float]] | None = None  # a re-check's samples
        self._last: tuple[str, float] | None = None  # the last measuring call, its end
        self._read_machine = read_machine
        self._load_start: Reading | None = None
        #: how busy the machine was while the first decision was measured (``None``: not
        #: read, or not decided yet)
        self.load: Load | None = None
        self._lock = threading.Lock()

    @property
    def medians(self) -> dict[str, float]:
        return {n: statistics.median(s) for n, s in self.samples.items() if s}

    @property
    def timings(self) -> dict[str, Timing]:
        """Each candidate's first-decision timing (median and spread)."""
        return {n: Timing.of(s) for n, s in self.samples.items() if s}

    @property
    def measuring(self) -> bool:
        return self.choice is None or self._phase is not None

    def describe(self) -> str:
        """The choice in words: timings, the variant that now runs and why (the best
        candidate's speed-up over the default against the margin), the re-checks.

        >>> MeasuredChoice({"streams": abs, "eager": abs}, trials=5, default="eager").describe()
        'measuring: streams against eager in 5 interleaved rounds (20 calls)'
        """
        if self.choice is None:
            return (f"measuring: {' against '.join(self._names)} in {self.trials} interleaved "
                    f"rounds ({len(self.schedule)} calls)")
        if len(self.candidates) == 1:
            return f"runs {self.choice} (single candidate, not measured)"
        times = ", ".join(f"{n} {t}" for n, t in self.timings.items())
        checks = (f"; re-checked {self.rechecks} times, {self.switches} switches"
                  if self.rechecks else "")
        return (f"measured over {self.trials} interleaved rounds ({self.calls_to_decision} "
                f"calls): {times}; runs {self.choice}: {self.reason}{checks}")

    def __call__(self, *args: Any) -> Any:
        with self._lock:
            step = self._next_step()
            kept = self.choice
        if step is None:
            return self.candidates[kept](*args)
        name, timed, wait = step
        if wait > 0:
            self._sleep(wait)
        synchronize_inputs(args)
        t0 = self._clock()
        out = self.candidates[name](*args)
        synchronize_inputs(args)
        t1 = self._clock()
        with self._lock:
            self._last = (name, t1)
            if timed:
                (self._phase if self._phase is not None else self.samples)[name].append(t1 - t0)
                if self._turn >= len(self.schedule) and self.measuring:
                    self._finish_phase()
        return out

    def remeasure(self, name: str, fn: Callable[..., Any]) -> None:
        """``name`` now runs ``fn`` (a new plan; a new candidate if ``name`` is not one):
        time it alone in ``trials`` rounds, then decide again against the other
        candidates' first-decision samples (they run the same callables as before, so they
        are not timed again).

        >>> now = [0.0]
        >>> def slow(x): now[0] += 0.002; return x
        >>> choose = MeasuredChoice({"plan": slow, "eager": slow}, trials=3, settle_s=0.0,
        ...                         default="eager", clock=lambda: now[0])
        >>> _ = [choose(1) for _ in range(12)]; choose.choice
        'eager'
        >>> choose.remeasure("plan", lambda x: x)
        >>> _ = [choose(1) for _ in range(6)]; choose.choice, len(choose.samples["eager"])
        ('plan', 3)
        """
        with self._lock:
            if name not in self.candidates:
                self._names.append(name)
            self.candidates[name] = fn
            self.samples[name] = []
            self.schedule = rounds_schedule([name], self.trials)
            self._phase, self._turn, self.choice, self._last = None, 0, None, None

    def _next_step(self) -> tuple[str, bool, float] | None:
        """The measuring call to make now, ``(candidate, timed, seconds to wait)``, or
        ``None``: call the kept candidate."""
        self._calls += 1
        if not self.measuring:
            self._since += 1
            if self._interval is None or self._since < self._interval:
                return None
            self._start_recheck()
        if self._turn >= len(self.schedule):  # concurrent calls past the phase's end
            return None if self.choice is not None else (self.schedule[-1][0], False, 0.0)
        if self._turn == 0 and self.choice is None and self._read_machine is not None:
            self._load_start = self._read_machine()
        name, timed = self.schedule[self._turn]
        self._turn += 1
        return name, timed, self._settle_wait(name)

    def _settle_wait(self, name: str) -> float:
        if self._last is None or self._last[0] == name or self._settle_s == 0:
            return 0.0
        return max(0.0, self._settle_s - (self._clock() - self._last[1]))

    def _start_recheck(self) -> None:
        medians = self.medians
        runner_up = min((n for n in self._names if n != self.choice),
                        key=lambda n: (medians.get(n, float("inf")), self._names.index(n)))
        self._phase = {self.choice: [], runner_up: []}
        self.schedule = rounds_schedule([self.choice, runner_up], RECHECK_ROUNDS)
        self._turn = 0

    def _finish_phase(self) -> None:
        if self._phase is None:  # the first decision
            self.choice, self.reason = decide(self.samples, self.default, self.margin,
                                              self.floors)
            self.calls_to_decision = self._calls
            if self._load_start is not None:
                self.load = Load.between(self._load_start, self._read_machine())
            if self._on_choice is None:
                log.info("autostream: %s", self.describe())
            else:  # the owner tells it (the backend, in its report's words)
                self._on_choice(self.choice, self.medians)
        else:
            kept = self.choice
            self.rechecks += 1
            choice, why = decide(self._phase, kept, self.margin, self.floors)
            self._phase = None
            if choice != kept:
                self.switches += 1
                self.choice, self.reason = choice, f"re-check against {kept}: {why}"
                self._interval = self._recheck_after
                log.info("autostream: re-check of %s: %s; now runs %s", kept, why, choice)
            elif self._interval is not None:
                self._interval = min(2 * self._interval, RECHECK_MAX)
        self._since = 0
