"""The machine a figure was timed on, and how busy it was meanwhile.

A CPU timing depends on the CPU (cores, caches, memory bandwidth) and on what else runs:
eager's intra-op threads wait for each other when another process holds a core, so a
busy machine makes a plan on one thread per stream look many times faster than it is
(``docs/cpu-runtime.md``).  Every figure the demo, ``experiments/speedup.py`` and the
backend's measured choice print names its :class:`Machine` and its :class:`Load`; a
figure timed while the machine was :attr:`Load.busy` is printed marked unreliable, with
the reason, never as a result.

**Busy** (defined here only): during the timing, other processes (and, on a VM, the
hypervisor's steal) took more than ``BUSY_SHARE`` of the cores the timing uses
(:attr:`Load.used`: its threads, by default every core).  Other processes may keep the
cores the timing leaves idle busy; beyond those, each core they hold is one the timing
needed.  Their CPU time is what ``/proc/stat`` counts on all cores, less this process's
own (all its threads), on average over the timing.  The 1-minute load average cannot tell
on its own: it counts this process's threads, which a timing keeps busy.  Where
``/proc/stat`` cannot be read, or the timing was shorter than ``MIN_WINDOW_S`` (its
counters tick every 10 ms), the rule falls back on the load average before the timing:
busy above the idle cores plus ``BUSY_LOAD`` of the used ones.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

#: the share of the cores a timing uses that other processes may take, on average during
#: it, beyond the cores it leaves idle
BUSY_SHARE = 0.1
#: the 1-minute load average before a timing, beyond the idle cores, as a share of the
#: cores the timing uses, above which a machine is busy where the CPU time of other
#: processes cannot be read
BUSY_LOAD = 0.5
#: the shortest timing whose other processes' CPU time is read (``/proc/stat`` ticks 10 ms)
MIN_WINDOW_S = 0.2


@dataclass(frozen=True)
class Machine:
    """What a figure was measured on: the CPU model, its cores, the intra-op threads.

    >>> str(Machine("AMD EPYC 7B13", 2, 2))
    'AMD EPYC 7B13, 2 cores, 2 intra-op threads'
    """

    cpu: str
    cores: int
    threads: int

    def __str__(self) -> str:
        return (f"{self.cpu}, {self.cores} core{'s' * (self.cores != 1)}, {self.threads} "
                f"intra-op thread{'s' * (self.threads != 1)}")


def this_machine(cpuinfo: str | None = None) -> Machine:
    """This machine: the CPU model from ``/proc/cpuinfo`` (``cpuinfo``: its text, for
    tests), else ``platform``'s; ``os.cpu_count()``; ``torch.get_num_threads()``.

    >>> this_machine("processor\\t: 0\\nmodel name\\t: Intel(R) Xeon(R) Gold 6148\\n").cpu
    'Intel(R) Xeon(R) Gold 6148'
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith("model name") and ":" in line), "")
    return Machine(model or platform.processor() or platform.machine() or "unknown CPU",
                   os.cpu_count() or 1, torch.get_num_threads())


@dataclass(frozen=True)
class Reading:
    """One look at the machine: ``at`` (monotonic seconds), the 1-minute load average,
    the seconds all cores have spent busy since boot (``None``: unreadable) and this
    process's CPU seconds."""

    at: float
    load1: float | None
    busy_s: float | None
    own_s: float


def busy_seconds(proc_stat: str, ticks_per_s: float) -> float | None:
    """Seconds all cores spent busy (steal included, idle and I/O wait not), from the
    text of ``/proc/stat``; ``None`` without its ``cpu`` line.

    >>> busy_seconds("cpu  100 0 50 900 10 0 5 20 0 0\\ncpu0 1 0 0 0 0 0 0 0 0 0\\n", 100)
    1.75
    """
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu" and len(fields) >= 8:
            user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(v) for v in fields[1:])
            steal = rest[0] if rest else 0  # guest time is counted in user already
            return (user + nice + system + irq + softirq + steal) / ticks_per_s
    return None


def read() -> Reading:
    """This machine now (see :class:`Reading`)."""
    try:
        load1: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):  # pragma: no cover - platforms without it
        load1 = None
    try:
        with open("/proc/stat") as f:
            busy = busy_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        busy = None
    return Reading(time.monotonic(), load1, busy, time.process_time())


@dataclass(frozen=True)
class Load:
    """How busy the machine was while a figure was timed.

    >>> quiet = Load(2, 0.4, 1.6, 0.05, 30.0)
    >>> quiet.busy, str(quiet)
    (False, 'load average 0.4 -> 1.6 on 2 cores; other processes 0.05 cores during the timing')
    >>> Load(2, 3.1, 3.4, 1.3, 30.0).reason
    'busy: other processes kept 1.30 of 2 cores busy during the timing (load average 3.1 -> 3.4 on 2 cores)'

    A timing on 2 of 8 cores leaves 6 to other processes:

    >>> Load(8, 6.0, 6.0, 5.5, 30.0, used=2).busy, Load(8, 6.0, 6.0, 6.5, 30.0, used=2).busy
    (False, True)
    """

    cores: int
    #: the 1-minute load average before and after the timing (``None``: unknown)
    before: float | None
    after: float | None
    #: cores other processes kept busy on average during the timing (``None``: unknown)
    others: float | None
    #: the timing's length, seconds
    seconds: float
    #: cores the timing itself keeps busy (its threads; ``None``: every core)
    used: int | None = None

    @classmethod
    def between(cls, start: Reading, end: Reading, cores: int | None = None,
                used: int | None = None) -> Load:
        """The load from ``start`` to ``end`` (two :func:`read` results) of a timing on
        ``used`` of the ``cores`` (``None``: all).

        >>> a, b = Reading(0.0, 0.5, 100.0, 10.0), Reading(10.0, 1.9, 124.0, 22.0)
        >>> Load.between(a, b, cores=2).others  # 24 s busy, 12 of them this process's
        1.2
        """
        cores = cores or os.cpu_count() or 1
        seconds = max(0.0, end.at - start.at)
        others = None
        if start.busy_s is not None and end.busy_s is not None and seconds >= MIN_WINDOW_S:
            spent = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
            others = round(min(float(cores), max(0.0, spent / seconds)), 3)
        return cls(cores, start.load1, end.load1, others, seconds, used)

    @property
    def timing_cores(self) -> int:
        """Cores the timing uses: :attr:`used`, at most every core."""
        return max(1, min(self.cores, self.used or self.cores))

    @property
    def busy(self) -> bool:
        """Whether the figure is unreliable (the rule in the module docstring).

        >>> Load(2, 0.5, 0.5, 0.46, 9.0).busy  # 23% of the timing's 2 cores
        True
        """
        idle = self.cores - self.timing_cores
        if self.others is not None:
            return self.others > idle + BUSY_SHARE * self.timing_cores
        return self.before is not None and self.before > idle + BUSY_LOAD * self.timing_cores

    @property
    def reason(self) -> str:
        """Why the figure is unreliable, in words ("" when the machine was not busy)."""
        if not self.busy:
            return ""
        on = (f", which used {self.timing_cores} of them" if self.timing_cores < self.cores
              else "")
        if self.others is not None:
            return (f"busy: other processes kept {self.others:.2f} of {self.cores} cores busy "
                    f"during the timing{on} (load average {self._loads()} on {self.cores} "
                    f"cores)")
        return (f"busy: load average {self._loads()} on {self.cores} cores before the "
                f"timing{on}")

    def _loads(self) -> str:
        if self.before is None:
            return "unknown"
        after = (f" -> {self.after:.1f}" if self.after is not None
                 and f"{self.after:.1f}" != f"{self.before:.1f}" else "")
        return f"{self.before:.1f}{after}"

    def __str__(self) -> str:
        others = (f"; other processes {self.others:.2f} cores during the timing"
                  if self.others is not None else "; other processes' CPU time unknown")
        return f"load average {self._loads()} on {self.cores} cores{others}"

    def figures(self) -> dict[str, Any]:
        """The load as JSON-ready figures.

        >>> Load(2, 0.4, None, None, 0.1).figures()
        {'cores': 2, 'used_cores': 2, 'load_before': 0.4, 'load_after': None, 'others_cores': None, 'seconds': 0.1, 'busy': False}
        """
        def rounded(x: float | None) -> float | None:
            return None if x is None else round(x, 2)

        return {"cores": self.cores, "used_cores": self.timing_cores,
                "load_before": rounded(self.before), "load_after": rounded(self.after),
                "others_cores": self.others, "seconds": round(self.seconds, 3), "busy": self.busy}


def worst(loads: Iterable[Load | None]) -> Load | None:
    """The busiest of ``loads`` (a figure drawn from several timings is as reliable as the
    least reliable of them): busy ones first, then the most other processes' CPU time.

    >>> worst([Load(2, 0.1, 0.1, 0.0, 1.0), Load(2, 0.2, 0.2, 0.9, 1.0), None]).others
    0.9
    """
    known = [x for x in loads if x is not None]
    if not known:
        return None
    return max(known, key=lambda x: (x.busy, x.others or 0.0, x.before or 0.0))


class LoadWatch:
    """Reads the machine when made; :meth:`load` is the load since, of a timing on
    ``used`` of the ``cores`` (``None``: all).

    >>> readings = iter([Reading(0.0, 0.1, 0.0, 0.0), Reading(1.0, 0.1, 1.9, 0.5)])
    >>> LoadWatch(lambda: next(readings), cores=2).load().busy  # 1.4 cores of others
    True
    """

    def __init__(self, reader: Callable[[], Reading] = read, cores: int | None = None,
                 used: int | None = None):
        self._reader, self._cores, self._used = reader, cores, used
        self._start = reader()

    def load(self) -> Load:
        return Load.between(self._start, self._reader(), self._cores, self._used)
