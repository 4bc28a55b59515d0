"""Where the pass spends its time: one figure per stage, measured by a stopwatch.

>>> ticks = iter([0.0, 0.5, 2.0, 2.25])
>>> watch = Stopwatch(clock=lambda: next(ticks))
>>> watch.lap("graph"); watch.lap("solve"); watch.lap("syncs")
>>> watch.times()
StageTimes(graph=0.5, costs=0.0, solve=1.5, syncs=0.25, rewrite=0.0, verify=0.0)
>>> watch.times().total
2.25
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class StageTimes:
    """Seconds per stage of the pass (capturing the graph is not a stage of the pass)."""

    graph: float = 0.0  # the FX graph to the dependence graph
    costs: float = 0.0  # op cost estimates and the scheduling problem
    solve: float = 0.0  # the solvers (a memory repair's re-solves are counted in syncs)
    syncs: float = 0.0  # checking plans: syncs, simulated timeline, memory, repairs
    rewrite: float = 0.0  # the graph rewritten with streams and syncs
    verify: float = 0.0  # the rewritten graph checked against the dependences

    @property
    def total(self) -> float:
        """The whole pass: what a compilation pays for autostream."""
        return sum(dataclasses.astuple(self))

    def plus(self, **seconds: float) -> StageTimes:
        """These times with ``seconds`` added to the named stages."""
        return dataclasses.replace(
            self, **{k: getattr(self, k) + v for k, v in seconds.items()})

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in dataclasses.asdict(self).items()}


class Stopwatch:
    """Adds the time since the previous lap (or since it started) to a named stage."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._last = clock()
        self._times = StageTimes()

    def lap(self, stage: str) -> None:
        now = self._clock()
        self._times = self._times.plus(**{stage: now - self._last})
        self._last = now

    def times(self) -> StageTimes:
        return self._times


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a pass runs or a calibration
    times ops (as ``timeit`` does), then restored.

    A pass allocates many short-lived objects, which start collections; a full
    collection walks every object of the process (millions beside a loaded model) and
    costs far more than planning a small graph.  Refcounting still frees the pass's
    garbage; cycles wait for the collector's next run.  ``torch.distributed.checkpoint``
    does the same around ``state_dict`` traversals.

    >>> with collector_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
