"""The README's test command on a busy machine: does it still pass, and how long does it take?

Starts ``--loops-per-core`` busy loops per core (separate processes spinning in pure
Python: 3 per core, 6 on 2 cores, by default), runs the README's test command (read
from README.md, ``python`` being this interpreter) beside them, samples the 1-minute
load average while it runs, and always kills the loops.  Writes a small JSON (the
command, wall time, pytest's count line and counts, failed tests, load samples
against cores, the CPU model) and prints a summary; exits non-zero when the suite
failed, printed no count line, or the loops did not spin throughout.

    python -m experiments.busy_suite --out /tmp/busy.json       # the whole suite (~30+ min)
    python -m experiments.busy_suite --loops-per-core 1 --pytest-args "-q tests/test_stg.py"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from experiments.readme_commands import from_readme

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(tempfile.gettempdir()) / "autostream-busy-suite.json"
LOOP = "while True: pass"
#: seconds between two readings of the load average
SAMPLE_S = 5.0
#: pytest's last line: "1 failed, 1132 passed, 41 skipped in 1134.52s (0:18:54)"
COUNT_LINE = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in [\d.]+s\b.*?=*$")


@dataclass(frozen=True)
class Load:
    """The 1-minute load average, sampled during the run."""

    samples: int
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Load:
        """
        >>> Load.of([6.5, 2.0, 7.25])
        Load(samples=3, min=2.0, median=6.5, max=7.25)
        """
        return cls(len(values), min(values), statistics.median(values), max(values))


@dataclass(frozen=True)
class BusyRun:
    command: str
    readme_command: str
    #: pytest's arguments given instead of the README's (``None``: the README's command)
    pytest_args: str | None
    cores: int
    loops_per_core: int
    loops: int
    #: loops spinning once started, when the suite ended, and gone after the kill
    loops_started: int
    loops_alive_at_end: int
    loops_killed: int
    cpu_model: str
    python: str
    started: str
    seconds: float
    returncode: int
    count_line: str | None
    counts: dict[str, int]
    #: pytest's "FAILED ..." and "ERROR ..." lines
    failed: list[str]
    load: Load


def count_line(lines: list[str]) -> tuple[str | None, dict[str, int]]:
    """pytest's count line (the last one) and its counts by outcome.

    >>> count_line(["...", "1 failed, 1132 passed, 41 skipped in 1134.52s (0:18:54)"])
    ('1 failed, 1132 passed, 41 skipped in 1134.52s (0:18:54)', {'failed': 1, 'passed': 1132, 'skipped': 41})
    >>> count_line(["===== 2 passed, 1 warning in 0.51s ====="])[1]
    {'passed': 2, 'warning': 1}
    >>> count_line(["no tests ran"])
    (None, {})
    """
    for line in reversed(lines):
        found = COUNT_LINE.match(line.strip())
        if found:
            counts = {what: int(n) for n, what in
                      (part.split(" ", 1) for part in found["counts"].split(", "))}
            return line.strip(), counts
    return None, {}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def command_line(pytest_args: str | None) -> tuple[list[str], str]:
    """The command to run (``python`` being this interpreter) and the README's own.

    >>> argv, readme = command_line("-q tests/test_stg.py")
    >>> argv[1:], readme.startswith("python -m pytest")
    (['-m', 'pytest', '-q', 'tests/test_stg.py'], True)
    """
    readme = from_readme().test
    words = shlex.split(readme)
    if pytest_args is not None:
        words = [*words[:3], *shlex.split(pytest_args)]
    return [sys.executable if words[0] == "python" else words[0], *words[1:]], readme


def _sample_load(into: list[float], stop: threading.Event, every_s: float) -> None:
    while True:
        into.append(os.getloadavg()[0])
        if stop.wait(every_s):
            return


def _run_pytest(argv: list[str], tail: deque[str], failed: list[str]) -> int:
    """Run ``argv`` in the repository root, echoing its output, keeping its last lines."""
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            tail.append(line.rstrip("\n"))
            if line.startswith(("FAILED ", "ERROR ")):
                failed.append(line.strip())
    return proc.returncode


def run(loops_per_core: int, pytest_args: str | None = None,
        sample_s: float = SAMPLE_S) -> BusyRun:
    """The README's test command beside ``loops_per_core`` busy loops per core."""
    argv, readme = command_line(pytest_args)
    cores = os.cpu_count() or 1
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tail: deque[str] = deque(maxlen=200)
    failed: list[str] = []
    loads: list[float] = []
    stop = threading.Event()
    loops: list[subprocess.Popen] = []
    sampler = threading.Thread(target=_sample_load, args=(loads, stop, sample_s), daemon=True)
    try:
        for _ in range(loops_per_core * cores):
            loops.append(subprocess.Popen([sys.executable, "-c", LOOP]))
        spinning = sum(p.poll() is None for p in loops)
        print(f"busy suite: {spinning} busy loops on {cores} cores; running "
              f"{shlex.join(argv)}", file=sys.stderr, flush=True)
        sampler.start()
        t0 = time.perf_counter()
        code = _run_pytest(argv, tail, failed)
        seconds = time.perf_counter() - t0
        alive = sum(p.poll() is None for p in loops)
    finally:
        stop.set()
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()
    if sampler.is_alive():
        sampler.join()
    line, counts = count_line(list(tail))
    return BusyRun(shlex.join(argv), readme, pytest_args, cores, loops_per_core, len(loops),
                   spinning, alive, sum(p.returncode is not None for p in loops), cpu_model(),
                   platform.python_version(), started, round(seconds, 1), code, line, counts,
                   failed, Load.of(loads))


def summary(r: BusyRun) -> str:
    """The run in one line.

    >>> r = BusyRun("py -m pytest -q", "python -m pytest -q", None, 2, 3, 6, 6, 6, 6, "Xeon",
    ...             "3.11", "2026-12-05 10:00 UTC", 1500.0, 0, "3 passed in 1499.9s",
    ...             {"passed": 3}, [], Load.of([5.9, 7.8, 8.1]))
    >>> summary(r)
    '`python -m pytest -q` beside 6 busy loops (3 per core, 2 cores, Xeon): 3 passed in 1499.9s; 1500 s (0:25:00); 1-minute load average 5.9 / 7.8 / 8.1 (min / median / max) on 2 cores; exit 0'
    """
    what = (r.readme_command if r.pytest_args is None
            else f"python -m pytest {r.pytest_args} (not the README's `{r.readme_command}`)")
    minutes, secs = divmod(round(r.seconds), 60)
    return (f"`{what}` beside {r.loops} busy loops ({r.loops_per_core} per core, {r.cores} "
            f"cores, {r.cpu_model}): {r.count_line or 'no count line'}; {r.seconds:.0f} s "
            f"({minutes // 60}:{minutes % 60:02d}:{secs:02d}); 1-minute load average "
            f"{r.load.min:.1f} / {r.load.median:.1f} / {r.load.max:.1f} (min / median / max) "
            f"on {r.cores} cores; exit {r.returncode}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops-per-core", type=int, default=3,
                    help="busy loops (pure-Python processes) per core (default 3)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the JSON written (default {OUT})")
    ap.add_argument("--pytest-args", default=None,
                    help="pytest's arguments instead of the README's (a quick check)")
    ap.add_argument("--sample-s", type=float, default=SAMPLE_S,
                    help="seconds between readings of the load average")
    args = ap.parse_args(argv)
    if args.loops_per_core < 0:
        ap.error(f"--loops-per-core must be >= 0, got {args.loops_per_core}")
    result = run(args.loops_per_core, args.pytest_args, args.sample_s)
    args.out.write_text(json.dumps(asdict(result), indent=2) + "\n")
    print(f"busy suite: {summary(result)}; wrote {args.out}", file=sys.stderr)
    spun = result.loops_started == result.loops_alive_at_end == result.loops
    if not spun:
        print(f"busy suite: only {result.loops_alive_at_end} of {result.loops} busy loops "
              f"spun throughout", file=sys.stderr)
    return result.returncode or int(result.count_line is None or not spun)


if __name__ == "__main__":
    raise SystemExit(main())
