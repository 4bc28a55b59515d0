"""What the CUDA experiments measured on a real GPU: the runs kept in ``experiments/cuda_runs/``.

No GPU is reachable from this machine or from CI; when one is lent, the CUDA experiments run
there and their JSON outputs are kept, one folder per run (``<device>-<date>``), with the
command that made them in its ``README.md``.  This script prints every kept run as tables
and records their headline rows, so RESULTS.md shows measured GPU figures by the same
method as the scripts that took them:

- ``inductor_streams.json`` (``python -m experiments.inductor_streams --out DIR``): eager,
  single-stream Inductor and ``backend="autostream"`` (its streams runtime, or Inductor
  with the pass where that Inductor has streams), median over 50 calls;
- ``speedup_cuda.json`` (``python -m experiments.speedup --device cuda --cost-table h200
  --no-inductor --json FILE``): the zoo's measured against predicted speed-up;
- ``cuda_graphs.json`` (``python -m experiments.cuda_graphs --out DIR``): captured graphs,
  autostream's against the one-stream graph, with eager and reduce-overhead beside them;
  its headline rows are the experiment's own (``experiments.cuda_graphs.headlines``).

    python -m experiments.cuda_runs
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RUNS = Path(__file__).resolve().parent / "cuda_runs"


def kept_runs(root: Path = RUNS) -> list[Path]:
    """The run folders, oldest first."""
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def inductor_table(data: dict[str, Any]) -> list[str]:
    missing = ", ".join(data.get("missing") or []) or "none"
    lines = [f"`experiments.inductor_streams`, torch {data['torch']} (multi-stream Inductor "
             f"missing: {missing}); median us per call over 50 calls, max abs error vs eager "
             f"over 20 calls (bf16)", "",
             "| model | eager | Inductor | autostream | autostream err | autostream over "
             "Inductor |", "|---|---|---|---|---|---|"]
    for row in data["rows"]:
        ours = row.get("autostream_backend_us") or row.get("inductor_pass_us")
        err = row.get("autostream_backend_err", row.get("inductor_pass_err"))
        lines.append(f"| {row['model']} | {row['eager_us']:.1f} | {row['inductor_us']:.1f} | "
                     f"{ours:.1f} | {err:g} | {row['inductor_us'] / ours:.2f}x |")
    return lines


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == value  # NaN: no prediction


def speedup_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["`experiments.speedup --device cuda --cost-table h200 --no-inductor`: median ms "
             "per call; plan x = best single-stream variant over the multi-stream plan on the "
             "streams runtime; kept = what the backend's measured choice kept", "",
             "| model | streams | eager | as-seq | plan | predicted | plan x | kept |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        predicted = f"{r['predicted']:.2f}x" if _number(r.get("predicted")) else "n/a"
        lines.append(f"| {r['model']} | {r['streams']} | {r['eager_ms']:.3f} | "
                     f"{r['as_seq_ms']:.3f} | {r['plan_ms']:.3f} | {predicted} | "
                     f"{r['plan_measured']:.2f}x | {r.get('kept') or '-'} |")
    return lines


def graphs_table(data: dict[str, Any]) -> list[str]:
    """``cuda_graphs.json`` as a table: microseconds per call, and the ratios."""
    def us(v: Any) -> str:
        return f"{v:,.1f}" if _number(v) else "-"

    lines = [f"`experiments.cuda_graphs`, torch {data['torch']}, table {data['table']}: "
             f"{data['method']}; measured = one-stream graph over autostream's graph (the "
             f"rounds' range); auto = the measured choice's backend", "",
             "| model | batch | eager | reduce-overhead | one-stream graph | autostream graph | "
             "predicted | measured | error | kept | auto | bitwise |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        rounds = r.get("measured_rounds") or [r["measured"]]
        error = f"{100 * r['error']:+.0f}%" if _number(r.get("error")) else "-"
        predicted = f"{r['predicted']:.2f}x" if _number(r.get("predicted")) else "-"
        lines.append(f"| {r['model']} | {r['batch']} | {us(r['eager_us'])} | "
                     f"{us(r['inductor_ro_us'])} | {us(r['graph1_us'])} | "
                     f"{us(r['autostream_us'])} | {predicted} | {r['measured']:.2f}x "
                     f"({min(rounds):.2f}-{max(rounds):.2f}) | {error} | {r['kept']} | "
                     f"{us(r.get('auto_us'))} | {'yes' if r['bitwise'] else 'no'} |")
    return lines


def machine_of(run: Path) -> str:
    """The lent machine a kept run was measured on: its README's first clause."""
    readme = run / "README.md"
    text = readme.read_text().strip() if readme.exists() else ""
    first = re.split(r"[.,]\s", text, maxsplit=1)[0].replace("\n", " ").strip()
    return f"lent: {first}" if first else f"lent machine of {run.name}"


def main() -> None:
    from experiments.headline import Headline, record

    headlines = []
    runs = kept_runs()
    if not runs:
        print("No GPU run is kept in experiments/cuda_runs/.")
    for run in runs:
        print(f"### {run.name}\n")
        readme = run / "README.md"
        if readme.exists():
            print(readme.read_text().strip() + "\n")
        inductor = run / "inductor_streams.json"
        if inductor.exists():
            data = json.loads(inductor.read_text())
            print("\n".join(inductor_table(data)) + "\n")
        speedup = run / "speedup_cuda.json"
        if speedup.exists():
            rows = json.loads(speedup.read_text())
            print("\n".join(speedup_table(rows)) + "\n")
            planned = [r for r in rows if r["streams"] > 1 and _number(r.get("predicted"))]
            best = max(planned, key=lambda r: r["plan_measured"])
            worst = min(planned, key=lambda r: r["plan_measured"])
            headlines.append(Headline(
                f"{run.name}: multi-stream plans on the CUDA streams runtime, measured "
                f"speed-up over eager ({len(planned)} zoo models)",
                f"{worst['plan_measured']:.2f}x ({worst['model']}) to "
                f"{best['plan_measured']:.2f}x ({best['model']})", ">= 1x",
                worst["plan_measured"] >= 1.0, machine=machine_of(run)))
            kept = sum((r.get("kept") or "") == "eager" for r in planned)
            headlines.append(Headline(f"{run.name}: the measured choice kept eager",
                                      f"{kept} of {len(planned)} models", "-", None,
                                      machine=machine_of(run)))
        graphs = run / "cuda_graphs.json"
        if graphs.exists():
            from experiments.cuda_graphs import Row
            from experiments.cuda_graphs import headlines as graph_headlines

            data = json.loads(graphs.read_text())
            print("\n".join(graphs_table(data)) + "\n")
            rows = [Row(**r) for r in data["rows"]]
            headlines += [Headline(f"{run.name}: {h.what}", h.measured, h.target, h.met,
                                   machine=h.machine)
                          for h in graph_headlines(rows, f"{machine_of(run)}, torch "
                                                         f"{data['torch']}",
                                                   data.get("calibration_s"),
                                                   data.get("total_s"))]
    record(__file__, headlines)


if __name__ == "__main__":
    main()
