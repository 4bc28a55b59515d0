"""Solver comparison over the model zoo: predicted speed-up, gap and syncs of every solver.

Every zoo model (and a few random DAG models), and every ``autostream.models.hf_zoo``
model at two layers when ``transformers`` is installed, is captured once, costed
with the default cost model (``--cost-table`` another), and planned by every
solver on ``--streams`` streams.  A line under the tables counts the models where
cpsat is slower than a baseline (never, by construction) and faster than HEFT.  Prints
markdown tables (models x solvers) and writes figures into ``experiments/figures/``:
``solver_speedups.png`` (grouped bars) and ``gantt_<model>.png`` (the best plan of
each model that uses several streams, with syncs, makespan and lower bound), and the
graph dump of the article's model (``graph_article.dot``, ``.svg`` with Graphviz).

    python -m experiments.compare_solvers            # ~1-2 min on 2 cores
    python -m experiments.compare_solvers --quick    # cpsat 1 s, one random DAG
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autostream.models import hf_zoo, zoo
from autostream.report.compare import plan_solvers
from autostream.report.dot import write_graph
from autostream.report.gantt import gantt_png
from autostream.report.sources import problem_from_model
from autostream.report.table import SolverResult, fmt_pct
from autostream.scheduling.solvers import SOLVERS
from experiments.headline import Headline, record

FIGURES = Path(__file__).resolve().parent / "figures"
ORDER = ("single", "round_robin", "tf_greedy", "opara", "critical_path", "nimble", "heft",
         "cpsat")


def models(quick: bool) -> dict[str, tuple]:
    """name -> (model, example_inputs) of every model compared."""
    out = {name: fn() for name, fn in zoo.ZOO.items()}
    for seed in range(1 if quick else 3):
        out[f"random_dag_{seed}"] = zoo.random_dag_model(seed, ops=24)
    for name in hf_zoo.available()[:2 if quick else None]:
        out[f"hf_{name}"] = hf_zoo.HF_ZOO[name](layers=2)
    return out


@dataclass(frozen=True)
class Versus:
    """cpsat against the baselines over the models it planned."""

    models: int
    slower: tuple[str, ...]  # models where some baseline's plan is faster than cpsat's
    faster_than_heft: int

    def __str__(self) -> str:
        which = f" ({', '.join(self.slower)})" if self.slower else ""
        return (f"cpsat is slower than a baseline on {len(self.slower)} of {self.models} models"
                f"{which}, strictly faster than HEFT on {self.faster_than_heft} of "
                f"{self.models}.")

    def headlines(self) -> list[Headline]:
        n = self.models
        return [Headline(f"solver comparison ({n} models): models where cpsat is slower than "
                         "a baseline", f"{len(self.slower)} of {n}", "0", not self.slower),
                Headline(f"solver comparison ({n} models): cpsat strictly faster than HEFT",
                         f"{self.faster_than_heft} of {n}", ">= half",
                         2 * self.faster_than_heft >= n > 0)]


def cpsat_versus_baselines(rows: dict[str, list[SolverResult]]) -> Versus:
    """How often cpsat is slower than some baseline, and faster than HEFT."""
    slower, faster, total = [], 0, 0
    for model, results in rows.items():
        by = {r.solver: r.schedule.makespan for r in results if r.ok}
        if "cpsat" not in by:
            continue
        total += 1
        if any(by["cpsat"] > m + 1e-6 for s, m in by.items() if s != "cpsat"):
            slower.append(model)
        faster += "heft" in by and by["cpsat"] < by["heft"] - 1e-6
    return Versus(total, tuple(slower), faster)


def matrix(title: str, rows: dict[str, list[SolverResult]], solvers: list[str], cell) -> str:
    """A markdown table: one row per model, one column per solver."""
    lines = [f"**{title}**", "", "| model | " + " | ".join(solvers) + " |",
             "|---|" + "---:|" * len(solvers)]
    for model, results in rows.items():
        by = {r.solver: r for r in results}
        cells = [cell(by[s], by) if s in by and by[s].ok else "-" for s in solvers]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speedup_figure(path: Path, rows: dict[str, list[SolverResult]], solvers: list[str]) -> Path:
    """Grouped bars: predicted speed-up over one stream, per model and solver."""
    from matplotlib.figure import Figure

    from autostream.report.kinds import PALETTE

    fig = Figure(figsize=(12, 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(solvers)
    for j, s in enumerate(solvers):
        xs, ys = [], []
        for i, results in enumerate(rows.values()):
            by = {r.solver: r for r in results}
            if s in by and by[s].ok and "single" in by and by["single"].ok:
                xs.append(i + (j - (len(solvers) - 1) / 2) * width)
                ys.append(by["single"].schedule.makespan / by[s].schedule.makespan)
        ax.bar(xs, ys, width, label=s, color=PALETTE[j % len(PALETTE)])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(list(rows), rotation=15, fontsize=8)
    ax.set_ylabel("predicted speed-up over one stream")
    ax.legend(ncol=4, fontsize=7, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="cpsat 1 s, one random DAG")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=None,
                    help="cpsat budget in seconds (default 5, 1 with --quick)")
    ap.add_argument("--solvers", default=",".join(s for s in ORDER if s in SOLVERS))
    ap.add_argument("--figures", type=Path, default=FIGURES)
    ap.add_argument("--cost-table", default=None, help="cost table (default: the default model)")
    args = ap.parse_args(argv)
    time_limit = args.time_limit or (1.0 if args.quick else 5.0)
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    t0 = time.perf_counter()
    rows: dict[str, list[SolverResult]] = {}
    problems = {}
    for name, (model, inputs) in models(args.quick).items():
        source = problem_from_model(model, inputs, args.streams, cost_table=args.cost_table,
                                    time_limit=time_limit, title=name)
        problems[name] = source.problem
        rows[name] = plan_solvers(source.problem, solvers, time_limit=time_limit)
        print(f"planned {name}: {source.problem.graph.number_of_nodes()} ops", file=sys.stderr)

    def speedup(r: SolverResult, by: dict) -> str:
        base = by["single"].schedule.makespan if "single" in by and by["single"].ok else None
        star = "*" if r.schedule.optimal else ""
        return f"{base / r.schedule.makespan:.2f}x{star}" if base else "-"

    table = f"the {args.cost_table} cost table" if args.cost_table else "the default cost model"
    print(f"Predicted by {table}, up to {args.streams} streams, cpsat budget "
          f"{time_limit:g} s. Speed-up is over the single-stream plan; * = proven optimal.\n")
    print(matrix("Predicted speed-up over one stream", rows, solvers, speedup))
    print()
    print(matrix("Gap to the lower bound", rows, solvers,
                 lambda r, by: fmt_pct(r.schedule.gap)))
    print()
    print(matrix("Syncs (record/wait pairs) / streams used", rows, solvers,
                 lambda r, by: f"{len(r.syncs)} / {r.schedule.streams_used}"))
    print()
    comparison = cpsat_versus_baselines(rows)
    print(f"{comparison}\n")
    failed = [(m, r.solver, r.error) for m, rs in rows.items() for r in rs if not r.ok]
    for m, s, err in failed:
        print(f"- {m}: {s} failed: {err}")
    figure = speedup_figure(args.figures / "solver_speedups.png", rows, solvers)
    print(f"![predicted speed-up per model and solver](figures/{figure.name})\n")
    for name, results in rows.items():
        ok = [r for r in results if r.ok]
        if not ok:
            continue
        # Draw the best plan that uses several streams (the picture is about overlap);
        # its title compares it with one stream.
        multi = [r for r in ok if r.schedule.streams_used > 1] or ok
        best = min(multi, key=lambda r: (r.schedule.makespan, ORDER.index(r.solver)
                                         if r.solver in ORDER else 99))
        single = next((r.schedule.makespan for r in ok if r.solver == "single"), None)
        versus = f" vs {single:,.1f} us on one stream" if single else ""
        syncs = list(best.syncs)
        path = gantt_png(args.figures / f"gantt_{name}.png", problems[name], best.schedule, syncs,
                         title=f"{name}: best multi-stream plan ({best.solver}), "
                               f"{best.schedule.makespan:,.1f} us on "
                               f"{best.schedule.streams_used} streams{versus}, "
                               f"{len(syncs)} sync(s)")
        print(f"![{name}, {best.solver}](figures/{path.name})")
        if name == "article":  # the seed article's example: its graph dump, like TorchAir's
            dumped = write_graph(args.figures / "graph_article.dot", problems[name],
                                 best.schedule, syncs)
            shown = dumped[-1].name
            print(f"\nThe article's model, planned by {best.solver} (dashed: record/wait): "
                  + (f"![graph dump](figures/{shown})" if shown.endswith(".svg")
                     else f"[figures/{shown}](figures/{shown}) (install Graphviz for the SVG)")
                  + "\n")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    record(__file__, comparison.headlines())
    return 1 if len(failed) == sum(len(r) for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
