"""``experiments.cuda_graphs`` end to end on the CPU: every variant built and timed, the rows
and headline rows computed, the JSON written (the graph runtime on a fake device: no GPU
here; the real run is on a lent GPU)."""

from __future__ import annotations

import json

import pytest

from experiments import cuda_graphs
from tests.fake_device import patch_backend_to_fake_capture


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
