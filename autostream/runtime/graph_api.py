"""Device-generic graph capture: the few calls a captured runtime makes.

CUDA's ``torch.cuda.CUDAGraph`` and torch-npu's ``torch.npu.NPUGraph`` share one API
(``torch.cuda.graph(g, pool=..., stream=...)`` as a context manager, ``g.replay()``,
``graph_pool_handle()``), so the device-specific part is the name of the graph class
(:data:`GRAPH_CLASSES`).  Everything else goes through ``torch.get_device_module``.

:class:`GraphAPI` is what the runtime and the calibration call; tests pass a fake one
(``tests/fake_device.py``) to check the capture on the CPU, and run
:class:`TorchGraphAPI` itself on a fake of torch 2.11's ``torch.cuda``.

**A capture that fails leaves nothing.**  ``torch.cuda.graph.__exit__`` (torch 2.11) calls
``capture_end()`` before it restores the caller's stream: a body that raises with a side
stream forked and not joined makes ``capture_end`` raise "unjoined" instead, skip the
allocator's ``endAllocateToPool``, and leave the capture stream current.
:meth:`TorchGraphAPI.capture` therefore runs the capture itself: on a failure it returns
to the capture stream, joins the forked side streams (``join``), ends the capture (its
own error dropped), ends the pool's allocation if ``capture_end`` did not, restores the
caller's stream and re-raises the body's error.

**cuBLAS workspaces** are cleared right before and after each capture, as Inductor's
cudagraph trees do (``torch._inductor.cudagraph_trees.clear_cublas_manager``): a workspace
allocated outside the graph's pool during warm-up, baked into the graph, would be freed
under it by the next clearing (cudagraph trees clear around their own captures).

>>> TorchGraphAPI.graph_class_name(torch.device("cpu")) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

__all__ = ["GRAPH_CLASSES", "CaptureUnsupported", "GraphAPI", "TorchGraphAPI"]

T = TypeVar("T")

#: the graph class of each device module that has one
GRAPH_CLASSES = ("CUDAGraph", "NPUGraph", "XPUGraph")


class CaptureUnsupported(RuntimeError):
    """The device has no graph capture (CPU, or a backend without a graph class)."""


class GraphAPI(Protocol):
    """Capture and replay on one device."""

    def new_graph(self) -> Any: ...

    def new_stream(self) -> Any:
        """A stream the device's graph context accepts as its capture stream."""
        ...

    def new_pool(self) -> Any: ...

    def capture(self, graph: Any, body: Callable[[], T], stream: Any, pool: Any,
                join: Callable[[], None] | None = None) -> T:
        """Run ``body`` under capture into ``graph`` on ``stream`` (the capture stream,
        current while ``body`` runs), allocating from ``pool``; its return value holds
        the graph's static outputs (their values are set by :meth:`replay`).

        If ``body`` raises, ``join`` (on the capture stream) joins every side stream it
        forked; the capture then ends, nothing of it stays open, the caller's stream is
        current again, and ``body``'s error propagates."""
        ...

    def replay(self, graph: Any) -> None: ...

    def synchronize(self) -> None: ...


class TorchGraphAPI:
    """``torch.<device>.<Graph class>`` and ``torch.<device>.graph`` for ``device``."""

    def __init__(self, device: torch.device):
        name = self.graph_class_name(device)
        if name is None:
            raise CaptureUnsupported(
                f"{self.no_capture(device)}; use runtime='streams' (or 'auto')")
        self.device = device
        self.module = torch.get_device_module(device)
        self._graph_name = name
        self._graph_class = getattr(self.module, name)

    @staticmethod
    def graph_class_name(device: torch.device) -> str | None:
        """The graph class of ``device``'s module, or ``None`` when it has no capture."""
        if device.type in ("cpu", "meta"):
            return None
        try:
            module = torch.get_device_module(device)
        except (RuntimeError, AttributeError):
            return None
        if not hasattr(module, "graph"):
            return None
        return next((n for n in GRAPH_CLASSES if hasattr(module, n)), None)

    @classmethod
    def no_capture(cls, device: torch.device) -> str | None:
        """Why ``device`` has no graph capture (``None``: it has)."""
        if cls.graph_class_name(device) is not None:
            return None
        return (f"no graph capture on {device.type}: its device module has none of "
                f"{', '.join(GRAPH_CLASSES)}")

    def new_graph(self) -> Any:
        return self._graph_class()

    def new_stream(self) -> Any:
        return self.module.Stream(self.device)

    def new_pool(self) -> Any:
        return self.module.graph_pool_handle()

    def capture(self, graph: Any, body: Callable[[], T], stream: Any, pool: Any,
                join: Callable[[], None] | None = None) -> T:
        """As ``torch.cuda.graph(graph, pool, stream)`` runs ``body``, with the workspaces
        cleared around it and a failure undone in full (the module docstring)."""
        self._clear_workspaces()  # before empty_cache: the freed workspaces go back too
        self.module.synchronize(self.device)  # as torch.cuda.graph: free what can be freed
        if hasattr(self.module, "empty_cache"):
            self.module.empty_cache()
        restore = self.module.stream(stream)  # torch's own context: it handles other devices
        restore.__enter__()
        try:
            self._begin(graph, pool)
            try:
                out = body()
            except BaseException:
                self._abandon(graph, stream, join)
                raise
            try:
                graph.capture_end()
            except BaseException:
                self._end_allocation(graph)
                raise
            return out
        finally:
            restore.__exit__(None, None, None)
            self._clear_workspaces()

    def replay(self, graph: Any) -> None:
        graph.replay()

    def synchronize(self) -> None:
        self.module.synchronize(self.device)

    def _begin(self, graph: Any, pool: Any) -> None:
        try:
            graph.capture_begin(pool)
        except BaseException:
            # capture_begin routes the pool's allocations before it begins the stream's
            # capture: a failure between the two would leave the routing open
            self._end_allocation(graph, pool)
            raise

    def _abandon(self, graph: Any, stream: Any, join: Callable[[], None] | None) -> None:
        """End a capture whose body raised: ``capture_end`` must run on the capture stream
        with every forked side stream joined (else it raises and ends nothing)."""
        self.module.set_stream(stream)
        if join is not None:
            try:
                join()
            except Exception:  # noqa: BLE001 - the capture must end all the same
                pass
        try:
            graph.capture_end()
        except Exception:  # noqa: BLE001 - the body's error is the one to report
            self._end_allocation(graph)

    def _end_allocation(self, graph: Any, pool: Any = None) -> None:
        """End the pool's allocation routing that a failed ``capture_end`` (or
        ``capture_begin``) left open, and release the pool the graph will not release."""
        kind = self._graph_name.removesuffix("Graph").lower()  # cuda, npu, xpu
        end = getattr(torch._C, f"_{kind}_endAllocateToPool", None)
        release = getattr(torch._C, f"_{kind}_releasePool", None)
        if end is None:
            return
        try:
            pool = pool if pool is not None else graph.pool()
            end(self._index(), pool)
        except Exception:  # noqa: BLE001 - not open (capture_end got that far): nothing to end
            return
        if release is not None:  # a graph whose capture did not end never releases its pool
            release(self._index(), pool)

    def _index(self) -> int:
        return self.device.index if self.device.index is not None else self.module.current_device()

    def _clear_workspaces(self) -> None:
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if self.device.type == "cuda" and clear is not None:
            clear()
