"""Reading a ``torch_npu`` profiler output folder (``*_ascend_pt/ASCEND_PROFILER_OUTPUT``).

``kernel_details.csv`` has one row per kernel: ``Name``, ``Type``, ``Accelerator
Core`` (AI_CORE, AI_VECTOR_CORE, MIX_AIC, MIX_AIV, AI_CPU, ...), ``Start Time(us)``,
``Duration(us)``, ``Block Num``, optionally ``Mix Block Num`` and a leading ``Step
Id`` (headers of torch-npu 2.14.0, ``prof_common_func/_csv_headers.py`` and
``prof_view/_kernel_view_parser.py``).  ``trace_view.json`` has the torch ops (with
``Input Dims``/``Input type`` when profiled with ``record_shapes``) and one
``torch_to_npu`` flow per kernel: its start sits on the op that launched the kernel,
its end on the kernel's start time, which is how a kernel row finds its op.
``operator_details.csv`` is not needed: it has no dtypes and no block counts.

>>> find_outputs(Path("/nonexistent"))
Traceback (most recent call last):
...
autostream.cost.prof_errors.ProfileError: profile /nonexistent: does not exist
"""

from __future__ import annotations

import csv
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from autostream.cost.prof_chrome import (
    ProfileCalls,
    load_json,
    op_call,
    require_shapes,
    weighted_share,
)
from autostream.cost.prof_errors import ProfileError
from autostream.cost.prof_signature import kernel_share

KERNELS = "kernel_details.csv"
TRACE = "trace_view.json"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
#: columns a kernel row must have
REQUIRED = ("Name", "Accelerator Core", "Start Time(us)", "Duration(us)", "Block Num")


def is_npu_profile(path: Path) -> bool:
    """Whether ``path`` is (or holds) a torch_npu profiler output folder."""
    return path.is_dir() and bool(_candidates(path))


def _candidates(path: Path) -> list[Path]:
    if (path / KERNELS).exists() or (path / TRACE).exists():
        return [path]
    if (path / OUTPUT_DIR).is_dir():
        return [path / OUTPUT_DIR]
    return sorted(p for p in path.glob(f"*/{OUTPUT_DIR}") if p.is_dir())


def find_outputs(path: Path) -> list[Path]:
    """The ``ASCEND_PROFILER_OUTPUT`` folders at or under ``path`` (one per rank or run)."""
    if not path.exists():
        raise ProfileError(str(path), "", "", "does not exist")
    found = _candidates(path)
    if not found:
        raise ProfileError(str(path), "", "",
                           f"has no {OUTPUT_DIR} folder with {KERNELS} and {TRACE}: give the "
                           "folder torch_npu.profiler wrote (*_ascend_pt) or its "
                           f"{OUTPUT_DIR}")
    return found


def _ts(text: Any) -> Decimal:
    """A timestamp in us as an exact decimal (floats cannot hold epoch us to the ns)."""
    return Decimal(str(text).strip()).quantize(Decimal("0.001"))


def _read_kernels(path: Path) -> list[tuple[str, dict[str, str]]]:
    source = str(path)
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except FileNotFoundError:
        raise ProfileError(source, "", "", "does not exist (torch_npu writes it with the "
                           "profiler's default export)") from None
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        for col in REQUIRED:
            if col not in header:
                raise ProfileError(source, "header", col,
                                   f"is missing (columns: {', '.join(header) or 'none'}); not a "
                                   "torch_npu kernel_details.csv")
        return [(f"row {reader.line_num}", row) for row in reader]


def _int(row: dict[str, str], col: str, source: str, where: str) -> int:
    text = (row.get(col) or "0").strip()
    if text in ("", "N/A"):
        return 0
    try:
        return int(float(text))
    except ValueError:
        raise ProfileError(source, where, col, f"is {text!r}, not a block count") from None


def _float(row: dict[str, str], col: str, source: str, where: str) -> float:
    text = (row.get(col) or "").strip()
    try:
        v = float(text)
    except ValueError:
        raise ProfileError(source, where, col, f"is {text!r}, not a number") from None
    if not v >= 0:
        raise ProfileError(source, where, col, f"is {text!r}; a time must be >= 0")
    return v


class _Thread:
    """The torch ops of one host thread, found by the time a flow leaves them."""

    def __init__(self, ops: list[tuple[int, dict]]) -> None:
        self.ops = ops
        self.at: dict[Decimal, tuple[int, dict]] = {}
        for i, ev in ops:  # the innermost op starting at each time: a flow starts on it
            ts = _ts(ev["ts"])
            if ts not in self.at or float(ev.get("dur", 0)) < float(self.at[ts][1].get("dur", 0)):
                self.at[ts] = (i, ev)

    def op_at(self, ts: Decimal) -> tuple[int, dict] | None:
        if ts in self.at:
            return self.at[ts]
        best = None  # a flow that does not start exactly on an op: the innermost around it
        for i, ev in self.ops:
            start = _ts(ev["ts"])
            if start <= ts <= start + Decimal(str(ev.get("dur", 0))) and (
                    best is None or float(ev.get("dur", 0)) < float(best[1].get("dur", 0))):
                best = (i, ev)
        return best


def read_output(out: Path, cores: dict[str, int]) -> ProfileCalls:
    """The op calls of one ``ASCEND_PROFILER_OUTPUT`` folder."""
    kpath, tpath = out / KERNELS, out / TRACE
    rows = _read_kernels(kpath)
    trace = load_json(tpath)
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ProfileError(str(tpath), "", "", "is not a trace event list (unknown layout)")
    ops_by_thread: dict[tuple[Any, Any], list[tuple[int, dict]]] = {}
    starts: dict[Any, tuple[Any, Any, Decimal]] = {}
    ends: dict[Decimal, Any] = {}
    steps = set()
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        ph, name = ev.get("ph"), str(ev.get("name", ""))
        if ph == "X" and name.startswith("ProfilerStep#"):
            steps.add(name)
        elif ph == "X" and (ev.get("cat") == "cpu_op" or "::" in name) and "ts" in ev:
            ops_by_thread.setdefault((ev.get("pid"), ev.get("tid")), []).append((i, ev))
        elif ph == "s" and ev.get("name") == "torch_to_npu":
            starts[ev.get("id")] = (ev.get("pid"), ev.get("tid"), _ts(ev["ts"]))
        elif ph == "f" and ev.get("name") == "torch_to_npu":
            ends[_ts(ev["ts"])] = ev.get("id")
    require_shapes([op for ops in ops_by_thread.values() for op in ops], str(tpath))
    threads = {key: _Thread(ops) for key, ops in ops_by_thread.items()}
    linked: dict[int, tuple[dict, list[tuple[float, float | None]]]] = {}
    unlinked = 0
    source = str(kpath)
    for where, row in rows:
        try:
            start = _ts(row["Start Time(us)"])
        except InvalidOperation:
            raise ProfileError(source, where, "Start Time(us)",
                               f"is {row['Start Time(us)']!r}, not a time") from None
        dur = _float(row, "Duration(us)", source, where)
        flow = ends.get(start)
        op = None
        if flow is not None and flow in starts:
            pid, tid, ts = starts[flow]
            op = threads[(pid, tid)].op_at(ts) if (pid, tid) in threads else None
        if op is None:
            unlinked += 1
            continue
        core = (row.get("Accelerator Core") or "").strip()
        share = kernel_share(core, _int(row, "Block Num", source, where),
                             _int(row, "Mix Block Num", source, where), cores)
        linked.setdefault(op[0], (op[1], []))[1].append((dur, share))
    calls = []
    for i in sorted(linked):
        ev, parts = linked[i]
        calls.append(op_call(ev, str(tpath), f"event {i}", sum(d for d, _ in parts),
                             weighted_share(parts)))
    return ProfileCalls(tuple(calls), "npu", str(out), len(steps), unlinked, dict(cores))


def read_npu_profile(path: str | Path, cores: dict[str, int]) -> ProfileCalls:
    """The op calls of every output folder at or under ``path``, together."""
    outs = [read_output(o, cores) for o in find_outputs(Path(path))]
    return ProfileCalls(tuple(c for o in outs for c in o.calls), "npu", str(path),
                        sum(o.steps for o in outs), sum(o.unlinked_kernels for o in outs),
                        dict(cores))
