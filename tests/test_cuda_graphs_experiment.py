"""``experiments.cuda_graphs`` end to end on the CPU: every variant built and timed, the rows
and headline rows computed, the JSON written (the graph runtime on a fake device: no GPU
here; the real run is on a lent GPU)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from experiments import cuda_graphs
from tests.fake_device import (
    FakeCosts,
    FakeDeviceTimer,
    FakeStreams,
    LoggedOps,
    fake_device,
    patch_backend_to_fake_capture,
)


@pytest.mark.slow
def test_the_experiment_writes_one_row_per_case_with_the_issues_keys(monkeypatch, tmp_path):
    devices = patch_backend_to_fake_capture(monkeypatch)
    code = cuda_graphs.main(["--out", str(tmp_path), "--device", "cpu", "--scale", "16",
                             "--models", "two_branch_gemv", "qwen3_moe_decode",
                             "--cost-table", "h200", "--no-inductor", "--rounds", "2",
                             "--runs", "2", "--warmup", "1", "--streams", "2"])
    assert code == 0
    data = json.loads((tmp_path / "cuda_graphs.json").read_text())
    rows = data["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [
        ("qwen3_moe_decode", 1), ("qwen3_moe_decode", 8), ("qwen3_moe_decode", 64),
        ("two_branch_gemv", 16)]
    keys = {"model", "batch", "eager_us", "inductor_ro_us", "graph1_us", "autostream_us",
            "predicted", "measured", "kept", "bitwise"}
    for r in rows:
        assert keys <= set(r)
        assert r["measured"] == pytest.approx(r["graph1_us"] / r["autostream_us"])
        assert len(r["measured_rounds"]) == 2 and r["kept"] in ("graph", "graph1", "eager")
        assert r["runtime"] == "graph" and r["bitwise"] is True
    assert devices and all(d.captures >= 1 for d in devices)
    for r in rows:  # every runner captured: the row counts, and says what its runners did
        assert r["captured"] is True and r["not_captured"] == []
        assert any(k.startswith("autostream") for k in r["runners"])
        assert any(k.startswith("graph1") for k in r["runners"])
        assert any(k.startswith("auto") for k in r["runners"])
        assert all(d.startswith("captured 1 graph") for d in r["runners"].values())
    assert data["complete"] is True and data["failed"] == data["skipped"] == []
    lines = (tmp_path / "cuda_graphs.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["row"] * len(rows)
    log = (tmp_path / "cuda_graphs.log").read_text()
    assert log.count("one-stream graph") == len(rows)


def test_headlines_follow_the_targets():
    rows = [cuda_graphs.Row("googlenet", 1, graph1_us=2.0, autostream_us=1.0, auto_us=1.0,
                            measured=2.0, predicted=1.8, error=2.0 / 1.8 - 1, kept="graph",
                            bitwise=True, measured_rounds=[1.9, 2.0, 2.1]),
            cuda_graphs.Row("qwen3_moe_decode", 8, graph1_us=1.0, autostream_us=1.02,
                            auto_us=1.0, measured=0.98, predicted=1.1, error=0.98 / 1.1 - 1,
                            kept="graph1", bitwise=False, measured_rounds=[0.98])]
    heads = {h.what.split(" (")[0].split(":")[0]: h for h in cuda_graphs.headlines(rows, "h200")}
    assert heads["GoogLeNet batch 1"].met is True
    assert heads["GoogLeNet batch 1"].machine == "h200"
    assert heads["MoE decode layers at 1-8 tokens"].met is False
    assert heads["outputs bitwise equal to the one-stream graph"].measured == "1 of 2 cases"
    errors = next(h for h in heads.values() if "median |error|" in h.what)
    assert errors.measured == "11.0%" and errors.met is True  # median of 11.1% and 10.9%


def _fake_rows(monkeypatch, step_s: float = 1.0, fail: dict | None = None):
    """``run_case`` replaced: each case advances a fake clock by ``step_s`` and returns a
    row, or raises ``fail[(model, batch)]``; returns the clock and the cases run."""
    now = [0.0]
    ran: list[tuple[str, int]] = []

    def run_case(case, *args, **kwargs):
        ran.append((case.model, case.batch))
        now[0] += step_s
        exc = (fail or {}).get((case.model, case.batch))
        if exc is not None:
            raise exc
        return cuda_graphs.Row(case.model, case.batch, graph1_us=2.0, autostream_us=1.0,
                               measured=2.0, predicted=2.0, kept="graph", bitwise=True,
                               measured_rounds=[2.0])

    monkeypatch.setattr(cuda_graphs, "run_case", run_case)
    return (lambda: now[0]), ran


ARGS = ["--device", "cpu", "--cost-table", "h200", "--no-inductor"]


def test_a_crash_in_one_row_leaves_the_earlier_rows_on_disk(monkeypatch, tmp_path):
    clock, ran = _fake_rows(monkeypatch, fail={
        ("googlenet", 8): RuntimeError("CUDA out of memory"),
        ("qwen3_moe_decode", 8): KeyboardInterrupt()})  # the slot taken away mid-run
    with pytest.raises(KeyboardInterrupt):
        cuda_graphs.main(["--out", str(tmp_path), *ARGS], clock=clock)
    assert ran == [("googlenet", 1), ("googlenet", 8), ("qwen3_moe_decode", 1),
                   ("qwen3_moe_decode", 8)]
    data = json.loads((tmp_path / "cuda_graphs.json").read_text())
    assert data["complete"] is False and data["total_s"] is None
    assert [(r["model"], r["batch"]) for r in data["rows"]] == [("googlenet", 1),
                                                               ("qwen3_moe_decode", 1)]
    assert data["failed"] == [{"model": "googlenet", "batch": 8, "seconds": 1.0,
                               "error": "RuntimeError: CUDA out of memory"}]
    lines = [json.loads(x) for x in (tmp_path / "cuda_graphs.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["model"], x["batch"]) for x in lines] == [
        ("row", "googlenet", 1), ("failed", "googlenet", 8), ("row", "qwen3_moe_decode", 1)]
    log = (tmp_path / "cuda_graphs.log").read_text()
    assert "googlenet @8: FAILED RuntimeError: CUDA out of memory" in log


def test_a_failed_calibration_is_recorded_and_the_run_goes_on_with_the_shipped_table(
        monkeypatch, tmp_path):
    clock, ran = _fake_rows(monkeypatch)
    tables = []
    monkeypatch.setattr(cuda_graphs, "run_case",
                        lambda case, device, table, *a, **k: tables.append(table) or
                        cuda_graphs.Row(case.model, case.batch, graph1_us=1.0,
                                        autostream_us=1.0, measured=1.0))

    def calibrate(*args):
        raise RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")

    monkeypatch.setattr(cuda_graphs, "calibrate", calibrate)
    code = cuda_graphs.main(["--out", str(tmp_path), "--device", "cpu", "--no-inductor",
                             "--quick"], clock=clock)
    assert code == 0
    data = json.loads((tmp_path / "cuda_graphs.json").read_text())
    assert data["calibration_failed"] == "RuntimeError: CUBLAS_STATUS_ALLOC_FAILED"
    assert data["table"] == cuda_graphs.SHIPPED_TABLE and data["complete"] is True
    assert tables == [cuda_graphs.SHIPPED_TABLE] * 3 and len(data["rows"]) == 3
    assert "calibration FAILED" in (tmp_path / "cuda_graphs.log").read_text()


def test_the_budget_stops_the_run_before_it_ends_and_records_the_skipped_cases(
        monkeypatch, tmp_path):
    clock, ran = _fake_rows(monkeypatch, step_s=10.0)
    # 0 s: runs (nothing measured yet); 10 s: 10 + 10 + 5 <= 30 runs; 20 s: 35 > 30 skips
    assert cuda_graphs.main(["--out", str(tmp_path), *ARGS, "--budget-s", "30"],
                            clock=clock) == 0
    assert ran == [("googlenet", 1), ("googlenet", 8)]
    assert clock() <= 30
    data = json.loads((tmp_path / "cuda_graphs.json").read_text())
    assert len(data["rows"]) == 2 and data["budget_s"] == 30
    assert [(s["model"], s["batch"]) for s in data["skipped"]] == [
        (c.model, c.batch) for c in cuda_graphs.cases()[2:]]
    assert data["skipped"][0]["why"] == ("budget: 10 s left of 30 s, a case takes up to 10 s "
                                         "(5 s kept for the end)")


def test_a_bad_budget_names_the_option(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cuda_graphs.main(["--out", str(tmp_path), *ARGS, "--budget-s", "0"])
    assert "--budget-s must be > 0 seconds, got 0.0" in capsys.readouterr().err


def test_quick_runs_one_case_per_family(monkeypatch, tmp_path):
    clock, ran = _fake_rows(monkeypatch)
    assert cuda_graphs.main(["--out", str(tmp_path), *ARGS, "--quick"], clock=clock) == 0
    assert ran == [("googlenet", 1), ("qwen3_moe_decode", 1), ("two_branch_gemv", 16)]
    families = {c.family for c in cuda_graphs.cases()}
    assert len(ran) == len(families) == 3


def _refusing_graph_runners(monkeypatch, refuse: str):
    """The backend on fake devices whose every capture raises ``refuse``."""
    import importlib

    from autostream.runtime import select
    from autostream.runtime.graphed import GraphRunner

    patch_backend_to_fake_capture(monkeypatch)
    backend_module = importlib.import_module("autostream.backend")

    def make_runner(gm, kind, **options):
        if kind != "graph":
            return select.make_runner(gm, kind, **options)
        streams, graphs = fake_device(refuse=refuse)
        return GraphRunner(gm, graph_api=lambda d: graphs, stream_api=lambda d: streams,
                           **options)

    monkeypatch.setattr(backend_module, "make_runner", make_runner)


def test_a_row_whose_runners_did_not_capture_is_marked_and_counts_towards_no_target(
        monkeypatch):
    _refusing_graph_runners(monkeypatch, "operation not permitted when stream is capturing")
    [case] = cuda_graphs.cases(only=["two_branch_gemv"])
    said = []
    row = cuda_graphs.run_case(case, torch.device("cpu"), "h200", 2, 1, 2, 1, False,
                               said.append)
    assert row.captured is False
    assert any(w.startswith("autostream") and "refused at call time: capture failed "
               "(RuntimeError: operation not permitted when stream is capturing)" in w
               for w in row.not_captured)
    assert any(w.startswith("graph1") and "refused at call time" in w for w in row.not_captured)
    assert all(d.startswith("not captured") for d in row.runners.values()) and row.runners
    assert "NOT CAPTURED (counts towards no target)" in said[-1]
    # the uncaptured row is not counted, however fast it measured
    fast = cuda_graphs.Row("googlenet", 1, graph1_us=3.0, autostream_us=1.0, auto_us=1.0,
                           measured=3.0, predicted=3.0, error=0.0, kept="graph",
                           bitwise=True, measured_rounds=[3.0], captured=False,
                           not_captured=["autostream: refused at call time"])
    slow = cuda_graphs.Row("googlenet", 8, graph1_us=1.0, autostream_us=1.0, auto_us=1.0,
                           measured=1.0, predicted=1.5, error=1 / 1.5 - 1, kept="graph1",
                           bitwise=True, measured_rounds=[1.0])
    heads = cuda_graphs.headlines([fast, slow], "h200")
    assert not any(h.what.startswith("GoogLeNet batch 1") for h in heads)
    uncaptured = next(h for h in heads if "did not run captured" in h.what)
    assert uncaptured.measured == "1 of 2 cases" and "googlenet @1" in uncaptured.what
    assert uncaptured.met is False
    bitwise = next(h for h in heads if h.what.startswith("outputs bitwise"))
    assert bitwise.measured == "1 of 1 cases"
    errors = next(h for h in heads if "median |error|" in h.what)
    assert errors.measured == "33.3%"  # the slow row's alone


def test_a_runner_whose_effects_were_unknown_does_not_count():
    """Its writes were found by the warm-up, not by the ops' schemas: kept out of targets.
    The runner's own ``stats`` field is read (``GraphStats.effects_unknown``)."""
    from autostream.runtime.graphed import GraphStats

    stats = GraphStats(captures=1, effects_unknown="EffectsUnknown: an op without a schema")
    runner = SimpleNamespace(stats=stats, refused=None,
                             describe=lambda: "captured 1 graph, 9 replays")
    report = SimpleNamespace(capture_refused="", runtime="graph",
                             graph_runners=[("plan", runner)])
    described, why = cuda_graphs.capture_check("autostream", [report])
    assert described == {"autostream/plan": "captured 1 graph, 9 replays"}
    assert why == ["autostream/plan: effects unknown (EffectsUnknown: an op without a schema)"]
    stats.effects_unknown = ""
    assert cuda_graphs.capture_check("autostream", [report])[1] == []
    refused = SimpleNamespace(capture_refused="host sync (aten.item)", runtime="streams",
                              graph_runners=[])
    assert cuda_graphs.capture_check("graph1", [refused])[1] == [
        "graph1: refused at compile time: host sync (aten.item)"]


def test_device_time_is_read_from_the_injected_timer_beside_the_timed_call():
    streams = FakeStreams()
    timer = FakeDeviceTimer(streams, FakeCosts(op_us={"aten.mm.default": 5.0}))
    x = torch.randn(4, 4)
    variants = {"one": lambda: x @ x, "two": lambda: (x @ x) @ x}
    with LoggedOps(streams):
        host, device = cuda_graphs.time_variants(variants, 3, 1, torch.device("cpu"), timer)
    assert set(host) == {"one", "two"}
    # the timed call's ops alone: the untimed call before it is outside the marks
    assert device == {"one": 5.0, "two": 10.0}
