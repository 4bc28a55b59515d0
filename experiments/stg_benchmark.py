"""STG benchmark: ``cpsat`` and ``heft`` against the proven optima of the Standard Task Graph Set.

Every instance of the chosen sets (50 and 100 tasks, 180 each) on 2, 4, 8 and 16
streams, zero sync latency, no contention, task times as microseconds.  Prints,
per set and stream count: mean and max gap to the optimum, how many reached it,
and the median and max planning time per instance.  ``optimal.csv`` leaves some
instances open (a lower bound and the best known makespan): there the gap is to
the best known makespan, and "open closed" counts the ones ``cpsat`` proves
optimal.  "reproducible": cases whose search stopped on CP-SAT's deterministic clock
(or proved optimality) rather than on the wall-clock cap, so the same run gives the
same plan.

    python -m experiments.stg_benchmark                        # all 1,440 cases (long)
    python -m experiments.stg_benchmark --limit 10             # first 10 graphs of each set
    python -m experiments.stg_benchmark --sets 50 --streams 4 --time-limit 2 --csv out.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

from autostream.models.stg import benchmark_missing, read_optimal_csv, read_stg
from autostream.scheduling.solvers import solve
from experiments.headline import Headline, record

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "stg"


def run(root: Path, sets: list[str], streams: list[int], solvers: list[str], limit: int | None,
        time_limit: float, out_csv: Path | None) -> list[dict]:
    optimum = read_optimal_csv(root / "optimal.csv")
    rows: list[dict] = []
    for graph_set in sets:
        files = sorted((root / graph_set).glob("*.stg"))[:limit]
        for f in files:
            key = f"{graph_set}/{f.name}"
            for k in streams:
                problem = read_stg(f, streams=k)
                for name in solvers:
                    # a planning time is a solve's: never a hit of the persistent plan cache
                    options = {"time_limit": time_limit, "cache": False} if name == "cpsat" else {}
                    t0 = time.perf_counter()
                    s = solve(problem, name, **options)
                    seconds = time.perf_counter() - t0
                    best = optimum[(key, k)]
                    rows.append(dict(set=graph_set, graph=f.name, streams=k, solver=name,
                                     makespan=s.makespan, lower=best.lower, best=best.upper,
                                     known=best.proven, gap=s.makespan / best.upper - 1.0,
                                     seconds=seconds, proven=bool(s.optimal),
                                     deterministic=getattr(s.stats, "deterministic", True)))
            print(f"  {key} done", file=sys.stderr, flush=True)
    if out_csv:
        with out_csv.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


def summarise(rows: list[dict]) -> str:
    """Per set, stream count and solver.  The gap is to the proven optimum, or to the
    best known makespan where ``optimal.csv`` only has bounds (open instances)."""
    lines = ["| set | streams | solver | cases (open) | mean gap | max gap | reached best | "
             "proven opt | open closed | reproducible | median s | max s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["set"], r["streams"], r["solver"]) for r in rows},
                  key=lambda k: (int(k[0]), k[1], k[2]))
    for graph_set, k, name in keys:
        sel = [r for r in rows if (r["set"], r["streams"], r["solver"]) == (graph_set, k, name)]
        gaps = [r["gap"] for r in sel]
        secs = [r["seconds"] for r in sel]
        reached = sum(1 for g in gaps if g <= 1e-9)
        proven = sum(1 for r in sel if r["proven"])
        opened = [r for r in sel if not r["known"]]
        closed = sum(1 for r in opened if r["proven"])
        reproducible = sum(1 for r in sel if r["deterministic"])
        wrong = [r for r in sel if r["proven"] and not r["lower"] - 1e-9 <= r["makespan"]]
        if wrong:
            raise AssertionError(f"{name} claims optima below the known lower bound: {wrong[:3]}")
        lines.append(
            f"| {graph_set} | {k} | {name} | {len(sel)} ({len(opened)}) | "
            f"{100 * statistics.mean(gaps):.2f}% | {100 * max(gaps):.2f}% | {reached}/{len(sel)} | "
            f"{proven} | {closed}/{len(opened)} | {reproducible}/{len(sel)} | "
            f"{statistics.median(secs):.2f} | {max(secs):.2f} |"
        )
    return "\n".join(lines)


def headlines(rows: list[dict], solver: str = "cpsat") -> list[Headline]:
    """Per set and stream count: the mean gap to the best known makespan (target 0) and
    how many instances reach it; then the planning time per instance over all of them."""
    mine = [r for r in rows if r["solver"] == solver]
    out = []
    for graph_set, k in sorted({(r["set"], r["streams"]) for r in mine},
                               key=lambda key: (int(key[0]), key[1])):
        sel = [r for r in mine if (r["set"], r["streams"]) == (graph_set, k)]
        gap = statistics.mean(r["gap"] for r in sel)
        reached = sum(r["gap"] <= 1e-9 for r in sel)
        out.append(Headline(
            f"STG {graph_set} tasks, {k} streams: {solver} mean gap to the best known "
            "(instances at it)", f"{100 * gap:.2f}% ({reached}/{len(sel)})", "0.00% (all)",
            reached == len(sel)))
    if mine:
        secs = [r["seconds"] for r in mine]
        median, worst = statistics.median(secs), max(secs)
        out.append(Headline(f"STG: {solver} planning time per instance, median / max "
                            f"({len(mine)} instances)", f"{median:.2f} s / {worst:.2f} s",
                            "<= 1 s / <= 5 s", median <= 1.0 and worst <= 5.0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="benchmark directory")
    ap.add_argument("--sets", nargs="+", default=["50", "100"], help="graph sets (default both)")
    ap.add_argument("--streams", nargs="+", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--solvers", nargs="+", default=["cpsat", "heft"])
    ap.add_argument("--limit", type=int, default=None, help="first N graphs of each set only")
    ap.add_argument("--time-limit", type=float, default=5.0, help="cpsat time limit per case (s)")
    ap.add_argument("--csv", type=Path, default=None, help="write every case to this CSV")
    args = ap.parse_args(argv)
    if not (args.root / "optimal.csv").is_file():
        print(benchmark_missing(args.root), file=sys.stderr)
        return 2
    rows = run(args.root, args.sets, args.streams, args.solvers, args.limit, args.time_limit,
               args.csv)
    print(summarise(rows))
    record(__file__, headlines(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
