"""``autostream compare SPEC``: plan one model or STG graph with several solvers, side by side.

Writes ``table.md`` and, per solver, a Gantt chart, a Perfetto trace and a graph dump
into ``--out``, and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autostream.planning.defaults import DEFAULT_MAX_STREAMS

DEFAULT_SOLVERS = "single,round_robin,tf_greedy,opara,critical_path,nimble,heft,cpsat"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare",
        help="compare solvers on one model or .stg graph (table, Gantt, traces, graph dumps)",
        description="Plan SPEC with every solver in --solvers and write a comparison table, "
        "one Gantt chart, Perfetto trace and graph dump per solver into --out. SPEC is "
        "module.path:function or path/to/file.py:function returning (model, example_inputs), "
        "or a Standard Task Graph .stg file.",
    )
    p.add_argument("spec", metavar="SPEC", help="module:function, file.py:function, or file.stg")
    p.add_argument("--solvers", default=DEFAULT_SOLVERS,
                   help=f"comma-separated solver names (default: {DEFAULT_SOLVERS})")
    p.add_argument("--streams", type=int, default=DEFAULT_MAX_STREAMS,
                   help=f"maximum number of streams (default {DEFAULT_MAX_STREAMS}, as "
                        f"torch.compile(backend='autostream') plans)")
    p.add_argument("--out", default="autostream-compare", help="output folder")
    p.add_argument("--cost-table", default=None, help="cost table name or path (models only)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for solvers that search (cpsat); default: by the graph's size, "
                        "as plan")
    p.add_argument("--launch-overhead", type=float, default=0.0,
                   help="also replay every plan with this host launch cost per op, in us")
    p.add_argument("--sync-latency", type=float, default=None,
                   help="sync latency in us for .stg graphs (default: the file's, 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autostream.report.compare import parse_solvers, plan_solvers, write_reports
    from autostream.report.sources import problem_from_spec

    if args.streams < 1:
        raise ValueError(f"--streams must be >= 1, got {args.streams}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise ValueError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    solvers = parse_solvers(args.solvers)
    source = problem_from_spec(args.spec, args.streams, cost_table=args.cost_table,
                               time_limit=args.time_limit, sync_latency_us=args.sync_latency)
    if args.launch_overhead < 0:
        raise ValueError(f"--launch-overhead must be >= 0 us, got {args.launch_overhead}")
    results = plan_solvers(source.problem, solvers, time_limit=args.time_limit,
                           launch_overhead_us=args.launch_overhead, memory=source.memory,
                           split_problem=source.split_problem, runtime=source.runtime,
                           progress=lambda name: print(f"planning with {name} ...",
                                                       file=sys.stderr, flush=True))
    files = write_reports(args.out, source.problem, results, title=source.title,
                          table=source.table, split_problem=source.split_problem)
    print(files.table.read_text(), end="")
    for note in source.notes:
        print(f"note: {note}")
    failed = [r.solver for r in results if not r.ok]
    if failed:
        print(f"warning: no plan from {', '.join(failed)} (see the table)")
    from autostream.report.dot import rendering

    print(f"wrote {len(files.all())} files to {Path(args.out)}/ (table.md, *_gantt.png, "
          f"*_trace.json for ui.perfetto.dev, {rendering()})")
    return 0 if any(r.ok for r in results) else 1
