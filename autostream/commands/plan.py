"""``autostream plan SPEC``: plan one model or STG graph and print (or write) the figures.

``SPEC`` is ``module.path:function`` or ``path/to/file.py:function`` returning
``(model, example_inputs)``, or a Standard Task Graph ``.stg`` file (zero sync
latency, no contention, task times as microseconds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autostream.memory.budget import DEFAULT_MAX_MEMORY_INCREASE, MemoryBudget, format_bytes
from autostream.planning.defaults import DEFAULT_MAX_STREAMS, DEFAULT_SOLVER
from autostream.stages import Stopwatch

if TYPE_CHECKING:
    from autostream.scheduling.schedule import Schedule


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="plan one model or .stg graph and report makespan, bound, syncs",
        description="Plan SPEC on up to --streams streams with --solver and print a summary. "
        "SPEC is module.path:function or path/to/file.py:function returning "
        "(model, example_inputs), or a Standard Task Graph .stg file.",
    )
    p.add_argument("spec", metavar="SPEC", help="module:function, file.py:function, or file.stg")
    p.add_argument("--streams", type=int, default=DEFAULT_MAX_STREAMS,
                   help=f"maximum number of streams (default {DEFAULT_MAX_STREAMS}, as "
                        f"torch.compile(backend='autostream') plans)")
    p.add_argument("--solver", default=DEFAULT_SOLVER, help=f"solver name (default {DEFAULT_SOLVER})")
    p.add_argument("--cost-table", default=None, help="cost table name or path (models only)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for solvers that search (cpsat); default: by the graph's size")
    p.add_argument("--max-memory-increase", default=DEFAULT_MAX_MEMORY_INCREASE, metavar="X",
                   help="how far the plan's predicted peak memory may rise above one stream's: "
                   "a percentage (10%%), a size (512MiB), both (10%%,2MiB: the larger) or none; "
                   "0 keeps it at one stream's peak; a bare number is refused (default "
                   f"{DEFAULT_MAX_MEMORY_INCREASE.replace('%', '%%')})")
    p.add_argument("--core-budgets", action="store_true",
                   help="also choose each side stream's core budget (quarters of the chip) in "
                        "cpsat's model, emitted as limit_core_num's scope keys (models, "
                        "cpsat, a table with cube and vector core counts)")
    p.add_argument("--runtime", default="auto", metavar="RUNTIME",
                   help="the runtime the predictions are for: graph, streams, threads, "
                        "sequential or torchair (models only; default auto: graph for a CUDA "
                        "table, threads for a CPU one, torchair for Ascend)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="also write the figures as JSON to OUT")
    p.set_defaults(func=run)


def plan_stg(path: str, streams: int, solver: str, time_limit: float | None) -> dict[str, Any]:
    """Plan an ``.stg`` file; the same figures as ``Plan.summary()`` for a model."""
    from autostream.models.stg import read_stg, resolve_stg
    from autostream.scheduling.solvers import solve

    found = resolve_stg(path)
    t0 = time.perf_counter()
    problem = read_stg(found, streams=streams)
    watch = Stopwatch()
    options = {"time_limit": time_limit} if solver == "cpsat" and time_limit else {}
    schedule = solve(problem, solver, **options)
    watch.lap("solve")
    syncs = _syncs(problem.graph, schedule) if schedule.streams_used > 1 else []
    watch.lap("syncs")
    single = problem.single_stream_time()
    return {
        "solver": solver,
        "nodes": problem.graph.number_of_nodes(),
        "streams_used": schedule.streams_used,
        "makespan_us": schedule.makespan,
        "lower_bound_us": schedule.lower_bound,
        "single_stream_us": single,
        "predicted_speedup": single / schedule.makespan if schedule.makespan > 0 else 1.0,
        "num_syncs": len(syncs),
        "optimal": bool(schedule.optimal),
        "plan_seconds": time.perf_counter() - t0,
        "stage_seconds": (stages := watch.times()).as_dict(),
        "pass_seconds": round(stages.total, 4),
        "solver_stats": solver_stats(schedule),
        "cost_table": "none: the .stg file's task times",
    }


def _syncs(graph, schedule) -> list:
    try:
        from autostream.scheduling.sync import compute_syncs
    except ImportError:
        return _reduced_cross_edges(graph, schedule)
    return list(compute_syncs(graph, schedule))


def _reduced_cross_edges(graph, schedule) -> list:
    """Fallback sync count: cross-stream edges of the transitive reduction."""
    from autostream.scheduling.solvers._graphs import transitive_reduction_edges

    order = list(schedule.order)
    return [(u, v) for u, v in transitive_reduction_edges(graph, order)
            if schedule.stream_of[u] != schedule.stream_of[v]]


def solver_stats(schedule: Schedule) -> dict[str, Any]:
    """The solver's figures as JSON values (``{}`` when it reports none)."""
    if schedule.stats is None:
        return {}
    return {k: v for k, v in schedule.stats.as_dict().items() if _plain(v)}


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    return isinstance(value, (int, float, str, bool)) or value is None


def plan_spec(spec: str, streams: int, solver: str, cost_table: str | None,
              time_limit: float | None,
              max_memory_increase: float | str | None = DEFAULT_MAX_MEMORY_INCREASE,
              core_budgets: bool = False, runtime: str = "auto") -> dict[str, Any]:
    """Plan a ``.stg`` file or a model spec and return the summary figures."""
    from autostream.scheduling.solvers import check_solver_name

    MemoryBudget.parse(max_memory_increase, option="--max-memory-increase")
    if streams < 1:
        raise ValueError(f"--streams must be >= 1, got {streams}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"--time-limit must be > 0 seconds, got {time_limit}")
    check_solver_name(solver)
    from autostream.cost.runtime_target import TARGETS

    if runtime not in ("auto", *TARGETS):
        raise ValueError(f"--runtime {runtime!r}: choose auto or one of {', '.join(TARGETS)}")
    if spec.endswith(".stg"):
        if core_budgets:
            raise ValueError("--core-budgets needs a model (its ops' device shares); a .stg "
                             "graph has none: drop --core-budgets")
        summary = plan_stg(spec, streams, solver, time_limit)
    else:
        from autostream.models.modelspec import load_model_spec

        model, inputs = load_model_spec(spec)
        summary = plan_captured(model, inputs, streams, solver, cost_table, time_limit,
                                max_memory_increase, core_budgets, runtime)
    summary["optimal"] = bool(summary["optimal"]) or meets_bound(summary)
    return summary


def plan_captured(model: Any, inputs: Any, streams: int, solver: str, cost_table: str | None,
                  time_limit: float | None,
                  max_memory_increase: float | str | None = DEFAULT_MAX_MEMORY_INCREASE,
                  core_budgets: bool = False, runtime: str = "auto") -> dict[str, Any]:
    """Capture the model's graphs, run the pass on every one (plan, rewrite, verify), as
    ``torch.compile`` does, and return the largest graph's summary figures, with
    ``graphs`` (every graph's, in capture order) when Dynamo split the model;
    ``pass_seconds`` is all of the largest's but the capture.  ``runtime``: the runtime
    the costs are for (``auto``: the default of the table's device)."""
    import torch.fx

    from autostream.cost.runtime_target import default_runtime
    from autostream.fx.device import graph_device
    from autostream.passes import AutoStreamPass
    from autostream.planning.plan import largest_graph, model_graphs

    if isinstance(model, torch.fx.GraphModule) and not inputs:
        graphs = [model]  # a graph with fake values and no inputs (the experts' layers)
    else:
        graphs = model_graphs(model, inputs)
    largest = graphs.index(largest_graph(graphs))
    stream_pass = AutoStreamPass(max_streams=streams, solver=solver, cost_table=cost_table,
                                 time_limit=time_limit, max_memory_increase=max_memory_increase,
                                 core_budgets=core_budgets)
    if runtime == "auto":
        device = graph_device(graphs[largest].graph)
        runtime = default_runtime(stream_pass.cost_model_for(device).profile.kind)
    reports = [stream_pass.run(gm, runtime=runtime) for gm in graphs]  # logged: INFO lines
    report = reports[largest]
    if report.plan is None:
        hint = ("; it is placed by hand: `autostream check SPEC` checks it and sets autostream's "
                "plan beside it" if "already contains stream op" in report.reason else "")
        raise RuntimeError(f"the model could not be planned: {report.reason}{hint}")
    summary = report.figures()
    summary["solver"] = solver
    summary["solver_stats"] = solver_stats(report.plan.schedule)
    summary["notes"] = list(report.plan.notes)
    if core_budgets:
        summary["core_budgets"] = budget_summary(report.plan, cost_table)
    if len(graphs) > 1:
        summary["graphs"] = [graph_figures(i, r, i == largest) for i, r in enumerate(reports)]
    return summary


def graph_figures(index: int, report: Any, shown: bool) -> dict[str, Any]:
    """One graph's figures, for a model Dynamo split into several."""
    plan = report.plan
    out: dict[str, Any] = {"graph": index + 1, "graph_nodes": report.graph_nodes,
                           "applied": report.applied, "reason": report.reason, "shown": shown}
    if plan is not None:
        out.update(nodes=plan.op_graph.number_of_nodes(), streams_used=plan.schedule.streams_used,
                   predicted_us=plan.predicted_us, single_stream_us=plan.single_stream_us)
    return out


def budget_summary(plan: Any, cost_table: str | None) -> dict[str, Any]:
    """The side-stream core budgets of ``plan`` and the ``limit_core_num`` scope keys each
    side stream's scope gets."""
    from autostream.planning.plan import load_cost_model
    from autostream.scheduling.core_budgets import scope_keys

    cores = getattr(getattr(load_cost_model(cost_table), "profile", None), "cores", {})
    return {"budgets": {str(k): v for k, v in plan.core_budgets.items()},
            "scope_keys": {str(k): scope_keys(v, cores) for k, v in plan.core_budgets.items()}}


#: where the plan a solver returned came from, when not from its own search
_SOURCE_WORDS = {
    "single": "the plan is one stream: no multi-stream plan it found is predicted faster",
    "heft": "the plan is HEFT's, its warm start: the search found none faster",
    "overlap": "the plan is the overlap heuristic's: the search found none faster",
    "cpsat_x1.5": "the plan is from its CP-SAT model of the device at 1.5x its capacity "
                  "(shares may oversubscribe it; the simulator picked it)",
    "cpsat_relaxed": "the plan is from its CP-SAT model without device shares (the "
                     "simulator picked it)",
}


def status_words(s: dict[str, Any]) -> str:
    """What the solver's status and the plan's origin mean, in words.

    >>> status_words({"solver": "cpsat", "optimal": False, "solver_stats": {"source": "heft"}})
    "feasible, not proven optimal within its time budget; the plan is HEFT's, its warm start: the search found none faster"
    >>> status_words({"solver": "heft", "optimal": False})
    'a heuristic: no optimality proof'
    """
    if s["optimal"]:
        words = "proven optimal"
    elif meets_bound(s):
        words = "optimal: the makespan meets the lower bound"
    elif s["solver"] == "cpsat":
        words = "feasible, not proven optimal within its time budget"
    elif s["solver"] == "single":
        words = "one stream in program order (no search)"
    else:
        words = "a heuristic: no optimality proof"
    source = s.get("solver_stats", {}).get("source")
    if source and source != s["solver"]:
        words += "; " + _SOURCE_WORDS.get(
            source, f"the plan is the {source} baseline's (of its portfolio): the search "
                    f"found none faster")
    return words


def meets_bound(s: dict[str, Any]) -> bool:
    """Whether the plan's makespan is its lower bound: optimal, whatever the solver proved.

    >>> meets_bound({"makespan_us": 5.0, "lower_bound_us": 5.0}), meets_bound({"makespan_us": 5.0})
    (True, False)
    """
    bound = s.get("lower_bound_us") or 0.0
    return bound > 0 and s["makespan_us"] <= bound * (1 + 1e-9)


def gap_words(makespan: float, bound: float) -> str:
    """The gap to the lower bound, never ``0.00%`` unless it is none.

    >>> gap_words(5.0, 5.0), gap_words(100.001, 100.0), gap_words(6.0, 5.0)
    ('0.00%', 'under 0.01%', '20.00%')
    """
    gap = 100 * (makespan / bound - 1)
    if gap <= 1e-7:
        return "0.00%"
    return "under 0.01%" if gap < 0.005 else f"{gap:.2f}%"


def describe(spec: str, s: dict[str, Any]) -> str:
    """The human summary."""
    lines = [
        f"plan {spec}: {s['solver']}: {status_words(s)}",
        f"  ops                {s['nodes']}",
        f"  streams used       {s['streams_used']}",
        f"  makespan           {s['makespan_us']:.2f} us",
        f"  lower bound        {s['lower_bound_us']:.2f} us"
        + (f"  (gap {gap_words(s['makespan_us'], s['lower_bound_us'])})"
           if s["lower_bound_us"] > 0 else ""),
        f"  single stream      {s['single_stream_us']:.2f} us"
        + (f"  (predicted speed-up {s['single_stream_us'] / _predicted(s):.2f}x"
           f"{' on the ' + s['runtime'] + ' runtime' if s.get('runtime') else ''})"
           if _predicted(s) > 0 else ""),
        f"  syncs              {s['num_syncs']}",
        *([f"  with runtime costs {s['predicted_us']:.2f} us  (the makespan and the multi-stream "
           f"runtime's host costs, as compare's column)"]
          if s.get("predicted_us") and s["streams_used"] > 1 else []),
        f"  cost table         {s.get('cost_table', 'unknown')}",
        *([f"  runtime            {s['runtime']} (the predictions are for it)"]
          if s.get("runtime") else []),
        *([f"  cost sources       {s['cost_sources']}"] if "cost_sources" in s else []),
        *_memory_lines(s),
        f"  planning time      {s['plan_seconds']:.2f} s",
    ]
    if "pass_seconds" in s:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in s["stage_seconds"].items() if v)
        lines.append(f"  pass time          {s['pass_seconds']:.2f} s ({stages})")
    if "core_budgets" in s:
        b = s["core_budgets"]
        chosen = ", ".join(f"stream {k}: {v:g} of the chip ({keys})" for (k, v), keys in
                           zip(b["budgets"].items(), b["scope_keys"].values(), strict=True))
        lines.append(f"  core budgets       {chosen or 'none predicted faster: none emitted'}")
    lines += [f"note: {n}" for n in s.get("notes", [])]
    return "\n".join([*lines, *_graph_lines(s.get("graphs", []))])


def _graph_lines(graphs: list[dict[str, Any]]) -> list[str]:
    """Every graph of a model Dynamo split, one line each (the figures above: the largest).

    >>> print("\\n".join(_graph_lines([
    ...     {"graph": 1, "graph_nodes": 9, "shown": True, "applied": True, "nodes": 5,
    ...      "streams_used": 2, "predicted_us": 8.0, "single_stream_us": 10.0, "reason": ""},
    ...     {"graph": 2, "graph_nodes": 4, "shown": False, "applied": False,
    ...      "reason": "left unchanged: one op"}])))
      graphs             2: Dynamo split the model at graph breaks; each is planned as torch.compile plans it
        graph 1          5 ops, 2 streams, 8.00 us (one stream 10.00 us): the figures above
        graph 2          4 nodes: left unchanged: one op
    """
    if not graphs:
        return []
    lines = [f"  graphs             {len(graphs)}: Dynamo split the model at graph breaks; each "
             f"is planned as torch.compile plans it"]
    for g in graphs:
        head = f"    graph {g['graph']:<10}"
        if "nodes" not in g or not (g["applied"] or g["shown"]):
            lines.append(f"{head} {g['graph_nodes']} nodes: {g['reason']}")
            continue
        streams = g["streams_used"]
        lines.append(f"{head} {g['nodes']} ops, {streams} stream{'s' * (streams != 1)}, "
                     f"{g['predicted_us']:.2f} us (one stream {g['single_stream_us']:.2f} us)"
                     + (": the figures above" if g["shown"] else ""))
    return lines


def _predicted(s: dict[str, Any]) -> float:
    """The plan's predicted time with its runtime's costs (an STG plan: its makespan)."""
    return s.get("predicted_us") or s["makespan_us"]


def _memory_lines(s: dict[str, Any]) -> list[str]:
    if "peak_bytes" not in s:
        return []
    single = s["single_stream_peak_bytes"]
    rise = f"  ({100 * (s['peak_bytes'] / single - 1):+.1f}% over one stream" if single else "  ("
    limit = s.get("memory_limit_bytes")
    budget = f", budget {format_bytes(limit)})" if limit is not None else ", no budget)"
    lines = [f"  peak memory        {format_bytes(s['peak_bytes'])}{rise}{budget}"]
    bound = s.get("peak_bound_bytes", s["peak_bytes"])
    if bound > s["peak_bytes"]:
        lines.append(f"  at most            {format_bytes(bound)} (any interleaving the syncs allow)")
    return [*lines, f"  one stream's peak  {format_bytes(single)}"]


def run(args: argparse.Namespace) -> int:
    summary = plan_spec(args.spec, args.streams, args.solver, args.cost_table, args.time_limit,
                        args.max_memory_increase, args.core_budgets, args.runtime)
    print(describe(args.spec, summary))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0
