"""Device-generic graph capture: the few calls a captured runtime makes.

CUDA's ``torch.cuda.CUDAGraph`` and torch-npu's ``torch.npu.NPUGraph`` share one API
(``torch.cuda.graph(g, pool=..., stream=...)`` as a context manager, ``g.replay()``,
``graph_pool_handle()``), so the device-specific part is the name of the graph class
(:data:`GRAPH_CLASSES`).  Everything else goes through ``torch.get_device_module``.

:class:`GraphAPI` is what the runtime and the calibration call; tests pass a fake one
(``tests/fake_device.py``) to check the capture on the CPU.

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

    def capture(self, graph: Any, body: Callable[[], T], stream: Any, pool: Any) -> T:
        """Run ``body`` under capture into ``graph`` on ``stream`` (the capture stream,
        current while ``body`` runs), allocating from ``pool``; its return value holds
        the graph's static outputs (their values are set by :meth:`replay`)."""
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

    def capture(self, graph: Any, body: Callable[[], T], stream: Any, pool: Any) -> T:
        with self.module.graph(graph, pool=pool, stream=stream):
            return body()

    def replay(self, graph: Any) -> None:
        graph.replay()

    def synchronize(self) -> None:
        self.module.synchronize(self.device)
