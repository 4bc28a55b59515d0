"""``autostream demo``: the first thing to run.

Plans the built-in MoE layer (a shared expert beside routed experts) with several
solvers, prints the comparison table, writes Gantt charts, Perfetto traces and graph
dumps into ``--out``, then runs the best plan (or ``--solver``'s) on the CPU threads
runtime (when it is installed) and prints the measured speed-up over the best single-stream run
(eager, or the same compiled graph on one stream) next to the predicted one, and the
plan's predicted and measured peak memory.  Missing
optional pieces are reported, never fatal: the demo exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEMO_SOLVERS = ("single", "round_robin", "opara", "nimble", "heft", "cpsat")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="plan a built-in MoE layer with several solvers, draw the plans, measure them",
        description="Plan the built-in MoE model (shared expert beside routed experts) with "
        "several solvers, print the comparison table, write pictures into --out, and run the "
        "best plan on the CPU threads runtime when available.",
    )
    p.add_argument("--out", default="autostream-demo", help="folder for the pictures")
    p.add_argument("--streams", type=int, default=2, help="maximum number of streams (default 2)")
    p.add_argument("--solver", default="best",
                   help="solver of the measured plan (default: the best one in the table)")
    p.add_argument("--time-limit", type=float, default=1.0,
                   help="search budget of cpsat in seconds (default 1)")
    p.add_argument("--repeats", type=int, default=30,
                   help="timed runs of each variant for the measured speed-up (default 30)")
    p.add_argument("--no-run", action="store_true", help="plan and draw only, do not measure")
    p.set_defaults(func=run)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _available_solvers() -> tuple[list[str], list[str]]:
    from autostream.solvers import get_solver

    ok, missing = [], []
    for name in DEMO_SOLVERS:
        try:
            get_solver(name)
        except ImportError:
            missing.append(name)
        else:
            ok.append(name)
    return ok, missing


def _median_us(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _compile(model: Any, inputs: tuple[Any, ...], streams: int, solver: str,
             time_limit: float) -> tuple[Any, Any]:
    """``torch.compile`` with the autostream backend on the CPU threads runtime; run once."""
    import torch

    from autostream.backend import backend

    # measure=0: the demo times the plan itself against one stream, side by side.
    compile_fn = backend(runtime="threads", max_streams=streams, solver=solver,
                         time_limit=time_limit, measure=0)
    compiled = torch.compile(model, backend=compile_fn)
    with torch.no_grad():
        compiled(*inputs)  # compiles, plans, rewrites
    return compiled, compile_fn.autostream_pass.last_report


def _measure(model: Any, inputs: tuple[Any, ...], streamed: Any, report: Any, streams: int,
             repeats: int) -> list[str]:
    """Time the planned graph against the best single-stream run (eager or compiled)."""
    import torch

    single, _ = _compile(model, inputs, 1, "single", 1.0)
    lines = [f"pass: {report.reason}"]
    used = report.plan.schedule.streams_used if report.applied and report.plan else 1
    planned = f"autostream, {used} stream{'s' if used > 1 else ''}"
    with torch.no_grad():
        same = torch.allclose(model(*inputs), streamed(*inputs), rtol=1e-4, atol=1e-5)
        variants = {"eager": lambda: model(*inputs), "compiled, 1 stream": lambda: single(*inputs),
                    planned: lambda: streamed(*inputs)}
        for fn in variants.values():  # warm-up
            for _ in range(3):
                fn()
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(max(1, repeats // 5)):  # alternate, so drift hits every variant alike
            for k, fn in variants.items():
                samples[k].append(_median_us(fn, 5))
    med = {k: statistics.median(v) for k, v in samples.items()}
    base_name = min(("eager", "compiled, 1 stream"), key=lambda k: med[k])
    predicted = report.plan.predicted_speedup if report.plan is not None and report.applied else 1.0
    lines.append(f"outputs equal eager: {'yes' if same else 'NO'}")
    lines.append("measured on CPU threads (median us): "
                 + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()))
    lines.append(f"measured speed-up {med[base_name] / med[planned]:.2f}x over the best single "
                 f"stream ({base_name}); predicted {predicted:.2f}x")
    if report.plan is not None and report.plan.memory is not None:
        lines.append(_predicted_memory(report.plan.memory))
    if not report.applied:
        lines.append("(the pass kept one stream, so the measured run is single-stream)")
    return lines


def _predicted_memory(memory: Any) -> str:
    from autostream.budget import format_bytes

    limit = (f", budget {format_bytes(memory.limit_bytes)}" if memory.limit_bytes is not None
             else "")
    return (f"predicted peak memory {format_bytes(memory.peak_bytes)} "
            f"({100 * memory.increase:+.1f}% over one stream's "
            f"{format_bytes(memory.single_stream_peak_bytes)}{limit})")


def _measured_trace(model: Any, inputs: tuple[Any, ...], out: Path, streams: int, solver: str,
                    time_limit: float, repeats: int = 5) -> str:
    """Run the plan on the threads runtime with per-op spans and the bytes it holds, and
    write predicted and measured timelines into one Perfetto trace."""
    import torch

    from autostream.capture import capture
    from autostream.passes import AutoStreamPass
    from autostream.report import write_trace
    from autostream.runtime import ThreadsRunner
    from autostream.timeline import Timeline

    [captured] = capture(model, inputs)
    stream_pass = AutoStreamPass(max_streams=streams, solver=solver, time_limit=time_limit)
    stream_pass(captured.gm)
    report = stream_pass.last_report
    if not report.applied:
        return f"measured trace: skipped ({report.reason})"
    with ThreadsRunner(captured.gm, record_spans=True, record_memory=True) as runner, \
            torch.no_grad():
        for _ in range(repeats):  # the last call's spans, after warm-up
            runner(*captured.args)
        spans, measured = runner.last_spans, runner.last_memory
    plan = report.plan
    path = write_trace(out / "measured_trace.json", plan.problem, plan.schedule, plan.syncs,
                       measured=Timeline.from_spans(spans))
    from autostream.budget import format_bytes

    return (f"measured peak memory {format_bytes(measured.peak_bytes)} (predicted "
            f"{format_bytes(plan.memory.peak_bytes)})\n"
            f"measured trace (predicted and measured timelines): {path}")


def _best_solver(results: list, fallback: str) -> str:
    """The solver of the fastest predicted plan (ties: fewer streams, then name)."""
    ok = [r for r in results if r.ok and r.schedule is not None]
    if not ok:
        return fallback
    return min(ok, key=lambda r: (r.schedule.makespan, r.schedule.streams_used, r.solver)).solver


def run(args: argparse.Namespace) -> int:
    if args.streams < 1:
        raise ValueError(f"--streams must be >= 1, got {args.streams}")
    t_start = time.perf_counter()
    title = "MoE layer (autostream demo)"
    _say("autostream demo: an MoE layer (shared expert beside routed experts)")
    try:
        from autostream.zoo import moe_model
    except ImportError as exc:
        _say(f"demo unavailable: the model zoo (autostream.zoo.moe_model) is missing ({exc})")
        return 0
    from autostream.report.compare import plan_solvers, write_reports
    from autostream.report.sources import problem_from_model
    from autostream.report.table import markdown_table

    solvers, missing = _available_solvers()
    model, inputs = moe_model()
    _say("capturing the post-AOT ATen graph and estimating op costs ...")
    try:
        source = problem_from_model(model, inputs, args.streams, time_limit=args.time_limit,
                                    title=title)
    except Exception as exc:  # noqa: BLE001 - the demo reports, it does not crash
        _say(f"demo could not plan the model: {type(exc).__name__}: {exc}")
        return 0
    problem = source.problem
    _say(f"{problem.graph.number_of_nodes()} ops, up to {problem.streams} streams, "
         f"sync latency {problem.sync_latency_us:g} us; planning with {', '.join(solvers)}")
    results = plan_solvers(problem, solvers, time_limit=args.time_limit, memory=source.memory)
    _say()
    _say(markdown_table(results))
    _say()
    for note in source.notes:
        _say(f"note: {note}")
    if missing:
        _say(f"not in this build: solver(s) {', '.join(missing)}")
    for r in results:
        if r.note:
            _say(f"note: {r.solver}: {r.note}")
    files = write_reports(args.out, problem, results, title=title)
    out = Path(args.out)
    ok = [r for r in results if r.ok and r.schedule is not None]
    multi = [r for r in ok if r.schedule.streams_used > 1] or ok
    if multi:
        shown = min(multi, key=lambda r: (r.schedule.makespan, r.solver)).solver
        _say(f"best multi-stream plan: {shown}: Gantt {files.gantt[shown]}, trace "
             f"{files.trace[shown]} (open in https://ui.perfetto.dev), graph "
             f"{files.graph[shown][-1]}")
    _say(f"{len(files.all())} files in {out}/ (one Gantt chart, trace and graph dump per solver, "
         "table.md)")
    runtime_ok = hasattr(importlib.import_module("autostream.runtime"), "make_runner")
    if args.no_run:
        _say("measured: skipped (--no-run)")
    elif not runtime_ok:
        _say("measured: skipped, the CPU threads runtime (autostream.runtime.make_runner) is "
             "not in this build")
    else:
        solver = args.solver if args.solver != "best" else _best_solver(results, "heft")
        _say(f"measuring: torch.compile(backend=autostream.backend(runtime='threads', "
             f"max_streams={args.streams}, solver={solver!r})) against one stream ...")
        try:
            streamed, report = _compile(model, inputs, args.streams, solver, args.time_limit)
            if report is None:
                raise RuntimeError("the autostream pass did not run on the model")
            for line in _measure(model, inputs, streamed, report, args.streams, args.repeats):
                _say(line)
            _say(_measured_trace(model, inputs, out, args.streams, solver, args.time_limit))
        except Exception as exc:  # noqa: BLE001 - an optional step must not fail the demo
            _say(f"measured: failed: {type(exc).__name__}: {exc}")
    _say(f"done in {time.perf_counter() - t_start:.1f} s")
    return 0
