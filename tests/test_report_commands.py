"""``autostream compare`` on STG files and model specs; STG benchmark files are hand written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autostream.cli import main

# 4 real tasks, dummy entry 0 and exit 5: 0 -> (1, 2, 3) -> 4 -> 5
STG = """4
0 0 0
1 5 1 0
2 7 1 0
3 3 1 0
4 2 3 1 2 3
5 0 1 4
#
"""


def test_compare_on_stg_writes_table_gantt_trace_and_graph(tmp_path: Path, capsys) -> None:
    pytest.importorskip("autostream.models.stg")
    stg = tmp_path / "g.stg"
    stg.write_text(STG)
    out = tmp_path / "out"
    rc = main(["compare", str(stg), "--solvers", "single,heft,round_robin", "--streams", "3",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    table = (out / "table.md").read_text()
    assert table in printed or table.splitlines()[-1] in printed
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "solver" not in ln]
    assert [r.split("|")[1].strip() for r in rows] == ["single", "heft", "round_robin"]
    single_ms, heft_ms = (rows[i].split("|")[4].replace(",", "").strip() for i in (0, 1))
    assert single_ms == "17.0" and heft_ms == "9.0*"  # 5+7+3+2 alone; 5|7|3 side by side, then 2: optimal
    assert {r.split("|")[5].strip() for r in rows} == {"9.0"}  # one bound in every row
    for solver in ("single", "heft", "round_robin"):
        trace = json.loads((out / f"{solver}_trace.json").read_text())
        assert any(e["ph"] == "X" for e in trace["traceEvents"])
        assert (out / f"{solver}_gantt.png").stat().st_size > 5_000
        dot = (out / f"{solver}_graph.dot").read_text()
        assert dot.startswith("digraph")


def test_compare_rejects_unknown_solver_and_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["compare", str(tmp_path / "none.stg"), "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    stg = tmp_path / "g.stg"
    stg.write_text(STG)
    assert main(["compare", str(stg), "--solvers", "single,magic", "--out", str(tmp_path)]) == 2
    assert "unknown solver 'magic'" in capsys.readouterr().err
