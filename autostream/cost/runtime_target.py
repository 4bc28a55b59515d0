"""Costs as one runtime pays them: what a predicted speed-up is a prediction *for*.

A cost table holds each op's time as it was measured (eager launches, or graph replay)
and a device profile.  Which part of that time a plan can overlap depends on how the plan
runs on an accelerator:

- ``graph`` (a captured device graph, replayed: ``runtime/graphed.py``; TorchAir's ACL
  graph alike): the host issues one launch per call, off the critical path; each kernel
  costs its device time plus the replay's gap between kernels (``graph_kernel_us``),
  a cross-stream edge ``graph_sync_us``, a call ``graph_call_us`` (every variant, one
  stream included);
- ``streams`` (the interpreted streams runtime): one Python thread launches every op,
  so host issue is one serial resource: each op is issued ``launch_overhead_us`` after
  the previous one (plus the interpreter's ``runtime_op_us`` on several streams), and
  runs for its device time once issued.  A host-bound graph is predicted host-bound,
  one stream as much as several;
- ``threads`` (CPU), ``torchair`` (GE, ACL as TorchAir runs them), ``sequential``: the
  table's own figures, as planned so far.

A table with no runtime (:class:`~autostream.cost.model.TableCostModel` alone) charges an
accelerator's launch as device time that streams overlap: its label says so.

>>> from autostream.cost.model import TableCostModel
>>> h200 = TableCostModel.load("h200")
>>> runtime_label(h200), runtime_label(for_runtime(h200, "graph"))
('launches overlapped (no runtime named)', 'graph')
>>> for_runtime(h200, "graph").sync_latency_us < h200.sync_latency_us
True
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.fx

from autostream.cost.model import OpCost, TableCostModel

__all__ = ["DEVICE_RUNTIMES", "TARGETS", "RuntimeCostModel", "RuntimeCosts", "default_runtime",
           "for_runtime", "runtime_label"]

#: runtimes a plan can be costed for
TARGETS = ("graph", "streams", "threads", "sequential", "torchair")
#: the runtimes whose costs differ from the table's own (accelerators only)
DEVICE_RUNTIMES = ("graph", "streams")
#: the gap between kernels in a replayed graph where the profile gives none:
#: about 0.9 us per kernel in a published CUDA graph example (CUDA.jl documentation)
DEFAULT_KERNEL_GAP_US = 1.0
#: a cross-stream edge in a replayed graph where the profile gives none: two kernel gaps
DEFAULT_SYNC_GAPS = 2.0


def default_runtime(device_kind: str) -> str:
    """The runtime plans for a kind of device are costed for by default.

    >>> [default_runtime(k) for k in ("cpu", "cuda", "npu")]
    ['threads', 'graph', 'torchair']
    """
    return {"cpu": "threads", "npu": "torchair"}.get(device_kind, "graph")


class RuntimeCostModel:
    """``base``'s estimates as ``runtime`` pays them (see the module docstring); every
    other attribute is the base model's."""

    def __init__(self, base: TableCostModel, runtime: str):
        if runtime not in TARGETS:
            raise ValueError(f"unknown runtime {runtime!r} to cost a plan for; choose one of "
                             f"{', '.join(TARGETS)}")
        self.base = base
        self.runtime = runtime
        profile = base.profile
        self._device = runtime in DEVICE_RUNTIMES and profile.kind != "cpu"
        #: a replayed device graph: its own sync and call costs, no interpreter's
        self._graph = self._device and runtime == "graph"
        given = getattr(profile, "graph_kernel_us", 0.0)
        self.kernel_gap_us = given if given > 0 else DEFAULT_KERNEL_GAP_US

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    # -- what the runtime pays per op, per sync, per call ---------------------------------
    def estimate(self, node: torch.fx.Node) -> OpCost:
        cost = self.base.estimate(node)
        return self.device_time(cost) if self._device else cost

    def device_time(self, cost: OpCost) -> OpCost:
        """An op's time on the device alone: a replay-timed entry as it is; otherwise the
        time less the host's launch, plus the gap between kernels (never below the gap)."""
        if cost.source == "free" or cost.timing == "replay":
            return cost
        launch = self.base.profile.launch_overhead_us
        core = max(0.0, cost.duration_us - launch)
        note = (f"{cost.note + '; ' if cost.note else ''}device time: "
                f"{cost.duration_us:.2f} us less the {launch:g} us launch, plus a "
                f"{self.kernel_gap_us:g} us gap between kernels")
        return dataclasses.replace(cost, duration_us=core + self.kernel_gap_us, note=note)

    @property
    def sync_latency_us(self) -> float:
        if self._graph:
            given = getattr(self.base.profile, "graph_sync_us", 0.0)
            return given if given > 0 else DEFAULT_SYNC_GAPS * self.kernel_gap_us
        return self.base.sync_latency_us

    @property
    def issue_us(self) -> float:
        """Host time to issue one op, serial across all streams (0: off the critical path)."""
        if self.runtime == "streams" and self._device:
            return self.base.profile.launch_overhead_us
        return 0.0

    @property
    def call_fixed_us(self) -> float:
        """What every variant pays per call, one stream included (a graph's launch)."""
        if self._graph:
            return getattr(self.base.profile, "graph_call_us", 0.0)
        return 0.0

    @property
    def runtime_op_us(self) -> float:
        return 0.0 if self._graph else self.base.runtime_op_us

    @property
    def runtime_call_us(self) -> float:
        return 0.0 if self._graph else self.base.runtime_call_us

    @property
    def runtime_segment_us(self) -> float:
        return 0.0 if self._graph else self.base.runtime_segment_us

    def describe(self) -> str:
        return f"{self.base.describe()}; costed for the {runtime_label(self)} runtime"


def for_runtime(model: Any, runtime: str | None) -> Any:
    """``model`` costed for ``runtime`` (``None``: as it is).  Models that are not tables
    (a test's uniform costs, Inductor's fused costs) stay as they are.

    >>> for_runtime(TableCostModel.load("cpu"), "threads").runtime
    'threads'
    """
    if runtime is None:
        return model
    if isinstance(model, RuntimeCostModel):
        return model if model.runtime == runtime else RuntimeCostModel(model.base, runtime)
    if isinstance(model, TableCostModel):
        return RuntimeCostModel(model, runtime)
    return model


def runtime_label(model: Any) -> str:
    """The runtime a model's predictions are for, in words ("" for a model that is not a
    table: a test's uniform costs)."""
    runtime = getattr(model, "runtime", None)
    if isinstance(runtime, str):
        return runtime
    profile = getattr(model, "profile", None)
    kind = getattr(profile, "kind", None)
    if kind == "cpu":
        return "threads"
    if kind == "npu":
        return "torchair"
    if kind is not None:
        return "launches overlapped (no runtime named)"
    return ""


@dataclasses.dataclass(frozen=True)
class RuntimeCosts:
    """The multi-stream runtime's host costs (``CostModel.runtime_*_us``), and what every
    variant pays, one stream included: ``issue_us`` per op launched by one host thread
    (serial: the interpreted streams runtime), ``fixed_us`` per call (a graph's launch:
    :class:`RuntimeCostModel`)."""

    op_us: float = 0.0
    call_us: float = 0.0
    segment_us: float = 0.0
    issue_us: float = 0.0
    fixed_us: float = 0.0

    @classmethod
    def of(cls, model: Any) -> RuntimeCosts:
        """The costs a cost model names (``issue_us``, ``call_fixed_us``: 0 where absent)."""
        return cls(model.runtime_op_us, model.runtime_call_us, model.runtime_segment_us,
                   getattr(model, "issue_us", 0.0), getattr(model, "call_fixed_us", 0.0))
