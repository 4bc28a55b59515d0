"""``autostream plan`` and ``autostream compare`` tell one story: compare solves multi-stream
plans on plan's problem and shows plan's prediction, with the runtime's host costs, in a
labelled column."""

from __future__ import annotations

import pytest

from autostream.commands.plan import describe, plan_spec
from autostream.report.compare import RUNTIME_NOTE, plan_solvers, write_reports
from autostream.report.sources import problem_from_spec

SPEC = "autostream.models.zoo:two_branch_gemv"


def test_compare_shows_the_figure_plan_decides_on(tmp_path):
    streams = 2
    planned = plan_spec(SPEC, streams, "cpsat", None, None)
    assert planned["streams_used"] == 2  # the plan is applied: its figures are the candidate's
    assert (f"  with runtime costs {planned['predicted_us']:.2f} us  (the makespan and the "
            f"multi-stream runtime's host costs, as compare's column)") in describe(SPEC, planned)
    source = problem_from_spec(SPEC, streams)
    [single, cpsat] = plan_solvers(source.problem, ["single", "cpsat"],
                                   split_problem=source.split_problem, runtime=source.runtime)
    assert cpsat.schedule.makespan == pytest.approx(planned["makespan_us"], rel=1e-9)
    assert cpsat.runtime_us == pytest.approx(planned["predicted_us"], rel=1e-9)
    assert cpsat.runtime_us > cpsat.schedule.makespan  # the runtime's costs are in it
    assert single.runtime_us == single.schedule.makespan == planned["single_stream_us"]
    files = write_reports(tmp_path, source.problem, [single, cpsat], table=source.table,
                          split_problem=source.split_problem)
    text = files.table.read_text()
    assert "| with runtime costs (us) |" in text and RUNTIME_NOTE in text
    assert f"{cpsat.runtime_us:,.1f} ({single.schedule.makespan / cpsat.runtime_us:.2f}x)" in text
    assert "cost table 'cpu' (the default of cpu graphs; cpu, measured on " in text
    assert source.table in text


@pytest.mark.parametrize("streams", [1, 4])
def test_one_graph_one_table_one_bound_and_one_prediction_per_placement(streams):
    """Issue 51, item 6: a one-stream plan is timed as it runs (each op on all the intra-op
    threads), whichever solver found it, and every row has the table's bound."""
    source = problem_from_spec("autostream.models.zoo:inception_block", streams)
    assert source.split_problem is not source.problem  # CPU: the split durations differ
    rows = plan_solvers(source.problem, ["single", "heft", "cpsat"],
                        split_problem=source.split_problem, runtime=source.runtime)
    single = rows[0].schedule
    one_stream = [r for r in rows[1:] if r.schedule.streams_used == 1]
    assert one_stream  # HEFT keeps one stream here: the case the issue saw
    for r in one_stream:
        assert r.schedule.makespan == pytest.approx(single.makespan, rel=1e-12)
        assert r.runtime_us == pytest.approx(single.makespan, rel=1e-12)
    assert len({r.schedule.lower_bound for r in rows}) == 1
    assert all(r.schedule.makespan >= r.schedule.lower_bound - 1e-9 for r in rows)
