"""``experiments.busy_suite``: the README's test command beside busy loops, loops always killed."""

from __future__ import annotations

import json
import os
import sys

import pytest

from experiments import busy_suite
from experiments.readme_commands import from_readme

TINY = '''
def test_passes():
    assert 1 + 1 == 2


def test_fails():
    assert 1 + 1 == 3
'''


@pytest.mark.slow  # a pytest run beside busy loops: about 5 s
def test_a_tiny_selection_beside_one_loop_per_core_is_recorded_and_the_loops_killed(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TINY)
    out = tmp_path / "busy.json"
    code = busy_suite.main(["--loops-per-core", "1", "--out", str(out), "--sample-s", "0.1",
                            "--pytest-args", f"-q -p no:cacheprovider {tmp_path / 'test_tiny.py'}"])
    data = json.loads(out.read_text())
    assert code == 1 and data["returncode"] == 1  # a failed test fails the run
    cores = os.cpu_count()
    assert (data["cores"], data["loops"]) == (cores, cores)
    assert data["loops_started"] == data["loops_alive_at_end"] == data["loops_killed"] == cores
    assert data["counts"] == {"failed": 1, "passed": 1}
    assert data["count_line"].startswith("1 failed, 1 passed in ")
    [failed] = data["failed"]
    assert failed.startswith("FAILED ") and failed.split(" - ")[0].endswith("test_tiny.py::test_fails")
    assert data["readme_command"] == from_readme().test
    assert data["command"].endswith(f"-m pytest -q -p no:cacheprovider {tmp_path / 'test_tiny.py'}")
    load = data["load"]
    assert load["samples"] >= 1 and load["min"] <= load["median"] <= load["max"]
    assert data["cpu_model"] and data["seconds"] > 0


def test_without_an_override_it_runs_the_readmes_command_with_this_python():
    argv, readme = busy_suite.command_line(None)
    assert readme == from_readme().test == "python -m pytest -q --slow"
    assert argv == [sys.executable, "-m", "pytest", "-q", "--slow"]
