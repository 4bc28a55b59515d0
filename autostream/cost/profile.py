"""Device profiles: the numbers a roofline estimate needs.

A profile is either *measured* (by ``autostream calibrate``) or *spec-derived*
(published peak numbers, never profiled).  Times are in microseconds.

>>> p = GENERIC_CPU
>>> round(p.roofline_us(flops=2e9, nbytes=0, dtype="f32") - p.launch_overhead_us, 3)
20000.0
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("cpu", "cuda", "npu")
ORIGINS = ("measured", "spec")


@dataclass(frozen=True)
class DeviceProfile:
    """Peak rates and fixed costs of one device.

    ``peak_flops`` maps dtype short names (``"f32"``, ``"f16"``, ``"bf16"``...) to
    FLOP/s; ``bandwidth`` is in bytes/s.  ``record_wait_us`` is the cost of one
    record/wait pair between streams (the planner's sync latency),
    ``stream_switch_us`` the host cost of switching the current stream,
    ``launch_overhead_us`` the fixed cost of launching one op, ``runtime_op_us``
    what autostream's multi-stream runtime adds per graph node on the host beyond
    the compiled graph's own call (its interpreter), ``runtime_call_us`` what it
    adds once per call (handing work to the side streams, joining them) and
    ``runtime_segment_us`` what it adds per segment, a run of one stream's ops
    between two of its syncs (on CPU: calling it, and taking the GIL back from the
    other streams after it; all three 0 when not measured).  ``compile_call_us`` is
    what ``torch.compile`` itself adds to each call over running the same code
    eagerly (Dynamo's frame evaluation and guards, measured with its identity
    backend; 0 when not measured): every variant inside ``torch.compile`` pays it, so
    the planner never charges it, but a speed-up predicted over plain eager must.
    ``link_bandwidth`` (bytes/s, bus bandwidth), ``link_latency_us`` and ``link_share``
    are the interconnect's figures for collectives the table has no link fit for
    (``cost.collectives``; 0: unknown).  ``cores`` counts the compute cores by type
    (``cube`` and ``vector`` on Ascend, ``sm`` on CUDA; ``cores_source`` cites where the
    counts come from): a profiled op's device share is its blocks over them.
    ``graph_kernel_us``, ``graph_sync_us`` and ``graph_call_us`` are the costs of a
    captured graph replayed (``autostream calibrate`` on a device with graph capture; 0
    when not measured): per kernel in the graph (a tiny kernel's share of a graph of
    many back to back: the replay's gap between kernels and the kernel itself), per
    dependence between kernels captured on two streams (beyond the same dependence on
    one), and per ``replay()`` call as the host sees it (wall time of a replay of one
    tiny kernel and a synchronize, less that replay's device time).
    """

    name: str
    kind: str
    origin: str
    peak_flops: dict[str, float]
    bandwidth: float
    launch_overhead_us: float
    record_wait_us: float
    stream_switch_us: float
    runtime_op_us: float = 0.0
    runtime_call_us: float = 0.0
    runtime_segment_us: float = 0.0
    compile_call_us: float = 0.0
    link_bandwidth: float = 0.0
    link_latency_us: float = 0.0
    link_share: float = 0.0
    #: compute cores by type (``cube``/``vector`` on Ascend, ``sm`` on CUDA): an op's
    #: profiled share is its blocks over its core type's count (empty: unknown)
    cores: dict[str, int] = field(default_factory=dict)
    cores_source: str = ""
    #: a captured graph replayed: per kernel, per cross-stream dependence, per replay call
    graph_kernel_us: float = 0.0
    graph_sync_us: float = 0.0
    graph_call_us: float = 0.0
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; unknown dtypes use the f32 (or slowest) rate."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        return self.peak_flops.get("f32", min(self.peak_flops.values()))

    def core_us(self, flops: float, nbytes: float, dtype: str) -> float:
        """Roofline time without the launch overhead."""
        return max(flops / self.peak(dtype), nbytes / self.bandwidth) * 1e6

    def roofline_us(self, flops: float, nbytes: float, dtype: str) -> float:
        """``launch + max(flops / peak, bytes / bandwidth)``."""
        return self.launch_overhead_us + self.core_us(flops, nbytes, dtype)

    def roofline_share(self, flops: float, nbytes: float, dtype: str) -> float:
        """Device share guessed from the roofline: the fraction of the op's time spent
        working rather than launching (a launch-bound op leaves the device idle)."""
        core = self.core_us(flops, nbytes, dtype)
        total = core + self.launch_overhead_us
        return core / total if total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: A modest generic CPU used when no calibrated table is available.
GENERIC_CPU = DeviceProfile(
    name="generic-cpu", kind="cpu", origin="spec",
    peak_flops={"f32": 1e11, "f64": 5e10, "bf16": 5e10, "f16": 2.5e10},
    bandwidth=1e10, launch_overhead_us=5.0, record_wait_us=10.0, stream_switch_us=5.0,
    notes="rough generic CPU; calibrate for real numbers",
)
