"""Writes torch_npu profiler output folders for tests, following torch-npu 2.14.0's layout.

``<root>/<name>_ascend_pt/ASCEND_PROFILER_OUTPUT/`` with ``kernel_details.csv``
(headers of ``prof_common_func/_csv_headers.py``: ``OP_SUMMARY_KERNEL_BASE_HEADERS``
plus ``OP_SUMMARY_ADDITIONAL_HEADERS`` when shapes were recorded, and a leading
``Step Id`` when steps were marked, as ``prof_view/_kernel_view_parser.py`` writes
it), ``operator_details.csv`` (``OperatorViewParser.OPERATOR_HEADERS``) and
``trace_view.json`` (torch ops as ``cpu_op`` events, kernels on the NPU process,
one ``torch_to_npu`` flow per kernel from its op's start to the kernel's start, as
``TraceEventManager.create_torch_to_npu_flow`` writes them).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

BASE = ["Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
        "Wait Time(us)", "Block Num"]
ADDITIONAL = ["Mix Block Num", "Input Shapes", "Input Data Types", "Input Formats",
              "Output Shapes", "Output Data Types", "Output Formats"]
OPERATOR = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)",
            "Host Total Duration(us)", "Device Self Duration(us)", "Device Total Duration(us)",
            "Device Self Duration With AICore(us)", "Device Total Duration With AICore(us)"]
#: an epoch timestamp in us: more digits than a float holds to the ns
T0 = 1733212345678901.25
_NPU_TYPES = {"float": "FLOAT", "c10::Half": "FLOAT16", "c10::BFloat16": "DT_BF16",
              "long int": "INT64", "int": "INT32", "bool": "BOOL"}


@dataclass
class Kernel:
    name: str
    core: str  # AI_CORE, AI_VECTOR_CORE, MIX_AIC, MIX_AIV, AI_CPU
    duration_us: float
    blocks: int
    mix_blocks: int = 0


@dataclass
class Op:
    """One torch op call and the kernels it launched."""

    name: str
    dims: list
    types: list
    kernels: list[Kernel]
    strides: list = field(default_factory=list)
    concrete: list = field(default_factory=list)


def write_npu_profile(root: Path, steps: list[list[Op]], shapes: bool = True,
                      step_ids: bool = True, name: str = "host_1_20261203_ascend_pt") -> Path:
    """Write one profiler folder with ``steps`` (each a list of op calls); returns the
    ``*_ascend_pt`` folder.  ``shapes=False`` writes it as a profile taken without
    ``record_shapes``: no ``Input Dims`` on the ops and no shape columns."""
    out = root / name / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    header = (["Step Id"] if step_ids else []) + BASE + (ADDITIONAL if shapes else [])
    rows, events, operators = [], [], []
    host, npu = 1001, 2002
    t = T0
    for s, ops in enumerate(steps):
        step_start = t
        for op in ops:
            op_ts = t
            args = {"Sequence number": -1}
            if shapes:  # torch_npu joins the per-argument values with ";\r\n", no scalars
                args.update({"Input Dims": ";\r\n".join(",".join(str(x) for x in d)
                                                          if d and isinstance(d[0], int) else
                                                          str(d) if d else "" for d in op.dims),
                             "Input type": ";\r\n".join(op.types)})
            kt = t + 5.0
            flows = []
            for k in op.kernels:
                ts = f"{kt:.3f}"
                row = ([s + 1] if step_ids else []) + [0, k.name, k.name.split("_")[0], k.core, ts,
                                                       k.duration_us, 0.5, k.blocks]
                if shapes:
                    dims = ";".join(",".join(str(x) for x in d) for d in op.dims
                                    if isinstance(d, list) and d and isinstance(d[0], int))
                    dtypes = ";".join(_NPU_TYPES.get(x, "UNDEFINED") for x in op.types
                                      if x in _NPU_TYPES)
                    row += [k.mix_blocks, f'"{dims}"', dtypes, "ND", '""', dtypes, "ND"]
                rows.append(row)
                events.append({"ph": "X", "name": k.name, "pid": npu, "tid": 3, "ts": ts,
                               "dur": k.duration_us, "args": {"Task Type": k.core}})
                flows.append(ts)
                kt += k.duration_us + 1.0
            dur = max(kt - op_ts, 10.0)
            events.append({"ph": "X", "name": op.name, "pid": host, "tid": 7, "ts": f"{op_ts:.3f}",
                           "dur": dur, "cat": "cpu_op", "args": args})
            for ts in flows:
                events += [{"ph": "s", "bp": "e", "name": "torch_to_npu", "id": ts, "pid": host,
                            "tid": 7, "ts": f"{op_ts:.3f}", "cat": "async_npu"},
                           {"ph": "f", "bp": "e", "name": "torch_to_npu", "id": ts, "pid": npu,
                            "tid": 3, "ts": ts, "cat": "async_npu"}]
            operators.append([op.name, str(op.dims) if shapes else "", "", 1.0, dur,
                              sum(k.duration_us for k in op.kernels),
                              sum(k.duration_us for k in op.kernels), 0.0, 0.0])
            t = kt + 20.0
        events.append({"ph": "X", "name": f"ProfilerStep#{s + 1}", "pid": host, "tid": 7,
                       "ts": f"{step_start:.3f}", "dur": t - step_start, "cat": "cpu_op",
                       "args": {}})
    with (out / "kernel_details.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    with (out / "operator_details.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(OPERATOR)
        w.writerows(operators)
    (out / "trace_view.json").write_text(json.dumps(events))
    return out.parent
