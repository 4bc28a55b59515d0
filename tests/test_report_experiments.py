"""``experiments/run_all.py``: sections, markdown detection, figure links, failures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def run_all(tmp_path: Path, monkeypatch):
    spec = importlib.util.spec_from_file_location("run_all_under_test",
                                                  ROOT / "experiments" / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_all_under_test"] = module
    spec.loader.exec_module(module)
    here = tmp_path / "experiments"
    here.mkdir()
    monkeypatch.setattr(module, "HERE", here)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "FIGURES", here / "figures")
    monkeypatch.setattr(module, "machine", lambda: "test machine")
    monkeypatch.setattr(module, "EXPERIMENTS", (
        module.Experiment("table.py", "Table", "prints markdown and draws a figure"),
        module.Experiment("text.py", "Text", "prints plain text", ("--runs", "2", "--absent")),
        module.Experiment("broken.py", "Broken", "fails"),
        module.Experiment("absent.py", "Absent", "not written yet"),
    ))
    (here / "table.py").write_text(
        "import argparse, pathlib\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('--quick', action='store_true')\n"
        "a = ap.parse_args()\n"
        "p = pathlib.Path(__file__).parent / 'figures' / 'pic.png'; p.write_bytes(b'png')\n"
        "print('| a | b |'); print('|---|---:|'); print(f'| quick | {a.quick} |')\n")
    (here / "text.py").write_text("import sys  # options: '--runs'\n"
                                  "print('alpha   1.0'); print('beta    2.0'); print(sys.argv[1:])\n")
    (here / "broken.py").write_text("import sys; print('partial'); sys.exit('boom: no data')\n")
    return module


def test_run_all_writes_sections_links_figures_and_reports_failures(run_all, tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    rc = run_all.main(["--quick", "--out", str(out)])
    text = out.read_text()
    assert rc == 1  # broken.py failed
    assert "| quick | True |" in text  # --quick passed through; markdown kept raw
    assert "```text\nalpha   1.0\nbeta    2.0\n" in text  # plain output fenced
    assert "![pic.png](figures/pic.png)" in text
    assert "**failed (exit 1)**" in text and "boom: no data" in text
    assert "`experiments/absent.py` does not exist" in text
    for title in ("## Table", "## Text", "## Broken", "## Absent"):
        assert text.count(title) == 1


def test_only_runs_the_selected_script_and_keeps_earlier_sections(run_all, tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    assert run_all.main(["--only", "text.py", "--out", str(out)]) == 0
    text = out.read_text()
    assert "alpha   1.0" in text and "| quick |" not in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert sum("| not run (--only) |" in ln for ln in rows) == 3
    (run_all.HERE / "text.py").write_text("print('gamma   3.0')\n")
    assert run_all.main(["--only", "table.py", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| quick | False |" in text  # the new run
    assert "alpha   1.0" in text and "gamma" not in text  # text.py's section kept, not rerun
    assert "| Text | `text.py` | ok (earlier run) | 0 |" in text
    assert text.count("## Text") == 1
    with pytest.raises(SystemExit):
        run_all.main(["--only", "nope.py", "--out", str(out)])


def test_quick_is_not_passed_to_scripts_without_it(run_all) -> None:
    o = run_all.run_experiment(run_all.EXPERIMENTS[1], quick=True, timeout_s=60)
    assert o.returncode == 0 and "--quick" not in o.command
    assert "['--runs', '2']" in o.stdout  # only the quick_args the script defines
