"""``autostream demo`` end to end (slow-ish: compiles a model; about 30 s on 2 cores)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import fork_join

ROOT = Path(__file__).resolve().parents[1]


#: the demo's measured line of the plan forced on, on a quiet machine or marked unreliable
#: on a busy one
MEASURED_LINE = (r"^plan forced on: (measured speed-up \d+\.\d\dx over|speed-up unreliable, busy: .+; the "
                 r"plan ran \d+\.\d\dx as fast as) the best single stream, (eager|eager "
                 r"\(\d+ threads?\)|compiled, 1 stream)(; |, .*; )predicted \d+\.\d\dx")


def test_the_measured_line_pattern_reads_both_the_quiet_and_the_busy_wording():
    quiet = ("plan forced on: measured speed-up 1.55x over the best single stream, compiled, 1 "
             "stream; predicted 1.23x (experiments/speedup.py's ...)")
    busy = ("plan forced on: speed-up unreliable, busy: other processes 1.33 cores; the plan "
            "ran 1.17x as fast "
            "as the best single stream, eager (1 thread), meanwhile: rerun on a quiet machine; "
            "predicted 1.23x")
    assert re.search(MEASURED_LINE, quiet) and re.search(MEASURED_LINE, busy)
    assert not re.search(MEASURED_LINE, "plan forced on: measured speed-up 7.01x over eager; "
                         "predicted 1.23x")


@pytest.mark.slow
def test_demo_plans_for_both_devices_measures_on_cpu_and_says_what_it_applied(
        tmp_path: Path) -> None:
    from matplotlib.image import imread

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "autostream.cli", "demo", "--out", str(tmp_path / "demo"),
         "--repeats", "5", "--time-limit", "0.3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
        timeout=900)  # a hang guard: the demo takes about 30 s on 2 idle cores
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.count("| solver | streams used | syncs | predicted makespan (us) |") == 2
    for table, device, runtime in (("ascend910b", "Ascend 910B", "torchair"),
                                   ("h200", "NVIDIA H200", "graph")):
        assert f"{device} ({table} table, costed for the {runtime} runtime)" in out
        assert re.search(rf"^- {device}: .* faster than one stream on the {runtime} runtime",
                         out, flags=re.M)
        best = re.search(rf"best multi-stream plan: (\w+): Gantt (\S*/{table}/\S+),", out)
        assert best is not None
        png = Path(best.group(2))
        assert png.stat().st_size > 10_000 and float(imread(png)[..., :3].std()) > 0.05
        assert (tmp_path / "demo" / table / "table.md").read_text().count("\n| ") >= 3
        assert re.search(rf"^- {device}: \w+ would run the MoE layer on \d+ streams", out,
                         flags=re.M)
    # a result on a quiet machine, marked unreliable on a busy one, against the fastest of
    # eager (at each thread count the plan could use) and the compiled graph on one stream
    assert re.search(MEASURED_LINE, out, flags=re.M)
    # one timing method with experiments/speedup.py, said, with the machine and its load
    assert re.search(r"^timing: median of 5 interleaved rounds after 5 warm-up rounds, one "
                     r"timed call of each variant per round after 20 ms of its own untimed "
                     r"calls \(the method of experiments/speedup.py\)$", out, flags=re.M)
    machine = re.search(r"^machine: .+, \d+ cores?, (\d+) intra-op threads?; load average ", out,
                        flags=re.M)
    assert machine is not None
    if int(machine.group(1)) > 1:  # eager on one thread, as each stream runs
        assert re.search(r"^measured on CPU threads \(median us; plan forced on: measure=0, "
                         r"\d+ streams?\): eager [\d,]+, eager \(1 thread\) [\d,]+, ", out,
                         flags=re.M)
    assert "outputs equal eager: yes" in out
    # what the backend decides as a user runs it, before the forced plan's figure
    decided = re.search(r"^the backend decides \(measure=5, its default\): runs (eager|eager "
                        r"\(\d+ threads?\)|streams): ", out, flags=re.M)
    assert decided is not None and decided.start() < re.search(MEASURED_LINE, out,
                                                                flags=re.M).start()
    applied = re.search(r"^pass: \d+ streams", out, flags=re.M) is not None
    summary = re.search(r"^- This CPU(?: \(.+?, \d+ intra-op threads?\))?: (.*)$", out,
                        flags=re.M)
    assert summary is not None
    assert summary.group(1).startswith("autostream planned" if applied
                                       else "the GEMV model was left")
    assert f"The backend runs {decided.group(1)}: " in summary.group(1)
    trace = re.search(r"measured trace \(predicted and measured timelines\): (\S+)", out)
    assert (trace is not None) == applied, "a measured trace exactly when the plan is applied"
    if trace is not None:
        import json

        events = json.loads(Path(trace.group(1)).read_text())["traceEvents"]
        assert {e["pid"] for e in events if e.get("ph") == "X"} == {1, 2}
        assert re.search(r"^peak memory: predicted [\d.]+ \w+ .* measured [\d.]+ \w+$", out,
                         flags=re.M)
        assert (tmp_path / "demo" / "cpu" / "plan_gantt.png").stat().st_size > 10_000


def _args(tmp_path: Path, **kw):
    import argparse

    base = {"out": str(tmp_path / "demo"), "streams": 2, "solver": "cpsat", "time_limit": 0.2,
            "repeats": 5, "no_run": False}
    return argparse.Namespace(**{**base, **kw})


def test_demo_without_the_zoo_says_so_and_exits_0(tmp_path, monkeypatch, capsys) -> None:
    import autostream.models.zoo
    from autostream.commands import demo

    monkeypatch.delattr(autostream.models.zoo, "moe_model")
    assert demo.run(_args(tmp_path)) == 0
    assert "demo unavailable" in capsys.readouterr().out


def test_demo_without_runtime_or_cpsat_still_prints_the_table(tmp_path, monkeypatch,
                                                               capsys) -> None:
    import autostream.report.sources as sources
    import autostream.runtime
    from autostream.commands import demo

    problem = fork_join([5.0, 5.0], share=0.2, streams=2)
    monkeypatch.setattr(sources, "problem_from_model",
                        lambda *a, **k: sources.Source(problem, "stub"))
    monkeypatch.delattr(autostream.runtime, "make_runner", raising=False)
    monkeypatch.setattr(demo, "DEMO_SOLVERS", ("single", "heft", "no_such_solver"))
    monkeypatch.setitem(__import__("autostream.scheduling.solvers").scheduling.solvers.SOLVERS, "no_such_solver",
                        "autostream.scheduling.solvers.no_such_module:solve")
    assert demo.run(_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert out.count("| heft | 2 | ") == 2 and "| single | 1 | 0 | 12.0 |" in out
    assert "not in this build: solver(s) no_such_solver" in out
    assert "measured: skipped, the CPU threads runtime" in out
    assert (tmp_path / "demo" / "ascend910b" / "heft_gantt.png").is_file()
    assert "- NVIDIA H200: heft would run the MoE layer on 2 streams" in out


def test_demo_on_one_stream_without_running_says_so(tmp_path, capsys) -> None:
    from autostream.commands import demo

    assert demo.run(_args(tmp_path, streams=1, no_run=True)) == 0
    out = capsys.readouterr().out
    assert "up to 1 stream," in out and "1 streams" not in out
    assert out.count("*: proven optimal") == 2  # the star under each table is explained
    assert "- This CPU: not measured (--no-run)." in out


def test_the_summary_gives_a_speed_up_timed_while_busy_as_unreliable_never_as_a_result():
    from autostream.commands.demo import CpuRun, _cpu_line
    from autostream.runtime.machine import Load

    machine = "AMD EPYC, 2 cores, 2 intra-op threads"
    busy = _cpu_line(CpuRun(True, "2 streams", 2, 1, 7.01, 1.23, "eager", machine,
                            Load(2, 3.1, 3.1, 1.3, 9.0)))
    assert busy.startswith(f"- This CPU ({machine}): autostream planned 2 streams with 1 sync")
    assert ("speed-up unreliable, busy: other processes kept 1.30 of 2 cores busy during the "
            "timing (load average 3.1 on 2 cores); the plan ran 7.01x") in busy
    assert not re.search(r"measured (speed-up )?\d", busy)
    quiet = _cpu_line(CpuRun(True, "2 streams", 2, 1, 0.85, 1.23, "eager (1 thread)", machine,
                             Load(2, 0.6, 0.9, 0.02, 9.0)))
    assert ("measured speed-up 0.85x over the best single stream, eager (1 thread); predicted "
            "1.23x") in quiet and "docs/cpu-runtime.md" in quiet


def test_the_summary_says_what_the_backend_runs_and_gives_the_forced_plan_as_such():
    from autostream.commands.demo import CpuRun, _cpu_line
    from autostream.runtime.machine import Load

    why = ("streams 0.80x as fast as eager (0.78x less the spread of 5 rounds) does not clear "
           "the 5% margin")
    line = _cpu_line(CpuRun(True, "2 streams", 2, 1, 0.75, 1.23, "eager", "AMD EPYC, 2 cores",
                            Load(2, 0.1, 0.1, 0.02, 9.0), runs="eager", why=why))
    assert "applied" not in line
    assert (f"for the GEMV model. The backend runs eager: {why}. Forced on (measure=0), the "
            "plan: measured speed-up 0.75x over the best single stream, eager; predicted "
            "1.23x.") in line


def test_the_demo_asks_the_backend_what_it_decides_before_timing_the_plan_forced_on(
        tmp_path, capsys):
    from autostream.commands import demo
    from autostream.models.zoo import two_branch_gemv

    model, inputs = two_branch_gemv(depth=2)
    runs, why = demo._decide(model, inputs, _args(tmp_path, time_limit=0.2))
    out = capsys.readouterr().out
    assert out == f"the backend decides (measure=5, its default): runs {runs}: {why}\n"
    # the backend's own candidates, its own words (runtime.choice.decide)
    assert runs == "eager" or runs.startswith(("eager (", "streams"))
    assert re.search(r"^\S.* \d+\.\d\dx as fast as eager \(\d+\.\d\dx less the spread of 5 "
                     r"rounds\) (clears|does not clear) the 5% margin$",
                     why.removeprefix("unreliable (").split("): ", 1)[-1])
