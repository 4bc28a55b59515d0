"""A fresh clone, as a new user meets it: writes ``docs/fresh-clone.md`` from what it runs.

Clones this checkout's ``HEAD`` into a temporary folder and runs, in it, the README's two
Quick start commands exactly as the README states them (read from README.md:
``experiments.readme_commands``): the virtual environment, CPU torch, the package and
the demo; then the test command, whole (the README's shell keeps the venv active, so
the transcript's step sources it first).  Then ``autostream plan`` and ``compare`` on a
transformers model (a 2-layer Llama built from its config), and
``autostream.last_report()`` after ``torch.compile(model, backend="autostream")``.
Every command and its output (the last lines of long ones) and its time go into the
transcript; nothing in it is typed by hand.

    python -m experiments.fresh_clone                 # the whole suite: tens of minutes
"""

from __future__ import annotations

import argparse
import os
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
            ("The README's test command", f"{venv}{readme.test}"),
            ("autostream plan on a transformers model (2-layer Llama)",
             f"{venv}autostream plan {MODEL} --streams 4"),
            ("autostream compare on the same model",
             f"{venv}autostream compare {MODEL} --solvers single,heft,cpsat --out compare"),
            ('autostream.last_report() after torch.compile(model, backend="autostream")',
             f"{venv}python -c {shlex.quote(LAST_REPORT.strip())}")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per step")
    args = ap.parse_args(argv)
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
    note = (f"the README's commands, the whole suite; {this_machine()}; load average "
            f"{os.getloadavg()[0]:.1f} at the end")
    args.out.write_text(markdown(steps, note) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return max(s.returncode for s in steps)


if __name__ == "__main__":
    raise SystemExit(main())
