"""``autostream demo`` end to end (slow-ish: compiles a model; about 30 s on 2 cores)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_exits_0_prints_the_table_and_writes_pictures(tmp_path: Path) -> None:
    from matplotlib.image import imread

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "autostream.cli", "demo", "--out", str(tmp_path / "demo"),
         "--repeats", "5", "--time-limit", "0.3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "| solver | streams used | syncs | predicted makespan (us) |" in out
    rows = re.findall(r"^\| (\w+) \| (\d+|-) \|", out, flags=re.M)
    solvers = {name for name, _ in rows}
    assert {"single", "heft"} <= solvers
    single = re.search(r"^\| single \| 1 \| 0 \| ([\d,.]+) ", out, flags=re.M)
    assert single is not None
    # Either a measured speed-up is printed, or the reason it is not.
    assert re.search(r"measured speed-up \d+\.\d\dx", out) or "measured: skipped" in out \
        or "measured: failed" in out
    png = tmp_path / "demo" / "heft_gantt.png"
    assert png.stat().st_size > 10_000
    assert float(imread(png)[..., :3].std()) > 0.05
    assert (tmp_path / "demo" / "table.md").read_text().count("\n| ") >= 3
