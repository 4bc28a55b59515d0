"""A short probe of this CPU: what the shipped table is rescaled by (``cost.rescale``).

The probe times, on this machine, a few matmuls (``x @ w.T`` and with a bias, as
``nn.Linear`` runs them, from 1 to 270 MFLOP) and elementwise adds (6 KB to 6 MB), each as ``calibrate`` times an
op alone (per-core cache scrubbed before each call; the median over interleaved rounds of
each round's fastest call), and the roofline's terms: the per-op overhead (a 1-element
add), the bandwidth (a copy of 8 M floats), the peak FLOP/s (the fastest matmul's rate),
and the planner's sync costs (a record/wait pair, a stream switch).  Each probe op is also
predicted by the shipped table from its isolated times, so that what is compared is the
same op timed the same way on two machines.  It takes well under 2 s on any CPU fast
enough to plan on.

It runs in a thread of its own, so that no dispatch mode of its caller (a compile's fake
tensors) and no grad mode reach its ops.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from autostream.cost.calibrate import device_name, robust_time
from autostream.cost.model import TableCostModel
from autostream.cost.signature import OpSignature, node_signature
from autostream.cost.table import CostTable
from autostream.cost.timing import CpuTimer

#: matmuls ``x[M, K] @ w[N, K].T`` (M, K, N), without a bias and with one (``nn.Linear``):
#: some of the shipped table's sizes, then larger ones
MATMULS = ((8, 256, 256), (16, 512, 256), (64, 512, 1024), (128, 1024, 1024))
LINEARS = ((4, 512, 512), (32, 512, 1024), (128, 1024, 1024))
#: elementwise adds of two ``[rows, cols]`` tensors
ELEMENTWISE = ((8, 64), (8, 256), (64, 1024), (512, 1024))
#: timing rounds, and samples per round, of each probe op
ROUNDS, PER_ROUND = 5, 3


@dataclass(frozen=True)
class ProbePoint:
    """One probe op: its work, its time on this machine and the shipped table's prediction."""

    op: str
    signature: str
    flops: int
    bytes: int
    #: whether torch has a FLOP formula for the op (the table then scales it by FLOPs)
    flop_formula: bool
    measured_us: float
    predicted_us: float


@dataclass(frozen=True)
class Probe:
    """What the probe measured on this machine (times in us)."""

    machine: str
    launch_us: float
    record_wait_us: float
    stream_switch_us: float
    #: FLOP/s of the fastest probe matmul (f32)
    peak_flops: float
    #: bytes/s of a large copy
    bandwidth: float
    points: tuple[ProbePoint, ...]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Probe:
        """The inverse of :meth:`to_json`.

        >>> p = Probe("cpu x", 1.0, 20.0, 0.1, 1e11, 1e10, (ProbePoint("aten.add.Tensor",
        ...           "f32[8, 64], f32[8, 64]", 512, 6144, False, 2.0, 6.0),), 0.3)
        >>> Probe.from_json(p.to_json()) == p
        True
        """
        points = tuple(ProbePoint(**p) for p in data["points"])
        return cls(**{**data, "points": points})


def run_probe(shipped: CostTable) -> Probe:
    """Probe this CPU (module docstring) against ``shipped``'s predictions."""
    out: list[Probe | BaseException] = []

    def work() -> None:
        try:
            with torch.no_grad():
                out.append(_probe(shipped))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out.append(exc)

    worker = threading.Thread(target=work, name="autostream-cost-probe")
    worker.start()
    worker.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _probe(shipped: CostTable) -> Probe:
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    aten = torch.ops.aten
    calls: list[tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = []
    for bias, sizes in ((False, MATMULS), (True, LINEARS)):
        for m, k, n in sizes:
            x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen).t()
            calls.append((aten.addmm.default, (torch.randn(n, generator=gen), x, w)) if bias
                         else (aten.mm.default, (x, w)))
    for rows, cols in ELEMENTWISE:
        calls.append((aten.add.Tensor, tuple(torch.randn(rows, cols, generator=gen) for _ in range(2))))
    timer = CpuTimer(scrub_bytes=0)
    times = _robust_us([lambda f=f, a=a: f(*a) for f, a in calls], timer)
    isolated = TableCostModel(isolated_times(shipped))
    points = []
    for (f, args), t in zip(calls, times, strict=True):
        sig = signature(f, args)
        points.append(ProbePoint(sig.op, sig.key, sig.flops, sig.bytes, sig.has_flop_formula,
                                 round(t, 4),
                                 round(isolated.estimate_signature(sig).duration_us, 4)))
    launch = launch_us()
    peak = max(p.flops / (p.measured_us * 1e-6) for p in points if p.flop_formula)
    bandwidth = max(p.bytes / (max(p.measured_us - launch, 1e-3) * 1e-6) for p in points
                    if not p.flop_formula)
    return Probe(device_name(torch.device("cpu")), round(launch, 4),
                 round(timer.record_wait_us(n=40), 4), round(timer.stream_switch_us(n=500), 4),
                 peak, bandwidth, tuple(points), round(time.perf_counter() - t0, 3))


def isolated_times(table: CostTable) -> CostTable:
    """``table`` with each entry's planning time replaced by its isolated time (where it
    has one), the way the probe times its ops.

    >>> from autostream.cost import TableCostModel
    >>> t = TableCostModel.load("cpu").table
    >>> [e.time_us == e.isolated_us for e in isolated_times(t).entries][:2]
    [True, True]
    """
    return dataclasses.replace(table, entries=tuple(
        dataclasses.replace(e, time_us=e.isolated_us) if e.isolated_us is not None else e
        for e in table.entries))


def signature(target: Any, args: Sequence[torch.Tensor]) -> OpSignature:
    """The :class:`OpSignature` a graph node calling ``target(*args)`` would have.

    >>> x = torch.ones(8, 64)
    >>> signature(torch.ops.aten.add.Tensor, (x, x)).key
    'f32[8, 64], f32[8, 64]'
    """
    graph = torch.fx.Graph()
    inputs = []
    for i, a in enumerate(args):
        node = graph.placeholder(f"a{i}")
        node.meta["val"] = a
        inputs.append(node)
    call = graph.call_function(target, tuple(inputs))
    call.meta["val"] = target(*args)
    return node_signature(call)


def _robust_us(fns: Sequence[Callable[[], object]], timer: CpuTimer) -> list[float]:
    """Each function's robust time (``calibrate.robust_time``) over interleaved rounds."""
    rounds: list[list[list[float]]] = [[] for _ in fns]
    for r in range(ROUNDS):
        for i, fn in enumerate(fns):
            rounds[i].append(timer.samples(fn, 2 if r == 0 else 1, PER_ROUND))
    return [robust_time(r) for r in rounds]


def launch_us(calls: int = 400) -> float:
    """Host time of one call of a 1-element add (the per-op overhead), median of single calls.

    >>> launch_us(20) > 0
    True
    """
    tiny, add = torch.ones(1), torch.ops.aten.add.Tensor
    for _ in range(20):
        add(tiny, tiny)
    clock, samples = time.perf_counter_ns, []
    for _ in range(calls):
        start = clock()
        add(tiny, tiny)
        samples.append((clock() - start) / 1e3)
    return statistics.median(samples)
