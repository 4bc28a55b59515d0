"""Scaling a measured op to a size the table lacks, outside its measured sizes.

An op's time is taken as affine in its work (FLOPs or bytes): a fixed part (launch,
dispatch, allocation) plus work at a marginal rate.  A small reference cannot tell the two
apart: its time is nearly all fixed, and dividing it by its work gives a rate hundreds of
times slower than the device's.  So above the largest reference, the growth is the larger
of

- the roofline's extra time: the extra work at the device profile's peak rates, which no
  op beats; and
- the extra work at the op's measured rate: the slope of a least-squares line through the
  references (those of the op's family, else all of the op's at that dtype) when their
  roofline times differ by at least one launch (their time differences then measure work,
  not noise); else the reference's time beyond the launch over its work, counted only
  for the part of it the roofline calls work (its roofline share, ``core / (core +
  launch)``: about 0 for a launch-bound op, 1 for a work-bound one).

Below the smallest reference, the time beyond the launch shrinks with the work
(``launch + (t_ref - launch) * work / work_ref``): never below the launch, never above
the reference.  The roofline share would keep a launch-bound reference's time instead;
on the transformers graphs of ``autostream.models.hf_zoo``, timed in their graphs, the
proportional shrink was the closer of the two (most small ops there run well below the
profile's peak rates, so the roofline calls too little of their time work).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    """A measured op: its time (us), work (FLOPs or bytes) and roofline core time (us)."""

    time_us: float
    work: float
    core_us: float


def fitted_rate(refs: Sequence[Reference], launch_us: float) -> float | None:
    """Least-squares slope (us per unit of work, at least 0) of time over work through
    ``refs``, or ``None`` when they cannot show one: fewer than two distinct works, or
    roofline times within one launch of each other (their differences would be noise).

    >>> fitted_rate([Reference(10, 100, 5), Reference(30, 300, 15)], 1.0)
    0.1
    >>> fitted_rate([Reference(18, 256, 0.01), Reference(25, 512, 0.02)], 5.0) is None
    True
    """
    if len({r.work for r in refs}) < 2:
        return None
    if max(r.core_us for r in refs) - min(r.core_us for r in refs) < launch_us:
        return None
    n = len(refs)
    mean_w = sum(r.work for r in refs) / n
    mean_t = sum(r.time_us for r in refs) / n
    var = sum((r.work - mean_w) ** 2 for r in refs)
    cov = sum((r.work - mean_w) * (r.time_us - mean_t) for r in refs)
    return max(0.0, cov / var)


def extrapolate(ref: Reference, work: float, core_us: float, launch_us: float,
                rate: float | None = None, fitted_over: int = 0, unit: str = "units"
                ) -> tuple[float, str]:
    """Time (us) of the op with ``work`` and roofline core time ``core_us``, scaled from
    ``ref`` (module docstring), and how, in words.  ``rate``: a fitted rate over
    ``fitted_over`` references (:func:`fitted_rate`), else ``None``; used above ``ref``.

    Below ``ref``, the time beyond the launch in proportion to the work:

    >>> extrapolate(Reference(105.0, 1000, 0.1), 500, 0.05, launch_us=5.0)
    (55.0, "-50.0 us (the reference's time beyond the launch, in proportion to the work)")

    A launch-bound reference 256x smaller grows by little more than the roofline's time:

    >>> t, how = extrapolate(Reference(18.5, 256, 0.005), 65536, 1.3, launch_us=5.6)
    >>> round(t, 1), how
    (21.4, "+2.9 us (the reference's time beyond the launch per unit of work, x 0.1%: its work share by the roofline)")

    a work-bound one almost linearly (``launch + 2 * (600 - launch)`` is 1195):

    >>> extrapolate(Reference(600.0, 1e6, 590.0), 2e6, 1180.0, launch_us=5.0)[0]
    1190.0
    """
    fixed = min(launch_us, ref.time_us)
    if work < ref.work:
        t = fixed + (ref.time_us - fixed) * work / ref.work
        return t, (f"-{ref.time_us - t:.1f} us (the reference's time beyond the launch, in "
                   f"proportion to the work)")
    roof = max(0.0, core_us - ref.core_us)
    share = ref.core_us / (ref.core_us + launch_us) if ref.core_us + launch_us > 0 else 0.0
    if rate is not None:
        by_rate = rate * (work - ref.work)
        why = (f"affine fit over {fitted_over} references: {1e6 * rate:.3g} us per million "
               f"{unit}")
    else:
        avg = (ref.time_us - fixed) / ref.work if ref.work > 0 else 0.0
        by_rate = share * avg * (work - ref.work)
        why = (f"the reference's time beyond the launch per unit of work, x {share:.1%}: its "
               f"work share by the roofline")
    step = max(roof, by_rate)
    if roof > by_rate:
        why = "the roofline's extra time (the extra work at the device's peak rates)"
    return ref.time_us + step, f"+{step:.1f} us ({why})"
