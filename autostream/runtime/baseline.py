"""Eager at its best intra-op thread count: the fair single-stream baseline of a CPU plan.

A plan on the threads runtime gives its main stream ``budget // streams`` intra-op
threads and each side stream one (``runtime/threads.py``); eager runs every op on the
caller's whole count.  Where ops are small, or another process holds a core (eager's
OpenMP threads then wait for each other: 16 matmuls took 14 ms on one thread and 128 ms
on two, on a busy 2-core VM), one thread beats two, and a plan compared with eager at the
caller's count only gains by the threads it does not use.  So a plan is compared with
eager at every intra-op thread count it could have used instead: 1 to the count the plan
uses in all (on 2 cores with 2 streams: 1 and 2), and the fastest is the baseline.

Above 4 threads the counts double (1, 2, 3, 4, 8, ... and the top), so the candidates
stay a handful on a large machine.  Counts above the caller's (or the cores) are left out:
the caller chose its count, and a caller on one thread gets eager's bits from a plan
(``docs/correctness.md``), which eager on two threads would not give.  A thread-count
change holds for the calling thread only (not torch's process default); each candidate
sets its count for the call and restores the caller's after it, also when the call
raises.  Where this torch's OpenMP cannot be reached there are no such candidates.

Outputs: a matmul or reduction on 1 and on 2 threads may differ in the last bits, so a
candidate at another count equals eager within rounding (``docs/correctness.md``);
with ``deterministic=True`` (eager's bits promised) no such candidate is made.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from autostream.fx.intra_op import IntraOpThreads, threads_here
from autostream.runtime.choice import MeasuredChoice

#: counts up to this are each tried; above it they double
EVERY_COUNT_UP_TO = 4


def plan_threads(streams: int, budget: int) -> int:
    """Intra-op threads a plan on ``streams`` streams uses in all on the threads runtime,
    the caller holding ``budget`` (the main stream ``max(1, budget // streams)``, each
    side stream one).

    >>> plan_threads(2, 2), plan_threads(2, 8), plan_threads(1, 4), plan_threads(4, 2)
    (2, 5, 4, 4)
    """
    streams = max(1, streams)
    return max(1, budget // streams) + streams - 1


def thread_counts(total: int, caller: int, cores: int | None = None) -> list[int]:
    """Intra-op thread counts to time eager at besides the caller's own (which is eager's
    default candidate): 1 to ``total``, at most the caller's count and ``cores``, doubling
    above ``EVERY_COUNT_UP_TO``.

    >>> thread_counts(2, 2, cores=2)
    [1]
    >>> thread_counts(5, 8, cores=8)
    [1, 2, 3, 4, 5]
    >>> thread_counts(33, 64, cores=64)
    [1, 2, 3, 4, 8, 16, 32, 33]
    >>> thread_counts(4, 2, cores=2), thread_counts(2, 1, cores=2)  # never above the caller
    ([1], [])
    """
    top = max(1, min(total, caller, cores or os.cpu_count() or 1))
    counts = set(range(1, min(top, EVERY_COUNT_UP_TO) + 1))
    k = EVERY_COUNT_UP_TO
    while k * 2 <= top:
        k *= 2
        counts.add(k)
    counts.add(top)
    return sorted(counts - {caller})


def label(threads: int) -> str:
    """The candidate's name: eager at ``threads`` intra-op threads.

    >>> label(1), label(4)
    ('eager (1 thread)', 'eager (4 threads)')
    """
    return f"eager ({threads} thread{'s' * (threads != 1)})"


def at_threads(fn: Callable[..., Any], threads: int,
               intra_op: IntraOpThreads | None = None) -> Callable[..., Any]:
    """``fn`` run with ``threads`` intra-op threads on the calling thread, whose own count
    is restored after the call, also when it raises; torch's process default (which
    threads started meanwhile take) is left alone (``fx.intra_op``).

    >>> before = torch.get_num_threads()
    >>> at_threads(lambda: torch.get_num_threads(), 1)(), torch.get_num_threads() == before
    (1, True)
    """
    setter = intra_op or IntraOpThreads.find()

    def run(*args: Any) -> Any:
        if torch.get_num_threads() == threads:
            return fn(*args)
        with threads_here(threads, setter):
            return fn(*args)

    run.intra_op_threads = threads
    return run


def eager_candidates(fn: Callable[..., Any], runtime: str, streams: int,
                     deterministic: bool = False, caller: int | None = None,
                     cores: int | None = None) -> dict[str, Callable[..., Any]]:
    """Eager (``fn``, Dynamo's graph) at the other thread counts a plan on ``runtime``
    with ``streams`` streams is compared with, by name: none off the threads runtime
    (streams on a device, the sequential runtime on the caller's count) or with
    ``deterministic=True``.

    >>> sorted(eager_candidates(abs, "threads", 2, caller=2, cores=2))
    ['eager (1 thread)']
    >>> eager_candidates(abs, "threads", 2, deterministic=True, caller=2, cores=2)
    {}
    """
    if runtime != "threads" or deterministic:
        return {}
    intra_op = IntraOpThreads.find()
    if not intra_op.available:  # a count set here would be every thread's
        return {}
    caller = caller or torch.get_num_threads()
    return {label(k): at_threads(fn, k, intra_op)
            for k in thread_counts(plan_threads(streams, caller), caller, cores)}


def fastest_single(choice: MeasuredChoice | None, names: tuple[str, ...],
                   caller_threads: int) -> tuple[str, int] | None:
    """The fastest of the single-stream candidates ``names`` that ``choice`` measured, and
    its intra-op threads (``None`` until measured).

    >>> now = [0.0]
    >>> def taking(seconds):  # a candidate that advances a fake clock
    ...     return lambda x: now.__setitem__(0, now[0] + seconds)
    >>> choice = MeasuredChoice({"eager": taking(2e-3), label(1): at_threads(taking(1e-3), 1)},
    ...                         trials=1, settle_s=0.0, clock=lambda: now[0])
    >>> _ = [choice(0) for _ in range(4)]
    >>> fastest_single(choice, ("eager", label(1)), caller_threads=2)
    ('eager (1 thread)', 1)
    """
    timings = choice.timings if choice is not None else {}
    measured = [n for n in names if n in timings]
    if not measured:
        return None
    best = min(measured, key=lambda n: timings[n].median)
    return best, getattr(choice.candidates[best], "intra_op_threads", None) or caller_threads


def baseline_text(choice: MeasuredChoice, names: tuple[str, ...], caller_threads: int) -> str:
    """The fastest single stream, the plan (candidate ``streams``, or ``graph`` on the graph
    runtime) against it and the load, in words ("" until measured)."""
    best = fastest_single(choice, names, caller_threads)
    if best is None:
        return ""
    name, threads = best
    timings = choice.timings
    text = f"fastest single stream: {name}"
    if not hasattr(choice.candidates[name], "intra_op_threads"):
        text += f" (the caller's {threads} intra-op thread{'s' * (threads != 1)})"
    plan = next((n for n in ("streams", "graph") if n in timings), None)
    if plan is not None:
        text += f"; {plan} {timings[name].median / timings[plan].median:.2f}x as fast as it"
    return text + (f"; {choice.load}" if choice.load is not None else "")
