"""``TableCostModel``: an op's duration and device share, and where the numbers came from.

Lookup chain for one op: ``exact`` (the table measured this signature) ->
``scaled`` (the same op measured at other shapes: interpolated by FLOPs or bytes, or
extrapolated as in :mod:`autostream.cost.scaling`) ->
``roofline`` (the device profile's peak rates) -> ``free`` (metadata-only ops).

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda a: (a @ a).view(-1), tracing_mode="fake")(torch.ones(8, 8))
>>> cm = TableCostModel(CostTable.from_profile())
>>> [cm.estimate(n).source for n in gm.graph.nodes if n.op == "call_function"]
['roofline', 'free']
"""

from __future__ import annotations

import bisect
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch.fx

import cost_models
from autostream.cost.collectives import TransferCost, estimate_transfer
from autostream.cost.free import is_free_target
from autostream.cost.profile import GENERIC_CPU
from autostream.cost.scaling import Reference, extrapolate, fitted_rate
from autostream.cost.signature import OpSignature, dtype_short, node_cost_key, node_signature
from autostream.cost.table import CostTable, Entry

SOURCES = ("exact", "scaled", "roofline", "free")


@dataclass(frozen=True)
class OpCost:
    """One estimate: duration (us) when alone, device share in [0, 1], and its source."""

    duration_us: float
    share: float
    source: str
    note: str = ""
    #: duration in a multi-stream plan (on its share of the intra-op threads) / alone
    split: float = 1.0
    #: how the table entry behind it was timed (``Entry.timing``; "" for a roofline); not
    #: part of the estimate's value
    timing: str = field(default="", compare=False)


FREE = OpCost(0.0, 0.0, "free")


class TableCostModel:
    """Estimates op costs from a :class:`CostTable` (measured or spec-derived)."""

    def __init__(self, table: CostTable) -> None:
        self.table = table
        self.profile = table.profile
        self._exact: dict[tuple[str, str], Entry] = {e.key: e for e in table.entries}
        by_op: dict[tuple[str, str], list[Entry]] = defaultdict(list)
        for e in table.entries:
            by_op[(e.op, e.dtype)].append(e)
            by_op[(e.op, e.dtype, family(e.signature))].append(e)
        self._by_op = {k: sorted(v, key=lambda e: (_work(e), e.signature)) for k, v in by_op.items()}
        self._cache: dict[tuple[str, str], OpCost] = {}

    # -- construction ----------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | os.PathLike, device: str | None = None) -> TableCostModel:
        """A shipped table by name (``"cpu"``, ``"h200"``, ``"ascend910b"``) or a JSON path.

        ``device`` (``"cpu"``, ``"cuda"``, ``"npu"``) rejects a table made for another kind.
        """

        text = os.fspath(name_or_path)
        is_path = isinstance(name_or_path, Path) or text.endswith(".json") or os.sep in text
        path = Path(text) if is_path else cost_models.table_path(text)
        return cls(CostTable.load(path, expect_kind=device))

    @classmethod
    def default(cls) -> TableCostModel:
        """The shipped CPU table when present, else a roofline on a generic CPU profile."""

        if "cpu" in cost_models.available():
            return cls.load("cpu")
        return cls(CostTable.from_profile(GENERIC_CPU))

    # -- device-level costs ------------------------------------------------------------
    @property
    def sync_latency_us(self) -> float:
        """Cost of one record/wait pair between streams."""
        return self.profile.record_wait_us

    @property
    def launch_overhead_us(self) -> float:
        return self.profile.launch_overhead_us

    @property
    def stream_switch_us(self) -> float:
        return self.profile.stream_switch_us

    @property
    def runtime_op_us(self) -> float:
        """Host cost per graph node that running a multi-stream plan adds (0: unmeasured)."""
        return self.profile.runtime_op_us

    @property
    def runtime_call_us(self) -> float:
        """Host cost per call that running a multi-stream plan adds (0: unmeasured)."""
        return self.profile.runtime_call_us

    @property
    def runtime_segment_us(self) -> float:
        """Host cost per segment (a stream's ops between two of its syncs) that running a
        multi-stream plan adds (0: unmeasured)."""
        return self.profile.runtime_segment_us

    @property
    def compile_call_us(self) -> float:
        """Host cost per call of ``torch.compile`` itself (Dynamo) over eager (0: unmeasured)."""
        return self.profile.compile_call_us

    def describe(self) -> str:
        """One line: device, kind, whether measured or spec-derived, entry count."""
        d = self.table.device
        how = ("measured" if self.profile.origin == "measured"
               else "spec-derived, unprofiled")
        where = f" on {d['host']}" if d.get("host") else ""
        return (f"{d['name']} ({d['kind']}, {how}{where}; {len(self.table.entries)} measured "
                f"op signatures; table {self.table.source})")

    # -- estimates ---------------------------------------------------------------------
    def transfer(self, collective: str, nbytes: int, backend: str | None = None,
                 world_size: int | None = None) -> TransferCost:
        """A collective's transfer time on its link (``cost.collectives``: the table's link
        fits, else the profile's link figures), with its source and note."""
        return estimate_transfer(self.table.links, self.profile, collective, nbytes, backend,
                                 world_size, table=f"cost table {self.table.device['name']!r}")

    def estimate(self, node: torch.fx.Node) -> OpCost:
        """Cost of one FX node; never raises for odd nodes (they fall back to a roofline)."""
        if node.op != "call_function" or is_free_target(node.target):
            return FREE
        try:
            hit = self._cache.get(node_cost_key(node))  # a repeated op: no work to count
            sig = node_signature(node) if hit is None else None
        except Exception as exc:  # noqa: BLE001 - an exotic node must not break planning
            lo = self.profile.launch_overhead_us
            return OpCost(lo, 0.0, "roofline", f"signature unreadable ({type(exc).__name__}); "
                          "launch overhead only")
        return hit if sig is None else self.estimate_signature(sig)

    def estimate_signature(self, sig: OpSignature) -> OpCost:
        """Cost of an :class:`OpSignature` (the chain exact -> scaled -> roofline)."""
        ck = (sig.op, sig.key)
        hit = self._cache.get(ck)
        if hit is None:
            hit = self._cache[ck] = self._lookup(sig)
        return hit

    def _lookup(self, sig: OpSignature) -> OpCost:
        dtype = dtype_short(sig.dtype)
        if sig.approximate:
            return self._roofline(sig, dtype, "symbolic size without a hint: roofline on "
                                  "a fallback size")
        e = self._exact.get((sig.op, sig.key))
        if e is not None:
            return OpCost(e.time_us, e.share, "exact", split=e.split, timing=e.timing)
        scaled = self._scaled(sig, dtype)
        if scaled is not None:
            return scaled
        return self._roofline(sig, dtype, "")

    def _roofline(self, sig: OpSignature, dtype: str, note: str) -> OpCost:
        p = self.profile
        return OpCost(p.roofline_us(sig.flops, sig.bytes, dtype),
                      p.roofline_share(sig.flops, sig.bytes, dtype), "roofline", note)

    def _scaled(self, sig: OpSignature, dtype: str) -> OpCost | None:
        # prefer references of the same family (same ranks, layouts and non-tensor
        # arguments: a 1x1 conv scales from 1x1 convs, not from 5x5 ones)
        refs = self._by_op.get((sig.op, dtype, family(sig.key))) or self._by_op.get((sig.op, dtype))
        if not refs:
            return None
        by_flops = refs[0].flop_formula
        work = float(sig.flops if by_flops else sig.bytes)
        works = [_work(e) for e in refs]
        i = bisect.bisect_left(works, work)
        lo, hi = (refs[i - 1] if i > 0 else None), (refs[i] if i < len(refs) else None)
        what = "FLOPs" if by_flops else "bytes"
        if lo is not None and hi is not None and _work(hi) > _work(lo):
            # bracketed: interpolate between the two neighbours
            f = (work - _work(lo)) / (_work(hi) - _work(lo))
            t = lo.time_us + f * (hi.time_us - lo.time_us)
            share = lo.share + f * (hi.share - lo.share)
            split = lo.split + f * (hi.split - lo.split)
            return OpCost(t, share, "scaled", f"interpolated by {what} between "
                          f"({lo.signature}) and ({hi.signature})", split, lo.timing)
        # outside the measured sizes: affine from the nearest reference (cost.scaling)
        ref = hi if lo is None else lo
        p = self.profile
        rate, fitted = None, 0
        for group in ((refs, self._by_op.get((sig.op, dtype), ())) if lo is ref else ()):
            rate = fitted_rate([self._reference(e) for e in group], p.launch_overhead_us)
            if rate is not None:
                fitted = len(group)
                break
        t, how = extrapolate(self._reference(ref), work, p.core_us(sig.flops, sig.bytes, dtype),
                             p.launch_overhead_us, rate, fitted, what)
        return OpCost(t, ref.share, "scaled", f"scaled by {what} from ({ref.signature}): {how}",
                      ref.split, ref.timing)

    def _reference(self, e: Entry) -> Reference:
        return Reference(e.time_us, _work(e), self.profile.core_us(e.flops, e.bytes, e.dtype))


_TENSOR = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\[([0-9, ]*)\]")


def family(signature: str) -> str:
    """A signature with tensor sizes replaced by ranks: entries of one family differ
    only in sizes, so their times scale with the work.

    >>> family("f32[8, 16], f32[16, 4]T, [1, 1]")
    'f32[r2], f32[r2]T, [1, 1]'
    """
    return _TENSOR.sub(lambda m: f"{m.group(1)}[r{len(m.group(2).split(',')) if m.group(2) else 0}]",
                       signature)


def _work(e: Entry) -> float:
    return float(e.flops if e.flop_formula else e.bytes)


@dataclass(frozen=True)
class SourceBreakdown:
    """What fraction of predicted time (and how many ops) rests on each source."""

    time_us: dict[str, float]
    counts: dict[str, int]

    @property
    def total_us(self) -> float:
        return sum(self.time_us.values())

    def fraction(self, source: str) -> float:
        total = self.total_us
        return self.time_us.get(source, 0.0) / total if total > 0 else 0.0

    def __str__(self) -> str:
        parts = [f"{s} {100 * self.fraction(s):.1f}% ({self.counts[s]} ops)"
                 for s in SOURCES if self.counts.get(s)]
        return ", ".join(parts) if parts else "no ops"


def source_breakdown(estimates: Iterable[OpCost]) -> SourceBreakdown:
    """Sum predicted time and op counts per source.

    >>> b = source_breakdown([OpCost(3, 1, "exact"), OpCost(1, 1, "roofline"), FREE])
    >>> b.fraction("exact"), str(b)
    (0.75, 'exact 75.0% (1 ops), roofline 25.0% (1 ops), free 0.0% (1 ops)')
    """
    time_us = {s: 0.0 for s in SOURCES}
    counts = {s: 0 for s in SOURCES}
    for c in estimates:
        time_us[c.source] = time_us.get(c.source, 0.0) + c.duration_us
        counts[c.source] = counts.get(c.source, 0) + 1
    return SourceBreakdown(time_us, counts)
