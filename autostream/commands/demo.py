"""``autostream demo``: the first thing to run.

Two parts, then a summary in plain words:

1. **Planned for accelerators** (predicted): the built-in MoE layer (a shared expert
   beside routed experts) planned with several solvers on the Ascend 910B and H200
   cost tables (spec-derived), with a comparison table, Gantt charts, Perfetto traces
   and graph dumps per device in ``--out``;
2. **Measured on this machine**: a model whose two independent GEMV chains two CPU
   streams can overlap, compiled with ``torch.compile(backend=autostream.backend(...))``
   on the CPU threads runtime.  First what the backend decides, as it does for a user (its
   measured choice: the plan runs only where it clears the margin over eager); then the
   plan forced on (``measure=0``) timed against eager (at each intra-op thread count the
   plan could use instead: ``runtime/baseline.py``) and the compiled graph on one stream:
   measured against predicted speed-up and peak memory, with the machine and its load
   (a speed-up timed while the machine was busy is marked unreliable, never a result).

Missing optional pieces are reported, never fatal: the demo exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autostream.runtime.machine import Load

DEMO_SOLVERS = ("single", "round_robin", "opara", "nimble", "heft", "cpsat")
#: (cost table, device) the MoE layer is planned for
DEVICES = (("ascend910b", "Ascend 910B"), ("h200", "NVIDIA H200"))
#: depth of each GEMV chain of the measured model
GEMV_DEPTH = 8
#: untimed rounds before the timed ones (``autostream.runtime.timing``)
WARMUP = 5


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="plan an MoE layer for Ascend and H200, and measure a plan on this CPU",
        description="Plan the built-in MoE layer (shared expert beside routed experts) with "
        "several solvers on the Ascend 910B and H200 cost tables, write pictures into --out, "
        "then compile a two-branch model with the autostream backend and measure it on this "
        "CPU against one stream.",
    )
    p.add_argument("--out", default="autostream-demo", help="folder for the pictures")
    p.add_argument("--streams", type=int, default=2, help="maximum number of streams (default 2)")
    p.add_argument("--solver", default="cpsat",
                   help="solver of the measured CPU plan (default cpsat)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="cpsat's search budget in seconds (default: by graph size)")
    p.add_argument("--repeats", type=int, default=30,
                   help="timed runs of each variant for the measured speed-up (default 30)")
    p.add_argument("--no-run", action="store_true", help="plan and draw only, do not measure")
    p.set_defaults(func=run)


def _say(text: str = "") -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class DevicePlan:
    """The MoE layer's best multi-stream plan for one device table, in words."""

    device: str
    solver: str
    streams: int
    syncs: int
    speedup: float
    memory_increase: float | None
    #: the runtime the prediction is for (``cost.runtime_target``)
    runtime: str = ""


@dataclass(frozen=True)
class CpuRun:
    """What happened to the measured model on this machine, in words."""

    applied: bool
    reason: str
    streams: int = 1
    syncs: int = 0
    #: the plan forced on (``measure=0``): its speed-up over the best single stream
    measured: float | None = None
    predicted: float | None = None
    baseline: str = ""
    #: the machine and its load while timed ("" / ``None``: not timed)
    machine: str = ""
    load: Load | None = None
    #: what the backend runs after its measured choice, and why ("": not decided)
    runs: str = ""
    why: str = ""


def _available_solvers() -> tuple[list[str], list[str]]:
    from autostream.scheduling.solvers import get_solver

    ok, missing = [], []
    for name in DEMO_SOLVERS:
        try:
            get_solver(name)
        except ImportError:
            missing.append(name)
        else:
            ok.append(name)
    return ok, missing


# -- part 1: planned for accelerators -------------------------------------------------------
def _plan_for_device(table: str, device: str, args: argparse.Namespace,
                     solvers: list[str]) -> DevicePlan | None:
    """Plan the MoE layer with every solver on ``table``; print and draw; the best plan."""
    from autostream.models.zoo import moe_model
    from autostream.report.compare import plan_solvers, write_reports
    from autostream.report.sources import problem_from_model
    from autostream.report.table import markdown_table

    model, inputs = moe_model()
    try:
        source = problem_from_model(model, inputs, args.streams, cost_table=table,
                                    time_limit=args.time_limit, title=f"MoE layer, {device}")
    except Exception as exc:  # noqa: BLE001 - the demo reports, it does not crash
        _say(f"{device}: could not plan the model: {type(exc).__name__}: {exc}")
        return None
    problem = source.problem
    _say(f"{device} ({table} table, costed for the {source.runtime_name} runtime): "
         f"{problem.graph.number_of_nodes()} ops, up to {_count(problem.streams, 'stream')}, "
         f"sync latency {problem.sync_latency_us:.1f} us")
    results = plan_solvers(problem, solvers, time_limit=args.time_limit, memory=source.memory)
    _say(markdown_table(results))
    if any(r.ok and r.schedule is not None and r.schedule.optimal for r in results):
        _say("*: proven optimal")
    for r in results:
        if r.note:
            _say(f"note: {r.solver}: {r.note}")
    files = write_reports(Path(args.out) / table, problem, results, title=source.title)
    multi = [r for r in results if r.ok and r.schedule is not None and r.schedule.streams_used > 1]
    if not multi:
        _say("no solver found a multi-stream plan\n")
        return None
    best = min(multi, key=lambda r: (r.schedule.makespan, r.schedule.streams_used, r.solver))
    single = next((r for r in results if r.solver == "single" and r.ok
                   and r.schedule is not None), None)
    one_stream_us = single.schedule.makespan if single is not None else problem.single_stream_time()
    _say(f"best multi-stream plan: {best.solver}: Gantt {files.gantt[best.solver]}, trace "
         f"{files.trace[best.solver]} (open in https://ui.perfetto.dev), graph "
         f"{files.graph[best.solver][-1]}"
         + ("" if files.graph[best.solver][-1].suffix == ".svg" else
            " (no Graphviz here: render it with `dot -Tsvg`)") + "\n")
    return DevicePlan(device, best.solver, best.schedule.streams_used, len(best.syncs),
                      one_stream_us / best.schedule.makespan,
                      best.memory.peak_bytes / single.memory.peak_bytes - 1
                      if best.memory is not None and single is not None
                      and single.memory is not None else None, source.runtime_name)


# -- part 2: measured on this machine -------------------------------------------------------
#: the forced plan's name among the timed variants
FORCED = "plan forced on"


def _compile(model: Any, inputs: tuple[Any, ...], streams: int, solver: str,
             time_limit: float | None, measure: int = 0) -> tuple[Any, Any]:
    """``torch.compile`` with the autostream backend on the CPU threads runtime; run once.
    ``measure=0`` forces the plan on; else the backend measures it against eager."""
    import torch

    from autostream.backend import backend

    compile_fn = backend(runtime="threads", max_streams=streams, solver=solver,
                         time_limit=time_limit, measure=measure)
    compiled = torch.compile(model, backend=compile_fn)
    with torch.no_grad():
        compiled(*inputs)  # compiles, plans, rewrites
    return compiled, compile_fn.last_report


def backend_decision(report: Any) -> tuple[str, str]:
    """What the backend runs after its measured choice, and why, in words.

    >>> from types import SimpleNamespace as NS
    >>> backend_decision(NS(choice=None, kept="eager", not_measured="no plan to measure"))
    ('eager', 'not measured: no plan to measure')
    """
    choice = getattr(report, "choice", None)
    if choice is None:
        return report.kept, f"not measured: {report.not_measured}"
    busy = (f"unreliable ({choice.load.reason}): " if choice.load is not None
            and choice.load.busy else "")
    return choice.choice, busy + choice.reason


def _decide(model: Any, inputs: tuple[Any, ...], args: argparse.Namespace) -> tuple[str, str]:
    """Compile as a user does (the backend's measured choice on), call until it decides."""
    import torch

    from autostream.backend import backend as make_backend

    measure = _default_measure(make_backend)
    compiled, report = _compile(model, inputs, args.streams, args.solver, args.time_limit,
                                measure)
    with torch.no_grad():
        for _ in range(1000):  # 2 * measure calls per candidate decide
            if report.choice is None or not report.choice.measuring:
                break
            compiled(*inputs)
    runs, why = backend_decision(report)
    _say(f"the backend decides (measure={measure}, its default): runs {runs}: {why}")
    return runs, why


def _default_measure(backend_fn: Callable[..., Any]) -> int:
    import inspect

    return inspect.signature(backend_fn).parameters["measure"].default


def _time_variants(variants: dict[str, Callable[[], Any]], repeats: int, used: int
                   ) -> tuple[dict[str, float], Load]:
    """Median us of each variant, by the experiments' method (``autostream.runtime.timing``),
    and the machine's load meanwhile (the timing keeps ``used`` cores busy)."""
    from autostream.runtime.machine import LoadWatch
    from autostream.runtime.timing import method, time_alternating

    _say(f"timing: {method(repeats, WARMUP)} (the method of experiments/speedup.py)")
    watch = LoadWatch(used=used)
    medians = time_alternating(variants, repeats, WARMUP)
    return {k: v * 1e6 for k, v in medians.items()}, watch.load()


def speedup_words(measured: float, baseline: str, load: Load | None) -> str:
    """A measured speed-up in words: as a result on a quiet machine, marked unreliable with
    the reason on a busy one (``runtime.machine``: never a result there).

    >>> from autostream.runtime.machine import Load
    >>> speedup_words(1.21, "eager (1 thread)", Load(2, 0.3, 0.9, 0.02, 9.0))
    'measured speed-up 1.21x over the best single stream, eager (1 thread)'
    >>> speedup_words(7.01, "eager", Load(2, 3.1, 3.1, 1.4, 9.0))
    'speed-up unreliable, busy: other processes kept 1.40 of 2 cores busy during the timing (load average 3.1 on 2 cores); the plan ran 7.01x as fast as the best single stream, eager, meanwhile: rerun on a quiet machine'
    """
    if load is not None and load.busy:
        return (f"speed-up unreliable, {load.reason}; the plan ran {measured:.2f}x as fast as "
                f"the best single stream, {baseline}, meanwhile: rerun on a quiet machine")
    return f"measured speed-up {measured:.2f}x over the best single stream, {baseline}"


def _measure(model: Any, inputs: tuple[Any, ...], args: argparse.Namespace) -> CpuRun:
    """What the backend decides; then compile with the plan forced on, check outputs, and
    time it against the best single-stream run."""
    import torch

    from autostream.runtime.baseline import eager_candidates, plan_threads
    from autostream.runtime.machine import this_machine

    runs, why = _decide(model, inputs, args)
    streamed, report = _compile(model, inputs, args.streams, args.solver, args.time_limit)
    if report is None:
        raise RuntimeError("the autostream pass did not run on the model")
    _say(f"pass: {report.reason}")
    single, _ = _compile(model, inputs, 1, "single", None)
    used = report.plan.schedule.streams_used if report.applied else 1
    machine = this_machine()
    # eager at every intra-op thread count the plan could have used instead
    eager = {"eager": model, **eager_candidates(model, "threads", used)}
    threads = min(machine.cores, max(machine.threads, plan_threads(used, machine.threads)))
    with torch.no_grad():
        same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
                   for a, b in zip(model(*inputs), streamed(*inputs), strict=True))
        med, load = _time_variants({**{k: partial(fn, *inputs) for k, fn in eager.items()},
                                    "compiled, 1 stream": lambda: single(*inputs),
                                    FORCED: lambda: streamed(*inputs)}, args.repeats, threads)
    base = min((*eager, "compiled, 1 stream"), key=lambda k: med[k])
    measured = med[base] / med[FORCED]
    predicted = report.plan.predicted_speedup if report.applied else 1.0
    _say(f"outputs equal eager: {'yes' if same else 'NO'}")
    _say(f"machine: {machine}; {load}")
    _say(f"measured on CPU threads (median us; {FORCED}: measure=0, "
         f"{_count(used, 'stream')}): " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()))
    _say(f"{FORCED}: {speedup_words(measured, base, load)}; predicted {predicted:.2f}x "
         f"(experiments/speedup.py's 'measured' column is over the best of eager and "
         f"Inductor, and times the backend's measured choice)")
    if not report.applied:
        return CpuRun(False, report.reason, machine=str(machine), load=load, runs=runs,
                      why=why)
    return CpuRun(True, report.reason, used, len(report.plan.syncs), measured, predicted, base,
                  str(machine), load, runs, why)


def _measured_trace(model: Any, inputs: tuple[Any, ...], args: argparse.Namespace) -> None:
    """Run the plan with per-op spans and the bytes it holds; print memory, write a trace
    with the predicted and the measured timelines."""
    import torch

    from autostream.fx.capture import capture
    from autostream.memory.budget import format_bytes
    from autostream.passes import AutoStreamPass
    from autostream.report import write_trace
    from autostream.runtime import ThreadsRunner
    from autostream.scheduling.timeline import Timeline

    [captured] = capture(model, inputs)
    report = AutoStreamPass(max_streams=args.streams, solver=args.solver,
                            time_limit=args.time_limit).run(captured.gm)
    if not report.applied:
        return
    with ThreadsRunner(captured.gm, record_spans=True, record_memory=True) as runner, \
            torch.no_grad():
        for _ in range(5):  # the last call's spans, after warm-up
            runner(*captured.args)
        spans, held = runner.last_spans, runner.last_memory
    plan = report.plan
    path = write_trace(Path(args.out) / "cpu" / "measured_trace.json", plan.problem,
                       plan.schedule, plan.syncs, measured=Timeline.from_spans(spans))
    _say(f"peak memory: predicted {format_bytes(plan.memory.peak_bytes)} "
         f"({100 * plan.memory.increase:+.1f}% over one stream), measured "
         f"{format_bytes(held.peak_bytes)}")
    _say(f"measured trace (predicted and measured timelines): {path}")
    from autostream.report.gantt import gantt_png

    gantt = gantt_png(Path(args.out) / "cpu" / "plan_gantt.png", plan.problem, plan.schedule,
                      list(plan.syncs), title=f"two GEMV chains, {plan.schedule.solver}, "
                      f"{plan.predicted_us:,.1f} us predicted on {plan.schedule.streams_used} "
                      f"streams", predicted_us=plan.predicted_us)
    _say(f"Gantt chart of the measured plan (predicted times): {gantt}")


def _measure_on_cpu(args: argparse.Namespace) -> CpuRun | None:
    from autostream.models.zoo import two_branch_gemv

    if not hasattr(importlib.import_module("autostream.runtime"), "make_runner"):
        _say("measured: skipped, the CPU threads runtime (autostream.runtime.make_runner) is "
             "not in this build")
        return None
    model, inputs = two_branch_gemv(depth=GEMV_DEPTH)
    _say(f"two independent GEMV chains ({inputs[0].shape[0]}x{inputs[0].shape[1]} activations, "
         f"{GEMV_DEPTH} matmuls each), torch.compile(backend=autostream.backend("
         f"runtime='threads', max_streams={args.streams}, solver={args.solver!r})) against "
         "one stream ...")
    try:
        run_ = _measure(model, inputs, args)
        _measured_trace(model, inputs, args)
    except Exception as exc:  # noqa: BLE001 - an optional step must not fail the demo
        _say(f"measured: failed: {type(exc).__name__}: {exc}")
        return None
    return run_


# -- summary --------------------------------------------------------------------------------
def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _device_line(p: DevicePlan) -> str:
    memory = (f", peak memory {100 * p.memory_increase:+.0f}%" if p.memory_increase is not None
              else "")
    return (f"- {p.device}: {p.solver} would run the MoE layer on {p.streams} streams with "
            f"{_count(p.syncs, 'sync')}, predicted {p.speedup:.2f}x faster than one stream "
            f"on the {p.runtime} runtime{memory} (spec-derived costs: calibrate on the device "
            "for a plan to trust).")


def _cpu_line(r: CpuRun) -> str:
    decided = f" The backend runs {r.runs}: {r.why}." if r.runs else ""
    if not r.applied:
        return f"- This CPU: the GEMV model was left on one stream: {r.reason}.{decided}"
    return (f"- This CPU ({r.machine}): autostream planned {r.streams} streams with "
            f"{_count(r.syncs, 'sync')} for the GEMV model.{decided} Forced on (measure=0), "
            f"the plan: {speedup_words(r.measured, r.baseline, r.load)}; predicted "
            f"{r.predicted:.2f}x. The gain depends on the CPU: docs/cpu-runtime.md.")


def run(args: argparse.Namespace) -> int:
    if args.streams < 1:
        raise ValueError(f"--streams must be >= 1, got {args.streams}")
    t_start = time.perf_counter()
    try:
        importlib.import_module("autostream.models.zoo").moe_model  # noqa: B018
    except (ImportError, AttributeError) as exc:
        _say(f"demo unavailable: the model zoo (autostream.models.zoo.moe_model) is missing ({exc})")
        return 0
    solvers, missing = _available_solvers()
    _say("autostream demo\n\n1. Planned for accelerators: an MoE layer (a shared expert beside "
         f"routed experts), solvers {', '.join(solvers)}\n")
    if missing:
        _say(f"not in this build: solver(s) {', '.join(missing)}\n")
    planned = [_plan_for_device(table, device, args, solvers) for table, device in DEVICES]
    _say("2. Measured on this machine (CPU threads runtime)\n")
    cpu = None if args.no_run else _measure_on_cpu(args)
    if args.no_run:
        _say("measured: skipped (--no-run)")
    _say("\nSummary")
    for p in planned:
        if p is not None:
            _say(_device_line(p))
    if cpu is not None:
        _say(_cpu_line(cpu))
    elif args.no_run:
        _say("- This CPU: not measured (--no-run).")
    _say(f"Pictures and traces in {args.out}/. Done in {time.perf_counter() - t_start:.1f} s.")
    return 0
