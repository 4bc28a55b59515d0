"""Fit the alpha-beta link model of collectives on a real multi-process run.

``calibrate_collectives("gloo", nproc=2)`` spawns ``nproc`` ranks
(``torch.multiprocessing``, one process group on ``backend``), times every
collective kind at every message size as compiled graphs run it (a barrier, then
the ``_c10d_functional`` op and its ``wait_tensor``; ``repeat`` timed runs after
``warmup``; each run's time is its slowest rank's), and fits ``time = alpha + traffic(kind, n) * bytes / bandwidth`` by least
squares on each size's typical (lower-quartile) time, weighted for relative error
(``cost.collectives``).  Rank 0 shows a progress
bar.  The device share of a running transfer is measured too: a fixed run of
matmuls timed alone and while the largest all-reduce is in flight, on every rank;
``share = clamp(slowdown - 1, 0, 1)`` (under the planner's processor sharing, an op
of share 1 beside a transfer of share ``s`` runs ``1 + s`` times slower).

Each fit keeps its provenance: backend, world size, sizes, samples, the largest
relative error of the fit over the sizes, host, torch version and date.

    autostream calibrate --collectives --backend gloo --nproc 2 --out cost_models/cpu.json
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import torch
import torch.distributed as dist
from tqdm import tqdm

from autostream.comm.spawn import run_ranks
from autostream.cost.collectives import LinkFit, traffic

#: message sizes in bytes (multiples of 4 x world size for power-of-two world sizes up to
#: 16; other world sizes pass ``sizes`` of their own)
DEFAULT_SIZES = (1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
MEASURED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
DEVICE_OF_BACKEND = {"gloo": "cpu", "nccl": "cuda", "hccl": "npu"}


@dataclass(frozen=True)
class Sample:
    """One collective at one size: each timed run's slowest rank, in microseconds."""

    collective: str
    nbytes: int
    times_us: tuple[float, ...]

    @property
    def typical_us(self) -> float:
        """The lower quartile: load from other processes only ever adds time (a lost
        time slice costs milliseconds), which a median of a shared machine's runs shows."""
        ts = sorted(self.times_us)
        return ts[(len(ts) - 1) // 4]


def _device(backend: str, rank: int):
    kind = DEVICE_OF_BACKEND.get(backend, "cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "npu":
        import torch_npu  # noqa: F401 - registers the npu device (only with hccl)
    getattr(torch, kind).set_device(rank)
    return torch.device(kind, rank)


def _sync(device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def _runner(kind: str, nbytes: int, world: int, device):
    """A callable running one ``kind`` collective of ``nbytes`` (message convention) and
    its wait, as compiled graphs run it: the ``_c10d_functional`` op and ``wait_tensor``;
    an all-reduce in place, as the backend runs one whose input nothing else reads
    (``dialects.reinplace``), the others into a fresh output tensor."""

    n = nbytes // 4
    ops = torch.ops._c10d_functional
    group = dist.group.WORLD.group_name
    x = torch.zeros(n, device=device)  # zeros: reducing in place again and again stays finite
    if kind == "all_reduce":
        return lambda: ops.wait_tensor(ops.all_reduce_(x, "sum", group))
    if kind == "all_gather":
        shard = torch.ones(n // world, device=device)
        return lambda: ops.wait_tensor(ops.all_gather_into_tensor(shard, world, group))
    if kind == "reduce_scatter":
        return lambda: ops.wait_tensor(ops.reduce_scatter_tensor(x, "sum", world, group))
    if kind == "all_to_all":
        splits = [n // world] * world
        return lambda: ops.wait_tensor(ops.all_to_all_single(x, splits, splits, group))
    if kind == "broadcast":
        return lambda: ops.wait_tensor(ops.broadcast(x, 0, group))
    raise ValueError(f"cannot calibrate collective kind {kind!r}; choose from {MEASURED_KINDS}")


def _time_rank(rank: int, world: int, backend: str, kinds: Sequence[str], sizes: Sequence[int],
               warmup: int, repeat: int, progress: bool) -> dict:
    device = _device(backend, rank)
    jobs = [(k, s) for k in kinds for s in sizes]
    bar = None
    if progress and rank == 0:

        bar = tqdm(total=len(jobs), desc=f"collectives on {backend} x{world}", unit="size")
    times: dict[tuple[str, int], list[float]] = {}
    for kind, nbytes in jobs:
        run = _runner(kind, nbytes, world, device)
        for i in range(warmup + repeat):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            run()
            _sync(device)
            if i >= warmup:
                times.setdefault((kind, nbytes), []).append((time.perf_counter() - t0) * 1e6)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return {"times": times, "share": _transfer_share(world, device, max(sizes))}


def _transfer_share(world: int, device, nbytes: int, rounds: int = 5) -> float:
    """``clamp(slowdown - 1, 0, 1)`` of a fixed matmul run while an all-reduce is in flight."""

    a = torch.randn(256, 256, device=device)

    def compute() -> float:
        t0 = time.perf_counter()
        for _ in range(8):
            torch.mm(a, a)
        _sync(device)
        return time.perf_counter() - t0

    x = torch.ones(nbytes // 4, device=device)
    alone, busy = [], []
    for _ in range(rounds):
        dist.barrier()
        alone.append(compute())
        dist.barrier()
        work = dist.all_reduce(x, async_op=True)
        busy.append(compute())
        work.wait()
    return min(max(statistics.median(busy) / statistics.median(alone) - 1.0, 0.0), 1.0)


def samples_from_ranks(per_rank: Sequence[dict]) -> list[Sample]:
    """Each timed run's slowest rank, per (collective, size)."""
    keys = sorted(per_rank[0]["times"])
    return [Sample(k, s, tuple(max(r["times"][(k, s)][i] for r in per_rank)
                               for i in range(len(per_rank[0]["times"][(k, s)]))))
            for k, s in keys]


def fit_link(samples: Sequence[Sample], collective: str, backend: str, world: int,
             share: float = 0.0, provenance: dict | None = None) -> LinkFit:
    """``alpha + x / bandwidth`` (``x = traffic * bytes``) through each size's typical time,
    least squares on relative errors (small messages count as much as large ones).

    >>> s = [Sample("all_reduce", b, (50.0 + b / 1e3,)) for b in (1000, 10_000, 100_000)]
    >>> f = fit_link(s, "all_reduce", "gloo", 2)
    >>> round(f.alpha_us, 3), round(f.bandwidth / 1e9, 3), f.max_error < 1e-9
    (50.0, 1.0, True)
    """
    mine = [s for s in samples if s.collective == collective]
    if len(mine) < 2:
        raise ValueError(f"fitting {collective} needs at least 2 message sizes, got {len(mine)}")
    xs = [traffic(collective, world) * s.nbytes for s in mine]
    ys = [s.typical_us for s in mine]
    alpha, slope = _weighted_line(xs, ys, [1.0 / y ** 2 for y in ys])
    errors = [abs(alpha + slope * x - y) / y for x, y in zip(xs, ys) if y > 0]
    return LinkFit(collective, backend, world, round(alpha, 3), 1e6 / slope, round(share, 4),
                   "measured", sum(len(s.times_us) for s in mine),
                   (min(s.nbytes for s in mine), max(s.nbytes for s in mine)),
                   round(max(errors, default=0.0), 4), dict(provenance or {}))


def _weighted_line(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]
                   ) -> tuple[float, float]:
    """``(intercept >= 0, slope > 0)`` of the weighted least-squares line."""
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx if sxx else 0.0
    slope = max(slope, 1e-9)  # at least some cost per byte (1 PB/s)
    return max(my - slope * mx, 0.0), slope


def default_sizes(nproc: int) -> tuple[int, ...]:
    """:data:`DEFAULT_SIZES`, each rounded down to a multiple of ``4 * nproc`` bytes (every
    rank's share a whole number of float32 elements).

    >>> default_sizes(2)[:2], default_sizes(3)[:2]
    ((4096, 16384), (4092, 16380))
    """
    step = 4 * nproc
    return tuple(max(step, s // step * step) for s in DEFAULT_SIZES)


def calibrate_collectives(
    backend: str = "gloo", nproc: int = 2, kinds: Sequence[str] = MEASURED_KINDS,
    sizes: Sequence[int] | None = None, warmup: int = 3, repeat: int = 10,
    timeout_s: float = 900.0, progress: bool = True, share: float | None = None,
) -> list[LinkFit]:
    """Fitted link entries for ``kinds`` on ``backend`` with ``nproc`` ranks.

    ``sizes``: message sizes in bytes (default :func:`default_sizes`); ``share``
    overrides the measured device share of a running transfer.
    """
    if nproc < 2:
        raise ValueError(f"--nproc must be >= 2 (a collective needs two ranks), got {nproc}")
    sizes = default_sizes(nproc) if sizes is None else sizes
    bad = [k for k in kinds if k not in MEASURED_KINDS]
    if bad:
        raise ValueError(f"cannot calibrate {bad}; choose from {', '.join(MEASURED_KINDS)}")
    if any(s <= 0 or s % (4 * nproc) for s in sizes):
        raise ValueError(f"message sizes must be positive multiples of 4 x nproc = {4 * nproc} "
                         f"bytes, got {list(sizes)}")
    per_rank = run_ranks(_time_rank, nproc, args=(backend, tuple(kinds), tuple(sizes), warmup,
                                                  repeat, progress),
                         backend=backend, timeout_s=timeout_s)
    samples = samples_from_ranks(per_rank)
    measured_share = max(r["share"] for r in per_rank) if share is None else share

    provenance = {"host": platform.node(), "platform": platform.platform(),
                  "torch": torch.__version__, "nproc": nproc, "warmup": warmup, "repeat": repeat,
                  "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "method": "barrier, functional collective (all-reduce in place), wait_tensor; "
                            "slowest rank; "
                            "lower quartile per size; least squares on relative errors of alpha + traffic * "
                            "bytes / bandwidth"}
    return [fit_link(samples, k, backend, nproc, measured_share, provenance) for k in kinds]
