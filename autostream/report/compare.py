"""Plan one problem with several solvers and write every report for each plan.

This is what ``autostream compare``, ``autostream demo`` and the experiments share:
:func:`plan_solvers` returns one :class:`SolverResult` per solver (a solver that is
missing or fails gets a row with its error instead of stopping the others), and
:func:`write_reports` writes ``table.md`` plus, per solver, ``<solver>_gantt.png``,
``<solver>_trace.json`` and ``<solver>_graph.dot`` (and ``.svg`` with Graphviz).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from autostream.cost.runtime_target import RuntimeCosts
from autostream.memory.predict import GraphMemory, allocation_timeline, predict_memory
from autostream.report.dot import write_graph
from autostream.report.gantt import counted, gantt_png
from autostream.report.table import SolverResult, markdown_table
from autostream.report.trace import write_trace
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule, Sync
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.solvers import check_solver_name, get_solver, solver_options
from autostream.scheduling.sync import compute_syncs
from autostream.scheduling.timeline import Timeline

#: what the "with runtime costs" column is, under every table that has it
RUNTIME_NOTE = ("Multi-stream makespans are solved as `autostream plan` solves them (each op on "
                "its stream's share of the intra-op threads); \"with runtime costs\" adds the "
                "multi-stream runtime's host costs per call, segment and op, which `plan` "
                "includes: it keeps one stream unless that figure is at least 1% under the "
                "single-stream time.")
#: what the lower bound column is, under every table that solves on split durations
BOUND_NOTE = ("The lower bound is the table's, the same in every row: no plan runs faster, "
              "on one stream or on several; a plan on one stream is timed as `plan` runs it "
              "(each op on all the intra-op threads), whichever solver found it.")


def parse_solvers(text: str) -> list[str]:
    """``"single, heft"`` -> ``["single", "heft"]``; unknown names raise ``ValueError``.

    >>> parse_solvers("single,heft")
    ['single', 'heft']
    """
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ValueError("--solvers is empty; give a comma-separated list such as single,heft")
    return [check_solver_name(n) for n in dict.fromkeys(names)]


def syncs_for(problem: SchedulingProblem, schedule: Schedule) -> tuple[Sync, ...]:
    """The minimal syncs of ``schedule`` (``autostream.scheduling.sync.compute_syncs``)."""
    return tuple(compute_syncs(problem.graph, schedule))


def plan_solvers(
    problem: SchedulingProblem,
    solvers: Sequence[str],
    *,
    time_limit: float | None = None,
    launch_overhead_us: float = 0.0,
    memory: GraphMemory | None = None,
    split_problem: SchedulingProblem | None = None,
    runtime: RuntimeCosts | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[SolverResult]:
    """Run each solver on ``problem``; a failure becomes a row with ``error`` set.

    Every plan is replayed with :func:`autostream.scheduling.simulate.simulate_plan` and its
    syncs; a replayed makespan that differs from the planner's is noted.  With
    ``launch_overhead_us > 0`` the replay with that host launch cost per op is kept in
    ``SolverResult.overhead_makespan`` (the table then shows it).  With ``memory``
    (the graph's tensor sizes), each plan's predicted peak memory is kept in
    ``SolverResult.memory`` (the table and the Gantt charts then show it).

    As ``autostream plan`` does, every solver but ``single`` solves ``split_problem`` when
    given (each op on its stream's share of the intra-op threads), and with ``runtime``
    each plan's time with the multi-stream runtime's host costs is kept in
    ``SolverResult.runtime_us``: what ``plan`` predicts, and compares with one stream.
    ``progress`` is told each solver's name before it runs.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> [r.schedule.makespan for r in plan_solvers(SchedulingProblem(g, 2), ["single", "heft"])]
    [3.0, 2.0]
    """
    results = []
    for name in solvers:
        if progress is not None:
            progress(name)
        solved = problem if name == "single" or split_problem is None else split_problem
        t0 = time.perf_counter()
        try:
            fn = get_solver(name)
        except ImportError as exc:
            results.append(SolverResult(name, None, error=f"solver not available ({exc})"))
            continue
        try:
            searches = time_limit is not None and "time_limit" in solver_options(name)
            options = {"time_limit": time_limit} if searches else {}
            schedule = fn(solved, **options)
        except Exception as exc:  # noqa: BLE001 - one failing solver must not hide the others
            results.append(SolverResult(name, None, plan_seconds=time.perf_counter() - t0,
                                        error=f"{type(exc).__name__}: {exc}"))
            continue
        seconds = time.perf_counter() - t0
        schedule, note = _as_run(problem, solved, schedule)
        solved = timed_problem(problem, split_problem, schedule)
        syncs = syncs_for(solved, schedule)
        replayed = simulate_plan(solved, schedule, syncs)
        replay = replayed.makespan
        if abs(replay - schedule.makespan) > 1e-6 * max(1.0, schedule.makespan):
            note = f"replayed makespan {replay:.1f} us (planner {schedule.makespan:.1f} us)"
        overhead = (simulate_plan(solved, schedule, syncs, launch_overhead_us).makespan
                    if launch_overhead_us > 0 else None)
        peak = None if memory is None else predict_memory(
            memory, schedule, syncs, allocation_timeline(memory, schedule, replayed))
        with_runtime = None if runtime is None else runtime_us(solved, schedule, syncs, runtime)
        results.append(SolverResult(name, schedule, syncs, seconds, None, note, overhead, peak,
                                    with_runtime))
    return with_one_bound(problem, split_problem, results)


def timed_problem(problem: SchedulingProblem, split_problem: SchedulingProblem | None,
                  schedule: Schedule) -> SchedulingProblem:
    """The problem a plan is timed on, as ``autostream plan`` times it: a plan on several
    streams on ``split_problem`` (each op on its stream's share of the intra-op
    threads), a plan on one stream on ``problem`` (it runs as the graph itself, each op
    on all of them), whichever solver found it."""
    if split_problem is None or schedule.streams_used <= 1:
        return problem
    return split_problem


def _as_run(problem: SchedulingProblem, solved: SchedulingProblem, schedule: Schedule
            ) -> tuple[Schedule, str | None]:
    """``schedule`` timed on the problem it runs on (:func:`timed_problem`), and a note
    when that is not the one it was solved on."""
    if schedule.streams_used > 1 or solved is problem:
        return schedule, None
    run = simulate_plan(problem, schedule, ())
    note = (f"one stream: timed with each op on all intra-op threads, as `plan` runs it "
            f"(solved at {schedule.makespan:,.1f} us, each op on a stream's share)")
    return replace(schedule, start=run.start, end=run.end, makespan=run.makespan), note


def table_bound(problem: SchedulingProblem, split_problem: SchedulingProblem | None,
                results: Sequence[SolverResult]) -> float:
    """One lower bound for every row: no plan of the graph runs faster, on one stream
    (``problem``'s durations) or on several (``split_problem``'s, when given): the
    lower of the two bounds, each the best a solver or the problem gives.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> table_bound(SchedulingProblem(g, 2), None, [])
    2.0
    """
    solved = split_problem or problem
    bounds = [r.schedule.lower_bound for r in results if r.ok and r.schedule is not None
              and (r.solver != "single" or split_problem is None)]
    multi = max([solved.lower_bound(), *bounds])
    if split_problem is None:
        return multi
    return min(replace(problem, streams=1).lower_bound(), multi)


def with_one_bound(problem: SchedulingProblem, split_problem: SchedulingProblem | None,
                   results: Sequence[SolverResult]) -> list[SolverResult]:
    """Every row with the table's bound (:func:`table_bound`); a row is optimal when its
    solver proved it against that bound, or its makespan meets it."""
    bound = table_bound(problem, split_problem, results)
    out = []
    for r in results:
        s = r.schedule
        if r.ok and s is not None:
            met = s.makespan <= bound + 1e-9 * max(1.0, bound)
            s = replace(s, lower_bound=bound,
                        optimal=met or bool(s.optimal and s.lower_bound == bound))
            r = replace(r, schedule=s)
        out.append(r)
    return out


def runtime_us(problem: SchedulingProblem, schedule: Schedule, syncs: Sequence[Sync],
               runtime: RuntimeCosts) -> float:
    """A plan's predicted time with the multi-stream runtime's host costs, as
    ``autostream plan`` predicts it (``planning.evaluate.evaluate``): one stream runs as planned."""
    if schedule.streams_used <= 1:
        return schedule.makespan
    timeline = simulate_plan(problem, schedule, syncs, launch_overhead_us=runtime.op_us,
                             segment_overhead_us=runtime.segment_us)
    return timeline.makespan + runtime.call_us


@dataclass(frozen=True)
class ReportFiles:
    """Paths written by :func:`write_reports`."""

    table: Path
    gantt: dict[str, Path] = field(default_factory=dict)
    trace: dict[str, Path] = field(default_factory=dict)
    graph: dict[str, list[Path]] = field(default_factory=dict)

    def all(self) -> list[Path]:
        out = [self.table, *self.gantt.values(), *self.trace.values()]
        for paths in self.graph.values():
            out.extend(paths)
        return out


def write_reports(
    out_dir: str | Path,
    problem: SchedulingProblem,
    results: Iterable[SolverResult],
    *,
    measured: Mapping[str, Timeline] | None = None,
    kinds: Mapping[str, str] | None = None,
    title: str | None = None,
    table: str = "",
    split_problem: SchedulingProblem | None = None,
) -> ReportFiles:
    """Write ``table.md`` and every solver's Gantt PNG, trace JSON and graph dump.

    ``measured`` maps a solver name to a measured timeline, added to its trace; ``table``
    names the cost table; ``split_problem`` is what solvers but ``single`` solved
    (:func:`plan_solvers`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = list(results)
    table_text = markdown_table(results)
    notes = [f"- {r.solver}: {r.note}" for r in results if r.note]
    head = f"# {title}\n\n" if title else ""
    body = (f"{head}{problem.graph.number_of_nodes()} ops, up to {problem.streams} stream{'s' * (problem.streams != 1)}, "
            f"sync latency {problem.sync_latency_us:.1f} us, single-stream time "
            f"{get_solver('single')(problem).makespan:,.1f} us"
            + (f"; cost table {table}" if table else "") + f".\n\n{table_text}\n")
    if any(r.runtime_us is not None for r in results):
        body += f"\n{RUNTIME_NOTE}\n"
    if split_problem is not None:
        body += f"\n{BOUND_NOTE}\n"
    if any(r.ok and r.schedule is not None and r.schedule.optimal for r in results):
        body += "\n`*`: proven optimal.\n"
    if notes:
        body += "\nNotes:\n" + "\n".join(notes) + "\n"
    files = ReportFiles(out / "table.md")
    files.table.write_text(body)
    for r in results:
        if not r.ok or r.schedule is None:
            continue
        s, syncs = r.schedule, list(r.syncs)
        solved = timed_problem(problem, split_problem, s)
        label = f"{title}: " if title else ""
        files.gantt[r.solver] = gantt_png(
            out / f"{r.solver}_gantt.png", solved, s, syncs, kinds=kinds, memory=r.memory,
            title=f"{label}{r.solver}, {s.makespan:,.1f} us on "
                  f"{counted(s.streams_used, 'stream')}, {counted(len(syncs), 'sync')}")
        files.trace[r.solver] = write_trace(
            out / f"{r.solver}_trace.json", solved, s, syncs,
            measured=(measured or {}).get(r.solver), kinds=kinds)
        files.graph[r.solver] = write_graph(out / f"{r.solver}_graph.dot", solved, s, syncs,
                                            kinds=kinds)
    return files


def with_note(result: SolverResult, note: str) -> SolverResult:
    """``result`` with ``note`` appended to its notes."""
    return replace(result, note=f"{result.note}; {note}" if result.note else note)
