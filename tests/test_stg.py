"""The STG reader: the benchmark files parse; malformed files name the line and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autostream.models.stg import SAMPLE, benchmark_missing, parse_stg, read_optimal_csv, read_stg

STG = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "stg"
needs_stg = pytest.mark.skipif(not STG.is_dir(), reason=benchmark_missing(STG))

GOOD = "2\n0 0 0\n1 4 1 0\n2 3 1 0\n3 0 2 1 2\n# comment\n"


def test_parse_builds_the_dag_with_times_in_microseconds():
    p = parse_stg(GOOD, streams=2)
    assert sorted(p.graph.edges) == [("0", "1"), ("0", "2"), ("1", "3"), ("2", "3")]
    assert p.duration("1") == 4.0 and p.share("1") == 0.0
    assert p.sync_latency_us == 0.0 and p.streams == 2
    assert p.critical_path() == 4.0 and p.total_work() == 7.0


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("2\n0 0 0\n1 x 1 0\n2 3 1 0\n3 0 2 1 2\n", 3, "time"),
        ("2\n0 0 0\n1 -4 1 0\n2 3 1 0\n3 0 2 1 2\n", 3, "time"),
        ("2\n0 0 0\n1 4 2 0\n2 3 1 0\n3 0 2 1 2\n", 3, "n_preds"),
        ("2\n0 0 0\n1 4 1 0\n5 3 1 0\n3 0 2 1 2\n", 4, "id"),
        ("2\n0 0 0\n1 4 1 0\n2 3 1 7\n3 0 2 1 2\n", 4, "pred[0]"),
        ("2\n0 0 0\n1 4 1 0\n2 3 1 0\n3 0 2 1 q\n", 5, "pred[1]"),
        ("two\n0 0 0\n", 1, "task count"),
    ],
)
def test_malformed_files_name_the_line_and_the_field(text, line, field):
    with pytest.raises(ValueError, match=re.escape(f"bad.stg:{line}: field '{field}'")):
        parse_stg(text, name="bad.stg")


def test_truncated_files_and_short_lines_are_reported():
    with pytest.raises(ValueError, match="announces 2 tasks plus 2 dummies, but 3 task lines"):
        parse_stg("2\n0 0 0\n1 4 1 0\n2 3 1 0\n", name="bad.stg")
    with pytest.raises(ValueError, match="bad.stg:3: expected 'id time n_preds"):
        parse_stg("2\n0 0 0\n1 4\n2 3 1 0\n3 0 2 1 2\n", name="bad.stg")
    with pytest.raises(ValueError, match="empty file"):
        parse_stg("# nothing\n", name="bad.stg")


@needs_stg
def test_every_benchmark_file_parses_and_matches_its_header():
    files = sorted(STG.glob("*/*.stg"))
    assert len(files) == 360
    for f in files[::30]:
        p = read_stg(f, streams=4)
        first = int(f.read_text().split()[0])
        assert len(p.graph) == first + 2  # plus the dummy entry and exit
        assert p.duration("0") == 0.0 and p.duration(str(first + 1)) == 0.0
    optimum = read_optimal_csv(STG / "optimal.csv")
    assert len(optimum) == 1440
    assert {k for _, k in optimum} == {2, 4, 8, 16}
    open_cases = [key for key, o in optimum.items() if not o.proven]
    assert 0 < len(open_cases) < 1440  # rows with lower and upper bounds
    assert all(optimum[key].lower < optimum[key].upper for key in open_cases)
    for (graph, streams), value in list(optimum.items())[::97]:
        p = read_stg(STG / graph, streams=streams)
        assert p.lower_bound() <= value.upper + 1e-9  # a schedule respects the bound


def test_optimal_csv_rows_with_bounds_and_bad_rows(tmp_path):
    good = tmp_path / "optimal.csv"
    good.write_text("graph,streams,optimal_makespan\n50/a.stg,2,10\n50/b.stg,4,7,9\n")
    table = read_optimal_csv(good)
    assert table[("50/a.stg", 2)].proven and table[("50/a.stg", 2)].upper == 10.0
    assert not table[("50/b.stg", 4)].proven
    assert (table[("50/b.stg", 4)].lower, table[("50/b.stg", 4)].upper) == (7.0, 9.0)
    bad = tmp_path / "bad.csv"
    bad.write_text("graph,procs\n50/x.stg,2\n")
    with pytest.raises(ValueError, match="expected the header"):
        read_optimal_csv(bad)
    bad.write_text("graph,streams,optimal_makespan\n50/x.stg,two,3\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: field 'streams'"):
        read_optimal_csv(bad)
    bad.write_text("graph,streams,optimal_makespan\n50/x.stg,2,9,7\n")
    with pytest.raises(ValueError, match="below the lower bound"):
        read_optimal_csv(bad)


def test_the_shipped_sample_plans_from_the_command_line(capsys):
    from autostream.cli import main

    p = read_stg(SAMPLE, streams=2)
    assert p.graph.number_of_nodes() == 12 and p.total_work() == 47.0
    assert main(["plan", str(SAMPLE), "--streams", "2", "--solver", "cpsat"]) == 0
    out = capsys.readouterr().out
    assert "proven optimal" in out and "makespan           26.00 us" in out
    assert "cost table         none: the .stg file's task times" in out


def test_the_readme_sample_path_works_from_any_directory(tmp_path, monkeypatch, capsys):
    """Issue 51, item 13: ``autostream plan autostream/models/sample.stg`` outside the
    repository root plans the shipped sample."""
    from autostream.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["plan", "autostream/models/sample.stg", "--streams", "2"]) == 0
    assert "ops                12" in capsys.readouterr().out
    assert main(["compare", "sample.stg", "--solvers", "single", "--out", str(tmp_path)]) == 0
    assert main(["plan", "missing.stg"]) == 2
    assert "try the sample graph autostream/models/sample.stg" in capsys.readouterr().err
