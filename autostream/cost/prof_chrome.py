"""Reading a ``torch.profiler`` Chrome trace (``export_chrome_trace``) into op calls.

Each ``cpu_op`` event carries its ATen op's arguments when the profile was taken
with ``record_shapes=True``.  When the trace has device kernels (``cat`` ``kernel``,
``gpu_memcpy``, ``gpu_memset``), an op's time is the sum of the kernels it launched:
a kernel names its launching op by ``External id`` (or by ``correlation`` through the
runtime call that launched it), and the op whose kernels they are is the innermost
one.  Without kernels (a CPU profile) an op's time is its own span.  A kernel's
share is its grid's blocks over the device's SM count (``deviceProperties.numSms``
in the trace, else the table's ``sm`` cores).

>>> import torch, tempfile, os
>>> from torch.profiler import profile
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> with profile(record_shapes=True) as p:
...     _ = torch.ones(4, 4) @ torch.ones(4, 4)
>>> p.export_chrome_trace(path)
>>> [c.name for c in read_chrome_trace(path).calls if c.name == "aten::mm"]
['aten::mm']
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autostream.cost.prof_errors import ProfileError
from autostream.cost.prof_signature import ProfiledCall, kernel_share

KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class ProfileCalls:
    """What a profile says about op calls, and about the device it ran on."""

    calls: tuple[ProfiledCall, ...]
    kind: str  # "cpu", "cuda" or "npu"
    source: str
    steps: int = 0
    #: kernels whose launching op the profile does not name
    unlinked_kernels: int = 0
    cores: dict[str, int] = field(default_factory=dict)
    #: the device's name where the profile records it (CUDA traces' ``deviceProperties``)
    device_name: str = ""


def load_json(path: Path) -> Any:
    """Parse a JSON (or gzipped JSON) file; errors name the file and the line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError(str(path), "", "", "does not exist") from None
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProfileError(str(path), f"line {exc.lineno}", "",
                           f"is not valid JSON (truncated?): {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(str(path), "", "", f"is not a text JSON file ({exc.reason})") from None


def _number(x: Any, source: str, row: str, column: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ProfileError(source, row, column, f"is {x!r}, not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ProfileError(source, row, column, f"is {x!r}; a time must be finite and >= 0")
    return v


def require_shapes(ops: list[tuple[int, dict[str, Any]]], source: str) -> None:
    """Raise unless some op records its inputs (ops without arguments record none, so a
    profile without shapes is one where no op has them)."""
    if ops and not any("Input Dims" in (ev.get("args") or {}) for _, ev in ops):
        i, ev = ops[0]
        raise ProfileError(source, f"event {i}", "args.Input Dims",
                           f"op {ev.get('name')!r} (and every other) has no input shapes: the "
                           "profile was taken without them; profile again with record_shapes=True")


def op_call(ev: dict[str, Any], source: str, row: str, duration_us: float,
            share: float | None = None) -> ProfiledCall:
    """A :class:`ProfiledCall` from an op event (see :func:`require_shapes`)."""
    args = ev.get("args") or {}
    return ProfiledCall(ev["name"], args.get("Input Dims", []), args.get("Input type", []),
                        args.get("Input Strides", []), args.get("Concrete Inputs", []),
                        duration_us, share, f"{source}: {row}")


def read_chrome_trace(path: str | Path, sm_count: int = 0) -> ProfileCalls:
    """The op calls of a ``torch.profiler`` trace (see the module docstring)."""
    path = Path(path)
    source = str(path)
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ProfileError(source, "", "traceEvents",
                           "is not a torch.profiler Chrome trace (no traceEvents list); give a "
                           "file written by export_chrome_trace or a torch_npu *_ascend_pt folder")
    events = data["traceEvents"]
    ops, kernels, launches = [], [], {}
    steps = 0
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if str(ev.get("name", "")).startswith("ProfilerStep#"):
            steps += 1
        elif cat == "cpu_op":
            ops.append((i, ev))
        elif cat in KERNEL_CATS:
            kernels.append((i, ev))
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            corr = (ev.get("args") or {}).get("correlation")
            ext = (ev.get("args") or {}).get("External id")
            if corr is not None and ext is not None:
                launches[corr] = ext
    if not ops:
        raise ProfileError(source, "", "traceEvents",
                           "has no cpu_op events: profile with ProfilerActivity.CPU and "
                           "record_shapes=True")
    require_shapes(ops, source)
    props = data.get("deviceProperties") or []
    sms = next((int(p["numSms"]) for p in props if isinstance(p, dict) and p.get("numSms")),
               sm_count)
    if not kernels:
        calls = [op_call(ev, source, f"event {i}",
                         _number(ev.get("dur"), source, f"event {i}", "dur"))
                 for i, ev in ops]
        return ProfileCalls(tuple(calls), "cpu", source, steps)
    by_ext: dict[Any, tuple[int, dict]] = {}
    for i, ev in ops:
        ext = (ev.get("args") or {}).get("External id")
        if ext is not None:
            by_ext.setdefault(ext, (i, ev))
    linked: dict[int, list[tuple[float, float | None]]] = {}
    unlinked = 0
    for k, kev in kernels:
        row = f"event {k}"
        args = kev.get("args") or {}
        ext = args.get("External id", launches.get(args.get("correlation")))
        if ext not in by_ext:
            unlinked += 1
            continue
        dur = _number(kev.get("dur"), source, row, "dur")
        grid = args.get("grid")
        blocks = math.prod(grid) if isinstance(grid, list) and grid else 0
        share = kernel_share("SM", blocks, 0, {"sm": sms}) if blocks else (
            0.0 if kev.get("cat") != "kernel" else None)
        linked.setdefault(by_ext[ext][0], []).append((dur, share))
    calls = []
    for i, ev in ops:
        if i not in linked:
            continue
        parts = linked[i]
        total = sum(d for d, _ in parts)
        calls.append(op_call(ev, source, f"event {i}", total, weighted_share(parts)))
    named = next((str(p["name"]) for p in props if isinstance(p, dict) and p.get("name")), "")
    return ProfileCalls(tuple(calls), "cuda", source, steps, unlinked, {"sm": sms} if sms else {},
                        named)


def weighted_share(parts: list[tuple[float, float | None]]) -> float | None:
    """An op's share from its kernels' ``(duration, share)``: the time-weighted mean
    (kernels of one op run one after the other); ``None`` if any share is unknown.

    >>> weighted_share([(1.0, 1.0), (3.0, 0.5)])
    0.625
    """
    if not parts or any(s is None for _, s in parts):
        return None
    total = sum(d for d, _ in parts)
    if total <= 0:
        return max(s for _, s in parts)
    return sum(d * s for d, s in parts) / total
