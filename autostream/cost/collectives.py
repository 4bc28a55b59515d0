"""Collective transfer times: an alpha-beta model per (collective, backend, world size).

``time = alpha + traffic(kind, n) * bytes / bus_bandwidth``: ``alpha`` is the fixed
latency, ``bytes`` the message size (``nccl-tests``' convention: an all-gather's
whole output, a reduce-scatter's whole input), ``traffic`` the bytes each rank
sends per byte of message in the standard algorithms (ring all-reduce
``2 (n - 1) / n``; all-gather, reduce-scatter, all-to-all ``(n - 1) / n``;
broadcast and point-to-point 1), and ``bus_bandwidth`` the link's bytes per second
(``nccl-tests``' "busbw", which is independent of ``n`` for ring algorithms).

Lookup for one transfer: the table's fit for the same collective, backend and
world size (``exact``) -> the same collective and backend at another world size,
or another collective of the backend (``scaled``: its alpha and bus bandwidth with
this collective's traffic factor) -> the device profile's link figures
(``roofline``) -> the profile's memory bandwidth (``roofline``, and the note says
to calibrate).  Every estimate carries its source and a note.

>>> fit = LinkFit("all_reduce", "gloo", 2, alpha_us=50.0, bandwidth=1e9)
>>> round(fit.time_us(1_000_000), 1)   # 50 us + 2 * (1/2) * 1 MB / 1 GB/s
1050.0
>>> round(traffic("all_reduce", 8), 3), traffic("broadcast", 8)
(1.75, 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autostream.cost.profile import DeviceProfile


def traffic(collective: str, world_size: int) -> float:
    """Bytes each rank moves per byte of message, for the standard (ring) algorithms."""
    n = max(int(world_size), 1)
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "barrier":
        return 0.0
    return 1.0  # broadcast, send/recv, unknown


@dataclass(frozen=True)
class LinkFit:
    """One fitted (or spec-derived) line of the cost table's ``links`` list.

    ``bandwidth`` is the bus bandwidth in bytes/s, ``alpha_us`` the fixed latency,
    ``share`` the device share a running transfer takes from compute (NCCL/HCCL
    kernels run on compute units; 0 where the transfer runs elsewhere).
    ``sizes`` is the message-size range of the fit (bytes), ``max_error`` its
    largest relative error there; ``provenance`` says where the numbers come from.
    """

    collective: str
    backend: str
    world_size: int
    alpha_us: float
    bandwidth: float
    share: float = 0.0
    origin: str = "measured"
    samples: int = 0
    sizes: tuple[int, int] = (0, 0)
    max_error: float = 0.0
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.collective, self.backend, self.world_size)

    def time_us(self, nbytes: float, world_size: int | None = None,
                collective: str | None = None) -> float:
        """Predicted transfer time of ``nbytes`` (at another world size or kind if given)."""
        n = self.world_size if world_size is None else world_size
        kind = self.collective if collective is None else collective
        return self.alpha_us + traffic(kind, n) * nbytes / self.bandwidth * 1e6


@dataclass(frozen=True)
class TransferCost:
    """A transfer's time on its link and its device share, with source and note."""

    duration_us: float
    share: float
    source: str
    note: str = ""


def _pick(fits: Sequence[LinkFit], collective: str, backend: str | None,
          world_size: int | None) -> tuple[LinkFit | None, str]:
    """The best fit and how it matches: "exact", "world size", "collective" or ""."""
    usable = [f for f in fits if backend is None or f.backend == backend]
    same = [f for f in usable if f.collective == collective]
    for f in same:
        if world_size is None or f.world_size == world_size:
            return f, "exact" if world_size is not None else "world size"
    if same:
        return min(same, key=lambda f: (abs(f.world_size - (world_size or 0)), f.world_size)), \
            "world size"
    if usable:  # another collective of the backend: its bus bandwidth and latency
        preferred = [f for f in usable if f.collective == "all_reduce"] or usable
        return min(preferred, key=lambda f: (abs(f.world_size - (world_size or 0)),
                                             f.collective, f.world_size)), "collective"
    return None, ""


def estimate_transfer(
    fits: Sequence[LinkFit], profile: DeviceProfile, collective: str, nbytes: int,
    backend: str | None = None, world_size: int | None = None, table: str = "the table",
) -> TransferCost:
    """A transfer's cost from the table's link fits, else the profile's link figures.

    >>> from autostream.cost.profile import GENERIC_CPU
    >>> fits = [LinkFit("all_reduce", "gloo", 2, 100.0, 1e9)]
    >>> estimate_transfer(fits, GENERIC_CPU, "all_reduce", 10**6, "gloo", 2).source
    'exact'
    >>> c = estimate_transfer(fits, GENERIC_CPU, "all_reduce", 10**6, "gloo", 8)
    >>> c.source, round(c.duration_us), c.note
    ('scaled', 1850, 'link fit of all_reduce on gloo was made at world size 2, the group has 8: its alpha and bus bandwidth with the traffic factor of 8 ranks')
    """
    fit, match = _pick(fits, collective, backend, world_size)
    if fit is not None:
        n = world_size or fit.world_size
        cost = fit.time_us(nbytes, n, collective)
        if match == "exact":
            return TransferCost(cost, fit.share, "exact")
        if match == "world size" and world_size is None:
            note = (f"world size unknown (process group not identified): {fit.world_size} "
                    f"ranks assumed, as in the link fit of {collective} on {fit.backend}")
        elif match == "world size":
            note = (f"link fit of {collective} on {fit.backend} was made at world size "
                    f"{fit.world_size}, the group has {world_size}: its alpha and bus "
                    f"bandwidth with the traffic factor of {world_size} ranks")
        else:
            note = (f"no link fit for {collective} on {fit.backend}: the {fit.collective} fit "
                    f"({fit.world_size} ranks) with the traffic factor of {collective}")
        return TransferCost(cost, fit.share, "scaled", note)
    return _roofline(profile, collective, nbytes, world_size, backend, table)


def _roofline(profile: DeviceProfile, collective: str, nbytes: int, world_size: int | None,
              backend: str | None, table: str) -> TransferCost:
    n = world_size or 2
    what = f"{collective}" + (f" on {backend}" if backend else "")
    if profile.link_bandwidth > 0:
        cost = profile.link_latency_us + traffic(collective, n) * nbytes / profile.link_bandwidth * 1e6
        return TransferCost(cost, profile.link_share, "roofline",
                            f"{table} has no link fit for {what}: roofline on the device "
                            f"profile's link bandwidth ({profile.link_bandwidth / 1e9:g} GB/s, "
                            f"{profile.link_latency_us:g} us latency)")
    cost = profile.launch_overhead_us + traffic(collective, n) * nbytes / profile.bandwidth * 1e6
    return TransferCost(cost, 0.0, "roofline",
                        f"{table} has no link figures at all: {what} costed on the device's "
                        f"memory bandwidth, which overstates a network; calibrate with "
                        f"`autostream calibrate --collectives --backend BACKEND --nproc N`")
