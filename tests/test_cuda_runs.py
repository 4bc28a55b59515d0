"""The kept GPU runs are rendered as measured (experiments.cuda_runs)."""

from __future__ import annotations

import json

from experiments import cuda_runs


def test_speedup_rows_render_and_a_missing_prediction_reads_na(tmp_path):
    rows = [{"model": "probe", "streams": 2, "eager_ms": 0.4, "as_seq_ms": 0.42,
             "plan_ms": 0.47, "predicted": float("nan"), "plan_measured": 0.84, "kept": None},
            {"model": "moe", "streams": 2, "eager_ms": 0.944, "as_seq_ms": 1.141,
             "plan_ms": 1.416, "predicted": 1.86, "plan_measured": 0.67, "kept": "eager"}]
    lines = cuda_runs.speedup_table(rows)
    assert "| probe | 2 | 0.400 | 0.420 | 0.470 | n/a | 0.84x | - |" in lines
    assert "| moe | 2 | 0.944 | 1.141 | 1.416 | 1.86x | 0.67x | eager |" in lines
    run = tmp_path / "gpu-day"
    run.mkdir()
    (run / "speedup_cuda.json").write_text(json.dumps(rows))
    assert cuda_runs.kept_runs(tmp_path) == [run]


def test_the_kept_h200_run_is_there_and_says_what_it_measured():
    [run] = [r for r in cuda_runs.kept_runs() if r.name == "h200-2026-12-04"]
    data = json.loads((run / "inductor_streams.json").read_text())
    lines = cuda_runs.inductor_table(data)
    assert data["torch"].startswith("2.11") and data["missing"]
    assert len([line for line in lines if line.startswith("| ") and "eager" not in line]) \
        == len(data["rows"])


def test_a_kept_cuda_graphs_run_renders_with_its_spread_and_headlines(tmp_path, monkeypatch):
    row = {"model": "googlenet", "batch": 1, "eager_us": 3700.0, "inductor_ro_us": 1500.0,
           "graph1_us": 1970.0, "autostream_us": 1160.0, "auto_us": 1170.0, "predicted": 1.6,
           "measured": 1970.0 / 1160.0, "error": 1970.0 / 1160.0 / 1.6 - 1, "kept": "graph",
           "bitwise": True, "measured_rounds": [1.65, 1.70, 1.72]}
    data = {"torch": "2.11.0", "table": "h200-calibrated.json", "method": "median of 3 rounds",
            "rows": [row]}
    lines = cuda_runs.graphs_table(data)
    assert ("| googlenet | 1 | 3,700.0 | 1,500.0 | 1,970.0 | 1,160.0 | 1.60x | 1.70x "
            "(1.65-1.72) | +6% | graph | 1,170.0 | yes |") in lines
    run = tmp_path / "h200-2026-12-05"
    run.mkdir()
    (run / "cuda_graphs.json").write_text(json.dumps(data))
    monkeypatch.setattr(cuda_runs, "kept_runs", lambda: [run])
    recorded = []
    monkeypatch.setattr("experiments.headline.record", lambda script, rows: recorded.extend(rows))
    cuda_runs.main()
    googlenet = next(h for h in recorded if "GoogLeNet batch 1" in h.what)
    assert googlenet.measured == "1.70x" and googlenet.met is True
    assert googlenet.what.startswith("h200-2026-12-05: GoogLeNet batch 1")
    assert googlenet.machine.endswith("torch 2.11.0")
