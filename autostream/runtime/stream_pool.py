"""Device streams shared by every graph in the process: one pool per device.

Side stream ``k`` of every graph on a device is the same stream, and every graph runner
captures on the same capture stream: a model compiled into 24 graphs uses at most
``max_streams - 1`` side streams and one capture stream per device, not a set per graph.
Hand-placed stream code that made a stream per layer lost throughput (prefill 4.11 to 1.2
in one report) and ran out of device streams during capture.

Sharing is correct because every call forks each side stream from the caller's stream
(an event recorded there, waited on by the side stream) before its first op, and joins
them back before it returns (:class:`autostream.runtime.streams.DeviceCall`), with an
event of its own for every record.  Two calls on one side stream, from two user threads
at once, interleave their kernels in launch order: stream order adds dependences between
them (one call's join may also wait for the other's kernels), it never removes one,
and each dependence points to work already launched, so they cannot deadlock.  They
serialise on the stream, no more.  A block the allocator frees on a side stream is reused
there in stream order, after the waits that released it, whichever call allocates next.

A capture is the exception: while one thread captures, work another thread launches on
the capture stream or a forked side stream would be captured into its graph (or end the
capture with an isolation error).  ``DeviceStreams.lock`` is there for it: a capture
(warm-up included) holds it for its duration, and so must every other call that launches
on the pool's streams of that device while captures may run.

Pools are kept per device and per API factory (the class or function that builds the
device's stream API): in a process that is one per device; tests give each fake device
a factory of its own.  A forked child starts with none.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["DeviceStreams", "device_streams"]


class DeviceStreams:
    """The streams of one device: side stream ``k`` and one capture stream, each made once.

    >>> made = iter("abcd")
    >>> pool = DeviceStreams()
    >>> pool.side((1, 2), lambda: next(made)), pool.side((1,), lambda: next(made))
    ({1: 'a', 2: 'b'}, {1: 'a'})
    >>> pool.capture(lambda: next(made)), pool.capture(lambda: next(made))
    ('c', 'c')
    """

    def __init__(self) -> None:
        #: guards the streams made here; held by a capture on this device for its duration
        self.lock = threading.RLock()
        self._side: dict[int, Any] = {}
        self._capture: Any = None

    def side(self, streams: Iterable[int], new_stream: Callable[[], Any]) -> dict[int, Any]:
        """Side stream ``k`` for each ``k`` in ``streams`` (made by ``new_stream`` once)."""
        with self.lock:
            for k in streams:
                if k not in self._side:
                    self._side[k] = new_stream()
            return {k: self._side[k] for k in streams}

    def capture(self, new_stream: Callable[[], Any]) -> Any:
        """The device's capture stream (made by ``new_stream`` once)."""
        with self.lock:
            if self._capture is None:
                self._capture = new_stream()
            return self._capture

    def count(self) -> int:
        """Streams made so far (side and capture)."""
        with self.lock:
            return len(self._side) + (self._capture is not None)


_LOCK = threading.Lock()
#: API factory -> device -> its streams (a factory that cannot be weakly referenced: kept)
_BY_FACTORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_KEPT: dict[Any, dict[torch.device, DeviceStreams]] = {}


def _forget_in_child() -> None:
    """A forked child cannot use its parent's device streams (nor a lock held at fork)."""
    global _LOCK
    _LOCK = threading.Lock()
    _BY_FACTORY.clear()
    _KEPT.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def device_streams(factory: Callable[..., Any], device: torch.device) -> DeviceStreams:
    """The process-wide streams of ``device`` for the stream API ``factory`` builds.

    >>> a = device_streams(DeviceStreams, torch.device("cpu"))
    >>> a is device_streams(DeviceStreams, torch.device("cpu"))
    True
    """
    with _LOCK:
        try:
            per_device = _BY_FACTORY.setdefault(factory, {})
        except TypeError:  # no weak reference to it
            per_device = _KEPT.setdefault(factory, {})
        if device not in per_device:
            per_device[device] = DeviceStreams()
        return per_device[device]
