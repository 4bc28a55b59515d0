"""Predicted against measured peak memory, and what a memory budget costs in speed (issue 17).

**Prediction.**  For each model (the zoo and ``transformers`` models at tiny configs),
the post-AOT graph is planned on ``--streams`` streams with the H200 cost table (so
that plans use several streams even for small graphs) and no memory budget, then
run on the CPU threads runtime with ``record_memory=True``: the runtime counts the
bytes of every storage it holds, from the start of the op producing it until it
drops it, inputs included (``autostream.runtime.memory.LiveBytes``).  The same
graph left on one stream is measured the same way.  The prediction is
``Plan.memory`` (``autostream.memory.predict.predict_memory`` on the plan's simulated
timeline).  Error: predicted / measured - 1, against the largest of ``--runs`` calls.

**Budget.**  The fan-out model (``autostream.models.zoo.parallel_block``: attention heads
beside an MLP) planned with no budget, the default budget and ``0``: predicted
speed-up over one stream, predicted and measured peak, and how much of the
unconstrained speed-up each budget keeps.

    python -m experiments.memory
    python -m experiments.memory --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autostream.fx.capture import capture
from autostream.memory.budget import DEFAULT_MAX_MEMORY_INCREASE, format_bytes
from autostream.models.zoo import ZOO, parallel_block
from autostream.passes import AutoStreamPass
from autostream.planning.plan import Plan
from autostream.runtime import ThreadsRunner
from experiments.headline import Headline, record

#: every architecture with no cache and one with each cache mode
HF_MODELS = [("llama", "none"), ("llama", "prefill"), ("llama", "decode"),
             ("qwen3_moe", "none"), ("olmoe", "none"), ("gpt_oss", "none"),
             ("granite_moe", "none"), ("bert", "none")]
QUICK_HF = [("llama", "prefill"), ("qwen3_moe", "none")]


#: predicted peaks within PREDICTION of the measured; a budgeted plan keeps more than KEPT
#: of the unconstrained plan's gain
PREDICTION, KEPT = 0.10, 0.5


@dataclass(frozen=True)
class Row:
    model: str
    streams: int
    predicted_single: int
    measured_single: int
    predicted: int
    measured: list[int]
    #: the most any interleaving of the plan's threads can hold
    bound: int = 0

    @property
    def error(self) -> float:
        return self.predicted / max(self.measured) - 1.0


def models(quick: bool) -> dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]]:
    out: dict[str, Callable] = dict(ZOO)
    try:
        from autostream.models.hf_zoo import HF_ZOO, available
    except ImportError:
        return out
    have = set(available())
    for arch, cache in QUICK_HF if quick else HF_MODELS:
        if arch in have:
            out[f"{arch} ({cache})"] = lambda a=arch, c=cache: HF_ZOO[a](cache=c)
    return out


def measure(gm: torch.fx.GraphModule, args: tuple[Any, ...], runs: int) -> list[int]:
    """Peak bytes of ``runs`` calls of ``gm`` on the threads runtime."""
    peaks = []
    with ThreadsRunner(gm, record_memory=True) as runner, torch.no_grad():
        for _ in range(runs):
            runner(*args)
            peaks.append(runner.last_memory.peak_bytes)
    return peaks


def plan_and_measure(name: str, factory: Callable, streams: int, runs: int,
                     budget: float | str | None = None, solver: str = "heft"):
    model, inputs = factory()
    graphs = capture(model, inputs)
    graph = max(graphs, key=lambda g: len(g.gm.graph.nodes))
    single = measure(graph.gm, graph.args, runs)
    stream_pass = AutoStreamPass(max_streams=streams, solver=solver, cost_table="h200",
                                 max_memory_increase=budget)
    stream_pass(graph.gm)
    report = stream_pass.last_report
    plan = report.plan
    measured = measure(graph.gm, graph.args, runs) if report.applied else single
    row = Row(name, plan.schedule.streams_used if report.applied else 1,
              plan.memory.single_stream_peak_bytes, max(single),
              plan.memory.peak_bytes, measured, plan.memory.bound_bytes)
    return row, plan


def prediction_table(quick: bool, streams: int, runs: int) -> list[Row]:
    rows = []
    for name, factory in models(quick).items():
        try:
            row, _ = plan_and_measure(name, factory, streams, runs)
        except Exception as exc:  # noqa: BLE001 - one model must not hide the others
            print(f"- {name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        rows.append(row)
    print(f"### Predicted and measured peak ({streams} streams, heft on the H200 table, "
          f"CPU threads runtime, {runs} calls)\n")
    print("| model | streams used | one stream: predicted | measured | plan: predicted "
          "| measured (median) | measured (max) | error | at most |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.model} | {r.streams} | {format_bytes(r.predicted_single)} "
              f"| {format_bytes(r.measured_single)} | {format_bytes(r.predicted)} "
              f"| {format_bytes(statistics.median(r.measured))} | {format_bytes(max(r.measured))} "
              f"| {100 * r.error:+.1f}% | {format_bytes(r.bound)} |")
    worst = max(rows, key=lambda r: abs(r.error), default=None)
    if worst is not None:
        within = sum(abs(r.error) <= 0.10 for r in rows)
        print(f"\n{within} of {len(rows)} models within 10%; largest error "
              f"{100 * worst.error:+.1f}% ({worst.model}).  At most: the most bytes any "
              "interleaving of the plan's threads within its syncs can hold; measured above "
              f"it: {sum(max(r.measured) > r.bound for r in rows)} of {len(rows)}.\n")
    return rows


@dataclass(frozen=True)
class Budgeted:
    """The fan-out model under one budget: its measured row, its plan, the gain it kept."""

    budget: float | str | None
    streams: int
    row: Row
    plan: Plan
    kept: float


def budget_table(streams_list: list[int], runs: int, solver: str) -> list[Budgeted]:
    print(f"### Memory budget on the fan-out model (parallel attention + MLP block, {solver} "
          "on the H200 table)\n")
    print("| streams | budget | streams used | predicted speed-up | predicted peak | rise "
          "| at most | limit | measured peak (max) | speed-up kept | plan |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    out = []
    for streams in streams_list:
        free = None
        for budget in (None, DEFAULT_MAX_MEMORY_INCREASE, 0):
            row, plan = plan_and_measure("parallel", parallel_block, streams, runs, budget, solver)
            m = plan.memory
            free = free or plan.predicted_speedup
            gain = free - 1.0
            kept = (plan.predicted_speedup - 1.0) / gain if gain > 0 else 1.0
            out.append(Budgeted(budget, streams, row, plan, kept))
            limit = format_bytes(m.limit_bytes) if m.limit_bytes is not None else "-"
            shown = "none" if budget is None else budget
            print(f"| {streams} | {shown} | {row.streams} | {plan.predicted_speedup:.2f}x "
                  f"| {format_bytes(m.peak_bytes)} | {100 * m.increase:+.0f}% "
                  f"| {format_bytes(m.bound_bytes)} | {limit} "
                  f"| {format_bytes(max(row.measured))} | {100 * kept:.0f}% | {m.how} |")
    print("\nSpeed-up kept: the share of the unconstrained plan's gain over one stream "
          "(predicted speed-up - 1) that the budgeted plan keeps.  At most: the most bytes "
          "any interleaving of the plan's threads within its syncs holds (what the budget "
          "binds).")
    return out


def headlines(rows: list[Row], budgeted: list[Budgeted]) -> list[Headline]:
    """The prediction error over the models; per stream count, what the default budget
    keeps (within its limit, measured) and that budget 0 never rises above one stream."""
    out = []
    if rows:
        worst = max(rows, key=lambda r: abs(r.error))
        within = sum(abs(r.error) <= PREDICTION for r in rows)
        out.append(Headline(f"peak memory: predicted against measured ({len(rows)} models, "
                            "CPU threads runtime)", f"{within}/{len(rows)} within; worst "
                            f"{100 * worst.error:+.1f}% ({worst.model})",
                            f"within {100 * PREDICTION:g}%", within == len(rows)))
        above = [r.model for r in rows if max(r.measured) > r.bound]
        out.append(Headline("peak memory: measured above the most any interleaving can hold",
                            f"{len(above)}/{len(rows)}" + (f" ({', '.join(above)})" if above else ""),
                            "never", not above))
    for b in budgeted:
        measured = max(b.row.measured)
        if b.budget == DEFAULT_MAX_MEMORY_INCREASE:
            limit = b.plan.memory.limit_bytes
            fits = limit is None or measured <= limit
            shown = format_bytes(limit) if limit is not None else "none"
            out.append(Headline(
                f"fan-out model, default budget {b.budget}, {b.streams} streams: "
                "speed-up kept, measured peak", f"{100 * b.kept:.0f}% kept; "
                f"{format_bytes(measured)} (limit {shown})",
                f"> {100 * KEPT:.0f}% kept, within the limit", b.kept > KEPT and fits))
        elif b.budget == 0:
            out.append(Headline(
                f"fan-out model, budget 0, {b.streams} streams: measured peak "
                "against one stream", f"{format_bytes(measured)} vs "
                f"{format_bytes(b.row.measured_single)} ({b.row.streams} used)",
                "never above one stream", measured <= b.row.measured_single))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="zoo and two transformers models")
    ap.add_argument("--streams", type=int, default=2, help="streams of the prediction table")
    ap.add_argument("--runs", type=int, default=5, help="calls measured per plan")
    ap.add_argument("--solver", default="cpsat", help="solver of the budget table")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = prediction_table(args.quick, args.streams, 3 if args.quick else args.runs)
    budgeted = budget_table([2] if args.quick else [2, 4], 3 if args.quick else args.runs,
                            "heft" if args.quick else args.solver)
    record(__file__, headlines(rows, budgeted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
