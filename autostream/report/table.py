"""Markdown comparison table of several solvers' plans for one problem."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autostream.memory.budget import format_bytes
from autostream.memory.predict import MemoryProfile
from autostream.scheduling.schedule import Schedule, Sync


@dataclass(frozen=True)
class SolverResult:
    """One solver's plan for a problem, or the reason it has none (``error``)."""

    solver: str
    schedule: Schedule | None
    syncs: tuple[Sync, ...] = ()
    plan_seconds: float = 0.0
    error: str | None = None
    note: str | None = None
    #: simulated makespan with a host launch overhead per op (``simulate_plan``), if asked
    overhead_makespan: float | None = None
    #: the plan's predicted memory, when the problem comes with tensor sizes
    memory: MemoryProfile | None = None
    #: the plan's time with the multi-stream runtime's host costs (``autostream plan``'s
    #: prediction), when the problem comes with them
    runtime_us: float | None = None

    @property
    def ok(self) -> bool:
        return self.schedule is not None and self.error is None


def _fmt_us(x: float) -> str:
    return f"{x:,.1f}"


def _runtime(us: float | None, baseline: float | None) -> str:
    if us is None:
        return "-"
    return _fmt_us(us) + (f" ({baseline / us:.2f}x)" if baseline and us > 0 else "")


def _fmt_peak(memory: MemoryProfile | None, single_peak: int | None) -> str:
    if memory is None:
        return "-"
    if not single_peak:
        return format_bytes(memory.peak_bytes)
    return f"{format_bytes(memory.peak_bytes)} ({memory.peak_bytes / single_peak - 1:+.0%})"


def fmt_pct(fraction: float) -> str:
    """``0.123`` -> ``"12.3%"``; rounding noise never prints as ``-0.0%``.

    >>> fmt_pct(0.1234), fmt_pct(-1e-12)
    ('12.3%', '0.0%')
    """
    value = round(100 * fraction, 1)
    return f"{value if value != 0 else 0.0:.1f}%"


def markdown_table(
    results: Sequence[SolverResult],
    baseline: float | None = None,
) -> str:
    """Solver, streams used, syncs, predicted makespan, lower bound, gap, speed-up, plan time.

    ``baseline`` is the single-stream time the speed-up is relative to (default:
    the ``single`` solver's makespan when present).  A proven-optimal makespan is
    marked ``*``.  When any result has ``overhead_makespan``, a column shows it;
    when any has ``memory``, a column shows its predicted peak (and its rise over
    the ``single`` solver's).

    >>> from autostream.scheduling.schedule import Schedule
    >>> s = Schedule("single", {"a": 0}, ("a",), {"a": 0.0}, {"a": 4.0}, 4.0, 2.0)
    >>> print(markdown_table([SolverResult("single", s, (), 0.01)]))
    | solver | streams used | syncs | predicted makespan (us) | lower bound (us) | gap | speed-up | plan time (s) |
    |---|---:|---:|---:|---:|---:|---:|---:|
    | single | 1 | 0 | 4.0 | 2.0 | 100.0% | 1.00x | 0.010 |
    """
    if baseline is None:
        baseline = next((r.schedule.makespan for r in results
                         if r.ok and r.solver == "single" and r.schedule is not None), None)
    extra = any(r.overhead_makespan is not None for r in results)
    runtime = any(r.runtime_us is not None for r in results)
    memory = any(r.memory is not None for r in results)
    single_peak = next((r.memory.peak_bytes for r in results
                        if r.ok and r.solver == "single" and r.memory is not None), None)
    head = ("| solver | streams used | syncs | predicted makespan (us) | lower bound (us) | gap "
            "| speed-up | plan time (s) |" + (" with launch overhead (us) |" if extra else "")
            + (" with runtime costs (us) |" if runtime else "")
            + (" peak memory |" if memory else ""))
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if extra else "")
             + ("---:|" if runtime else "") + ("---:|" if memory else "")]
    for r in results:
        s = r.schedule
        if s is None or r.error:
            reason = (r.error or "no plan").replace("|", "/").splitlines()[0][:80]
            lines.append(f"| {r.solver} | - | - | failed: {reason} | - | - | - "
                         f"| {r.plan_seconds:.3f} |" + (" - |" if extra else "")
                         + (" - |" if runtime else "") + (" - |" if memory else ""))
            continue
        star = "*" if s.optimal else ""
        speed = f"{baseline / s.makespan:.2f}x" if baseline and s.makespan > 0 else "-"
        lines.append(
            f"| {r.solver} | {s.streams_used} | {len(r.syncs)} | {_fmt_us(s.makespan)}{star} "
            f"| {_fmt_us(s.lower_bound)} | {fmt_pct(s.gap)} | {speed} | {r.plan_seconds:.3f} |"
            + (f" {_fmt_us(r.overhead_makespan)} |" if r.overhead_makespan is not None
               else " - |" if extra else "")
            + (f" {_runtime(r.runtime_us, baseline)} |" if runtime else "")
            + (f" {_fmt_peak(r.memory, single_peak)} |" if memory else "")
        )
    return "\n".join(lines)
