"""autostream: automatic multi-stream parallelism for PyTorch graph mode.

One line registers the pass with TorchAir::

    config.post_grad_custom_pre_pass = autostream.AutoStreamPass()

and elsewhere ``torch.compile(model, backend="autostream")`` plans and runs it.
"""

from autostream.backend import backend
from autostream.passes import AutoStreamPass, PassReport
from autostream.planning.check import check
from autostream.planning.plan import Plan, PlanOptions, plan_graph
from autostream.report.latest import last_report
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.version import __version__

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
