"""``experiments/run_all.py``: sections, markdown detection, figure links, failures, and the
headline table it writes into RESULTS.md and between the README's markers."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from experiments import headline, run_all
from experiments.headline import Headline

README = "# Tool\n\nintro\n\n<!-- results:begin -->\nold table\n<!-- results:end -->\n\nrest\n"


@pytest.fixture()
def experiments_dir(tmp_path: Path, monkeypatch) -> Path:
    here = tmp_path / "experiments"
    here.mkdir()
    (here / "__init__.py").write_text("")
    shutil.copy(Path(headline.__file__), here / "headline.py")  # the scripts record with it
    monkeypatch.setattr(run_all, "HERE", here)
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    monkeypatch.setattr(run_all, "FIGURES", here / "figures")
    monkeypatch.setattr(run_all, "HEADLINES", here / "headlines")
    monkeypatch.setattr(run_all, "machine", lambda: "test machine")
    monkeypatch.setattr(run_all, "row_machine", lambda: "test CPU, 2 cores")
    monkeypatch.setattr(run_all, "EXPERIMENTS", (
        run_all.Experiment("table.py", "Table", "prints markdown and draws a figure"),
        run_all.Experiment("text.py", "Text", "prints plain text", ("--runs", "2", "--absent")),
        run_all.Experiment("broken.py", "Broken", "fails"),
        run_all.Experiment("absent.py", "Absent", "not written yet"),
    ))
    (here / "table.py").write_text(
        "import argparse, pathlib\n"
        "from experiments.headline import Headline, record\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('--quick', action='store_true')\n"
        "a = ap.parse_args()\n"
        "p = pathlib.Path(__file__).parent / 'figures' / 'pic.png'; p.write_bytes(b'png')\n"
        "print('| a | b |'); print('|---|---:|'); print(f'| quick | {a.quick} |')\n"
        "record(__file__, [Headline('speed-up', '1.50x', '>= 1.3x', 1.5 >= 1.3),\n"
        "                  Headline('ceiling', '1.10x', '-', None)])\n")
    (here / "text.py").write_text("import sys  # options: '--runs'\n"
                                  "print('alpha   1.0'); print('beta    2.0'); print(sys.argv[1:])\n")
    (here / "broken.py").write_text("import sys; print('partial'); sys.exit('boom: no data')\n")
    return here


def test_run_all_writes_sections_links_figures_and_reports_failures(experiments_dir,
                                                                    tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    rc = run_all.main(["--quick", "--out", str(out)])
    text = out.read_text()
    assert rc == 1  # broken.py failed
    assert "| quick | True |" in text  # --quick passed through; markdown kept raw
    assert "```text\nalpha   1.0\nbeta    2.0\n" in text  # plain output fenced
    assert "![pic.png](figures/pic.png)" in text
    assert "**failed (exit 1)**" in text and "boom: no data" in text
    assert "`experiments/absent.py` does not exist" in text
    assert "`python -m experiments.table --quick`: ok" in text  # run as a module
    for title in ("## Table", "## Text", "## Broken", "## Absent"):
        assert text.count(title) == 1


def test_headline_rows_make_one_table_atop_results_and_a_summary_in_the_readme(experiments_dir,
                                                                     tmp_path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README)
    (experiments_dir / "headlines").mkdir()
    (experiments_dir / "headlines" / "broken.json").write_text(json.dumps(
        [{"what": "stale", "measured": "9x", "target": "-", "met": None}]))
    run_all.main(["--quick", "--out", str(tmp_path / "RESULTS.md")])
    results = (tmp_path / "RESULTS.md").read_text()
    # each row dated by its own run, as the experiment's section mark records it
    runs = dict(re.findall(r"<!-- experiment: (\S+) \| [^|]*\| \d+ s \| (\S+ \S+ UTC) -->",
                           results))
    assert set(runs) == {"table.py", "text.py", "broken.py"}  # absent.py did not run
    table = "\n".join([
        "| what | measured | target | met | run | machine |", "|---|---|---|---|---|---|",
        # the machine run_all ran the script on, where the script named none
        f"| speed-up | 1.50x | >= 1.3x | yes | {runs['table.py']} | test CPU, 2 cores |",
        f"| ceiling | 1.10x | - | - | {runs['table.py']} | test CPU, 2 cores |",
        f"| Text: no headline rows recorded | ok | - | - | {runs['text.py']} | - |",
        # not the stale row
        f"| Broken: no headline rows recorded | failed (1) | - | **no** | {runs['broken.py']} | - |",
        "| Absent: no headline rows recorded | not run (missing) | - | - | not run | - |"])
    assert results.index(table) < results.index("| experiment | script | status | run |")
    assert ("Last run: `python -m experiments.run_all --quick`, " in results
            and "; each row's own run in the `run` column; machine: test machine." in results)
    text = readme.read_text()
    before, after = README.split("old table\n")
    assert text.startswith(before) and text.endswith(after) and "old table" not in text
    assert table not in text and "machine: test machine" in text
    # the README: per experiment, its targets met and its first row
    assert "\n".join([
        "| experiment | targets met | first figure | measured on |", "|---|---|---|---|",
        "| Table | 1 of 1 | speed-up: 1.50x (target >= 1.3x) | test CPU, 2 cores |",
        "| Text | - | Text: no headline rows recorded: ok | - |",
        "| Broken | 0 of 1 | Broken: no headline rows recorded: failed (1) | - |",
        "| Absent | - | Absent: no headline rows recorded: not run (missing) | - |"]) in text
    assert json.loads((experiments_dir / "headlines" / "table.json").read_text())[0] == {
        "what": "speed-up", "measured": "1.50x", "target": ">= 1.3x", "met": True,
        "machine": "test CPU, 2 cores", "unreliable": ""}


def test_a_readme_without_both_markers_is_left_alone(tmp_path) -> None:
    for text in ("# Tool\n", "a\n<!-- results:begin -->\nb\n", "<!-- results:end -->\n"
                 "<!-- results:begin -->\n"):
        readme = tmp_path / "README.md"
        readme.write_text(text)
        assert not run_all.write_readme(readme, "| table |")
        assert readme.read_text() == text
    assert not run_all.write_readme(tmp_path / "missing.md", "| table |")


def test_only_runs_the_selected_script_and_keeps_earlier_sections(experiments_dir,
                                                                  tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    assert run_all.main(["--only", "text.py", "--out", str(out)]) == 0
    text = out.read_text()
    assert "alpha   1.0" in text and "| quick |" not in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "not run" in ln]
    assert sum("| not run (--only) |" in ln for ln in rows) == 3
    first = re.search(r"<!-- experiment: text.py \| ok \| 0 s \| (\S+ \S+ UTC) -->",
                      text).group(1)
    (experiments_dir / "text.py").write_text("print('gamma   3.0')\n")
    assert run_all.main(["--only", "table.py", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| quick | False |" in text  # the new run
    assert "alpha   1.0" in text and "gamma" not in text  # text.py's section kept, not rerun
    # the kept section keeps the date of its own run
    assert f"| Text | `text.py` | ok (earlier run) | {first} | 0 |" in text
    assert text.count("## Text") == 1
    (experiments_dir / "headlines" / "table.json").write_text(json.dumps(
        [{"what": "earlier", "measured": "1x", "target": "-", "met": None}]))
    assert run_all.main(["--only", "text.py", "--out", str(out)]) == 0
    assert "| earlier | 1x | - | - | " in out.read_text()  # table.py keeps its earlier rows
    # a section written before runs were dated says so
    out.write_text(re.sub(r"( \| \d+ s) \| [^|]*? -->", r"\1 -->", out.read_text()))
    assert run_all.main(["--only", "text.py", "--out", str(out)]) == 0
    assert "| Table | `table.py` | ok (earlier run) | earlier, not dated | 0 |" in out.read_text()
    with pytest.raises(SystemExit):
        run_all.main(["--only", "nope.py", "--out", str(out)])


def test_quick_is_not_passed_to_scripts_without_it(experiments_dir) -> None:
    o = run_all.run_experiment(run_all.EXPERIMENTS[1], quick=True, timeout_s=60)
    assert o.returncode == 0 and "--quick" not in o.command
    assert "['--runs', '2']" in o.stdout  # only the quick_args the script defines


def test_a_headline_must_say_met_with_a_bool_and_is_printed_when_not_recorded(
        monkeypatch, capsys) -> None:
    with pytest.raises(TypeError, match="met must be True, False or None"):
        Headline("x", "1", "2", 1)  # type: ignore[arg-type]
    monkeypatch.delenv(headline.ENV)
    assert headline.record("speedup.py", [Headline("a | b", "1", "-", None)]) is None
    assert "| a \\| b | 1 | - | - |" in capsys.readouterr().err


def test_an_unreliable_row_is_marked_counts_as_not_met_and_keeps_its_own_machine(
        experiments_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run_all, "EXPERIMENTS", (run_all.Experiment("busy.py", "Busy", "x"),))
    (experiments_dir / "busy.py").write_text(
        "from experiments.headline import Headline, record\n"
        "record(__file__, [Headline('speed-up', '7.01x', '>= 1.3x', True, 'EPYC; load 3.1',\n"
        "                           'busy: load 3.1 on 2 cores'),\n"
        "                  Headline('ceiling', '1.1x', '-', None)])\n")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert run_all.main(["--out", str(tmp_path / "RESULTS.md")]) == 0
    results = (tmp_path / "RESULTS.md").read_text()
    row = next(ln for ln in results.splitlines() if ln.startswith("| speed-up"))
    assert row.startswith("| speed-up | 7.01x (unreliable, busy: load 3.1 on 2 cores) | >= 1.3x "
                          "| **no** |") and row.endswith("| EPYC; load 3.1 |")
    assert next(ln for ln in results.splitlines() if ln.startswith("| ceiling")).endswith(
        "| test CPU, 2 cores |")  # run_all's machine only where the script named none
    assert ("| Busy | 0 of 1 (1 unreliable: busy) | speed-up: 7.01x (unreliable, busy: load "
            "3.1 on 2 cores) (target >= 1.3x) | EPYC; load 3.1 |") in readme.read_text()
