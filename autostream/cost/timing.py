"""Timers for calibration: a monotonic clock on CPU, device events on accelerators.

Both expose the same three measurements:

- ``samples(fn, warmup, repeat)``: per-call times (us) of ``fn`` run alone;
- ``contention(fn, fn2, n)``: ``(alone_us, together_us)`` for ``n`` calls of ``fn``
  alone versus ``n`` calls each of ``fn`` and ``fn2`` running concurrently (a second
  thread on CPU, a second stream on accelerators);
- ``record_wait_us()``, ``stream_switch_us()``: the device-level sync costs.

>>> t = CpuTimer()
>>> len(t.samples(lambda: None, warmup=1, repeat=5))
5
"""

from __future__ import annotations

import glob
import queue
import statistics
import threading
import time
from collections.abc import Callable

import torch

from autostream.fx.intra_op import IntraOpThreads, threads_here
from autostream.stages import collector_paused


def cpu_l2_bytes(default: int = 1 << 20) -> int:
    """Size of the largest per-core (unshared) cache level, from Linux sysfs."""

    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{d}/shared_cpu_list") as f:
                shared = f.read().strip()
            with open(f"{d}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        if "," in shared or "-" in shared:
            continue  # shared between cores (the LLC): leave it warm, as in a real graph
        mult = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
        best = max(best, int(size.rstrip("KM")) * mult)
    return best or default


#: untimed calls after each change of the intra-op thread count
WARMUP_AFTER_THREAD_CHANGE = 3


def _timed_calls(fn: Callable[[], object], n: int) -> float:
    """Microseconds of ``n`` calls, after warm-up calls (the first call after a change
    of the intra-op thread count resizes the OpenMP team: not timed)."""
    for _ in range(WARMUP_AFTER_THREAD_CHANGE):
        fn()
    with collector_paused():
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / 1e3


class CpuTimer:
    """Wall-clock timing with ``time.perf_counter_ns``; concurrency with a second thread.

    Before each timed call the timer scrubs ``scrub_bytes`` of memory (twice the
    per-core cache by default): an op inside a graph finds its weights in the shared
    cache or memory, not in the core's private cache where a tight loop would keep them.
    """

    kind = "cpu"

    def __init__(self, scrub_bytes: int | None = None) -> None:
        n = 2 * cpu_l2_bytes() if scrub_bytes is None else scrub_bytes
        self.scrub_bytes = n
        self._scrub = torch.zeros(max(n // 4, 1)) if n > 0 else None

    def unscrubbed(self) -> CpuTimer:
        """The same timer without the scrub: for timing the runtime itself.

        The scrub runs on every intra-op thread just before the timed call, and the
        OpenMP threads it wakes spin on after it, keeping the other cores awake: a
        thread handed work then wakes at once instead of paying a wake-up, which would
        hide most of the runtime's cost per call (``docs/cpu-runtime.md``).
        """
        return CpuTimer(scrub_bytes=0)

    def samples(self, fn: Callable[[], object], warmup: int, repeat: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        clock = time.perf_counter_ns
        scrub = self._scrub
        with collector_paused():
            for _ in range(repeat):
                if scrub is not None:
                    scrub.add_(1.0)
                t0 = clock()
                fn()
                out.append((clock() - t0) / 1e3)
        return out

    def contention(self, fn: Callable[[], object], fn2: Callable[[], object], n: int
                   ) -> tuple[float, float, float]:
        """Time ``n`` calls alone (all intra-op threads), alone with half of them, then
        beside a second copy; returns ``(alone, together, alone_split)`` in us.

        While two copies run, each thread gets half of the intra-op threads: the
        threads runtime divides cores between running streams the same way, so the
        measured slowdown is the one a two-stream plan meets.
        """
        clock = time.perf_counter_ns
        half = max(1, torch.get_num_threads() // 2)
        alone = _timed_calls(fn, n)
        barrier = threading.Barrier(2)
        setter = IntraOpThreads.find()

        def other() -> None:
            with threads_here(half, setter):
                for _ in range(WARMUP_AFTER_THREAD_CHANGE):
                    fn2()
                barrier.wait()
                for _ in range(n):
                    fn2()

        th = threading.Thread(target=other, daemon=True)
        with threads_here(half, setter):
            alone_split = _timed_calls(fn, n)
            th.start()
            with collector_paused():
                barrier.wait()
                t0 = clock()
                for _ in range(n):
                    fn()
                th.join()
                return alone, (clock() - t0) / 1e3, alone_split

    def record_wait_us(self, n: int = 200, idle_s: float = 0.0005) -> float:
        """A record/wait pair between two threads through ``threading.Event``, as the
        CPU runtime meets it: the waiting stream is blocked (asleep) when the record
        comes, so the cost is the time from ``set()`` until it runs again (a waiter
        that slept wakes far later than one spinning through a hot ping-pong).
        """
        go, done = threading.Event(), threading.Event()
        stamp = [0]
        latency: list[float] = []

        def waiter() -> None:
            for _ in range(n):
                go.wait()
                go.clear()
                latency.append((time.perf_counter_ns() - stamp[0]) / 1e3)
                done.set()

        th = threading.Thread(target=waiter, daemon=True)
        th.start()
        for _ in range(n):
            time.sleep(idle_s)  # let the waiter fall asleep
            done.clear()
            stamp[0] = time.perf_counter_ns()
            go.set()
            done.wait()
        th.join()
        return statistics.median(latency)

    def stream_switch_us(self, n: int = 2000) -> float:
        """Handing one task to another worker's queue and taking it back off."""
        q: queue.SimpleQueue = queue.SimpleQueue()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            q.put(None)
            q.get()
        return (time.perf_counter_ns() - t0) / 1e3 / n

    def synchronize(self) -> None:
        pass


class AcceleratorTimer:
    """Device-event timing through ``torch.Stream``/``torch.Event`` (CUDA, NPU, ...)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = device.type
        self.main = torch.Stream(device=device)
        self.side = torch.Stream(device=device)

    def _event(self) -> torch.Event:
        return torch.Event(device=self.device, enable_timing=True)

    def synchronize(self) -> None:
        torch.accelerator.synchronize(self.device)

    def samples(self, fn: Callable[[], object], warmup: int, repeat: int) -> list[float]:
        prev = torch.accelerator.current_stream(self.device)
        torch.accelerator.set_stream(self.main)
        try:
            for _ in range(warmup):
                fn()
            self.synchronize()
            pairs = []
            for _ in range(repeat):
                a, b = self._event(), self._event()
                a.record(self.main)
                fn()
                b.record(self.main)
                pairs.append((a, b))
            self.synchronize()
            return [a.elapsed_time(b) * 1e3 for a, b in pairs]
        finally:
            torch.accelerator.set_stream(prev)

    def contention(self, fn: Callable[[], object], fn2: Callable[[], object], n: int
                   ) -> tuple[float, float, float]:
        """``(alone, together, alone_split)``; streams do not divide the device, so the
        split time is the time alone."""
        prev = torch.accelerator.current_stream(self.device)
        try:
            torch.accelerator.set_stream(self.main)
            self.synchronize()
            a, b = self._event(), self._event()
            a.record(self.main)
            for _ in range(n):
                fn()
            b.record(self.main)
            self.synchronize()
            alone = a.elapsed_time(b) * 1e3
            c, d, side_done = self._event(), self._event(), self._event()
            c.record(self.main)
            self.side.wait_event(c)
            for _ in range(n):
                torch.accelerator.set_stream(self.main)
                fn()
                torch.accelerator.set_stream(self.side)
                fn2()
            side_done.record(self.side)
            self.main.wait_event(side_done)
            d.record(self.main)
            self.synchronize()
            return alone, c.elapsed_time(d) * 1e3, alone
        finally:
            torch.accelerator.set_stream(prev)

    def record_wait_us(self, n: int = 200) -> float:
        """Extra device time of a tiny op pair split over two streams with a record/wait
        between them, versus the same pair on one stream."""
        x = torch.ones(1, device=self.device)
        prev = torch.accelerator.current_stream(self.device)
        try:
            def one_stream() -> None:
                x.add_(1)
                x.add_(1)

            def two_streams() -> None:
                torch.accelerator.set_stream(self.side)
                x.add_(1)
                e = torch.Event(device=self.device)
                e.record(self.side)
                self.main.wait_event(e)
                torch.accelerator.set_stream(self.main)
                x.add_(1)

            base = statistics.median(self.samples(one_stream, 5, n))
            synced = statistics.median(self.samples(two_streams, 5, n))
            return max(synced - base, 0.0)
        finally:
            torch.accelerator.set_stream(prev)

    def stream_switch_us(self, n: int = 2000) -> float:
        """Host time of switching the current stream away and back, per switch."""
        prev = torch.accelerator.current_stream(self.device)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            torch.accelerator.set_stream(self.side)
            torch.accelerator.set_stream(prev)
        return (time.perf_counter_ns() - t0) / 1e3 / (2 * n)


def available_device(kind: str) -> torch.device:
    """``torch.device`` for ``kind`` (``cpu``, ``cuda``, ``npu``) or a clear ``RuntimeError``.

    >>> available_device("cpu")
    device(type='cpu')
    """
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except ImportError:
            raise RuntimeError("device 'npu' is not available: torch_npu is not installed "
                               "(install torch_npu and CANN on an Ascend machine, or use "
                               "--device cpu)") from None
    if kind not in ("cuda", "npu"):
        raise ValueError(f"unknown device {kind!r}; choose cpu, cuda or npu")
    backend = getattr(torch, kind, None)
    if backend is None or not backend.is_available():
        raise RuntimeError(f"device {kind!r} is not available on this machine "
                           f"(torch.{kind}.is_available() is False); use --device cpu or run "
                           f"on a machine with a {kind.upper()} device")
    return torch.device(kind, backend.current_device())


def make_timer(device: torch.device) -> CpuTimer | AcceleratorTimer:
    return CpuTimer() if device.type == "cpu" else AcceleratorTimer(device)
