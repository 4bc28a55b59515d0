"""Rerun every experiment; regenerate ``experiments/RESULTS.md`` and the README's results table.

Each experiment script runs as its own subprocess, ``python -m experiments.<name>``
(``--quick`` is passed through to the scripts that accept it, smaller run counts to
the others); its standard output becomes one section of ``RESULTS.md``: kept as
markdown when it prints markdown tables, fenced as text otherwise.  Each script also
records its headline rows (``experiments.headline``) in ``experiments/headlines/``;
all of them make one table at the top of ``RESULTS.md``, and a summary (per
experiment: its targets met and its first row) goes between the markers
``<!-- results:begin -->`` and ``<!-- results:end -->`` of ``README.md`` (when both
are there).  Every row names the machine it was measured on: the script's own words
(with the load while it timed, or a lent GPU's), else the machine ``run_all`` ran it on.  With ``--only``, the other experiments keep their sections and headline
rows from earlier runs (sections marked "earlier run").  Figures a script writes into
``experiments/figures/`` during its run and does not link itself are linked under its
section.  A missing script is listed as not run; a failing one gets its error tail,
and ``run_all`` exits 1.

    python -m experiments.run_all            # full runs (the STG benchmark alone takes hours)
    python -m experiments.run_all --quick    # smoke-sized runs
    python -m experiments.run_all --only compare_solvers.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from autostream.runtime.machine import this_machine
from experiments import headline
from experiments.headline import Headline

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIGURES = HERE / "figures"
HEADLINES = HERE / "headlines"
RESULTS = HERE / "RESULTS.md"
#: the README's results table lies between these lines
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


@dataclass(frozen=True)
class Experiment:
    script: str
    title: str
    about: str
    #: used with ``--quick`` when the script has no ``--quick`` option of its own
    quick_args: tuple[str, ...] = ()
    #: used for full runs
    full_args: tuple[str, ...] = ()


EXPERIMENTS = (
    Experiment("compare_solvers.py", "Solver comparison over the model zoo",
               "Predicted makespan of every solver on every zoo model (default cost model)."),
    Experiment("stg_benchmark.py", "STG benchmark",
               "Solvers against the published optimal makespans of the Standard Task Graph Set.",
               ("--limit", "5", "--streams", "2", "4", "--time-limit", "1")),
    Experiment("scale_benchmark.py", "Scale benchmark",
               "cpsat planning time and gap on synthetic decoder graphs of growing depth, "
               "without and with collectives (tensor- and expert-parallel).",
               ("--layers", "4", "--time-limit", "1"), ("--layers", "4", "8", "16", "32", "128")),
    Experiment("zoo_benchmark.py", "Zoo benchmark: the pass on transformers models",
               "Pass time, recompile from the plan cache, gap to the bound and HEFT on every "
               "hf_zoo model at 32 layers, ascend910b and h200 tables, 2 and 4 streams; "
               "planning time of the small zoo graphs.",
               ("--layers", "2", "--models", "llama", "bert")),
    Experiment("cost_accuracy.py", "Cost-model accuracy",
               "Estimated versus measured op and graph times on this machine.",
               ("--repeat", "5")),
    Experiment("profile_calibration.py", "Costs from profiles",
               "A table read from a torch.profiler trace of each zoo model beside the "
               "micro-benchmark table, both against measured graphs; how many graph ops "
               "profiles of zoo and transformers models cover."),
    Experiment("core_budgets.py", "Core budgets per stream (predicted)",
               "Predicted makespan with and without side-stream core budgets on the "
               "ascend910b table, zoo MoE and transformers MoE models at 2 and 4 streams; no "
               "device."),
    Experiment("speedup.py", "Measured speed-up",
               "Single stream versus autostream, measured, next to the predicted speed-up.",
               ("--runs", "20", "--warmup", "3")),
    Experiment("correctness.py", "Correctness sweep",
               "Every zoo and transformers model x solver x runtime x mode (no_grad, "
               "inference_mode, autocast bf16, training step) compiled with forced "
               "multi-stream plans, against eager: mismatches (the target is 0), applied and "
               "lifted plans."),
    Experiment("distributed.py", "Distributed graphs",
               "Two ranks on gloo: eager, compiled single-stream, autostream (as planned, and "
               "as the backend chooses) and the hand-written overlap of collectives, side by "
               "side, with the prediction."),
    Experiment("distributed_patterns.py", "Distributed patterns",
               "Valid SPMD patterns (a one-rank recompile, different call counts per graph, "
               "rank-dependent shapes, sub-groups, a slow rank, a rank that dies) on 2 and 4 "
               "gloo ranks: hangs, calls that differ from eager, time to an error after a "
               "death."),
    Experiment("overlap.py", "Overlap ceiling and segments",
               "What two CPU streams can gain at most per model (two copies of its graph), and "
               "plans run with ops through the interpreter loop, as generated segment functions "
               "(the runtime's default) and as the former TorchScript traces, in one run.",
               ("--runs", "5", "--warmup", "1")),
    Experiment("deterministic.py", "Bitwise equal to eager: what deterministic=True costs",
               "The threads runtime with and without deterministic=True (every op with "
               "eager's intra-op thread count) on the speed-up experiment's models: time and "
               "whether outputs equal eager's bit for bit.",
               ("--runs", "5", "--warmup", "1")),
    Experiment("torchair_conformance.py", "TorchAir 2.14 conformance",
               "Models compiled through TorchAir 2.14's own backends (get_npu_backend, "
               "npugraph_ex; natives stubbed), forward and backward, input mutations kept, "
               "static and dynamic=True: what the final program leaves uncovered (the target "
               "is 0), what was checked, results against the model compiled without the "
               "pass, and the predicted speed-up."),
    Experiment("experts.py", "Meet the experts: hand-placed streams (predicted)",
               "vLLM-Ascend's, vLLM's and SGLang's hand placements in MoE and MLA layers, "
               "rebuilt op by op: races the checker finds, predicted time of one stream, the "
               "expert's placement and autostream's plan per shape and table, autostream's "
               "choice per shape beside the experts' switches, predictions beside the published "
               "gains; no device.", ("--tokens", "1", "32", "4096")),
    Experiment("memory.py", "Peak memory: predicted, measured, budgeted",
               "Predicted against measured peak memory of multi-stream plans (CPU threads "
               "runtime), and what the memory budget keeps of the fan-out model's speed-up."),
    Experiment("cuda_runs.py", "Measured on a lent GPU",
               "The CUDA experiments' outputs kept from lent GPUs (experiments/cuda_runs/): "
               "the streams runtime and Inductor against eager, measured there."),
    Experiment("inductor_streams.py", "Streams inside Inductor",
               "Eager, single-stream Inductor and Inductor with AutoStreamPass(inductor_streams"
               "=True) on a two-branch model, the zoo MoE and a Qwen3-MoE decode step (bf16, "
               "CUDA): errors, median times, stream switches, waits and unsynced touches in "
               "the wrapper, predicted beside measured; without a GPU the CPU wrappers' "
               "structure."),
)


@dataclass(frozen=True)
class Outcome:
    experiment: Experiment
    command: list[str]
    returncode: int | None  # None: script missing
    seconds: float
    stdout: str
    stderr: str
    figures: tuple[str, ...]
    skipped: bool = False  # not selected by --only
    kept: tuple[str, str] | None = None  # (status, section) from the previous RESULTS.md
    #: when the script ran (UTC), this time or the earlier run's ("" where not recorded)
    when: str = ""

    @property
    def status(self) -> str:
        if self.kept is not None:
            return f"{self.kept[0]} (earlier run)"
        if self.skipped:
            return "not run (--only)"
        if self.returncode is None:
            return "not run (missing)"
        return "ok" if self.returncode == 0 else f"failed ({self.returncode})"


def defines_option(path: Path, option: str) -> bool:
    """Whether the script defines ``option`` (read from its source, without importing it)."""
    text = path.read_text()
    return f'"{option}"' in text or f"'{option}'" in text


def quick_arguments(exp: Experiment, path: Path) -> list[str]:
    """``--quick`` when the script has it, else its ``quick_args`` whose options it defines."""
    if defines_option(path, "--quick"):
        return ["--quick"]
    out: list[str] = []
    args = list(exp.quick_args)
    while args:
        option = args.pop(0)
        values = []
        while args and not args[0].startswith("--"):
            values.append(args.pop(0))
        if defines_option(path, option):
            out += [option, *values]
    return out


def run_experiment(exp: Experiment, quick: bool, timeout_s: float) -> Outcome:
    path = HERE / exp.script
    if not path.is_file():
        return Outcome(exp, [], None, 0.0, "", "", ())
    cmd = [sys.executable, "-m", f"experiments.{path.stem}"]
    cmd += quick_arguments(exp, path) if quick else list(exp.full_args)
    env = {**os.environ, headline.ENV: str(HEADLINES), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    FIGURES.mkdir(exist_ok=True)
    headlines_of(exp).unlink(missing_ok=True)  # a failed run leaves no stale rows
    t0, when = time.time(), now()
    print(f"running {' '.join(cmd[1:])} ...", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = f"timed out after {timeout_s:.0f} s"
    seconds = time.time() - t0
    stamp_machine(headlines_of(exp), row_machine())
    fresh = sorted(p.name for p in FIGURES.glob("*.png") if p.stat().st_mtime >= t0 - 1)
    print(f"  {exp.script}: exit {code} in {seconds:.0f} s", file=sys.stderr, flush=True)
    return Outcome(exp, cmd, code, seconds, out, err, tuple(fresh), when=when)


def now() -> str:
    """The time of a run, as every date in ``RESULTS.md`` is written."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def is_markdown(text: str) -> bool:
    """Output with a markdown table separator row is kept as markdown."""
    return re.search(r"^\|?\s*:?-{3,}:?\s*\|", text, flags=re.M) is not None


_MARK = re.compile(r"^<!-- experiment: (\S+) \| (.*?) \| (\d+) s(?: \| ([^|]*?))? -->$", re.M)


def previous_sections(path: Path) -> dict[str, tuple[str, str, int, str]]:
    """script -> (status, section text, seconds, when it ran: "" if not recorded) of an
    earlier ``RESULTS.md``."""
    if not path.is_file():
        return {}
    text = path.read_text()
    marks = list(_MARK.finditer(text))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = text[m.end():end].strip("\n")
        out[m.group(1)] = (m.group(2).removesuffix(" (earlier run)"), body, int(m.group(3)),
                           m.group(4) or "")
    return out


def section(o: Outcome) -> str:
    exp = o.experiment
    mark = (f"<!-- experiment: {exp.script} | {o.status} | {o.seconds:.0f} s"
            + (f" | {o.when}" if o.when else "") + " -->")
    if o.kept is not None:
        return f"{mark}\n{o.kept[1]}\n"
    return f"{mark}\n{_section_body(o)}"


def _section_body(o: Outcome) -> str:
    exp = o.experiment
    lines = [f"## {exp.title}", "", exp.about, ""]
    if o.skipped:
        lines += ["_Not run this time (`--only` selected other experiments)._", ""]
        return "\n".join(lines)
    if o.returncode is None:
        lines += [f"_Not run: `experiments/{exp.script}` does not exist in this checkout._", ""]
        return "\n".join(lines)
    shown = " ".join(["python", *o.command[1:]])
    status = "ok" if o.returncode == 0 else f"**failed (exit {o.returncode})**"
    lines += [f"`{shown}`: {status}, {o.seconds:.0f} s.", ""]
    out = o.stdout.strip()
    if out:
        lines += [out, ""] if is_markdown(out) else ["```text", out, "```", ""]
    if o.returncode != 0:
        tail = "\n".join(o.stderr.strip().splitlines()[-15:])
        lines += ["Error output (last lines):", "", "```text", tail, "```", ""]
    unlinked = [f for f in o.figures if f"figures/{f}" not in out]
    for f in unlinked:
        lines += [f"![{f}](figures/{f})", ""]
    return "\n".join(lines)


def machine() -> str:
    """This machine in words: CPU model, cores, intra-op threads (``runtime.machine``), OS,
    Python, torch, GPU."""
    try:
        import torch

        torch_v = torch.__version__
        accel = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:  # noqa: BLE001 - describing the machine must not fail the run
        torch_v, accel = "unknown", "unknown"
    return (f"{this_machine()}, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, torch {torch_v}, {accel}")


def row_machine() -> str:
    """The machine named beside each row a script records without one."""
    return str(this_machine())


def stamp_machine(path: Path, where: str) -> None:
    """Name ``where`` as the machine of the rows a script recorded in ``path`` without one."""
    if not path.is_file():
        return
    rows = headline.load(path)
    if all(r.machine for r in rows):
        return
    path.write_text(json.dumps([asdict(replace(r, machine=r.machine or where)) for r in rows],
                               indent=2) + "\n")


def headlines_of(exp: Experiment) -> Path:
    return HEADLINES / f"{Path(exp.script).stem}.json"


def headline_groups(outcomes: list[Outcome]) -> list[tuple[Outcome, list[Headline]]]:
    """Each experiment's recorded rows, in order; a row saying so for one that ran and
    recorded none."""
    groups: list[tuple[Outcome, list[Headline]]] = []
    for o in outcomes:
        path = headlines_of(o.experiment)
        if path.is_file():
            groups.append((o, headline.load(path)))
        elif not o.skipped:
            failed = o.returncode not in (0, None)
            groups.append((o, [Headline(f"{o.experiment.title}: no headline rows recorded",
                                        o.status, "-", False if failed else None)]))
    return groups


def headline_rows(outcomes: list[Outcome]) -> list[Headline]:
    """Every experiment's rows in one list (the table atop ``RESULTS.md``)."""
    return [row for _, rows in headline_groups(outcomes) for row in rows]


def headline_runs(outcomes: list[Outcome]) -> list[str]:
    """The run of each of :func:`headline_rows`: when its experiment ran."""
    return [run_of(o) for o, rows in headline_groups(outcomes) for _ in rows]


def run_of(o: Outcome) -> str:
    """When ``o``'s figures were measured, in words."""
    if o.when:
        return o.when
    return "earlier, not dated" if o.skipped else "not run"


def summary_table(outcomes: list[Outcome]) -> str:
    """The README's table: per experiment, its targets met and its first row.

    >>> e = Experiment("x.py", "X", "")
    >>> o = Outcome(e, [], 0, 1.0, "", "", ())
    >>> print(summary_table([o]))  # doctest: +NORMALIZE_WHITESPACE
    | experiment | targets met | first figure | measured on |
    |---|---|---|---|
    | X | - | X: no headline rows recorded: ok | - |
    """
    lines = ["| experiment | targets met | first figure | measured on |", "|---|---|---|---|"]
    for o, rows in headline_groups(outcomes):
        judged = [r.met for r in rows if r.met is not None]
        met = f"{sum(judged)} of {len(judged)}" if judged else "-"
        unreliable = sum(bool(r.unreliable) for r in rows)
        met += f" ({unreliable} unreliable: busy)" if unreliable else ""
        first = rows[0]
        target = f" (target {first.target})" if first.target not in ("-", "") else ""
        cell = f"{first.what}: {first.shown}{target}".replace("|", "\\|")
        on = (first.machine or "-").replace("|", "\\|")
        lines.append(f"| {o.experiment.title} | {met} | {cell} | {on} |")
    return "\n".join(lines)


def provenance(invocation: str, stamp: str, dated: str = "rows dated in RESULTS.md") -> str:
    """The line above a headline table: the last command and its date, where each row's own
    run is dated, the machine.

    >>> provenance(" --only x.py", "2026-12-04 15:00 UTC", "d").split("; machine")[0]
    'Last run: `python -m experiments.run_all --only x.py`, 2026-12-04 15:00 UTC; d'
    """
    return (f"Last run: `python -m experiments.run_all{invocation}`, {stamp}; {dated}; "
            f"machine: {machine()}.")


def write_readme(path: Path, table: str) -> bool:
    """Replace what lies between the README's result markers; False when they are absent."""
    if not path.is_file():
        return False
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return False
    path.write_text(f"{text[:start + len(BEGIN)]}\n{table}\n{text[end:]}")
    return True


def render(outcomes: list[Outcome], rows: list[Headline], invocation: str, stamp: str) -> str:
    head = [
        "# Experiment results",
        "",
        provenance(invocation, stamp, "each row's own run in the `run` column")
        + " Do not edit by hand: rerun the command.",
        "",
        headline.markdown(rows, headline_runs(outcomes)),
        "",
        "| experiment | script | status | run | time (s) |",
        "|---|---|---|---|---:|",
    ]
    for o in outcomes:
        head.append(f"| {o.experiment.title} | `{o.experiment.script}` | {o.status} "
                    f"| {run_of(o)} | {o.seconds:.0f} |")
    return "\n".join(head) + "\n\n" + "\n".join(section(o) for o in outcomes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Rerun every experiment; regenerate RESULTS.md.")
    ap.add_argument("--quick", action="store_true", help="pass --quick to the scripts")
    ap.add_argument("--only", nargs="*", default=None, metavar="SCRIPT",
                    help="run only these scripts; the others keep their sections from the "
                    "previous RESULTS.md")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per script (default 7200, 900 with --quick)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the markdown file to write")
    ap.add_argument("--readme", type=Path, default=None,
                    help="the README whose results table to rewrite (default: the repository's)")
    args = ap.parse_args(argv)
    known = {e.script for e in EXPERIMENTS}
    for name in args.only or []:
        if name not in known:
            ap.error(f"unknown experiment {name!r}; known: {', '.join(sorted(known))}")
    timeout_s = args.timeout or (900.0 if args.quick else 7200.0)
    previous = previous_sections(args.out)
    outcomes = []
    for exp in EXPERIMENTS:
        if args.only is not None and exp.script not in args.only:
            old = previous.get(exp.script)
            kept = (old[0], old[1]) if old and not old[0].startswith("not run") else None
            outcomes.append(Outcome(exp, [], None, float(old[2]) if kept and old else 0.0,
                                    "", "", (), skipped=True, kept=kept,
                                    when=old[3] if kept and old else ""))
            continue
        outcomes.append(run_experiment(exp, args.quick, timeout_s))
    invocation = (" --quick" if args.quick else "") + (
        " --only " + " ".join(args.only) if args.only is not None else "")
    stamp = now()
    rows = headline_rows(outcomes)
    args.out.write_text(render(outcomes, rows, invocation, stamp))
    print(f"wrote {args.out}", file=sys.stderr)
    table = (f"{provenance(invocation, stamp)} Every row, and every target: "
             f"[experiments/RESULTS.md](experiments/RESULTS.md).\n\n{summary_table(outcomes)}")
    readme = args.readme or ROOT / "README.md"
    if write_readme(readme, table):
        print(f"wrote the results table of {readme}", file=sys.stderr)
    return 0 if all(o.returncode in (0, None) for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
