"""A short probe of this CPU: what the shipped table is rescaled by (``cost.rescale``).

The probe times, on this machine, a few matmuls (``x @ w.T`` and with a bias, as
``nn.Linear`` runs them, from 1 to 134 MFLOP) and elementwise adds (6 KB to 6 MB), each alone in a loop (its fastest call over
interleaved rounds), and the roofline's terms:
the per-op overhead (a 1-element add), the bandwidth (the fastest add's bytes over its
time beyond the overhead: the caches and memory a graph's tensors live in), the peak
FLOP/s (the fastest matmul's rate), and the planner's sync costs (a record/wait pair, a
stream switch).  The caches stay warm between calls, as they do for the small models a
default table plans (their weights stay in cache from one call to the next), where
``calibrate`` scrubs the core's cache before each isolated call: on a machine whose memory
other processes share, a scrubbed call measures them as much as the op.  Each probe op is also
predicted by the shipped table from its isolated times, so that what is compared is the
same op timed the same way on two machines.  It takes well under 2 s on any CPU fast
enough to plan on.

It runs with its caller's dispatch modes (a compile's fake tensors) set aside and without
grad, in the caller's thread: a thread of its own would start a second team of intra-op
threads, which the first team, still spinning after the caller's last op, would slow.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from autostream.cost.calibrate import device_name
from autostream.cost.model import TableCostModel
from autostream.cost.signature import OpSignature, node_signature
from autostream.cost.table import CostTable
from autostream.cost.timing import CpuTimer

#: matmuls ``x[M, K] @ w[N, K].T`` (M, K, N), without a bias and with one (``nn.Linear``):
#: some of the shipped table's sizes, then larger ones
MATMULS = ((8, 256, 256), (16, 512, 256), (64, 512, 1024), (128, 1024, 512))
LINEARS = ((4, 512, 512), (24, 1024, 512), (128, 1024, 512))
#: elementwise adds of two ``[rows, cols]`` tensors
ELEMENTWISE = ((8, 64), (8, 256), (64, 1024), (512, 1024))
#: timing rounds of each probe op, and its samples per round: as many as fit in
#: ``ROUND_US`` (a short op's fastest call, taken over more calls, is as robust to other
#: processes as a long one's), within bounds
ROUNDS, PER_ROUND, MAX_PER_ROUND, ROUND_US = 5, 2, 20, 1000.0
#: seconds after which no further round starts (other processes can stretch a round many
#: times over; at least ``MIN_ROUNDS`` run)
TIMING_BUDGET_S, MIN_ROUNDS = 1.0, 2
#: rates no CPU worth planning for falls below: a probe op slower than this (beyond
#: ``SLACK_US``) waited for cores other processes held.  On a machine with more runnable
#: threads than cores, the spinning intra-op threads of a process can make each parallel
#: op wait a scheduler slice (milliseconds for a 10 us op) for tens of calls before they
#: settle; so the probe first runs its ops in turn until they run at plausible rates
#: (for at most ``SETTLE_S``), and times its ops once more, after settling again, if they
#: were implausibly slow and it has run less than ``RETRY_BEFORE_S``; else it gives up
MIN_FLOPS, MIN_BANDWIDTH, SLACK_US = 1e9, 1e9, 100.0
SETTLE_S, RETRY_BEFORE_S = 0.6, 1.0


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
    #: bytes/s of the fastest probe add, over its time beyond the launch
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
    with _disable_current_modes(), torch.no_grad():
        return _probe(shipped)


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
    fns = [lambda f=f, a=a: f(*a) for f, a in calls]
    sigs = [signature(f, args) for f, args in calls]
    plausible = [plausible_us(sig) for sig in sigs]
    settle(fns, plausible)
    times = _fastest_us(fns, timer)
    if starved(sigs, times) and time.perf_counter() - t0 < RETRY_BEFORE_S:
        settle(fns, plausible)
        times = _fastest_us(fns, timer)
    slow = starved(sigs, times)
    if slow:
        raise ProbeStarved(f"{slow}: other processes held the cores while the probe timed "
                           f"its ops (every op waits for its slowest intra-op thread)")
    isolated = TableCostModel(isolated_times(shipped))
    points = []
    for sig, t in zip(sigs, times, strict=True):
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


class ProbeStarved(RuntimeError):
    """The probe's times are those of a machine whose cores other processes held."""


def plausible_us(sig: OpSignature) -> float:
    """The longest time any CPU worth planning for takes for ``sig`` (``MIN_FLOPS``...).

    >>> x = torch.ones(8, 64)
    >>> plausible_us(signature(torch.ops.aten.add.Tensor, (x, x)))
    106.144
    """
    floor = sig.flops / MIN_FLOPS if sig.has_flop_formula else sig.bytes / MIN_BANDWIDTH
    return SLACK_US + floor * 1e6


def starved(sigs: Sequence[OpSignature], times: Sequence[float]) -> str:
    """The first probe op slower than :func:`plausible_us`, in words; "" when none is.

    >>> x = torch.ones(8, 64)
    >>> sig = signature(torch.ops.aten.add.Tensor, (x, x))
    >>> starved([sig], [2.0]), starved([sig], [5000.0])
    ('', 'aten.add.Tensor(f32[8, 64], f32[8, 64]) took 5000 us')
    """
    for sig, t in zip(sigs, times, strict=True):
        if t > plausible_us(sig):
            return f"{sig.op}({sig.key}) took {t:.0f} us"
    return ""


def settle(fns: Sequence[Callable[[], object]], plausible_us: Sequence[float],
           passes: int = 3) -> None:
    """Call ``fns`` in turn until ``passes`` passes in a row run each within its
    ``plausible_us``, or ``SETTLE_S`` has passed (see ``SETTLE_S``).

    >>> settle([lambda: None], [100.0])
    """
    clock, deadline, run = time.perf_counter, time.perf_counter() + SETTLE_S, 0
    while run < passes and clock() < deadline:
        ok = True
        for fn, limit in zip(fns, plausible_us, strict=True):
            start = clock()
            fn()
            ok &= (clock() - start) * 1e6 <= limit
        run = run + 1 if ok else 0


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


def _fastest_us(fns: Sequence[Callable[[], object]], timer: CpuTimer) -> list[float]:
    """Each function's fastest call over interleaved rounds: other processes only ever add
    time, and on a busy machine they can add it to most calls of several rounds."""
    rounds: list[list[list[float]]] = [[] for _ in fns]
    per = [max(PER_ROUND, min(MAX_PER_ROUND, int(ROUND_US / max(min(timer.samples(fn, 1, 2)),
                                                                 1e-3))))
           for fn in fns]
    start = time.perf_counter()
    for r in range(ROUNDS):
        if r >= MIN_ROUNDS and time.perf_counter() - start > TIMING_BUDGET_S:
            break
        for i, fn in enumerate(fns):
            rounds[i].append(timer.samples(fn, 1, per[i]))
    return [min(min(r) for r in op) for op in rounds]


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
