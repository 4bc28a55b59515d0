"""``autostream plan``: .stg and model specs, the JSON contract, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autostream.cli import main
from autostream.models.stg import benchmark_missing

STG = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "stg"
KEYS = {"solver", "nodes", "streams_used", "makespan_us", "lower_bound_us", "single_stream_us",
        "num_syncs", "optimal", "plan_seconds"}
SMALL = "4\n0 0 0\n1 3 1 0\n2 3 1 0\n3 3 1 0\n4 3 1 0\n5 0 4 1 2 3 4\n"


def test_plan_stg_prints_a_summary_and_writes_the_json(tmp_path, capsys):
    stg = tmp_path / "fork.stg"
    stg.write_text(SMALL)
    out = tmp_path / "plan.json"
    assert main(["plan", str(stg), "--streams", "2", "--solver", "cpsat", "--time-limit", "1",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert KEYS <= set(data)
    assert data["solver"] == "cpsat" and data["nodes"] == 6
    assert data["makespan_us"] == pytest.approx(6.0) and data["optimal"] is True
    assert data["single_stream_us"] == pytest.approx(12.0)
    assert data["streams_used"] == 2 and data["num_syncs"] >= 1
    text = capsys.readouterr().out
    assert "proven optimal" in text and "6.00 us" in text


def test_plan_single_stream_has_no_syncs(tmp_path):
    stg = tmp_path / "fork.stg"
    stg.write_text(SMALL)
    out = tmp_path / "plan.json"
    assert main(["plan", str(stg), "--streams", "1", "--solver", "heft", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["streams_used"] == 1 and data["num_syncs"] == 0
    assert data["makespan_us"] == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--streams", "0"], "--streams must be >= 1"),
        (["--time-limit", "0"], "--time-limit must be > 0"),
        (["--solver", "fastest"], "unknown solver 'fastest'"),
        (["--core-budgets"], "--core-budgets needs a model"),
    ],
)
def test_plan_bad_input_exits_2_with_the_reason(tmp_path, capsys, argv, message):
    stg = tmp_path / "fork.stg"
    stg.write_text(SMALL)
    assert main(["plan", str(stg), *argv]) == 2
    assert message in capsys.readouterr().err


def test_plan_missing_or_malformed_files(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "none.stg")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.stg"
    bad.write_text("1\n0 0 0\n1 x 1 0\n2 0 1 1\n")
    assert main(["plan", str(bad)]) == 2
    assert "bad.stg:3: field 'time'" in capsys.readouterr().err
    assert main(["plan", "no_such_module_xyz:make"]) == 2
    assert "cannot import module" in capsys.readouterr().err


@pytest.mark.skipif(not STG.is_dir(), reason=benchmark_missing(STG))
def test_plan_real_stg_file(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", str(STG / "50" / "rand0000.stg"), "--streams", "8", "--solver", "cpsat",
                 "--time-limit", "3", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["makespan_us"] == pytest.approx(55.0)  # optimal.csv
    assert data["lower_bound_us"] == pytest.approx(55.0)


def test_plan_model_spec(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "autostream.models.zoo:article_model", "--streams", "2", "--solver", "heft",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert KEYS <= set(data)
    assert data["nodes"] >= 2 and data["makespan_us"] <= data["single_stream_us"] + 1e-9


def test_plan_json_has_the_time_of_every_stage_of_the_pass(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "autostream.models.zoo:multihead_block", "--streams", "4", "--cost-table",
                 "ascend910b", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    stages = data["stage_seconds"]
    assert set(stages) == {"graph", "costs", "solve", "syncs", "rewrite", "verify"}
    assert data["applied"] is True and data["streams_used"] > 1  # rewritten and verified
    assert data["pass_seconds"] == pytest.approx(sum(stages.values()), abs=1e-3)
    assert "pass time" in capsys.readouterr().out


@pytest.mark.parametrize(("optimal", "solver", "source", "words"), [
    (False, "cpsat", "heft", "cpsat: feasible, not proven optimal within its time budget; the "
                             "plan is HEFT's, its warm start: the search found none faster"),
    (False, "cpsat", "single", "cpsat: feasible, not proven optimal within its time budget; "
                               "the plan is one stream: no multi-stream plan it found is "
                               "predicted faster"),
    (True, "cpsat", "cpsat", "cpsat: proven optimal"),
    (False, "cpsat", "opara", "the plan is the opara baseline's (of its portfolio)"),
    (False, "heft", None, "heft: a heuristic: no optimality proof"),
])
def test_plan_says_what_its_status_and_the_plans_origin_mean(optimal, solver, source, words):
    from autostream.commands.plan import describe

    summary = {"solver": solver, "optimal": optimal, "nodes": 3, "streams_used": 2,
               "makespan_us": 5.0, "lower_bound_us": 4.0, "single_stream_us": 8.0,
               "num_syncs": 1, "plan_seconds": 0.1,
               "solver_stats": {"source": source} if source else {}}
    first = describe("m:f", summary).splitlines()[0]
    assert first.startswith("plan m:f: ") and words in first
    assert "plan from" not in first


@pytest.mark.slow
def test_plan_names_the_runtime_its_predictions_are_for(tmp_path, capsys):
    """A CUDA table plans for the graph runtime by default; on the interpreted streams
    runtime one host thread issues every op, and this small graph is host-bound."""
    figures = {}
    for runtime in ("auto", "streams"):
        out = tmp_path / f"{runtime}.json"
        assert main(["plan", "autostream.models.zoo:moe_model", "--cost-table", "h200",
                     "--streams", "2", "--solver", "heft", "--runtime", runtime,
                     "--json", str(out)]) == 0
        figures[runtime] = json.loads(out.read_text())
        text = capsys.readouterr().out
        name = "graph" if runtime == "auto" else runtime
        assert f"runtime            {name} (the predictions are for it)" in text
        assert f"on the {name} runtime)" in text
    assert figures["auto"]["runtime"] == "graph" and figures["auto"]["streams_used"] == 2
    streams = figures["streams"]
    assert streams["runtime"] == "streams" and streams["streams_used"] == 1
    # issued one op at a time, the single stream takes longer than its device time
    assert streams["single_stream_us"] > 2 * figures["auto"]["single_stream_us"]
    assert main(["plan", "autostream.models.zoo:moe_model", "--runtime", "gpu"]) == 2
    assert "--runtime 'gpu': choose auto or one of graph, streams" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_plan_and_compare_default_to_what_torch_compile_plans(command):
    """Issue 51, item 10: ``plan SPEC`` previews ``torch.compile(backend="autostream")``."""
    from autostream.cli import build_parser
    from autostream.passes import AutoStreamPass

    args = build_parser().parse_args([command, "m:f"])
    compiled = AutoStreamPass()  # what backend() and torch.compile's "autostream" plan with
    assert args.streams == compiled.max_streams
    assert getattr(args, "solver", compiled.solver) == compiled.solver


BROKEN = """
import torch

class Broken(torch.nn.Module):
    def forward(self, x):
        a = torch.relu(x @ x) + torch.tanh(x @ x.T)
        torch._dynamo.graph_break()
        return torch.sigmoid(a @ a) + torch.relu(a @ a.T) + torch.tanh(a @ x)

def model():
    return Broken(), (torch.randn(64, 64),)
"""


def test_plan_plans_every_graph_of_a_model_with_a_graph_break(tmp_path, capsys):
    """Issue 51, item 9: every graph is planned, as torch.compile does, and named."""
    spec = tmp_path / "broken.py"
    spec.write_text(BROKEN)
    out = tmp_path / "plan.json"
    assert main(["plan", f"{spec}:model", "--solver", "heft", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    graphs = data["graphs"]
    assert [g["graph"] for g in graphs] == [1, 2]
    assert [g["shown"] for g in graphs].count(True) == 1
    assert all(g["nodes"] >= 2 and g["predicted_us"] > 0 for g in graphs)
    [shown] = [g for g in graphs if g["shown"]]
    assert shown["nodes"] == data["nodes"]  # the figures printed first are the largest's
    text = capsys.readouterr().out
    assert "graphs             2: Dynamo split the model at graph breaks" in text
    assert "graph 1" in text and "graph 2" in text
    assert main(["compare", f"{spec}:model", "--solvers", "single", "--out",
                 str(tmp_path / "cmp")]) == 0
    assert "split the model at graph breaks into 2 graphs" in capsys.readouterr().out


def test_a_plan_that_meets_its_lower_bound_is_not_called_unproven():
    """Issue 51, item 13: no "feasible, not proven optimal" at a 0.00% gap."""
    from autostream.commands.plan import describe

    summary = {"solver": "cpsat", "optimal": False, "nodes": 3, "streams_used": 1,
               "makespan_us": 5.0, "lower_bound_us": 5.0, "single_stream_us": 5.0,
               "num_syncs": 0, "plan_seconds": 0.1, "solver_stats": {}}
    text = describe("m:f", summary)
    assert "not proven optimal" not in text and "optimal" in text.splitlines()[0]
    assert "(gap 0.00%)" in text
    close = describe("m:f", {**summary, "makespan_us": 5.0000001})
    assert "not proven optimal" in close and "(gap under 0.01%)" in close


def test_plan_on_a_hand_placed_layer_says_to_check_it(capsys):
    """The experts' layers are graphs with fake values and no inputs: ``plan`` reads the
    graph itself (it crashed calling it with none) and points to ``check``."""
    assert main(["plan", "autostream.models.experts:coarse"]) == 2
    err = capsys.readouterr().err
    assert "already contains stream op" in err and "autostream check SPEC" in err
    assert "internal error" not in err
