"""autostream: automatic multi-stream parallelism for PyTorch graph mode.

One line registers the pass with TorchAir::

    config.post_grad_custom_pre_pass = autostream.AutoStreamPass()

and elsewhere ``torch.compile(model, backend="autostream")`` plans and runs it.

The names below are imported on first use (``import autostream`` itself loads nothing
heavy: the command line's ``--help`` and tools that only read a version stay fast).

>>> import autostream, autostream.backend
>>> autostream.AutoStreamPass.__module__, callable(autostream.backend)
('autostream.passes', True)
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from autostream.version import __version__

if TYPE_CHECKING:
    from autostream.backend import backend
    from autostream.passes import AutoStreamPass, PassReport
    from autostream.planning.check import check
    from autostream.planning.plan import Plan, PlanOptions, plan_graph
    from autostream.report.latest import last_report
    from autostream.scheduling.problem import SchedulingProblem
    from autostream.scheduling.schedule import JOIN, Schedule, Sync

#: public name -> the module that defines it
_LAZY = {
    "backend": "autostream.backend",
    "AutoStreamPass": "autostream.passes",
    "PassReport": "autostream.passes",
    "check": "autostream.planning.check",
    "Plan": "autostream.planning.plan",
    "PlanOptions": "autostream.planning.plan",
    "plan_graph": "autostream.planning.plan",
    "last_report": "autostream.report.latest",
    "SchedulingProblem": "autostream.scheduling.problem",
    "JOIN": "autostream.scheduling.schedule",
    "Schedule": "autostream.scheduling.schedule",
    "Sync": "autostream.scheduling.schedule",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autostream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """``autostream.backend`` is the function, as when it was imported eagerly: importing
    the submodule of that name (``torch.compile(backend="autostream")`` does, through its
    entry point) would otherwise set the package's attribute to the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType) and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "JOIN",
    "AutoStreamPass",
    "PassReport",
    "Plan",
    "PlanOptions",
    "Schedule",
    "SchedulingProblem",
    "Sync",
    "backend",
    "check",
    "last_report",
    "__version__",
    "plan_graph",
]
