"""Rescaling a table measured on another machine to this one, by a probe (``cost.probe``).

An op's time is its per-op overhead (the launch: dispatch, checks, allocation) plus its
work, and the two scale differently between machines: the overhead with the host's speed,
the work with the compute units or with the memory system, whichever bounds it by the
roofline of the machine it was measured on (a matrix-vector product is a matmul bound by
its bytes), and both of those with the op's size (a small matmul runs far below the peak
rate, a large one near it).  So:

1. **Overhead.** ``rho = launch_here / launch_there``, the 1-element add timed on both.
2. **Work.** For each probe op ``p``, ``r_p = (t_here - launch_here) / (t_there -
   launch_there)``: its time beyond the launch measured here over the shipped table's
   prediction of it (from its isolated times, as the probe times it).  Each entry's ratio
   ``r`` is that of the probe ops of its bound (compute: over FLOPs; memory: over bytes)
   interpolated in log-log over their work, held flat beyond the smallest and the largest.
3. **Entries.** ``t' = min(t, launch_there) * rho + max(0, t - launch_there) * r`` for the
   planning, median and isolated times (the spread in proportion); shares, splits and
   slowdowns are ratios on one machine and stay.
4. **Probe ops.** Those the table has no entry for join it as entries measured here
   (``provenance: probe``, isolated timing): matmuls well past the table's sizes, which
   its scaling could only extrapolate (from matrix-vector sizes, at their rate per FLOP).
5. **Profile.** The roofline is this machine's (peak FLOP/s, every dtype in proportion to
   f32; bandwidth; launch), as are the record/wait and stream-switch costs; the runtime's
   and ``torch.compile``'s host costs, not probed, scale with ``rho``.  Link fits (the
   network) stay.

>>> from autostream.cost import GENERIC_CPU as there
>>> pts = [ProbePoint("mm", "a", 10**6, 10**3, True, 15.0, 45.0),
...        ProbePoint("mm", "b", 10**8, 10**5, True, 205.0, 1005.0)]
>>> round(work_ratio(pts, there, "compute", 1e7, launch_here=5.0), 3)
0.224
"""

from __future__ import annotations

import dataclasses
import math
import platform
from collections.abc import Sequence
from datetime import datetime, timezone

import torch

from autostream.cost.probe import PER_ROUND, ROUNDS, Probe, ProbePoint
from autostream.cost.profile import DeviceProfile
from autostream.cost.table import CostTable, Entry

#: the smallest time beyond the launch a ratio is taken over, as a share of the launch
#: (an op within noise of its launch has no work to compare)
MIN_WORK_SHARE = 0.05


def bound(profile: DeviceProfile, flops: float, nbytes: float, dtype: str = "f32") -> str:
    """``compute`` where the roofline of ``profile`` (the machine the time was measured on)
    spends the op's work on FLOPs, else ``memory``: a matrix-vector product is a matmul
    bound by its bytes.

    >>> from autostream.cost import GENERIC_CPU
    >>> bound(GENERIC_CPU, 2e6, 1e6), bound(GENERIC_CPU, 2e8, 1e6)
    ('memory', 'compute')
    """
    return "compute" if flops / profile.peak(dtype) >= nbytes / profile.bandwidth else "memory"


def work_ratio(points: Sequence[ProbePoint], profile: DeviceProfile, kind: str, work: float,
               launch_here: float) -> float:
    """Time beyond the launch here over there (``profile``: the machine there), for an op
    bound by ``kind`` with ``work`` (FLOPs or bytes; step 2 of the module docstring); 1.0
    without probe ops of that kind."""
    launch_there = profile.launch_overhead_us
    curve = sorted((math.log(max(_work(p, kind), 1.0)),
                    math.log(_ratio(p, launch_here, launch_there)))
                   for p in points if bound(profile, p.flops, p.bytes) == kind)
    if not curve:
        return 1.0
    x = math.log(max(work, 1.0))
    if x <= curve[0][0]:
        return math.exp(curve[0][1])
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x <= x1:
            f = (x - x0) / (x1 - x0) if x1 > x0 else 1.0
            return math.exp(y0 + f * (y1 - y0))
    return math.exp(curve[-1][1])


def _work(p: ProbePoint | Entry, kind: str) -> float:
    return float(p.flops if kind == "compute" else p.bytes)


def _ratio(p: ProbePoint, launch_here: float, launch_there: float) -> float:
    here = max(p.measured_us - launch_here, MIN_WORK_SHARE * launch_here)
    there = max(p.predicted_us - launch_there, MIN_WORK_SHARE * launch_there)
    return here / there


def probe_entries(points: Sequence[ProbePoint], entries: Sequence[Entry]) -> list[Entry]:
    """The probe ops the table has no entry for, as entries measured here (isolated; share,
    slowdown and split those of the op's entry nearest in work, else 1)."""
    have = {e.key for e in entries}
    out = []
    for p in points:
        if (p.op, p.signature) in have:
            continue
        same = [e for e in entries if e.op == p.op and e.dtype == "f32"]
        near = min(same, key=lambda e: abs(math.log(max(e.flops, 1) / max(p.flops, 1))),
                   default=None)
        out.append(Entry(p.op, p.signature, "f32", p.flops, p.bytes, p.measured_us, 0.0,
                         ROUNDS * PER_ROUND, near.share if near else 1.0,
                         near.slowdown if near else 1.0, near.split if near else 1.0,
                         p.flop_formula, "isolated", p.measured_us, p.measured_us, "probe"))
    return out


def rescaled(shipped: CostTable, probe: Probe, name: str) -> CostTable:
    """``shipped`` (the shipped table ``name``) rescaled to the machine ``probe`` measured
    (module docstring); its device says so under ``probe``."""
    there = shipped.profile.launch_overhead_us
    here = probe.launch_us
    rho = here / there if there > 0 else 1.0

    def scale(t: float, r: float) -> float:
        return round(min(t, there) * rho + max(0.0, t - there) * r, 4)

    p = shipped.profile

    def entry(e: Entry) -> Entry:
        kind = bound(p, e.flops, e.bytes, e.dtype)
        r = work_ratio(probe.points, p, kind, _work(e, kind), here)
        median = scale(e.median_us, r)
        return dataclasses.replace(
            e, time_us=scale(e.time_us, r), median_us=median,
            spread_us=round(e.spread_us * median / e.median_us, 4) if e.median_us > 0 else 0.0,
            isolated_us=None if e.isolated_us is None else scale(e.isolated_us, r))

    flops = p.peak_flops.get("f32", max(p.peak_flops.values()))
    speed = probe.peak_flops / flops
    profile = dataclasses.replace(
        p, name=probe.machine, peak_flops={k: v * speed for k, v in p.peak_flops.items()},
        bandwidth=probe.bandwidth, launch_overhead_us=here,
        record_wait_us=probe.record_wait_us, stream_switch_us=probe.stream_switch_us,
        runtime_op_us=round(p.runtime_op_us * rho, 4),
        runtime_call_us=round(p.runtime_call_us * rho, 4),
        runtime_segment_us=round(p.runtime_segment_us * rho, 4),
        compile_call_us=round(p.compile_call_us * rho, 4))
    device = {
        **shipped.device, "name": probe.machine, "host": platform.node(),
        "platform": platform.platform(), "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "probe": {"table": name, "measured_on": shipped.device.get("name", ""),
                  "measured_date": shipped.device.get("date", ""),
                  "shipped_digest": shipped.digest(), "launch_ratio": round(rho, 4),
                  **probe.to_json()},
    }
    entries = [entry(e) for e in shipped.entries]
    return dataclasses.replace(shipped, device=device, profile=profile,
                               entries=(*entries, *probe_entries(probe.points, entries)))
