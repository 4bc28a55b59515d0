"""What a runtime measures of its memory: the bytes of the tensors it holds during one call.

Opt-in (``record_memory=True`` on a runner), nothing is counted otherwise.

- :class:`LiveBytes` (CPU threads runtime): every storage the runtime's environment
  references counts once, from the start of the op that produced it until the
  runtime drops its last reference; graph inputs count for the whole call (the
  caller holds them).  Op workspaces freed inside an op are not seen.
- :func:`allocator_peak` (accelerator runtime): the device allocator's own
  ``max_memory_allocated`` over the call, less what was allocated when the call
  began, plus the inputs: every allocation made during the call, workspaces included.

Both give a :class:`MeasuredMemory`, comparable to
:class:`autostream.memory.predict.MemoryProfile.peak_bytes`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["AllocatorStats", "LiveBytes", "MeasuredMemory", "allocator_peak", "storage_bytes"]


@dataclass(frozen=True)
class MeasuredMemory:
    """One call's measured memory, in bytes."""

    peak_bytes: int
    input_bytes: int
    #: ``(microseconds since the call began, bytes)`` after each change (empty when
    #: only the allocator's peak is known)
    curve: tuple[tuple[float, int], ...] = ()


def _storages(value: Any) -> list[tuple[int, int]]:
    """``(address, bytes)`` of each distinct non-empty storage in ``value``."""
    out = {}
    for t in tree_leaves(value):
        if isinstance(t, torch.Tensor):
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse, meta: no plain storage
                continue
            if storage.nbytes() > 0:
                out[storage.data_ptr()] = storage.nbytes()
    return list(out.items())


def storage_bytes(values: Iterable[Any]) -> int:
    """Bytes of the distinct storages in ``values``.

    >>> x = torch.zeros(4)
    >>> storage_bytes([x, x[:2], torch.zeros(2)])
    24
    """
    seen: dict[int, int] = {}
    for v in values:
        seen.update(_storages(v))
    return sum(seen.values())


class LiveBytes:
    """The storages a runtime holds, counted once each, safe to update from every stream.

    >>> m = LiveBytes(clock=iter([0.0, 1e-6, 2e-6]).__next__)
    >>> x = torch.zeros(256)
    >>> m.hold(x, start=m.now())
    >>> m.drop(x)
    >>> m.result()
    MeasuredMemory(peak_bytes=1024, input_bytes=0, curve=((0.0, 0), (1.0, 1024), (2.0, 0)))
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._refs: dict[int, int] = {}
        self._pinned: set[int] = set()
        self._events: list[tuple[float, int]] = []
        self._inputs = 0
        self._t0 = clock()

    def now(self) -> float:
        return self._clock()

    def pin(self, values: Iterable[Any]) -> None:
        """The call's inputs: held by the caller, so never dropped."""
        with self._lock:
            for v in values:
                for key, nbytes in _storages(v):
                    if key not in self._pinned:
                        self._pinned.add(key)
                        self._inputs += nbytes

    def hold(self, value: Any, start: float) -> None:
        """The runtime stores ``value``, produced by an op that began at ``start``."""
        with self._lock:
            for key, nbytes in _storages(value):
                if key in self._pinned:
                    continue
                self._refs[key] = self._refs.get(key, 0) + 1
                if self._refs[key] == 1:
                    self._events.append((start, nbytes))

    def drop(self, value: Any) -> None:
        """The runtime let go of ``value``."""
        if value is None:
            return
        t = self._clock()
        with self._lock:
            for key, nbytes in _storages(value):
                if key in self._pinned or key not in self._refs:
                    continue
                left = self._refs[key] - 1
                if left <= 0:
                    self._refs.pop(key, None)
                    self._events.append((t, -nbytes))
                else:
                    self._refs[key] = left

    def result(self) -> MeasuredMemory:
        live, peak = self._inputs, self._inputs
        curve = [(0.0, live)]
        for t, delta in sorted(self._events):
            live += delta
            peak = max(peak, live)
            curve.append(((t - self._t0) * 1e6, live))
        return MeasuredMemory(peak, self._inputs, tuple(curve))


class AllocatorStats(Protocol):
    """The three allocator figures :func:`allocator_peak` reads (``torch.accelerator``'s)."""

    def memory_allocated(self) -> int: ...
    def max_memory_allocated(self) -> int: ...
    def reset_peak_memory_stats(self) -> None: ...


def allocator_peak(stats: AllocatorStats, inputs: Iterable[Any], run: Callable[[], Any]
                   ) -> tuple[Any, MeasuredMemory]:
    """Run ``run()`` and measure its peak with the allocator's statistics.

    >>> class Fake:
    ...     allocated, peak = 1000, 0
    ...     def memory_allocated(self): return self.allocated
    ...     def max_memory_allocated(self): return self.peak
    ...     def reset_peak_memory_stats(self): self.peak = self.allocated
    >>> fake = Fake()
    >>> def run():
    ...     fake.peak = fake.allocated + 300
    ...     return "out"
    >>> allocator_peak(fake, [torch.zeros(16)], run)
    ('out', MeasuredMemory(peak_bytes=364, input_bytes=64, curve=()))
    """
    inputs = storage_bytes(inputs)
    base = stats.memory_allocated()
    stats.reset_peak_memory_stats()
    out = run()
    peak = stats.max_memory_allocated() - base
    return out, MeasuredMemory(inputs + max(0, peak), inputs)
