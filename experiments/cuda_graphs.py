"""Captured multi-stream graphs on a GPU against the strongest single-stream baseline (issue 41).

For each model, side by side in one run: eager; ``torch.compile(mode="reduce-overhead")``
(Inductor with CUDA graphs); the **one-stream graph** (Dynamo's graph captured into one
CUDA graph by autostream's graph runtime, ``max_streams=1``); **autostream's graph** (the
plan, up to ``--streams`` streams, captured the same way); and what the backend's
measured choice keeps (``runtime="auto"``: eager, one-stream graph or the plan).  The
device is calibrated first (``autostream calibrate --device cuda``: op times under graph
replay, pairs of ops sharing the chip), and the plans are made on that table.

    python -m experiments.cuda_graphs --out experiments/cuda_runs/h200-2026-12-05

Models: torchvision's GoogLeNet (random weights, batch 1 and 8: the anchors' model), a
Qwen3-MoE- and a DeepSeek-V3-shaped MoE decode layer with its shared expert at real sizes
in bf16 (1, 8 and 64 tokens; ``autostream.models.moe_decode``), and ``two_branch_gemv``.

Timing: ``--rounds`` interleaved rounds (3), each the method of ``autostream.runtime.timing``
(``--runs`` timed calls per variant, one per round-robin turn, after warm-up calls, the
device synchronised after each call); a row's figure is the median of the rounds'
medians, and its spread the rounds' range.  Columns: ``measured`` = one-stream graph over
autostream's graph; ``predicted`` = the plan's prediction for the graph runtime on the
calibrated table; ``error`` = measured / predicted - 1; ``bitwise`` = autostream's outputs
equal the one-stream graph's bit for bit; ``auto`` = the measured choice's backend (target:
never more than 2% slower than the one-stream graph).

Device time: each timed call also has device events around it (``cost.replay.EventTimer``
on a GPU; the ``timer`` argument of ``main`` in tests); ``device_us`` holds each variant's
median, ``measured_device`` the one-stream graph over autostream's graph in device time, and
``error_device`` that against the prediction.  A gap between the timed call and its device
time is host time the replay did not hide.

Rows: each row carries its graph runners' ``describe()`` (``runners``).  A row whose
autostream or one-stream graph did not run captured (refused, calls run uncaptured, or
writes found by the warm-up because the effects were unknown) has ``captured`` false and
``not_captured`` saying why; it is shown but never counted towards a target.

The slot can end at any moment: every row is on disk as soon as it is measured
(appended to ``cuda_graphs.jsonl``, and ``cuda_graphs.json`` rewritten with
``complete`` false until the run ends), as is every line of ``cuda_graphs.log``.  A
case that fails is recorded in ``failed`` and the run goes on; a calibration that fails is
recorded in ``calibration_failed`` and the run goes on with the shipped table
(``SHIPPED_TABLE``).  ``--budget-s`` stops before the budget ends: a case is run only when
the longest case so far still fits in what is left (less ``RESERVE_S``); the others are
recorded in ``skipped``.  ``--quick`` runs one case per family (``Case.family``).

Writes ``cuda_graphs.json`` (one row per model and batch), ``cuda_graphs.jsonl``,
``cuda_graphs.log`` (this output) and the calibrated table into ``--out``;
``python -m experiments.cuda_runs`` renders every kept run in RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

#: the targets of issue 41 (measured over the one-stream graph)
GOOGLENET_TARGET = 1.5
MOE_TARGET = 1.05
KEPT_FLOOR = 0.98
ERROR_TARGET = 0.15
#: the calibration's budget, and the whole run's, on an H200 (seconds)
CALIBRATION_BUDGET_S = 120.0
RUN_BUDGET_S = 360.0
#: the measured choice's rounds (``autostream.backend(measure=...)``)
MEASURE = 5
#: the table planned on when calibration fails (shipped with autostream)
SHIPPED_TABLE = "h200"
#: seconds kept free of cases under ``--budget-s`` (the headlines and the last writes)
RESERVE_S = 5.0


@dataclass(frozen=True)
class Case:
    """One model at one batch (tokens for the MoE layers); ``family``: what ``--quick`` runs
    one of."""

    model: str
    batch: int
    build: Callable[[torch.device], tuple[torch.nn.Module, tuple[Any, ...]]]
    family: str = ""


@dataclass
class Row:
    """What one case measured (the keys of ``cuda_graphs.json``)."""

    model: str
    batch: int
    eager_us: float | None = None
    inductor_ro_us: float | None = None
    graph1_us: float | None = None
    autostream_us: float | None = None
    auto_us: float | None = None
    predicted: float | None = None
    measured: float | None = None
    error: float | None = None
    kept: str = "-"
    bitwise: bool | None = None
    outputs_equal: str = ""
    streams_used: int = 1
    runtime: str = ""
    measured_rounds: list[float] = field(default_factory=list)
    auto_rounds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: each variant's median device time (events around the timed call; empty: no timer)
    device_us: dict[str, float] = field(default_factory=dict)
    measured_device: float | None = None
    error_device: float | None = None
    #: each graph runner's ``describe()``, by variant and label
    runners: dict[str, str] = field(default_factory=dict)
    #: whether autostream's graph and the one-stream graph both ran captured (else the row
    #: counts towards no target), and why not
    captured: bool = True
    not_captured: list[str] = field(default_factory=list)
    seconds: float | None = None


def googlenet(batch: int) -> Callable[[torch.device], tuple[torch.nn.Module, tuple[Any, ...]]]:
    def build(device: torch.device):
        from torchvision.models import googlenet as tv_googlenet  # on the GPU image

        torch.manual_seed(0)
        model = tv_googlenet(weights=None, aux_logits=False, init_weights=True)
        return model.eval().to(device), (torch.randn(batch, 3, 224, 224, device=device),)

    return build


def moe(name: str, tokens: int, scale: int, layers: dict[str, torch.nn.Module]
        ) -> Callable[[torch.device], tuple[torch.nn.Module, tuple[Any, ...]]]:
    """One layer of ``name`` per run (``layers``), serving every token count: DeepSeek's
    experts hold 22.5 GB."""
    def build(device: torch.device):
        from autostream.models import moe_decode

        if name not in layers:
            factory = getattr(moe_decode, f"{name}_decode")
            layers[name] = factory(tokens=1, scale=scale, device=device)[0]
        model = layers[name]
        return model, moe_decode.decode_inputs(model, tokens)

    return build


def gemv(device: torch.device):
    from autostream.models.zoo import two_branch_gemv

    model, inputs = two_branch_gemv()
    return model.to(device), tuple(x.to(device) for x in inputs)


def cases(scale: int = 1, only: Sequence[str] = (), quick: bool = False) -> list[Case]:
    """The issue's models (``scale`` divides the MoE layers' sizes, for a CPU check);
    ``quick``: the first case of each family.

    >>> [(c.model, c.batch) for c in cases(quick=True)]
    [('googlenet', 1), ('qwen3_moe_decode', 1), ('two_branch_gemv', 16)]
    """
    layers: dict[str, torch.nn.Module] = {}
    out = [Case("googlenet", b, googlenet(b), "cnn") for b in (1, 8)]
    out += [Case(f"{name}_decode", t, moe(name, t, scale, layers), "moe_decode")
            for name in ("qwen3_moe", "deepseek_v3") for t in (1, 8, 64)]
    out.append(Case("two_branch_gemv", 16, gemv, "gemv"))
    out = [c for c in out if not only or c.model in only]
    if quick:
        firsts: dict[str, Case] = {}
        for c in out:
            firsts.setdefault(c.family, c)
        out = list(firsts.values())
    return out


def _outputs(value: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _compile(model: torch.nn.Module, backend: Any) -> Callable[..., Any]:
    return torch.compile(model, backend=backend, dynamic=False)


class Collecting:
    """An autostream backend that keeps the report of every graph it compiles (Dynamo may
    split a model into several graphs; ``last_report`` is only the last)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.reports: list[Any] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        fn = self.backend(gm, example_inputs)
        self.reports.append(self.backend.last_report)
        return fn

    @property
    def last_report(self) -> Any:
        return self.backend.last_report


def capture_check(variant: str, reports: Sequence[Any]) -> tuple[dict[str, str], list[str]]:
    """Each graph runner's ``describe()`` (``"variant/label"``), and why ``variant`` did not
    run captured (empty: every graph of it was captured and every call replayed)."""
    described: dict[str, str] = {}
    why: list[str] = []
    for i, report in enumerate(reports):
        if report is None:
            continue
        where = f"{variant}" + (f" graph {i}" if len(reports) > 1 else "")
        if report.capture_refused:
            why.append(f"{where}: refused at compile time: {report.capture_refused}")
        elif report.runtime != "graph":
            why.append(f"{where}: ran on the {report.runtime or 'default'} runtime")
        elif not report.graph_runners:
            why.append(f"{where}: no graph runner")
        for label, runner in report.graph_runners:
            described[f"{where}/{label}"] = runner.describe()
            stats = runner.stats
            if runner.refused is not None:
                why.append(f"{where}/{label}: refused at call time: {runner.refused}")
            elif not stats.captures:
                why.append(f"{where}/{label}: never captured")
            if stats.uncaptured_calls:
                why.append(f"{where}/{label}: {stats.uncaptured_calls} calls uncaptured")
            if stats.effects_unknown:  # writes were found by the warm-up, not the schemas
                why.append(f"{where}/{label}: effects unknown ({stats.effects_unknown})")
    return described, why


def _report_prediction(report: Any) -> tuple[float, int, str]:
    """The predicted speed-up over the one-stream graph, the streams used and the runtime."""
    if report is None or report.plan is None:
        return 1.0, 1, ""
    lifted = report.lift if hasattr(report.lift, "predicted_speedup") else None
    source = lifted if lifted is not None else report.plan
    if not report.applied:
        return 1.0, 1, report.plan.runtime
    return source.predicted_speedup, source.schedule.streams_used, report.plan.runtime


def time_variants(variants: dict[str, Callable[[], Any]], runs: int, warmup: int,
                  device: torch.device, timer: Any = None,
                  clock: Callable[[], float] = time.perf_counter
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of one call of each variant and, given ``timer`` (a
    ``cost.replay.ReplayTimer``), its median device microseconds: the variants interleaved
    round by round, each timed call after an untimed one, the device synchronised after
    each call, device marks around the timed call.

    >>> now = [0.0]
    >>> def b(): now[0] += 0.001
    >>> time_variants({"a": lambda: None, "b": b}, 3, 1, torch.device("cpu"),
    ...               clock=lambda: now[0])
    ({'a': 0.0, 'b': 0.001}, {})
    """
    def sync() -> None:
        if device.type != "cpu":
            torch.accelerator.synchronize(device)

    host: dict[str, list[float]] = {name: [] for name in variants}
    dev: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(warmup + runs):
        for name, fn in variants.items():
            fn()
            sync()
            start = timer.mark() if timer is not None else None
            t0 = clock()
            fn()
            end = timer.mark() if timer is not None else None
            sync()
            dt = clock() - t0
            if i >= warmup:
                host[name].append(dt)
                if timer is not None:
                    dev[name].append(timer.elapsed_us(start, end))
    return ({n: statistics.median(v) for n, v in host.items()},
            {n: statistics.median(v) for n, v in dev.items() if v})


def run_case(case: Case, device: torch.device, table: Any, streams: int, rounds: int,
             runs: int, warmup: int, inductor: bool, say: Callable[[str], None],
             timer: Any = None) -> Row:
    """Build, compile every variant, check outputs, and time them side by side."""
    import autostream

    started = time.perf_counter()
    torch._dynamo.reset()
    row = Row(case.model, case.batch)
    model, inputs = case.build(device)
    with torch.no_grad():
        variants: dict[str, Callable[[], Any]] = {"eager": lambda: model(*inputs)}
        if inductor:
            try:
                ro = torch.compile(model, mode="reduce-overhead", dynamic=False)
                ro(*inputs), ro(*inputs)
                variants["inductor_ro"] = lambda: ro(*inputs)
            except Exception as exc:  # noqa: BLE001 - a column left empty, with its reason
                row.notes.append(f"inductor reduce-overhead failed: {type(exc).__name__}")
        one = Collecting(autostream.backend(runtime="graph", max_streams=1, measure=0,
                                            cost_table=table))
        graph1 = _compile(model, one)
        plan_backend = Collecting(autostream.backend(runtime="graph", max_streams=streams,
                                                     measure=0, cost_table=table))
        planned = _compile(model, plan_backend)
        auto_backend = Collecting(autostream.backend(runtime="auto", max_streams=streams,
                                                     measure=MEASURE, cost_table=table))
        auto = _compile(model, auto_backend)
        first = _outputs(graph1(*inputs))
        ours = _outputs(planned(*inputs))
        equal = [torch.equal(a, b) for a, b in zip(ours, first, strict=True)]
        row.bitwise = all(equal)
        row.outputs_equal = f"{sum(equal)} of {len(first)} outputs bitwise equal"
        for _ in range(2 * MEASURE * 3 + 4):  # until the measured choice has decided
            auto(*inputs)
        report = plan_backend.last_report
        row.predicted, row.streams_used, row.runtime = _report_prediction(report)
        auto_report = auto_backend.last_report
        row.kept = (auto_report.choice.choice if auto_report is not None
                    and auto_report.choice is not None else "-")
        variants.update({"graph1": lambda: graph1(*inputs), "autostream": lambda: planned(*inputs),
                         "auto": lambda: auto(*inputs)})
        per_round: dict[str, list[float]] = {name: [] for name in variants}
        device_rounds: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            medians, device_medians = time_variants(variants, runs, warmup, device, timer)
            for name, seconds in medians.items():
                per_round[name].append(seconds * 1e6)
            for name, us in device_medians.items():
                device_rounds[name].append(us)
    for variant, backend in (("autostream", plan_backend), ("graph1", one)):
        described, why = capture_check(variant, backend.reports)
        row.runners.update(described)
        row.not_captured += why
    row.captured = not row.not_captured
    row.runners.update(capture_check("auto", auto_backend.reports)[0])  # told, not judged
    figure = {name: statistics.median(v) for name, v in per_round.items()}
    row.eager_us = figure["eager"]
    row.inductor_ro_us = figure.get("inductor_ro")
    row.graph1_us, row.autostream_us, row.auto_us = (figure["graph1"], figure["autostream"],
                                                     figure["auto"])
    row.measured_rounds = [g / a for g, a in zip(per_round["graph1"], per_round["autostream"],
                                                 strict=True)]
    row.auto_rounds = [g / a for g, a in zip(per_round["graph1"], per_round["auto"],
                                             strict=True)]
    row.measured = row.graph1_us / row.autostream_us
    row.error = row.measured / row.predicted - 1 if row.predicted else None
    row.device_us = {n: statistics.median(v) for n, v in device_rounds.items() if v}
    if row.device_us.get("autostream"):
        row.measured_device = row.device_us["graph1"] / row.device_us["autostream"]
        row.error_device = (row.measured_device / row.predicted - 1 if row.predicted
                            else None)
    row.seconds = time.perf_counter() - started
    say(line(row))
    torch._dynamo.reset()
    return row


def line(row: Row) -> str:
    """One case in words."""
    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    spread = (f" [{min(row.measured_rounds):.2f}-{max(row.measured_rounds):.2f}]"
              if row.measured_rounds else "")
    predicted = f"{row.predicted:.2f}x" if row.predicted else "-"
    device = ""
    if row.device_us:
        device = ("; device time " + ", ".join(f"{n} {us(v)} us" for n, v in
                                               row.device_us.items()))
        if row.measured_device is not None:
            device += f": measured {row.measured_device:.2f}x in device time"
    return (f"{row.model} @{row.batch}: eager {us(row.eager_us)} us, reduce-overhead "
            f"{us(row.inductor_ro_us)} us, one-stream graph {us(row.graph1_us)} us, "
            f"autostream graph {us(row.autostream_us)} us ({row.streams_used} streams): "
            f"measured {row.measured:.2f}x{spread}, predicted {predicted} "
            f"({row.runtime or 'no'} runtime), kept {row.kept}, auto "
            f"{us(row.auto_us)} us; {row.outputs_equal}" + device
            + ("".join(f"; {n}" for n in row.notes))
            + ("".join(f"; NOT CAPTURED (counts towards no target): {n}"
                       for n in row.not_captured)))


def headlines(rows: Sequence[Row], machine: str, calibration_s: float | None = None,
              total_s: float | None = None) -> list[Any]:
    """The issue's targets, from the rows measured in this run on ``machine`` (the GPU)."""
    from functools import partial

    from experiments.headline import Headline

    Headline = partial(Headline, machine=machine)  # noqa: N806 - every row names the GPU
    out = []
    uncaptured = [r for r in rows if not r.captured]
    if uncaptured:
        out.append(Headline("cases whose autostream or one-stream graph did not run captured "
                            "(counted towards no target): "
                            + ", ".join(f"{r.model} @{r.batch}" for r in uncaptured),
                            f"{len(uncaptured)} of {len(rows)} cases", "none", False))
    rows = [r for r in rows if r.captured]
    g1 = next((r for r in rows if r.model == "googlenet" and r.batch == 1), None)
    if g1 is not None:
        spread = g1.measured_rounds or [g1.measured]
        out.append(Headline(f"GoogLeNet batch 1: autostream's graph over the "
                            f"one-stream graph (rounds {min(spread):.2f}-"
                            f"{max(spread):.2f})", f"{g1.measured:.2f}x",
                            f">= {GOOGLENET_TARGET}x (Opara 1.70x)",
                            bool(g1.measured >= GOOGLENET_TARGET)))
    moe_rows = [r for r in rows if r.model.endswith("_decode") and r.batch <= 8]
    if moe_rows:
        worst = min(moe_rows, key=lambda r: r.measured)
        out.append(Headline(f"MoE decode layers at 1-8 tokens ({len(moe_rows)} cases): lowest "
                            f"speed-up over the one-stream graph ({worst.model} @{worst.batch})",
                            f"{worst.measured:.2f}x", f">= {MOE_TARGET}x",
                            bool(worst.measured >= MOE_TARGET)))
    kept = [r for r in rows if r.kept == "graph"]
    autos = [r.graph1_us / r.auto_us for r in rows if r.auto_us]
    floor = min([r.measured for r in kept] + autos, default=None)
    if floor is not None:
        out.append(Headline(f"plans the measured choice keeps ({len(kept)} of {len(rows)}) and "
                            f"runtime='auto': lowest speed-up over the one-stream graph",
                            f"{floor:.2f}x", f">= {KEPT_FLOOR}x",
                            bool(floor >= KEPT_FLOOR)))
    errors = [abs(r.error) for r in rows if r.error is not None]
    if errors:
        med = statistics.median(errors)
        out.append(Headline(f"predicted vs measured speed-up, device-calibrated table "
                            f"({len(errors)} cases): median |error|", f"{100 * med:.1f}%",
                            f"<= {100 * ERROR_TARGET:.0f}%", bool(med <= ERROR_TARGET)))
    device_errors = [abs(r.error_device) for r in rows if r.error_device is not None]
    if device_errors:
        med = statistics.median(device_errors)
        out.append(Headline(f"predicted vs measured speed-up in device time (events around "
                            f"the call, {len(device_errors)} cases): median |error|",
                            f"{100 * med:.1f}%", f"<= {100 * ERROR_TARGET:.0f}%",
                            bool(med <= ERROR_TARGET)))
    if calibration_s is not None and total_s is not None:
        out.append(Headline("the run's time: calibration under replay (models captured), the "
                            "whole script", f"{calibration_s:.0f} s, {total_s:.0f} s",
                            f"<= {CALIBRATION_BUDGET_S:.0f} s, <= {RUN_BUDGET_S:.0f} s",
                            bool(calibration_s <= CALIBRATION_BUDGET_S
                                 and total_s <= RUN_BUDGET_S)))
    equal = sum(bool(r.bitwise) for r in rows)
    out.append(Headline("outputs bitwise equal to the one-stream graph", f"{equal} of "
                        f"{len(rows)} cases", "all (deterministic kernels)", equal == len(rows)))
    return out


def _device_name(device: torch.device) -> str:
    """The GPU's name, or the device type off a GPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def gpu_name(device: torch.device) -> str:
    """The device and torch, as a headline row names its machine."""
    return f"{_device_name(device)}, torch {torch.__version__}"


def machine_slug(device: torch.device) -> str:
    """``h200`` for an NVIDIA H200, else the device name in lower-case words."""
    name = _device_name(device)
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]*)\b", name)
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name.lower())).lower().strip("-")


def calibrate(selected: Sequence[Case], device: torch.device, out: Path,
              say: Callable[[str], None]) -> tuple[str, float]:
    """The device's table under graph replay, over every case's graphs (one pass), and the
    seconds it took (the models' capture included)."""
    from autostream.calibration import calibrate_graphs
    from autostream.fx.capture import capture

    t0 = time.perf_counter()
    graphs, args = [], []
    for case in selected:
        model, inputs = case.build(device)
        with torch.no_grad():
            for c in capture(model, inputs):
                graphs.append(c.gm)
                args.append(c.args)
        del model
    table = calibrate_graphs(graphs, device, progress=True, models=[c.model for c in selected],
                             graph_args=args)
    path = out / f"{machine_slug(device)}-calibrated.json"
    table.save(path)
    seconds = time.perf_counter() - t0
    say(f"calibrated {len(table.entries)} op signatures and {len(table.pairs)} pairs under "
        f"graph replay in {seconds:.0f} s, the models' capture included "
        f"({len(table.skipped)} skipped): {path.name}")
    return str(path), seconds


class Output:
    """The run's files in ``out``, kept current: each log line and each row is on disk as
    soon as it is made (``cuda_graphs.log``, ``cuda_graphs.jsonl``), and ``cuda_graphs.json``
    is rewritten after each row (``complete`` false until ``finish``)."""

    def __init__(self, out: Path, header: dict[str, Any]) -> None:
        self.json_path = out / "cuda_graphs.json"
        self.lines_path = out / "cuda_graphs.jsonl"
        self.log_path = out / "cuda_graphs.log"
        self.header = dict(header, complete=False, total_s=None)
        self.rows: list[Row] = []
        self.failed: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.lines_path.write_text("")
        self.log_path.write_text("")
        self.save()

    def say(self, text: str) -> None:
        print(text, flush=True)
        with self.log_path.open("a") as f:
            f.write(text + "\n")

    def _append(self, kind: str, entry: dict[str, Any]) -> None:
        with self.lines_path.open("a") as f:
            f.write(json.dumps({"kind": kind, **entry}) + "\n")
        self.save()

    def row(self, row: Row) -> None:
        self.rows.append(row)
        self._append("row", asdict(row))

    def fail(self, case: Case, error: str, seconds: float) -> None:
        self.failed.append({"model": case.model, "batch": case.batch, "error": error,
                            "seconds": seconds})
        self._append("failed", self.failed[-1])

    def skip(self, case: Case, why: str) -> None:
        self.skipped.append({"model": case.model, "batch": case.batch, "why": why})
        self._append("skipped", self.skipped[-1])

    def update(self, **fields: Any) -> None:
        self.header.update(fields)
        self.save()

    def save(self) -> None:
        """``cuda_graphs.json`` as it stands (written aside, then moved: never half)."""
        data = {**self.header, "rows": [asdict(r) for r in self.rows], "failed": self.failed,
                "skipped": self.skipped}
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.json_path)


def _error_text(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def budget_left(budget_s: float | None, elapsed_s: float, case_seconds: Sequence[float]
                ) -> str | None:
    """Why the next case would not fit in the budget (``None``: it fits, or no budget): the
    longest case so far must fit in what is left, less ``RESERVE_S``.

    >>> budget_left(100.0, 60.0, [20.0, 30.0]) is None
    True
    >>> budget_left(100.0, 70.0, [20.0, 30.0])
    'budget: 30 s left of 100 s, a case takes up to 30 s (5 s kept for the end)'
    """
    if budget_s is None:
        return None
    estimate = max(case_seconds, default=0.0)
    left = budget_s - elapsed_s
    if elapsed_s + estimate + RESERVE_S <= budget_s:
        return None
    return (f"budget: {left:.0f} s left of {budget_s:.0f} s, a case takes up to "
            f"{estimate:.0f} s ({RESERVE_S:.0f} s kept for the end)")


def main(argv: Sequence[str] | None = None, *, timer: Any = None,
         clock: Callable[[], float] = time.perf_counter) -> int:
    """Run the experiment; ``timer``: the device timer (``cost.replay.ReplayTimer``; default
    device events on a GPU, none on the CPU); ``clock``: the budget's clock."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the JSON, the log and the table (default: "
                             "experiments/cuda_runs/<device>-<date>)")
    parser.add_argument("--models", nargs="*", default=(), help="only these models")
    parser.add_argument("--quick", action="store_true", help="one case per model family")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop before this many seconds have passed: cases that would "
                             "not fit are skipped (recorded as such)")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cost-table", default=None,
                        help="plan on this table instead of calibrating first")
    parser.add_argument("--no-inductor", action="store_true",
                        help="leave out torch.compile(mode='reduce-overhead')")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", type=int, default=1,
                        help="divide the MoE layers' sizes (a quick check off the GPU)")
    args = parser.parse_args(argv)
    if args.budget_s is not None and not args.budget_s > 0:
        parser.error(f"--budget-s must be > 0 seconds, got {args.budget_s}")
    started = clock()
    device = torch.device(args.device)
    if timer is None and device.type == "cuda":
        from autostream.cost.replay import EventTimer

        timer = EventTimer(device)
    date = datetime.date.today().isoformat()
    out = args.out or Path(__file__).parent / "cuda_runs" / f"{machine_slug(device)}-{date}"
    out.mkdir(parents=True, exist_ok=True)
    selected = cases(args.scale, args.models, args.quick)
    files = Output(out, {
        "torch": torch.__version__, "device": str(device), "date": date, "table": None,
        "calibration_s": None, "calibration_failed": None, "budget_s": args.budget_s,
        "quick": args.quick,
        "method": (f"median of {args.rounds} interleaved rounds, each the median of "
                   f"{args.runs} timed calls per variant (synchronised after each call; "
                   f"device time: events around the timed call)")})
    say = files.say
    say(f"torch {torch.__version__} on {_device_name(device)}; "
        f"{len(selected)} cases, up to {args.streams} streams, {args.rounds} interleaved rounds "
        f"of {args.runs} timed calls per variant"
        + (f"; budget {args.budget_s:.0f} s" if args.budget_s is not None else ""))
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    table, calibration_s = args.cost_table, None
    if table is None:
        t0 = clock()
        try:
            table, calibration_s = calibrate(selected, device, out, say)
        except Exception as exc:  # noqa: BLE001 - the run goes on with the shipped table
            files.update(calibration_failed=_error_text(exc), calibration_s=clock() - t0)
            table = SHIPPED_TABLE
            say(f"calibration FAILED ({_error_text(exc)}): planning on the shipped "
                f"{SHIPPED_TABLE} table instead")
    files.update(table=Path(table).name if isinstance(table, str) else str(table),
                 calibration_s=calibration_s if calibration_s is not None
                 else files.header["calibration_s"])
    case_seconds: list[float] = []
    for case in selected:
        why = budget_left(args.budget_s, clock() - started, case_seconds)
        if why is not None:
            files.skip(case, why)
            say(f"{case.model} @{case.batch}: SKIPPED ({why})")
            continue
        t0 = clock()
        try:
            row = run_case(case, device, table, args.streams, args.rounds, args.runs,
                           args.warmup, not args.no_inductor, say, timer)
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            case_seconds.append(clock() - t0)
            files.fail(case, _error_text(exc), case_seconds[-1])
            say(f"{case.model} @{case.batch}: FAILED {_error_text(exc)}")
            continue
        case_seconds.append(clock() - t0)
        files.row(row)
    total_s = clock() - started
    say(f"total {total_s:.0f} s: {len(files.rows)} rows, {len(files.failed)} failed, "
        f"{len(files.skipped)} skipped")
    files.update(total_s=total_s, complete=True)
    from experiments.headline import record

    record(__file__, headlines(files.rows, gpu_name(device), calibration_s, total_s))
    return 0 if files.rows else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
