"""What autostream's multi-stream runtime adds to a call: per node, per call, per segment.

Fitted on two-stream graphs of tiny ops (``striped_chains``) run on the runtime the
backend uses for a device, against the same graphs' compiled code.  The fit lives
with the runtime it measures; the cost table stores the three figures in its device
profile (``runtime_op_us``, ``runtime_call_us``, ``runtime_segment_us``).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from autostream.cost.calibrate import ROUNDS
from autostream.runtime.builder import striped_chains
from autostream.runtime.program import parse_program
from autostream.runtime.segments import count_segments
from autostream.runtime.select import make_runner

__all__ = ["RUNTIME_COST_GRAPHS", "fit_runtime_costs", "runtime_costs"]


#: (depth, segments per stream) of the graphs ``runtime_costs`` fits on
RUNTIME_COST_GRAPHS = ((4, 1), (16, 1), (32, 1), (16, 4), (32, 4), (32, 16))


def runtime_costs(device: torch.device, timer: Any,
                  graphs: Sequence[tuple[int, int]] = RUNTIME_COST_GRAPHS,
                  repeat: int = 200, rounds: int = ROUNDS) -> tuple[float, float, float]:
    """``(per_node_us, per_call_us, per_segment_us)`` that autostream's multi-stream runtime adds.

    Runs two-stream graphs of tiny ops (``striped_chains``: two chains of ``depth``
    ops, each cut into ``segments`` runs by records) on the runtime the backend uses
    for ``device`` (threads on CPU, streams on accelerators) and each graph's
    compiled code, in interleaved rounds; the extra time is fitted (least squares,
    non-negative) as ``per_call + per_node * nodes + per_segment * segments``.  Per
    call: handing work to the side stream, the join (a blocked waiter's wake-up),
    binding inputs; per node: the interpreter; per segment: entering a run of ops and,
    on CPU, taking the GIL back from the other stream after it.  The planner charges
    all three to multi-stream plans and none to the single-stream graph.  Ops are
    tiny (2x2) so that overlapping the two chains gains nothing to offset the costs;
    on CPU without the timer's scrub (``CpuTimer.unscrubbed``).
    """
    timer = getattr(timer, "unscrubbed", lambda: timer)()
    cases = []
    for depth, segments in graphs:
        gm, inputs = striped_chains(depth=depth, segments=segments)
        inputs = tuple(t.to(device) for t in inputs)
        runner = make_runner(gm, "threads" if device.type == "cpu" else "streams")
        program = parse_program(gm)
        nodes = sum(1 for s in program.steps if s.kind == "op")
        cases.append((nodes, count_segments(program), gm, inputs, runner, [], []))
    rounds = max(1, min(rounds, repeat))
    try:
        with torch.no_grad():
            for _ in range(rounds):
                for _, _, gm, inputs, runner, plain, staged in cases:
                    plain += timer.samples(lambda gm=gm, a=inputs: gm(*a), 5, repeat // rounds)
                    staged += timer.samples(lambda r=runner, a=inputs: r(*a), 5, repeat // rounds)
    finally:
        for case in cases:
            getattr(case[4], "close", lambda: None)()
    return fit_runtime_costs([c[0] for c in cases],
                             [statistics.median(c[6]) - statistics.median(c[5]) for c in cases],
                             [c[1] for c in cases])


def fit_runtime_costs(nodes: Sequence[int], extra_us: Sequence[float],
                      segments: Sequence[int] | None = None) -> tuple[float, float, float]:
    """``(per_node, per_call, per_segment)`` from the extra time of graphs of ``nodes``
    nodes and ``segments`` segments: least squares slopes, none negative (a regressor
    whose slope would be is dropped), and the median of what they leave per call (>= 0).

    >>> fit_runtime_costs([10, 40, 160], [150.0, 240.0, 600.0])
    (3.0, 120.0, 0.0)
    >>> fit_runtime_costs([10, 40, 40, 160], [160.0, 250.0, 550.0, 910.0], [1, 1, 4, 4])
    (3.0, 30.0, 100.0)
    """
    y = np.asarray(extra_us, dtype=float)
    columns = {"node": np.asarray(nodes, dtype=float)}
    if segments is not None:
        columns["segment"] = np.asarray(segments, dtype=float)
    best: tuple[float, dict[str, float]] = (float("inf"), {})
    for k in range(len(columns) + 1):
        for names in itertools.combinations(columns, k):
            if any(len(set(columns[n])) < 2 for n in names):
                continue  # a constant regressor is the intercept's
            a = np.column_stack([np.ones_like(y), *(columns[n] for n in names)])
            coef = np.linalg.lstsq(a, y, rcond=None)[0]
            if any(c < 0 for c in coef[1:]):
                continue
            error = float(np.sum((a @ coef - y) ** 2))
            if error < best[0] - 1e-9:
                best = (error, dict(zip(names, map(float, coef[1:]), strict=True)))
    slopes = best[1]
    per_node, per_segment = slopes.get("node", 0.0), slopes.get("segment", 0.0)
    rest = y - per_node * columns["node"]
    if segments is not None:
        rest = rest - per_segment * columns["segment"]
    per_call = max(0.0, float(np.median(rest)))
    return round(per_node, 6), round(per_call, 6), round(per_segment, 6)
