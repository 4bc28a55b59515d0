"""Measured vs predicted speed-up of autostream's runtimes on the model zoo (issue 5).

For each model: eager, ``torch.compile`` (Inductor, default intra-op threads) and
autostream (``autostream.backend(runtime=...)``, default: threads on CPU) are timed
alternately, one timed call of each per round, median over ``--runs`` rounds after
``--warmup`` rounds; before each timed call the same variant runs untimed for
``--settle-ms`` (the OpenMP threads of the previous variant spin for several ms).
The baseline is the best single-stream variant: eager at each intra-op thread count
from 1 to the count the plan uses in all (the caller's, and fewer: one thread per stream
can beat eager's two only because eager's OpenMP threads wait for each other;
``autostream/runtime/baseline.py``), or Inductor.  Each row names the machine and its
load while it was timed; a row timed while the machine was busy
(``autostream/runtime/machine.py``) is marked unreliable, and a headline drawn from it
meets no target.  ``as-seq`` is
the same rewritten graph on the sequential runtime (stream ops as no-ops; the plan
lifted to Dynamo's graph where ``autostream.planning.lift`` allows): the gap between it and
the baseline is the interpreter's overhead, the gap between it and autostream the
overlap actually gained.

    python -m experiments.speedup                      # every zoo model + a deep GEMV pair
    python -m experiments.speedup --models two_branch_gemv_d8 --runs 40
    python -m experiments.speedup --no-inductor --cost-table cpu --json out.json
    python -m experiments.speedup --device cuda --cost-table h200   # streams runtime

The first row, ``probe_gemv_2x8``, runs a hand-written two-stream plan of two
chains of 8 matmuls (16x1024 @ 1024x1024) on the threads runtime, planner aside.
On CPU the row below it, ``threads_gemv_2x8``, runs the same chains on two plain
Python threads with one intra-op thread each (no autostream at all): what this
machine gives two such branches in this run, the ceiling of any plan of them.

Columns: predicted = the cost model's single-stream time of the graph over the
plan's predicted time plus ``torch.compile``'s own per-call cost (the cost table's
``compile_call_us``: the plan runs inside ``torch.compile``, eager does not; for a
graph kept on one stream, its single-stream time over the same plus that cost);
measured = baseline / autostream; error = measured / predicted - 1.  Not modelled:
the eager model's own Python around its ops (module calls, loops), which Dynamo's
graph drops (the random DAG runs 139 us eager and 77 us as its graph, so its
prediction comes out low), guards that grow with the parameters, and Inductor's
fusion when Inductor is the baseline.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

import autostream
from autostream.models.zoo import ZOO, random_dag_model, two_branch_gemv
from autostream.planning.lift import LiftedPlan
from autostream.planning.plan import PlanOptions, load_cost_model, predicted_speedup_over_eager
from autostream.runtime import make_runner, select_runtime
from autostream.runtime.baseline import eager_candidates
from autostream.runtime.builder import two_chains
from autostream.runtime.choice import SETTLE_S
from autostream.runtime.machine import Load, LoadWatch, this_machine, worst
from autostream.runtime.timing import method, time_alternating
from experiments.headline import Headline, record

#: the deep GEMV pair, and its target speed-up; no model may lose more than FLOOR;
#: predictions of multi-stream plans within PREDICTION of the measured speed-up
GEMV, GEMV_TARGET, FLOOR, PREDICTION = "two_branch_gemv_d8", 1.3, 0.97, 0.15


def models() -> dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]]:
    """The zoo plus the issue's probe: two chains of 8 matmuls 16x1024 @ 1024x1024."""
    out = dict(ZOO)
    out["two_branch_gemv_d8"] = partial(two_branch_gemv, rows=16, width=1024, depth=8)
    out["random_dag_1"] = partial(random_dag_model, 1)
    return out


def add_timing_arguments(parser: argparse.ArgumentParser, warmup: int) -> None:
    """``--models``, ``--runs``, ``--warmup``, ``--cost-table``, ``--settle-ms``: the options
    every timing experiment over the zoo takes."""
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--cost-table", help="cost table name or JSON path (default: planner's)")
    parser.add_argument("--settle-ms", type=float, default=SETTLE_S * 1e3,
                        help="untimed calls of a variant before each timed one, in ms "
                             "(default %(default)g: the backend's own settling time)")


def selected_models(parser: argparse.ArgumentParser, spec: str | None) -> dict[str, Callable]:
    """The models named in ``spec`` (comma-separated; all when empty), or a parser error."""
    table = models()
    names = spec.split(",") if spec else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(table)}")
    return {n: table[n] for n in names}


@dataclass
class Row:
    model: str
    streams: int
    eager_ms: float
    inductor_ms: float | None
    as_seq_ms: float
    plan_ms: float
    autostream_ms: float
    baseline: str
    predicted: float
    plan_measured: float
    measured: float
    error: float
    reason: str
    kept: str = "-"
    #: calls the backend's measured choice took to decide (``None``: nothing measured)
    calls: int | None = None
    #: plan vs the graph the planner predicted for (eager), Inductor's gain aside
    error_vs_eager: float = float("nan")
    #: ``torch.compile`` with Dynamo's identity backend: what any backend costs per call
    dynamo_ms: float | None = None
    #: eager at the other intra-op thread counts the plan could use, ms by candidate name
    eager_threads_ms: dict[str, float] = field(default_factory=dict)
    #: the machine, and its load while the row was timed (``None``: not read)
    machine: str = ""
    load: Load | None = None

    @property
    def baseline_ms(self) -> float:
        """The fastest single stream's median ms (the baseline's)."""
        return {"eager": self.eager_ms, "inductor": self.inductor_ms,
                **self.eager_threads_ms}.get(self.baseline) or float("nan")

    @property
    def unreliable(self) -> str:
        """Why the row's figures are unreliable ("" when the machine was not busy)."""
        return self.load.reason if self.load is not None else ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "load": self.load.figures() if self.load else None,
                "unreliable": self.unreliable}


def measure_model(name: str, factory, args: argparse.Namespace) -> Row:
    model, inputs = factory()
    device = torch.device(args.device)
    model, inputs = model.to(device), tuple(t.to(device) for t in inputs)
    options: dict[str, Any] = {"max_streams": args.max_streams, "solver": args.solver}
    if args.cost_table:
        options["cost_table"] = args.cost_table
    with torch.no_grad():
        expected = model(*inputs)
        variants: dict[str, Callable[[], Any]] = {"eager": lambda: model(*inputs)}
        # Dynamo's identity backend: the floor of any torch.compile backend (guards, frame)
        dynamo = torch.compile(model, backend="eager")
        dynamo(*inputs)
        variants["dynamo"] = lambda: dynamo(*inputs)
        if not args.no_inductor:
            inductor = torch.compile(model)
            inductor(*inputs)
            variants["inductor"] = lambda: inductor(*inputs)
        results = {}
        # "sequential" and the plan itself (measure=0), then the default backend, which
        # measures plan against eager on its first calls and keeps the faster.
        for key, runtime, measure in (("as_seq", "sequential", 0), ("plan", args.runtime, 0),
                                      ("autostream", args.runtime, 5)):
            fallback = args.fallback if measure else "eager"
            be = autostream.backend(runtime=runtime, measure=measure, fallback=fallback, **options)
            fn = torch.compile(model, backend=be)
            for _ in range(20000):  # until the backend has made its measured choices
                got = fn(*inputs)
                for g, e in zip(_tuple(got), _tuple(expected), strict=True):
                    torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
                if all(c.choice is not None for c in be.measured_choices):
                    break
            results[key] = (fn, be)
        for key, (fn, _) in results.items():
            variants[key] = partial(fn, *inputs)
        report = results["plan"][1].autostream_pass.last_report
        lifts = results["plan"][1].lifts
        choices = results["autostream"][1].measured_choices
        kept = choices[0].choice if choices else "eager"
        calls = choices[0].calls_to_decision if choices else None
        # what runs: the plan lifted to Dynamo's graph where it could be, else the ATen plan
        plan = report.plan if (report is not None and report.applied) else None
        if lifts and isinstance(lifts[-1], LiftedPlan):
            plan = lifts[-1]
        streams = plan.schedule.streams_used if plan is not None else 1
        threads = eager_candidates(model, select_runtime(args.runtime, inputs), streams)
        variants.update({k: partial(fn, *inputs) for k, fn in threads.items()})
        watch = LoadWatch()
        medians = time_alternating(variants, args.runs, args.warmup, device,
                                   args.settle_ms / 1e3)
        load = watch.load()
    torch._dynamo.reset()
    singles = {k: medians[k] for k in ("eager", *threads, "inductor") if k in medians}
    baseline = min(singles, key=singles.get)
    # over eager, so torch.compile's own per-call cost counts (see predicted_speedup_over_eager)
    compile_call_us = load_cost_model(args.cost_table).compile_call_us
    if plan is not None:
        predicted = predicted_speedup_over_eager(plan.single_stream_us, plan.predicted_us,
                                                 compile_call_us)
    elif report is not None and report.plan is not None:
        single_us = report.plan.single_stream_us
        predicted = predicted_speedup_over_eager(single_us, single_us, compile_call_us)
    else:
        predicted = 1.0
    reason = report.reason if report is not None else "no graph captured"
    if lifts:
        lifted = lifts[-1]
        reason += "; " + (lifted.describe() if isinstance(lifted, LiftedPlan)
                          else f"not lifted: {lifted}")
    measured = singles[baseline] / medians["autostream"]
    plan_measured = singles[baseline] / medians["plan"]
    return Row(
        model=name, streams=streams,
        eager_ms=medians["eager"] * 1e3,
        inductor_ms=medians["inductor"] * 1e3 if "inductor" in medians else None,
        dynamo_ms=medians["dynamo"] * 1e3,
        as_seq_ms=medians["as_seq"] * 1e3,
        plan_ms=medians["plan"] * 1e3,
        autostream_ms=medians["autostream"] * 1e3,
        baseline=baseline, predicted=predicted, plan_measured=plan_measured, measured=measured,
        error=plan_measured / predicted - 1.0, kept=kept, calls=calls,
        error_vs_eager=(medians["eager"] / medians["plan"]) / predicted - 1.0,
        reason=reason, eager_threads_ms={k: medians[k] * 1e3 for k in threads},
        machine=str(this_machine()), load=load,
    )


def measure_probe(args: argparse.Namespace, depth: int = 8) -> list[Row]:
    """The runtime alone, planner aside: a hand-written 2-stream plan of two GEMV chains.

    Baseline: the same ops on one stream (the GraphModule's own code, and the
    sequential runtime); Inductor is not involved (the graph is already ATen).
    """
    device = torch.device(args.device)
    gm1, inputs = two_chains(depth=depth, rows=16, width=1024, streams=1)
    gm2, _ = two_chains(depth=depth, rows=16, width=1024, streams=2)
    inputs = tuple(t.to(device) for t in inputs)
    seq = make_runner(gm1, "sequential")
    threads = make_runner(gm2, args.runtime)
    torch.testing.assert_close(threads(*inputs)[0], gm1(*inputs)[0])
    eager = {"eager": gm1, **eager_candidates(gm1, select_runtime(args.runtime, inputs), 2)}
    variants = {**{k: partial(fn, *inputs) for k, fn in eager.items()},
                "as_seq": lambda: seq(*inputs), "autostream": lambda: threads(*inputs)}
    plain = _PlainThreads(inputs, depth) if device.type == "cpu" else None
    if plain is not None:
        torch.testing.assert_close(plain(), gm1(*inputs)[0])
        variants["plain"] = plain
    watch = LoadWatch()
    medians = time_alternating(variants, args.runs, args.warmup, device, args.settle_ms / 1e3)
    load = watch.load()
    threads.close()
    base = min(eager, key=lambda k: medians[k])
    common = {"streams": 2, "eager_ms": medians["eager"] * 1e3, "inductor_ms": None,
              "baseline": base, "predicted": float("nan"), "error": float("nan"),
              "eager_threads_ms": {k: medians[k] * 1e3 for k in eager if k != "eager"},
              "machine": str(this_machine()), "load": load}
    rows = [Row(model=f"probe_gemv_2x{depth}", as_seq_ms=medians["as_seq"] * 1e3,
                plan_ms=medians["autostream"] * 1e3,
                autostream_ms=medians["autostream"] * 1e3,
                plan_measured=medians[base] / medians["autostream"],
                measured=medians[base] / medians["autostream"],
                reason="hand-written 2-stream plan on autostream's runtime (no planner, "
                       "no prediction)", **common)]
    if plain is not None:
        plain.close()
        rows.append(Row(model=f"threads_gemv_2x{depth}", as_seq_ms=float("nan"),
                        plan_ms=medians["plain"] * 1e3, autostream_ms=float("nan"),
                        plan_measured=medians[base] / medians["plain"],
                        measured=float("nan"),
                        reason="the same chains on two plain Python threads, no autostream "
                               "(this run's ceiling for two such branches)", **common))
    return rows


class _PlainThreads:
    """``y`` chain on a plain worker thread, ``x`` chain on the caller, one intra-op thread each."""

    def __init__(self, inputs: tuple[torch.Tensor, ...], depth: int):
        self.x, self.y = inputs[0], inputs[1]
        self.a, self.b = inputs[2:2 + depth], inputs[2 + depth:]
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._worker, daemon=True).start()

    @staticmethod
    def _chain(v: torch.Tensor, weights) -> torch.Tensor:
        for w in weights:
            v = torch.mm(v, w)
        return v

    def _worker(self) -> None:
        torch.set_num_threads(1)
        while self.jobs.get() is not None:
            self.done.put(self._chain(self.y, self.b))

    def __call__(self) -> torch.Tensor:
        threads = torch.get_num_threads()
        self.jobs.put(True)
        torch.set_num_threads(1)
        u = self._chain(self.x, self.a)
        v = self.done.get()
        torch.set_num_threads(threads)
        return u + v

    def close(self) -> None:
        self.jobs.put(None)


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def cell(value: float | None, width: int, digits: int) -> str:
    """``value`` right-aligned in ``width`` columns, ``-`` when missing (None or NaN)."""
    if value is None or value != value:
        return f"{'-':>{width}}"
    return f"{value:{width}.{digits}f}"


def print_table(rows: list[Row]) -> None:
    head = (f"{'model':<20} {'str':>3} {'eager':>8} {'dynamo':>8} {'inductor':>9} {'as-seq':>8} "
            f"{'plan':>8} {'autostrm':>9} {'base':>16} {'base ms':>8} {'pred':>6} {'plan x':>7} {'error':>7} {'err/eag':>7} "
            f"{'kept':>16} {'calls':>5} {'autostrm x':>10} {'others':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        pred = f"{r.predicted:6.2f}" if r.predicted == r.predicted else f"{'n/a':>6}"
        err = f"{r.error:+7.1%}" if r.error == r.error else f"{'n/a':>7}"
        err += " " + (f"{r.error_vs_eager:+7.1%}" if r.error_vs_eager == r.error_vs_eager
                      else f"{'n/a':>7}")
        print(f"{r.model:<20} {r.streams:>3} {r.eager_ms:8.3f} {cell(r.dynamo_ms, 8, 3)} "
              f"{cell(r.inductor_ms, 9, 3)} {cell(r.as_seq_ms, 8, 3)} "
              f"{r.plan_ms:8.3f} {cell(r.autostream_ms, 9, 3)} {r.baseline:>16} {cell(r.baseline_ms, 8, 3)} {pred} "
              f"{r.plan_measured:7.2f} {err} {r.kept:>16} "
              f"{r.calls if r.calls is not None else '-':>5} {cell(r.measured, 10, 2)} "
              f"{cell(r.load.others if r.load else None, 6, 2)}{'*' if r.unreliable else ' '}")
    print("times: median ms per call. dynamo: torch.compile with Dynamo's identity backend, the "
          "per-call floor of any backend (not a baseline). "
          "plan: the multi-stream plan on the runtime; autostrm: the "
          "backend with --fallback, which measured plan, eager (and Inductor) on its first calls "
          "and kept the fastest ('kept', after 'calls' calls). pred / plan x / autostrm x: speed-up over the best single-stream variant; "
          "pred: over the eager graph, torch.compile's per-call cost (cost table: "
          "compile_call_us) included; "
          "error: plan x vs pred; err/eag: (eager / plan) vs pred, the error of the cost "
          "model alone (the prediction is over the eager graph, Inductor's fusion aside). "
          "base: the fastest single stream, eager at each intra-op thread count the plan could "
          "use ('eager': the caller's count) or Inductor. others: cores other processes kept "
          "busy during the row's timing")
    busy = [r for r in rows if r.unreliable]
    for r in busy:
        print(f"* {r.model}: unreliable, {r.unreliable}: its speed-ups are not results")
    machines = sorted({r.machine for r in rows if r.machine})
    if machines:
        print(f"machine: {'; '.join(machines)}")


def measured_on(rows: list[Row]) -> dict[str, str]:
    """``Headline``'s ``machine`` and ``unreliable`` for a figure drawn from ``rows``: the
    machine and the busiest row's load; unreliable when any row was timed while busy."""
    load = worst(r.load for r in rows)
    machines = "; ".join(sorted({r.machine for r in rows if r.machine}))
    where = "; ".join(x for x in (machines, str(load) if load else "") if x)
    busy = [r for r in rows if r.unreliable]
    why = (busy[0].unreliable + (f"; {len(busy)} of {len(rows)} rows timed while busy"
                                 if len(rows) > 1 else "") if busy else "")
    return {"machine": where, "unreliable": why}


def headlines(rows: list[Row], device: str) -> list[Headline]:
    """The GEMV pair's speed-up, the lowest speed-up of any model, the prediction error:
    over the rows the backend planned (the hand-written probes aside).  Each names the
    machine and load of its rows; a figure from a row timed while the machine was busy is
    unreliable and meets no target."""
    planned = [r for r in rows if r.predicted == r.predicted]
    out = []
    gemv = next((r for r in planned if r.model == GEMV), None)
    if gemv is not None:
        out.append(Headline(f"two GEMV branches ({GEMV}, {device}): measured speed-up",
                            f"{gemv.measured:.2f}x", f">= {GEMV_TARGET:g}x",
                            gemv.measured >= GEMV_TARGET, **measured_on([gemv])))
    if planned:
        low = min(planned, key=lambda r: r.measured)
        out.append(Headline(f"measured speed-up, lowest of {len(planned)} models ({device})",
                            f"{low.measured:.2f}x ({low.model})", f">= {FLOOR:g}x",
                            low.measured >= FLOOR, **measured_on(planned)))
    decided = [r for r in planned if r.calls is not None]
    if decided:
        most = max(decided, key=lambda r: r.calls)
        out.append(Headline(f"measured choice: calls to a decision ({len(decided)} models, "
                            f"{device})", f"{min(r.calls for r in decided)}-{most.calls} "
                            f"({most.model})", "informational", None, **measured_on(decided)))
    multi = [r for r in planned if r.streams > 1]
    if multi:
        far = max(multi, key=lambda r: abs(r.error))
        within = sum(abs(r.error) <= PREDICTION for r in multi)
        out.append(Headline(f"predicted against measured speed-up, {len(multi)} multi-stream "
                            f"plans ({device})", f"{within}/{len(multi)} within; worst "
                            f"{100 * far.error:+.0f}% ({far.model})",
                            f"within {100 * PREDICTION:g}%", within == len(multi),
                            **measured_on(multi)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_arguments(parser, warmup=5)
    parser.add_argument("--runtime", default="auto", choices=("auto", "threads", "streams"))
    parser.add_argument("--device", default="cpu", help="cpu, cuda, npu... (default cpu)")
    parser.add_argument("--max-streams", type=int, default=2)
    parser.add_argument("--solver", default=PlanOptions.solver,
                        help="planner (default: the pass default, %(default)s)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile baseline")
    parser.add_argument("--fallback", choices=("eager", "inductor"), default=None,
                        help="the default backend's single-stream alternatives (default: "
                             "inductor, eager with --no-inductor)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--no-probe", action="store_true",
                        help="skip the hand-written 2-stream GEMV probe (runtime alone)")
    args = parser.parse_args(argv)
    if args.fallback is None:
        args.fallback = "eager" if args.no_inductor else "inductor"
    if args.runs < 20:
        parser.error("--runs must be >= 20 (the issue's protocol)")
    table = selected_models(parser, args.models)
    print(f"torch {torch.__version__}, device {args.device}, "
          f"{torch.get_num_threads()} intra-op threads, "
          f"runtime={args.runtime}, max_streams={args.max_streams}, solver={args.solver}, "
          f"fallback={args.fallback}, "
          f"cost_table={args.cost_table or 'default'}", flush=True)
    print(f"timing: {method(args.runs, args.warmup, args.settle_ms / 1e3)}; machine: "
          f"{this_machine()}; each row's load is read during its own timing", flush=True)
    rows = []
    if not args.no_probe:
        for row in measure_probe(args):
            rows.append(row)
            print(f"  {row.model}: {row.reason}; {row.load}", flush=True)
    for name, factory in table.items():
        row = measure_model(name, factory, args)
        rows.append(row)
        print(f"  {name}: {row.reason}; {row.load}", flush=True)
    print()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in rows], indent=2))
    record(__file__, headlines(rows, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
