"""Simulator and report artifacts (Gantt PNG, Perfetto trace, DOT dump, table)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
from functools import partial

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostream.report.compare import plan_solvers, syncs_for, write_reports
from autostream.report.dot import graph_dot
from autostream.report.gantt import gantt_png
from autostream.report.table import SolverResult, fmt_pct, markdown_table
from autostream.report.trace import chrome_trace
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Sync
from autostream.scheduling.simulate import cross_stream_syncs, simulate, simulate_plan
from autostream.scheduling.solvers import SOLVERS, get_solver, solve
from autostream.scheduling.solvers.base import schedule_from_assignment
from autostream.scheduling.timeline import Timeline
from tests import factories

#: a random DAG with durations, device shares, program order and op kinds
random_problem = partial(factories.random_problem, latency=2.0, prefix="op",
                         shares=(0.0, 0.3, 0.6, 1.0), kinds=("mm", "add", "relu", "softmax"))
#: ``src -> (b0, b1, b2) -> dst``: three independent branches
fork_join = partial(factories.fork_join, (10.0, 8.0, 6.0), share=0.3, streams=3, latency=1.0)


def available_solvers() -> list[str]:
    out = []
    for name in sorted(SOLVERS):
        try:
            get_solver(name)
        except ImportError:
            continue
        out.append(name)
    return out


PROBLEMS = [fork_join()] + [random_problem(s) for s in range(6)] + [
    random_problem(10, latency=0.0, shares=(0.0,)), random_problem(11, nodes=40, streams=4)]


# -- simulator ------------------------------------------------------------------------

@pytest.mark.parametrize("solver", [s for s in available_solvers() if s != "cpsat"])
@pytest.mark.parametrize("index", range(len(PROBLEMS)))
def test_simulator_agrees_with_planner(solver: str, index: int) -> None:
    problem = PROBLEMS[index]
    plan = solve(problem, solver)
    for syncs in (None, syncs_for(problem, plan),
                  cross_stream_syncs(problem, plan.stream_of, plan.order)):
        tl = simulate_plan(problem, plan, syncs)
        assert math.isclose(tl.makespan, plan.makespan, rel_tol=1e-9, abs_tol=1e-9)
        for n in problem.graph:
            assert math.isclose(tl.spans[n].start, plan.start[n], rel_tol=1e-9, abs_tol=1e-9)
            assert math.isclose(tl.spans[n].end, plan.end[n], rel_tol=1e-9, abs_tol=1e-9)
            assert tl.spans[n].stream == plan.stream_of[n]


@pytest.mark.skipif("cpsat" not in available_solvers(), reason="cpsat solver not in this build")
@pytest.mark.parametrize("index", [0, 1, 5])
def test_simulator_agrees_with_cpsat(index: int) -> None:
    # CP-SAT's own model blocks on capacity (see autostream.scheduling.simulate), but the Schedule
    # it returns is re-timed by the shared simulator: the replay must match exactly.
    problem = PROBLEMS[index]
    plan = solve(problem, "cpsat", time_limit=0.5)
    tl = simulate_plan(problem, plan, syncs_for(problem, plan))
    assert math.isclose(tl.makespan, plan.makespan, rel_tol=1e-9, abs_tol=1e-9)
    assert tl.makespan >= problem.lower_bound() - 1e-6
    for u, v in problem.graph.edges:
        assert tl.spans[v].start >= tl.spans[u].end - 1e-9


def test_simulator_contention_slows_concurrent_ops() -> None:
    g = nx.DiGraph()
    g.add_node("a", duration=4.0, share=1.0, order=0)
    g.add_node("b", duration=4.0, share=1.0, order=1)
    g.add_node("c", duration=4.0, share=0.0, order=2)
    p = SchedulingProblem(g, streams=3)
    plan = schedule_from_assignment(p, {"a": 0, "b": 1, "c": 2}, "manual")
    tl = simulate_plan(p, plan, [])
    assert tl.spans["a"].end == pytest.approx(8.0)  # two saturating ops share the device
    assert tl.spans["c"].end == pytest.approx(4.0)  # a zero-share op is not slowed


def test_sync_latency_only_on_syncs() -> None:
    p = fork_join()
    plan = schedule_from_assignment(p, {"src": 0, "b0": 0, "b1": 1, "b2": 2, "dst": 0}, "manual")
    tl = simulate_plan(p, plan, syncs_for(p, plan))
    assert tl.spans["b1"].start == pytest.approx(tl.spans["src"].end + 1.0)
    assert tl.spans["b0"].start == pytest.approx(tl.spans["src"].end)  # same stream: no latency
    joins = [e for e in tl.syncs if e.consumer == JOIN]
    assert all(e.consumer_stream == 0 for e in joins)


def test_launch_overhead_delays_ops_in_launch_order() -> None:
    p = random_problem(4)
    plan = solve(p, "heft")
    base = simulate_plan(p, plan)
    slow = simulate_plan(p, plan, launch_overhead_us=3.0)
    assert slow.makespan >= base.makespan
    for i, n in enumerate(plan.order):
        assert slow.spans[n].start >= 3.0 * (i + 1) - 1e-9
    # With a huge overhead the device is idle between launches: makespan set by the host.
    huge = simulate_plan(p, plan, launch_overhead_us=1000.0)
    last = plan.order[-1]
    assert huge.makespan == pytest.approx(1000.0 * len(plan.order) + p.duration(last))


def test_segment_overhead_delays_each_run_between_syncs() -> None:
    from autostream.scheduling.simulate import segment_leaders
    from autostream.scheduling.sync import compute_syncs

    p = random_problem(4)
    plan = solve(p, "heft")
    syncs = compute_syncs(p.graph, plan)
    base = simulate_plan(p, plan, syncs)
    slow = simulate_plan(p, plan, syncs, segment_overhead_us=7.0)
    assert slow.makespan >= base.makespan
    leaders = segment_leaders(plan, syncs)
    sequences = plan.stream_sequences()
    assert {seq[0] for seq in sequences.values()} <= leaders
    for seq in sequences.values():
        for a, b in zip(seq, seq[1:]):
            if b in leaders:  # a run starts: the stream pays the overhead after its last op
                assert slow.spans[b].start >= slow.spans[a].end + 7.0 - 1e-9
            else:
                assert not any(s.producer == a and s.consumer != JOIN
                               and plan.stream_of[s.consumer] != plan.stream_of[a] for s in syncs)
    # a single-stream plan runs as the compiled graph: no overhead at all
    single = solve(p, "single")
    assert simulate_plan(p, single, [], segment_overhead_us=7.0).makespan == single.makespan
    with pytest.raises(ValueError, match="segment_overhead_us"):
        simulate_plan(p, plan, syncs, segment_overhead_us=-1.0)


def test_missing_sync_is_reported() -> None:
    p = fork_join()
    plan = schedule_from_assignment(p, {"src": 0, "b0": 0, "b1": 1, "b2": 2, "dst": 0}, "manual")
    syncs = [s for s in syncs_for(p, plan) if s.consumer != "b1"]
    with pytest.raises(ValueError, match="'src' -> 'b1' is not ordered"):
        simulate_plan(p, plan, syncs)


def test_simulator_matches_core_simulate_with_arbitrary_assignment() -> None:
    rng = random.Random(7)
    for seed in range(5):
        p = random_problem(seed + 20)
        stream_of = {n: rng.randrange(p.streams) for n in p.graph}
        plan = schedule_from_assignment(p, stream_of, "random")
        start, end = simulate(p, plan.stream_of, plan.order)
        tl = simulate_plan(p, plan, syncs_for(p, plan))
        assert tl.start == pytest.approx(start) and tl.end == pytest.approx(end)


# -- artifacts ------------------------------------------------------------------------

def _plan(problem: SchedulingProblem, solver: str = "heft"):
    plan = solve(problem, solver)
    return plan, list(syncs_for(problem, plan))


@pytest.mark.parametrize("problem", [fork_join(), random_problem(5, nodes=30)])
def test_trace_has_one_track_per_stream_and_events_inside_makespan(problem) -> None:
    plan, syncs = _plan(problem)
    assert plan.streams_used > 1
    measured = Timeline.from_spans(
        {n: (plan.stream_of[n], 100.0 + plan.start[n] * 1.1, 100.0 + plan.end[n] * 1.1)
         for n in plan.order})
    trace = json.loads(json.dumps(chrome_trace(problem, plan, syncs, measured=measured)))
    events = trace["traceEvents"]
    for pid, makespan in ((1, plan.makespan), (2, measured.makespan - 100.0)):
        names = {e["tid"]: e["args"]["name"] for e in events
                 if e["pid"] == pid and e["ph"] == "M" and e["name"] == "thread_name"}
        slices = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
        assert sorted(names) == sorted(set(plan.stream_of.values()))
        assert len(set(names.values())) == len(names)
        assert {e["tid"] for e in slices} == set(names)
        assert sorted(e["name"] for e in slices) == sorted(problem.graph)
        for e in events:
            if e["pid"] == pid and e["ph"] in "Xsf":
                assert -1e-9 <= e["ts"] and e["ts"] + e.get("dur", 0.0) <= makespan + 1e-6
    flows = [e for e in events if e["pid"] == 1 and e["ph"] == "s"]
    assert len(flows) == sum(1 for s in syncs if s.consumer != JOIN)


@pytest.mark.parametrize("problem", [fork_join(), random_problem(1, nodes=30)])
def test_dot_has_every_op_once_and_one_dashed_edge_per_sync(problem) -> None:
    plan, syncs = _plan(problem)
    assert syncs
    text = graph_dot(problem, plan, syncs)
    for n in problem.graph:
        assert len(re.findall(rf'^\s*"{n}" \[label=', text, flags=re.M)) == 1
    assert text.count("style=dashed") == len(syncs)
    solid = [ln for ln in text.splitlines()
             if "->" in ln and "dashed" not in ln and "invis" not in ln]
    assert len(solid) == problem.graph.number_of_edges()
    clusters = re.findall(r"subgraph cluster_stream_(\d+)", text)
    assert sorted(map(int, clusters)) == sorted(set(plan.stream_of.values()))


def test_gantt_png_is_non_trivial(tmp_path) -> None:
    from matplotlib.image import imread

    problem = random_problem(2, nodes=30)
    plan, syncs = _plan(problem)
    path = gantt_png(tmp_path / "g.png", problem, plan, syncs)
    assert path.stat().st_size > 10_000
    img = imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 400
    assert float(img[..., :3].std()) > 0.05
    colours = {tuple(px) for px in img[..., :3].reshape(-1, 3)[::7].round(2).tolist()}
    assert len(colours) > 8  # several op kinds, lines and text, not one flat colour


def test_table_lists_every_solver_with_gap_and_speedup() -> None:
    problem = fork_join()
    results = plan_solvers(problem, ["single", "heft"])
    results.append(SolverResult("broken", None, error="boom"))
    text = markdown_table(results)
    rows = text.splitlines()
    assert len(rows) == 2 + 3
    heft = next(r for r in rows if r.startswith("| heft "))
    single = next(r.schedule for r in results if r.solver == "single")
    best = next(r.schedule for r in results if r.solver == "heft")
    assert f"{single.makespan / best.makespan:.2f}x" in heft
    assert fmt_pct(best.gap) in heft
    assert "failed: boom" in rows[-1]


def test_table_shows_launch_overhead_column_when_asked() -> None:
    problem = random_problem(6)
    plain = markdown_table(plan_solvers(problem, ["single", "heft"]))
    assert "launch overhead" not in plain
    results = plan_solvers(problem, ["single", "heft"], launch_overhead_us=50.0)
    rows = markdown_table(results).splitlines()
    assert rows[0].endswith("| with launch overhead (us) |")
    for r, row in zip(results, rows[2:], strict=True):
        assert r.overhead_makespan >= r.schedule.makespan
        assert row.endswith(f"| {r.overhead_makespan:,.1f} |")
        assert row.count("|") == rows[0].count("|")
    # 50 us per launch dominates: the host issues every op one after the other.
    assert results[1].overhead_makespan >= 50.0 * problem.graph.number_of_nodes()


def test_write_reports_writes_every_artifact(tmp_path) -> None:
    problem = random_problem(8)
    results = plan_solvers(problem, ["single", "heft"])
    files = write_reports(tmp_path, problem, results, title="random")
    assert files.table.read_text().count("\n| ") == 3
    assert set(files.gantt) == set(files.trace) == set(files.graph) == {"single", "heft"}
    for path in files.all():
        assert path.exists() and path.stat().st_size > 0


def test_unknown_sync_op_is_rejected() -> None:
    p = fork_join()
    plan = solve(p, "heft")
    with pytest.raises(ValueError, match="not in the schedule"):
        simulate_plan(p, plan, [Sync("zzz", "dst")])


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
@pytest.mark.parametrize("problem", [fork_join(), random_problem(9, nodes=40, streams=4)])
def test_real_graphviz_renders_the_dump_without_errors(problem, tmp_path) -> None:
    plan, syncs = _plan(problem)
    path = tmp_path / "g.dot"
    path.write_text(graph_dot(problem, plan, syncs))
    done = subprocess.run(["dot", "-Tsvg", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[:500]
    joins = any(s.consumer == JOIN for s in syncs)
    assert done.stdout.count('class="node"') == problem.graph.number_of_nodes() + joins


def test_write_graph_renders_svg_only_when_graphviz_is_installed(tmp_path, monkeypatch) -> None:
    from autostream.report.dot import write_graph

    p = fork_join()
    plan, syncs = _plan(p)
    system_path = os.environ.get("PATH", "")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert [f.suffix for f in write_graph(tmp_path / "a", p, plan, syncs)] == [".dot"]
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n# fake Graphviz: dot -Tsvg IN -o OUT\n'
                    'grep -c dashed "$2" > "$4"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{system_path}")
    written = write_graph(tmp_path / "b.dot", p, plan, syncs)
    assert [f.suffix for f in written] == [".dot", ".svg"]
    assert int(written[1].read_text()) == len(syncs)  # the DOT file was handed to dot


def _random_topological_order(problem: SchedulingProblem, rng: random.Random) -> tuple[str, ...]:
    indeg = {n: problem.graph.in_degree(n) for n in problem.graph}
    ready = sorted(n for n, d in indeg.items() if d == 0)
    order = []
    while ready:
        n = ready.pop(rng.randrange(len(ready)))
        order.append(n)
        for m in sorted(problem.graph.successors(n)):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return tuple(order)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), streams=st.integers(1, 4),
       latency=st.sampled_from([0.0, 1.5, 7.0]))
def test_replay_with_minimal_syncs_equals_prediction(seed: int, streams: int,
                                                     latency: float) -> None:
    # Any assignment and launch order: the minimal syncs reproduce the predicted timeline.
    rng = random.Random(seed)
    problem = random_problem(seed, nodes=rng.randint(2, 20), streams=streams, latency=latency)
    stream_of = {n: rng.randrange(streams) for n in problem.graph}
    plan = schedule_from_assignment(problem, stream_of, "random",
                                    order=_random_topological_order(problem, rng))
    syncs = syncs_for(problem, plan)
    tl = simulate_plan(problem, plan, syncs)
    assert tl.start == pytest.approx(dict(plan.start)) and tl.end == pytest.approx(dict(plan.end))
    assert tl.output >= tl.makespan
    assert len([e for e in tl.syncs if e.consumer == JOIN]) <= plan.streams_used - 1


def test_gantt_legend_names_what_is_drawn_and_the_memory_axis_shows_a_small_rise() -> None:
    from autostream.memory.predict import MemoryProfile
    from autostream.report.gantt import LEGEND_KINDS, gantt_figure
    from autostream.scheduling.solvers import solve

    g = nx.DiGraph()
    g.add_node("view", duration=0.0, kind="aten.view.default")  # drawn, but takes no time
    for i in range(LEGEND_KINDS + 2):  # more kinds than get a colour of their own
        g.add_node(f"op{i}", duration=1.0 + i, kind=f"aten.kind{i}.default")
        g.add_edge("view", f"op{i}")
    problem = SchedulingProblem(g, streams=2, sync_latency_us=0.5)
    plan = solve(problem, "heft")
    syncs = syncs_for(problem, plan)
    assert plan.streams_used == 2 and syncs
    top = 100 * 2**20
    memory = MemoryProfile(top + 2**20, 3.0, top, top, ((0.0, top), (3.0, top + 2**20)), (), {})
    fig = gantt_figure(problem, plan, syncs, memory=memory)
    lanes, panel = fig.axes
    labels = [t.get_text() for t in lanes.get_legend().get_texts()]
    assert "view" not in labels  # a kind with no time gets no colour of its own
    assert sum(label.startswith("kind") for label in labels) == LEGEND_KINDS
    assert "other ops" in labels and f"sync ({len(syncs)})" in labels
    # the join ends a sync latency after the last op: the arrow points at a line saying so
    assert labels[0] == f"outputs joined {plan.makespan + 0.5:.1f} us"
    assert labels[1] == f"makespan {plan.makespan:,.1f} us (ops and syncs)"
    low, high = panel.get_ylim()
    assert 99 < low < 100 and 101 < high < 101.2  # MiB: the 1% rise fills the panel


def test_gantt_names_the_predicted_time_the_title_may_give() -> None:
    """A title with the plan's predicted time (the makespan and the runtime's host costs)
    finds that figure in the legend too, beside the makespan."""
    from autostream.report.gantt import gantt_figure
    from autostream.scheduling.solvers import solve

    g = nx.DiGraph([("a", "b"), ("a", "c")])
    nx.set_node_attributes(g, 1000.0, "duration")
    problem = SchedulingProblem(g, streams=2)
    plan = solve(problem, "heft")
    predicted = plan.makespan + 113.2
    title = f"{predicted:,.1f} us predicted"
    fig = gantt_figure(problem, plan, syncs_for(problem, plan), title=title,
                       predicted_us=predicted)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_title() == "2,113.2 us predicted"
    assert "predicted 2,113.2 us (the makespan and the runtime's host costs)" in labels
    assert "makespan 2,000.0 us (ops and syncs)" in labels
    assert ax.get_xlim()[1] > predicted  # the line is inside the chart
    # equal to the makespan (one stream, no runtime costs): no second line
    same = gantt_figure(problem, plan, syncs_for(problem, plan), predicted_us=plan.makespan)
    assert not any(t.get_text().startswith("predicted")
                   for t in same.axes[0].get_legend().get_texts())


def test_compare_says_whether_graph_dumps_were_rendered(tmp_path, monkeypatch, capsys) -> None:
    from autostream.cli import main
    from autostream.report import dot

    stg = tmp_path / "g.stg"
    stg.write_text("2\n0 0 0\n1 3 1 0\n2 3 1 0\n3 0 2 1 2\n")
    monkeypatch.setattr(dot.shutil, "which", lambda name: None)
    assert main(["compare", str(stg), "--solvers", "single,heft", "--out",
                 str(tmp_path / "out")]) == 0
    out = capsys.readouterr()
    assert "*_graph.dot (Graphviz's `dot` is not installed, so no SVG" in out.out
    assert "planning with single ...\nplanning with heft ..." in out.err  # progress
    assert not list((tmp_path / "out").glob("*.svg"))


def _chain(n: int, us: float, name: str) -> SchedulingProblem:
    g = nx.DiGraph([(f"{name}{i}", f"{name}{i + 1}") for i in range(n - 1)])
    nx.set_node_attributes(g, us, "duration")
    return SchedulingProblem(g, streams=1)


def test_gantt_labels_stay_inside_their_bars() -> None:
    """Issue 51, item 13: names of narrow bars are cut or left out, never overlapping."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from autostream.report.gantt import gantt_figure
    from autostream.scheduling.solvers import solve

    problem = _chain(20, 1.0, "a_rather_long_operator_name_")
    plan = solve(problem, "single")
    fig = gantt_figure(problem, plan)
    ax = fig.axes[0]
    renderer = (fig.canvas if isinstance(fig.canvas, FigureCanvasAgg)
                else FigureCanvasAgg(fig)).get_renderer()
    mid = {(plan.start[n] + plan.end[n]) / 2: n for n in plan.order}
    labels = sorted(((t.get_window_extent(renderer), mid[t.get_position()[0]]) for t in ax.texts
                     if t.get_text()), key=lambda b: b[0].x0)
    assert labels, "bars this wide have room for a few characters"
    for (a, _), (b, _) in zip(labels, labels[1:], strict=False):
        assert a.x1 <= b.x0, "two labels overlap"
    for box, op in labels:
        (x0, _), (x1, _) = ax.transData.transform([(plan.start[op], 0), (plan.end[op], 0)])
        assert x0 <= box.x0 and box.x1 <= x1, f"{op}'s label runs out of its bar"


def test_gantt_legend_writes_every_figure_alike() -> None:
    """Issue 51, item 13: ``7,720.8 us`` everywhere, never ``7720.8 us`` beside it."""
    from autostream.report.gantt import gantt_figure
    from autostream.scheduling.solvers import solve

    problem = _chain(4, 1930.2, "op")
    plan = solve(problem, "single")
    fig = gantt_figure(problem, plan)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "makespan 7,720.8 us (ops and syncs)" in labels
    assert "lower bound 7,720.8 us" in labels
