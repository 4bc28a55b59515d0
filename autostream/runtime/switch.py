"""A compiled graph whose plan improves while it runs: the switch happens between calls.

:class:`PlanSwitch` calls the fast plan's runner.  It starts the background plan
(``planning.anytime.BackgroundPlan``) at the entry of a later call (the second at the
earliest) once no graph has compiled in this process for ``QUIET_S`` (:func:`compiling`
marks compiles): by then the model's first call, and every compile it triggered (a graph
break's graphs, run twice in one call, would otherwise start it between two compiles), are
over, so the background never slows a compile.  At the entry of a later call, once that plan has finished and the runner is
``ready`` (not in the middle of measuring), ``adopt`` builds the new runner, which every
later call uses; a call already running finishes on the runner it started with.  The
swap happens under a lock, so concurrent callers see one runner or the other, never a
half-built one.  :class:`PlanLog` says which plan ran which calls and why it switched.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: the first call whose entry may start the background plan
START_AT_CALL = 2
#: seconds since the last compile (of any graph) before a background plan starts
QUIET_S = 0.25

# when the last compile of this process ended (``inf``: one is under way)
_last_compile = [-math.inf]


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Mark a compile: no background plan starts while one runs or for ``QUIET_S`` after."""
    _last_compile[0] = math.inf
    try:
        yield
    finally:
        _last_compile[0] = time.perf_counter()


def quiet() -> bool:
    """Whether no graph compiled in the last ``QUIET_S`` seconds."""
    return time.perf_counter() - _last_compile[0] >= QUIET_S


@dataclass
class Segment:
    """Calls ``first``..``last`` (``None``: up to now) ran ``plan``."""

    plan: str
    first: int
    last: int | None = None

    def describe(self) -> str:
        """
        >>> Segment("heft plan", 1, 40).describe(), Segment("cpsat plan", 41).describe()
        ('heft plan ran calls 1-40', 'cpsat plan from call 41')
        """
        if self.last is None:
            return f"{self.plan} from call {self.first}"
        calls = f"call {self.first}" if self.last == self.first else \
            f"calls {self.first}-{self.last}"
        return f"{self.plan} ran {calls}"


@dataclass
class PlanLog:
    """Which plan ran which calls, the background plan's state, and why it switched."""

    job: Any  # planning.anytime.BackgroundPlan
    segments: list[Segment] = field(default_factory=list)
    #: what happened to the background plan, in words ("" while it runs)
    outcome: str = ""

    def describe(self) -> str:
        """
        >>> log = PlanLog(None, [Segment("heft plan", 1, 3), Segment("cpsat plan", 4)],
        ...               "CP-SAT's plan took over (predicted 9.0 us, was 10.0 us)")
        >>> log.describe()
        "plans: heft plan ran calls 1-3; cpsat plan from call 4: CP-SAT's plan took over (predicted 9.0 us, was 10.0 us)"
        """
        runs = "; ".join(s.describe() for s in self.segments) or "not called yet"
        state = self.outcome or {"waiting": "CP-SAT starts at a later call, after the compiles",
                                 "running": "CP-SAT is planning in the background"
                                 }.get(getattr(self.job, "state", ""), "")
        return f"plans: {runs}" + (f": {state}" if state else "")

    def wait(self, timeout: float | None = None) -> bool:
        """Start the background plan if it has not started, and wait for it to end."""
        self.job.start()
        return self.job.wait(timeout)


class PlanSwitch:
    """Call ``fn``; switch to ``adopt(job)``'s runner between calls once ``job`` finished.

    ``adopt`` returns ``(runner or None to keep fn, why)``, ``ready()`` says whether a
    switch may happen now, ``quiet()`` whether the job may start (:func:`quiet`).  Dropping the switch (Dynamo dropping the graph) cancels the job.

    >>> class Job:
    ...     state, finished = "waiting", False
    ...     def start(self): self.state, self.finished = "done", True
    ...     def cancel(self): pass
    >>> switch = PlanSwitch(lambda x: x + 1, Job(), lambda job: (lambda x: x + 2, "better"),
    ...                     "fast plan", "new plan", quiet=lambda: True)
    >>> [switch(0) for _ in range(3)], switch.log.describe()
    ([1, 1, 2], 'plans: fast plan ran calls 1-2; new plan from call 3: better')
    """

    def __init__(self, fn: Callable[..., Any], job: Any,
                 adopt: Callable[[Any], tuple[Callable[..., Any] | None, str]],
                 label: str, new_label: str, ready: Callable[[], bool] = lambda: True,
                 quiet: Callable[[], bool] = quiet) -> None:
        self.fn = fn
        self._quiet = quiet
        self.log = PlanLog(job, [Segment(label, 1)])
        self._adopt = adopt
        self._ready = ready
        self._new_label = new_label
        self._pending = True
        self._calls = 0
        self._lock = threading.Lock()
        weakref.finalize(self, job.cancel)

    def __call__(self, *args: Any) -> Any:
        with self._lock:
            self._calls += 1
            if self._pending:
                self._step()
            fn = self.fn
        return fn(*args)

    def _step(self) -> None:
        job = self.log.job
        if job.state == "waiting":
            if self._calls >= START_AT_CALL and self._quiet():
                job.start()
        elif job.state in ("cancelled", "forked"):
            self._pending = False
            self.log.outcome = f"the background plan was {job.state}; the fast plan stays"
        elif job.finished and self._ready():
            self._pending = False
            new, why = self._adopt(job)
            self.log.outcome = why
            if new is not None:
                self.log.segments[-1].last = self._calls - 1
                self.log.segments.append(Segment(self._new_label, self._calls))
                self.fn = new
