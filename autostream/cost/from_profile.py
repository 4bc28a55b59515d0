"""A cost table from a profile the user already has, with coverage and disagreement reports.

``torch.profiler`` Chrome traces (:mod:`.prof_chrome`) and ``torch_npu`` profiler
folders (:mod:`.prof_npu`) give op calls; each call is keyed by the op signature a
graph node of that call has (:mod:`.prof_signature`), so the entries land where the
planner looks them up.  Per signature: the median over all its calls (every step,
every layer that repeats it) is the entry's time, with provenance ``profile``.  An
entry's share is the profiled one (blocks over cores) when the profile has block
counts; else the share of the same signature in the table merged into; else 1.0,
the cautious end (an unknown op is assumed to fill the device).  The split factor
(CPU: time on one stream's share of the threads) is the merged table's, else 1.

>>> import torch, tempfile, os
>>> from torch.profiler import profile
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> with profile(record_shapes=True) as p:
...     for _ in range(3):
...         _ = torch.ones(8, 8) @ torch.ones(8, 8)
>>> p.export_chrome_trace(path)
>>> result = table_from_profile(path)
>>> [(e.op, e.signature, e.samples, e.provenance) for e in result.table.entries if e.op == "aten.mm.default"]
[('aten.mm.default', 'f32[8, 8], f32[8, 8]', 3, 'profile')]
"""

from __future__ import annotations

import datetime
import math
import platform
import socket
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.fx

import cost_models
from autostream.cost.calibrate import _quantile, device_name
from autostream.cost.free import is_free_target
from autostream.cost.prof_chrome import ProfileCalls, read_chrome_trace
from autostream.cost.prof_errors import ProfileError
from autostream.cost.prof_npu import is_npu_profile, read_npu_profile
from autostream.cost.prof_signature import UNKNOWN, Unresolved, call_signature
from autostream.cost.signature import (
    OpSignature,
    TensorSpec,
    dtype_short,
    node_cost_key,
    node_signature,
    signature_key,
)
from autostream.cost.table import CostTable, Entry

#: the shipped table whose device profile a profile of each kind starts from
BASE_TABLES = {"cpu": "cpu", "cuda": "h200", "npu": "ascend910b"}
#: a merged entry disagrees when the profile's time is off by more than this factor
DISAGREE_FACTOR = 1.5


@dataclass(frozen=True)
class Disagreement:
    """A signature the profile and the merged table time differently."""

    op: str
    signature: str
    profile_us: float
    table_us: float

    @property
    def ratio(self) -> float:
        return self.profile_us / self.table_us if self.table_us > 0 else float("inf")


@dataclass(frozen=True)
class ProfileTable:
    """The table read from a profile, and what reading it found."""

    table: CostTable
    calls: int
    unresolved: dict[str, str] = field(default_factory=dict)  # op name -> why
    #: distinct signatures read only with a scalar the profile did not record (torch_npu
    #: records none): kept only where a given model's graph supplies the scalar
    partial: int = 0
    #: graph signatures that took the entry of a profiled call differing only in scalars
    adopted: int = 0
    unlinked_kernels: int = 0
    steps: int = 0
    disagreements: tuple[Disagreement, ...] = ()
    #: median of profile time / merged table time over the signatures both have
    median_ratio: float | None = None
    common: int = 0


def read_profile(path: str | Path, cores: dict[str, int] | None = None) -> ProfileCalls:
    """The op calls of a Chrome trace file or a torch_npu folder at ``path``."""
    path = Path(path)
    if path.is_dir():
        if is_npu_profile(path):
            return read_npu_profile(path, cores or {})
        traces = sorted(path.glob("*.json")) + sorted(path.glob("*.json.gz"))
        if len(traces) == 1:
            return read_chrome_trace(traces[0], (cores or {}).get("sm", 0))
        raise ProfileError(str(path), "", "", "is a folder but neither a torch_npu profiler "
                           "output (*_ascend_pt/ASCEND_PROFILER_OUTPUT) nor one holding exactly "
                           f"one Chrome trace ({len(traces)} .json files); give the file")
    return read_chrome_trace(path, (cores or {}).get("sm", 0))


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def profile_device(base: CostTable, found: ProfileCalls, path: Path, merged: bool
                   ) -> dict[str, Any]:
    """The ``device`` label of a table read from a profile: whose op times, read when and
    where, and whose device profile (peak rates, launch, syncs: a profile has none).

    Merged into a table, the label stays that table's (only tables of one device merge)
    and ``profile.note`` says which entries the profile gave.  Else the device is the one the
    profile names (CUDA traces), or this machine's CPU for a CPU trace (read where it was
    taken), dated now; the notes name the shipped table whose device profile it keeps.
    """
    now = _utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")
    here = device_name(torch.device("cpu"))
    read = {"path": str(path), "steps": found.steps, "calls": len(found.calls), "read": now,
            "read_on": f"{here} ({socket.gethostname()})"}
    whose = (f"{base.device['name']}'s ({base.device.get('origin', 'measured')}"
             + (f", {base.device['date'][:10]}" if base.device.get("date") else "") + ")")
    if merged:
        read["note"] = (f"the entries with provenance 'profile' were read from {path} on "
                        f"{now[:10]} on {here}; the device label, the other entries and the "
                        f"device profile are {whose}")
        return {**base.device, "profile": read}
    name = found.device_name or (here if found.kind == "cpu" else
                                 f"{found.kind} device of {path.name} (unnamed)")
    notes = (f"op times read from the profile {path}; the device profile (peak rates, "
             f"bandwidth, launch, syncs, runtime costs) is the shipped "
             f"{BASE_TABLES[found.kind]!r} table's, {whose}: `autostream calibrate` measures "
             f"this device's")
    return {"name": name, "kind": found.kind, "origin": "measured", "host": socket.gethostname(),
            "platform": platform.platform(), "torch": torch.__version__, "date": now,
            "profile": read, "notes": notes}


def _entry(sig: OpSignature, calls: list, share: float) -> Entry:
    times = [c.duration_us for c in calls]
    median = statistics.median(times)
    spread = _quantile(times, 0.75) - _quantile(times, 0.25) if len(times) > 1 else 0.0
    return Entry(op=sig.op, signature=sig.key, dtype=dtype_short(sig.dtype), flops=sig.flops,
                 bytes=sig.bytes, median_us=round(median, 4), time_us=round(median, 4),
                 spread_us=round(spread, 4), samples=len(times), share=round(share, 4),
                 slowdown=1.0, flop_formula=sig.has_flop_formula, timing="graph",
                 provenance="profile")


def _loose(v: object) -> object:
    """An argument as a profile can match it: tensors without strides (torch_npu records
    none), scalars, scalar lists and 0-dim integer/double tensors all alike (eager
    PyTorch wraps a Python number into a 0-dim tensor, ``x + 1``, whose value the
    profiler does not record; torch_npu records no scalar at all)."""
    if isinstance(v, TensorSpec):
        if v.shape == () and v.dtype in (torch.int64, torch.float64, torch.bool):
            return "#"
        return TensorSpec(v.shape, v.dtype)
    if isinstance(v, list) and not any(isinstance(x, TensorSpec) for x in v):
        return "#"
    if isinstance(v, list):  # torch.profiler records no dtypes inside a tensor list
        return [TensorSpec(x.shape, torch.float32) if isinstance(x, TensorSpec) else _loose(x)
                for x in v]
    if isinstance(v, tuple):
        return tuple(_loose(x) for x in v)
    if isinstance(v, (bool, int, float, torch.dtype)) or v is UNKNOWN:
        return "#"
    return v


#: keyword arguments that place or lay out a result but do not change its cost
_PLACEMENT = ("device", "pin_memory", "layout", "memory_format", "non_blocking")


def loose_key(sig: OpSignature, lists: bool = False) -> tuple[str, str]:
    """``(op, key)`` with wrapped numbers and scalars alike (see :func:`_loose`).

    >>> from autostream.cost.signature import TensorSpec
    >>> x = TensorSpec((4,), torch.float32)
    >>> a = OpSignature("aten.add.Tensor", "", (x, 1))
    >>> b = OpSignature("aten.add.Tensor", "", (x, TensorSpec((), torch.int64)))
    >>> loose_key(a) == loose_key(b)
    True

    ``lists=True`` also makes every list alike (``aten.index``'s indices, which
    torch.profiler does not record).
    """
    loose = _loose if not lists else (lambda v: "#" if isinstance(v, list) else _loose(v))
    return sig.op, signature_key(tuple(loose(a) for a in sig.args),
                                 {k: _loose(v) for k, v in sig.kwargs.items()
                                  if k not in _PLACEMENT and v is not None})


def graph_signatures(graphs: Iterable[torch.fx.GraphModule]) -> dict[tuple[str, str], OpSignature]:
    """The distinct signatures of ``graphs``' costed (non-free) op nodes."""
    out: dict[tuple[str, str], OpSignature] = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function" and not is_free_target(node.target):
                sig = node_signature(node)
                out.setdefault((sig.op, sig.key), sig)
    return out


def table_from_profile(path: str | Path, merge: CostTable | None = None,
                       graphs: Iterable[torch.fx.GraphModule] = ()) -> ProfileTable:
    """Read the profile at ``path`` into a table on ``merge``'s device (else on the
    shipped table of the profile's device kind), merged into ``merge`` when given.

    With ``graphs`` (the model's), a graph signature the profile has only with a
    wrapped number in place of a scalar (:func:`loose_key`) gets that entry too."""
    cores = merge.profile.cores if merge is not None else {}
    found = read_profile(path, cores)
    shipped = CostTable.load(cost_models.table_path(BASE_TABLES[found.kind]))
    base = merge if merge is not None else shipped
    if found.kind == "npu" and not cores:  # the core counts of the shipped table's chip
        cores = shipped.profile.cores
        found = read_profile(path, cores)
    if merge is not None and base.device.get("kind") != found.kind:
        raise ValueError(f"the profile at {path} ran on a {found.kind} device but the table merged "
                         f"into ({merge.source}) is for {base.device.get('kind')}: merge into a "
                         f"{found.kind} table")
    groups: dict[tuple[str, str], tuple[OpSignature, list]] = {}
    partial: dict[tuple[str, str], tuple[OpSignature, list]] = {}  # scalars not recorded
    unresolved: dict[str, str] = {}
    for call in found.calls:
        try:
            sig = call_signature(call)
        except Unresolved as exc:
            if "::" in call.name:  # not user annotations (ProfilerStep, Dynamo's regions)
                unresolved.setdefault(call.name, str(exc))
            continue
        if is_free_target(_target(sig.op)):
            continue
        pool = partial if sig.approximate else groups
        pool.setdefault((sig.op, sig.key), (sig, []))[1].append(call)
    by_loose: dict[tuple[str, str], list] = {}
    by_looser: dict[tuple[str, str], list] = {}  # tensor lists the profile did not record
    for sig, calls in (*groups.values(), *partial.values()):
        by_loose.setdefault(loose_key(sig), []).extend(calls)
        if any(a is UNKNOWN for a in sig.args):
            by_looser.setdefault(loose_key(sig, lists=True), []).extend(calls)
    adopted = 0
    for key, sig in graph_signatures(graphs).items():
        if key in groups:
            continue
        calls = by_loose.get(loose_key(sig)) or by_looser.get(loose_key(sig, lists=True))
        if calls:
            groups[key] = (sig, calls)
            adopted += 1
    old = {e.key: e for e in base.entries} if merge is not None else {}
    entries = []
    for key, (sig, calls) in groups.items():
        shares = [c.share for c in calls if c.share is not None]
        share = statistics.median(shares) if shares else (old[key].share if key in old else 1.0)
        entry = _entry(sig, calls, share)
        if key in old:  # a profile does not measure the split (CPU threads): keep the table's
            entry = replace(entry, split=old[key].split)
        entries.append(entry)
    device = profile_device(base, found, Path(path), merged=merge is not None)
    new = CostTable(device=device, profile=replace(base.profile, name=device["name"],
                                                   cores={**cores, **found.cores}),
                    entries=tuple(entries))
    disagreements, ratios = [], []
    for e in entries:
        if e.key in old and old[e.key].time_us > 0:
            ratios.append(e.time_us / old[e.key].time_us)
            d = Disagreement(e.op, e.signature, e.time_us, old[e.key].time_us)
            if not 1 / DISAGREE_FACTOR <= d.ratio <= DISAGREE_FACTOR:
                disagreements.append(d)
    table = merge.merged(new) if merge is not None else new
    disagreements.sort(key=lambda d: -abs(_log(d.ratio)))
    return ProfileTable(table, len(found.calls), unresolved, len(partial), adopted,
                        found.unlinked_kernels, found.steps,
                        tuple(disagreements), statistics.median(ratios) if ratios else None,
                        len(ratios))


def _target(op: str) -> object:
    ns, name, overload = op.split(".", 2)
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def _log(x: float) -> float:
    return math.log(x) if 0 < x < float("inf") else float("inf")


@dataclass(frozen=True)
class Coverage:
    """How many of a model's costed ops (not free views) a table has an exact entry for."""

    ops: int
    covered: int
    missing: tuple[tuple[str, str], ...] = ()

    @property
    def fraction(self) -> float:
        return self.covered / self.ops if self.ops else 1.0


def coverage(graphs: Iterable[torch.fx.GraphModule], table: CostTable,
             provenance: str | None = "profile") -> Coverage:
    """The fraction of ``graphs``' non-free op nodes with an exact entry in ``table``
    (of ``provenance`` when given), and the distinct signatures missing."""
    have = {e.key for e in table.entries if provenance is None or e.provenance == provenance}
    ops = covered = 0
    missing: dict[tuple[str, str], None] = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function" or is_free_target(node.target):
                continue
            ops += 1
            key = node_cost_key(node)
            if key in have:
                covered += 1
            else:
                missing.setdefault(key)
    return Coverage(ops, covered, tuple(missing))


def report(result: ProfileTable, cover: Coverage | None = None, limit: int = 10) -> list[str]:
    """Lines for the command's output: what was read, what disagrees, what is covered."""
    t = result.table
    new = [e for e in t.entries if e.provenance == "profile"]
    lines = [f"read {result.calls} op calls over {result.steps or 'unmarked'} steps into "
             f"{len(new)} profiled signatures"]
    if result.adopted:
        lines.append(f"  {result.adopted} of the model's signatures matched a profiled call "
                     "whose scalars (or wrapped numbers, or strides) the profile did not record")
    if result.partial:
        lines.append(f"  {result.partial} profiled signatures lack scalar values (torch_npu records "
                     "none) and are kept only where a MODEL_SPEC's graph has them")
    if result.unlinked_kernels:
        lines.append(f"  {result.unlinked_kernels} kernels name no launching op (not counted)")
    for name, why in sorted(result.unresolved.items())[:limit]:
        lines.append(f"  not read: {name}: {why}")
    if result.common:
        lines.append(f"merged table: {result.common} signatures in common, median profile/table "
                     f"time {result.median_ratio:.2f}; {len(result.disagreements)} differ by more "
                     f"than {DISAGREE_FACTOR}x")
        for d in result.disagreements[:limit]:
            lines.append(f"  {d.op}({d.signature}): profile {d.profile_us:.1f} us, table "
                         f"{d.table_us:.1f} us ({d.ratio:.2f}x)")
    if cover is not None:
        lines.append(f"coverage: {cover.covered}/{cover.ops} ops of the model "
                     f"({cover.fraction:.1%}) have a profiled entry")
        for op, key in cover.missing[:limit]:
            lines.append(f"  missing {op}({key})")
    return lines
