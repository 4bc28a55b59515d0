"""What a fresh clone relies on: the README's test command prints pytest's count line, and
the package metadata builds without setuptools' deprecation warnings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_test_command_ends_with_the_count_line():
    readme = (ROOT / "README.md").read_text()
    command = "python -m pytest -q --slow"
    assert f"    {command}\n" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{command}\n" in ci  # CI runs the same command
    # the same options on one small test file of this suite, with the project's config
    run = subprocess.run([sys.executable, *command.split()[1:], "-p", "no:cacheprovider",
                          "tests/test_cli_help.py", "-k", "top_level"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # a hang guard
    assert run.returncode == 0, run.stdout + run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"1 passed, \d+ deselected in [\d.]+s", last), run.stdout


def test_the_license_is_an_spdx_string():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    requires = project["build-system"]["requires"]
    assert "setuptools>=77" in requires  # the first release that reads an SPDX string
    assert "-q" not in project["tool"]["pytest"]["ini_options"]["addopts"].split()


def test_the_fresh_clone_transcript_runs_the_readmes_two_commands_whole():
    from experiments import fresh_clone
    from experiments.readme_commands import from_readme

    readme = from_readme()
    assert readme.install_and_demo.startswith("python3 -m venv .venv && ")
    assert readme.install_and_demo.endswith(" && autostream demo")
    [install, test, *_] = [command for _, command in fresh_clone.steps_to_run(readme)]
    assert install == readme.install_and_demo  # as the README states it
    assert test == fresh_clone.ACTIVATE + readme.test == ". .venv/bin/activate && " \
        "python -m pytest -q --slow"  # whole: no test paths after it
