"""A fresh clone, as a new user meets it: writes ``docs/fresh-clone.md`` from what it runs.

Clones this checkout's ``HEAD`` into a temporary folder and runs, in it, the README's two
Quick start commands exactly as the README states them (read from README.md:
``experiments.readme_commands``): the virtual environment, CPU torch, the package and
the demo; then the test command, whole (the README's shell keeps the venv active, so
the transcript's step sources it first).  Then ``autostream plan`` and ``compare`` on a
transformers model (a 2-layer Llama built from its config), and
``autostream.last_report()`` after ``torch.compile(model, backend="autostream")``.
Every command and its output (the last lines of long ones) and its time go into the
transcript; nothing in it is typed by hand.  The README's sentence on the whole suite (its
time and test count, between ``<!-- fresh-clone:begin -->`` and ``<!-- fresh-clone:end -->``)
is written from the test step too, so the README's figures are this script's.

    python -m experiments.fresh_clone                 # the whole suite: tens of minutes
    python -m experiments.fresh_clone --readme-only   # the README's sentence, from the transcript
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from autostream.runtime.machine import this_machine
from experiments.readme_commands import ReadmeCommands, from_readme

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "fresh-clone.md"
MODEL = "autostream.models.hf_zoo:llama"
#: lines kept of a long output (its end: where the count line and the summary are)
TAIL = 40
#: the README's shell has the venv active after its first command; each step is a new shell
ACTIVATE = ". .venv/bin/activate && "
README = ROOT / "README.md"
#: the README's sentence on the whole suite lies between these lines
BEGIN, END = "<!-- fresh-clone:begin -->", "<!-- fresh-clone:end -->"
#: pytest's last line: "1303 passed, 53 skipped, 15 warnings in 295.74s (0:04:55)"
COUNT_LINE = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in [\d.]+s\b", re.M)
#: the outcomes pytest counts per test (warnings are not tests)
OUTCOMES = ("passed", "failed", "skipped", "errors", "error", "xfailed", "xpassed")
TEST_STEP = "The README's test command"

LAST_REPORT = f"""
import torch, autostream
from autostream.models.modelspec import load_model_spec
model, inputs = load_model_spec({MODEL!r})
compiled = torch.compile(model, backend="autostream")
with torch.no_grad():
    for _ in range(30):  # past the measured choice (2 * measure calls per candidate)
        compiled(*inputs)
print(autostream.last_report().summary())
"""


@dataclass(frozen=True)
class Step:
    title: str
    command: str
    returncode: int
    seconds: float
    output: str


def run(title: str, command: str, cwd: Path, env: dict[str, str], timeout_s: float) -> Step:
    print(f"{title}: {command}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s,
                              check=False)
        code, out = done.returncode, without_index_noise(done.stdout)
    except subprocess.TimeoutExpired as exc:
        code, out = 124, f"{exc.stdout or ''}\ntimed out after {timeout_s:.0f} s"
    seconds = time.perf_counter() - t0
    print(f"  exit {code} in {seconds:.0f} s", file=sys.stderr, flush=True)
    return Step(title, command, code, seconds, out if isinstance(out, str) else out.decode())


def without_index_noise(text: str) -> str:
    """``text`` without pip's warnings about a local index's missing pages (this machine's
    pip configuration, not the project's), counted in one line.

    >>> without_index_noise("a\\nWARNING: Location 'file:///x/' is ignored\\nb").splitlines()
    ['a', 'b', "[1 line of pip's warnings about a local package index left out]"]
    """
    lines = text.splitlines()
    kept = [ln for ln in lines if not ln.startswith("WARNING: Location 'file:")]
    cut = len(lines) - len(kept)
    if cut:
        kept.append(f"[{cut} line{'s' * (cut != 1)} of pip's warnings about a local package "
                    f"index left out]")
    return "\n".join(kept)


def tail(text: str, n: int = TAIL) -> str:
    """The last ``n`` lines, saying how many were left out.

    >>> tail("a\\nb\\nc", 2)
    '[1 line above left out]\\nb\\nc'
    """
    lines = text.rstrip().splitlines()
    if len(lines) <= n:
        return "\n".join(lines)
    cut = len(lines) - n
    return f"[{cut} line{'s' * (cut != 1)} above left out]\n" + "\n".join(lines[-n:])


def markdown(steps: list[Step], note: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# A fresh clone",
        "",
        f"Written by `python -m experiments.fresh_clone` on {stamp} ({note}); "
        "do not edit by hand. Each step: the command, run in the clone, its exit status and "
        "time, and its output (the end of long ones).",
        "",
    ]
    body = []
    for s in steps:
        body += [f"## {s.title}", "", f"`$ {s.command}`: exit {s.returncode}, {s.seconds:.0f} s",
                 "", "```text", tail(s.output), "```", ""]
    return "\n".join(head + body)


def steps_to_run(readme: ReadmeCommands, venv: str = ACTIVATE) -> list[tuple[str, str]]:
    """``(title, command)`` of each step run in the clone: the README's commands as it
    states them, then the commands a user tries next in the same shell.

    >>> steps = steps_to_run(ReadmeCommands("pip install x && x demo", "python -m pytest -q"))
    >>> [command for _, command in steps[:2]]
    ['pip install x && x demo', '. .venv/bin/activate && python -m pytest -q']
    """
    return [("Quick start: a virtual environment, CPU torch, the package and the demo",
             readme.install_and_demo),
            (TEST_STEP, f"{venv}{readme.test}"),
            ("autostream plan on a transformers model (2-layer Llama)",
             f"{venv}autostream plan {MODEL} --streams 4"),
            ("autostream compare on the same model",
             f"{venv}autostream compare {MODEL} --solvers single,heft,cpsat --out compare"),
            ('autostream.last_report() after torch.compile(model, backend="autostream")',
             f"{venv}python -c {shlex.quote(LAST_REPORT.strip())}")]


@dataclass(frozen=True)
class SuiteRun:
    """The whole suite in a fresh clone: its time, pytest's counts, when and where."""

    seconds: float
    #: pytest's count line, as counts by outcome ("passed": 1303, "skipped": 53, ...)
    counts: dict[str, int]
    date: str
    machine: str

    @property
    def tests(self) -> int:
        return sum(n for outcome, n in self.counts.items() if outcome in OUTCOMES)

    def sentence(self) -> str:
        """The README's sentence on the whole suite.

        >>> SuiteRun(301.0, {"passed": 1303, "skipped": 53, "warnings": 15}, "2026-12-04",
        ...          "AMD EPYC, 2 cores; load average 1.2 at the end").sentence()
        "The whole suite (5 min for 1,356 tests: 1303 passed, 53 skipped; in the fresh clone `python -m experiments.fresh_clone` made on 2026-12-04, AMD EPYC, 2 cores; load average 1.2 at the end) ends with pytest's count line:"
        """
        counts = ", ".join(f"{n} {outcome}" for outcome, n in self.counts.items()
                           if outcome in OUTCOMES)
        return (f"The whole suite ({self.seconds / 60:.0f} min for {self.tests:,} tests: "
                f"{counts}; in the fresh clone `python -m experiments.fresh_clone` made on "
                f"{self.date}, {self.machine}) ends with pytest's count line:")


def pytest_counts(output: str) -> dict[str, int] | None:
    """pytest's count line in ``output``, as counts by outcome (``None``: no count line).

    >>> pytest_counts("....\\n1 failed, 1303 passed, 15 warnings in 295.74s (0:04:55)\\n")
    {'failed': 1, 'passed': 1303, 'warnings': 15}
    """
    found = COUNT_LINE.findall(output)
    if not found:
        return None
    return {outcome: int(n) for n, outcome in (c.split(" ", 1) for c in found[-1].split(", "))}


def suite_run(steps: list[Step], date: str, machine: str) -> SuiteRun | None:
    """The test step's :class:`SuiteRun` (``None``: it did not run or printed no count line)."""
    step = next((s for s in steps if s.title == TEST_STEP), None)
    counts = pytest_counts(step.output) if step is not None else None
    return None if counts is None else SuiteRun(step.seconds, counts, date, machine)


def from_transcript(text: str) -> SuiteRun:
    """The :class:`SuiteRun` of a transcript this script wrote (``docs/fresh-clone.md``)."""
    head = re.search(r"^Written by `python -m experiments.fresh_clone` on (\S+) \S+ UTC \(the "
                     r"README's commands, the whole suite; (.+)\); do not edit", text, re.M)
    step = re.search(rf"^## {re.escape(TEST_STEP)}\n\n`\$ [^\n]*`: exit -?\d+, (\d+) s\n\n```text\n"
                     r"(.*?)```", text, re.M | re.S)
    if head is None or step is None:
        raise ValueError("the transcript has no header or no test step this script writes: "
                         "run `python -m experiments.fresh_clone` first")
    run = suite_run([Step(TEST_STEP, "", 0, float(step[1]), step[2])], head[1], head[2])
    if run is None:
        raise ValueError("the transcript's test step printed no pytest count line")
    return run


def write_readme(run: SuiteRun, path: Path = README) -> None:
    """Put ``run``'s sentence between the README's markers."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {BEGIN} ... {END} lines around the suite's sentence; "
                         f"put them back around it in the Quick start")
    path.write_text(f"{text[:start + len(BEGIN)]}\n{run.sentence()}\n{text[end:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--readme", type=Path, default=README,
                    help="the README whose suite sentence to write (default: this checkout's)")
    ap.add_argument("--readme-only", action="store_true",
                    help="write the README's sentence from the transcript --out, run nothing")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per step")
    args = ap.parse_args(argv)
    if args.readme_only:
        write_readme(from_transcript(args.out.read_text()), args.readme)
        print(f"wrote {args.readme} from {args.out}", file=sys.stderr)
        return 0
    readme = from_readme()
    # a new user's environment: no autostream settings, no other project on the path
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("AUTOSTREAM_")}
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="autostream-clone-") as tmp:
        env["AUTOSTREAM_PLAN_CACHE"] = str(Path(tmp) / "plans")  # a new user's: empty
        clone = Path(tmp) / "autostream"
        steps.append(run("Clone", f"git clone --quiet {shlex.quote(str(ROOT))} {clone} && "
                         f"git -C {clone} log -1 --format='%h %s'", Path(tmp), env,
                         args.timeout))
        for title, command in steps_to_run(readme):
            if steps[-1].returncode != 0:
                break
            steps.append(run(title, command, clone, env, args.timeout))
    # the transcript's own commands load the machine: the load average, not a busy verdict
    machine = f"{this_machine()}; load average {os.getloadavg()[0]:.1f} at the end"
    note = f"the README's commands, the whole suite; {machine}"
    args.out.write_text(markdown(steps, note) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    suite = suite_run(steps, datetime.now(timezone.utc).strftime("%Y-%m-%d"), machine)
    if suite is not None:
        write_readme(suite, args.readme)
        print(f"wrote the suite's figures into {args.readme}", file=sys.stderr)
    return max(s.returncode for s in steps)


if __name__ == "__main__":
    raise SystemExit(main())
