"""``calibrate --from-profile``: torch.profiler traces captured here on CPU, torch_npu
folders written by ``tests.npu_profiles``, merges, reports, bad inputs, profiled shares."""

from __future__ import annotations

import json
import statistics

import pytest
import torch
from torch.profiler import profile

from autostream.cli import main
from autostream.cost import CostTable, TableCostModel
from autostream.cost.from_profile import coverage, table_from_profile
from autostream.cost.prof_errors import ProfileError
from autostream.cost.signature import node_cost_key
from autostream.fx.capture import capture_graphs
from autostream.fx.graph import build_op_graph
from autostream.planning.plan import build_problem
from autostream.scheduling.simulate import simulate
from tests.npu_profiles import Kernel, Op, write_npu_profile


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) + 1)


def _trace(tmp_path, model, inputs, steps=3, shapes=True):
    path = tmp_path / "trace.json"
    with torch.no_grad(), profile(record_shapes=shapes) as p:
        for _ in range(steps):
            model(*inputs)
            p.step()
    p.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, inputs = Tiny().eval(), (torch.randn(4, 16),)
    return model, inputs, capture_graphs(model, inputs)


def test_cpu_trace_gives_the_graphs_signatures_with_median_times(tmp_path, tiny):
    model, inputs, graphs = tiny
    path = _trace(tmp_path, model, inputs)
    result = table_from_profile(path, graphs=graphs)
    cover = coverage(graphs, result.table)
    assert cover.fraction == 1.0, cover.missing
    # the addmm of the first layer: its entry is the median of its events' own spans
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("name") == "aten::addmm" and e["args"]["Input Dims"][1] == [4, 16]]
    assert len(events) == 3
    entry = next(e for e in result.table.entries
                 if e.op == "aten.addmm.default" and e.signature.startswith("f32[32], f32[4, 16]"))
    assert entry.samples == 3 and entry.provenance == "profile" and entry.timing == "graph"
    assert entry.time_us == pytest.approx(statistics.median(e["dur"] for e in events), abs=1e-3)
    # the planner finds the profiled entries as exact hits
    cm = TableCostModel(result.table)
    keys = {e.key for e in result.table.entries}
    for n in graphs[0].graph.nodes:
        if n.op == "call_function" and node_cost_key(n) in keys:
            assert cm.estimate(n).source == "exact"


def test_a_profile_table_is_labelled_with_the_machine_that_read_it_and_the_date(
        tmp_path, tiny, monkeypatch):
    import datetime

    from autostream.cost import from_profile

    model, inputs, _ = tiny
    path = _trace(tmp_path, model, inputs, steps=1)
    monkeypatch.setattr(from_profile, "device_name", lambda device: "Intel Xeon (8 cores)")
    monkeypatch.setattr(from_profile, "_utc_now", lambda: datetime.datetime(
        2027, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc))
    shipped = TableCostModel.load("cpu").table.device
    table = table_from_profile(path).table
    assert table.device["name"] == table.profile.name == "Intel Xeon (8 cores)"
    assert table.device["date"] == "2027-01-02T03:04:05Z"
    # the device profile is the shipped table's, and the label says whose
    assert f"shipped 'cpu' table's, {shipped['name']}'s (measured, {shipped['date'][:10]})" \
        in table.device["notes"]
    # merged into a table: its label stays (only one device's tables merge), the note says
    # which entries came from where
    merged = table_from_profile(path, merge=TableCostModel.load("cpu").table).table
    assert merged.device["name"] == shipped["name"] and merged.device["date"] == shipped["date"]
    note = merged.device["profile"]["note"]
    assert "read from" in note and "on 2027-01-02 on Intel Xeon (8 cores)" in note
    assert note.endswith(f"are {shipped['name']}'s (measured, {shipped['date'][:10]})")


def test_profile_without_shapes_is_an_error_naming_file_and_column(tmp_path, tiny):
    model, inputs, _ = tiny
    path = _trace(tmp_path, model, inputs, steps=1, shapes=False)
    with pytest.raises(ProfileError, match=r"trace\.json: event \d+, column 'args.Input Dims'.*"
                                           r"record_shapes=True"):
        table_from_profile(path)


@pytest.mark.parametrize("content, match", [
    (None, "does not exist"),
    ('{"traceEvents": [', r"line 1.*not valid JSON"),
    ('{"events": []}', r"column 'traceEvents'.*not a torch.profiler Chrome trace"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": "x", '
     '"args": {"Input Dims": [], "Input type": []}}]}', r"event 0, column 'dur'.*not a number"),
])
def test_bad_trace_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ProfileError, match=match):
        table_from_profile(path)


def test_cuda_kernels_sum_per_launching_op_with_sm_shares(tmp_path):
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50,
          "args": {"External id": 7, "Input Dims": [[64, 32], [32, 16]],
                   "Input type": ["c10::Half", "c10::Half"], "Input Strides": [[32, 1], [16, 1]],
                   "Concrete Inputs": ["", ""]}}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 3,
              "args": {"correlation": 99, "External id": 7}}
    k1 = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10, "dur": 6.0,
          "args": {"External id": 7, "correlation": 98, "grid": [33, 1, 1]}}
    k2 = {"ph": "X", "cat": "kernel", "name": "splitk_reduce", "ts": 20, "dur": 2.0,
          "args": {"correlation": 99, "grid": [132, 2, 1]}}
    stray = {"ph": "X", "cat": "kernel", "name": "other", "ts": 30, "dur": 1.0,
             "args": {"correlation": 5, "grid": [1, 1, 1]}}
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "numSms": 132}],
                                "traceEvents": [mm, launch, k1, k2, stray]}))
    result = table_from_profile(path)
    (entry,) = [e for e in result.table.entries if e.provenance == "profile"]
    assert (entry.op, entry.signature) == ("aten.mm.default", "f16[64, 32], f16[32, 16]")
    assert entry.time_us == 8.0  # both kernels of the op, summed
    assert entry.share == pytest.approx((6 * 33 / 132 + 2 * 1.0) / 8, abs=1e-4)
    assert result.unlinked_kernels == 1 and result.table.device["kind"] == "cuda"


def _mm(n: int, kernels: list[Kernel]) -> Op:
    return Op("aten::mm", [[n, 64], [64, 32]], ["c10::Half", "c10::Half"], kernels,
              [[64, 1], [32, 1]], ["", ""])


def _steps():
    """Three steps; mm has two kernels (summed), the last step runs mm at another size
    (dynamic shapes), softmax is a MIX kernel, nonzero runs on the AI CPU."""
    softmax = Op("aten::_softmax", [[8, 32], [], []], ["c10::Half", "Scalar", "Scalar"],
                 [Kernel("SoftmaxV2_mix", "MIX_AIV", 4.0, 24, 12)], [[32, 1], [], []],
                 ["", "-1", "False"])
    nonzero = Op("aten::nonzero", [[8, 32]], ["c10::Half"], [Kernel("NonZero", "AI_CPU", 30.0, 1)],
                 [[32, 1]], [""])
    steps = []
    for s, (gemm, cast) in enumerate([(10.0, 2.0), (30.0, 4.0), (11.0, 2.0)]):
        n = 8 if s < 2 else 16
        mm = _mm(n, [Kernel("MatMulV2_1", "AI_CORE", gemm, 12), Kernel("Cast_2", "AI_VECTOR_CORE",
                                                                          cast, 48)])
        steps.append([mm, softmax, nonzero] if s < 2 else [mm, _mm(8, mm.kernels), softmax])
    return steps


def _softmax_graph():
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(lambda x: torch.ops.aten._softmax(x, -1, False), tracing_mode="fake")(
        torch.ones(8, 32, dtype=torch.half))


def test_npu_folder_sums_kernels_takes_medians_and_profiled_shares(tmp_path):
    root = write_npu_profile(tmp_path, _steps())
    assert {e.op for e in table_from_profile(root).table.entries} == {
        "aten.mm.default", "aten.nonzero.default"}  # softmax's dim was not recorded
    # the model's graph supplies the scalars torch_npu does not record
    result = table_from_profile(root, graphs=[_softmax_graph()])
    table = result.table
    by = {(e.op, e.signature): e for e in table.entries}
    mm8 = by[("aten.mm.default", "f16[8, 64], f16[64, 32]")]
    mm16 = by[("aten.mm.default", "f16[16, 64], f16[64, 32]")]
    # step 1: 12, step 2: 34, step 3: 13 (the same mm again at the step's end)
    assert (mm8.samples, mm8.time_us) == (3, 13.0)
    assert (mm16.samples, mm16.time_us) == (1, 13.0)
    # share: time-weighted over the op's kernels (12 of 24 cube cores, 48 of 48 vector cores)
    assert mm8.share == pytest.approx((11 * 0.5 + 2 * 1.0) / 13, abs=1e-4)
    softmax = by[("aten._softmax.default", "f16[8, 32], -1, False")]
    assert softmax.share == 0.5  # MIX_AIV: 24 of 48 vector cores, 12 of 24 cube cores
    assert by[("aten.nonzero.default", "f16[8, 32]")].share == 0.0  # AI_CPU
    assert result.steps == 3 and result.unlinked_kernels == 0 and result.adopted == 1
    assert table.device["kind"] == "npu" and table.profile.cores == {"cube": 24, "vector": 48}
    assert all(e.provenance == "profile" for e in table.entries)


def test_npu_folder_found_from_its_parent_or_its_output_dir(tmp_path):
    root = write_npu_profile(tmp_path, _steps()[:1])
    a = table_from_profile(tmp_path).table
    b = table_from_profile(root / "ASCEND_PROFILER_OUTPUT").table
    assert {e.key for e in a.entries} == {e.key for e in b.entries} != set()


def test_npu_profile_without_shapes(tmp_path):
    root = write_npu_profile(tmp_path, _steps(), shapes=False, step_ids=False)
    with pytest.raises(ProfileError, match=r"trace_view\.json: event \d+, column 'args.Input Dims'"):
        table_from_profile(root)


def test_npu_bad_csv_names_row_and_column(tmp_path):
    root = write_npu_profile(tmp_path, _steps())
    csv_path = root / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    lines = csv_path.read_text().splitlines()
    cols = lines[0].split(",")
    row = lines[2].split(",")
    row[cols.index("Duration(us)")] = "abc"
    csv_path.write_text("\n".join([lines[0], lines[1], ",".join(row), *lines[3:]]) + "\n")
    with pytest.raises(ProfileError, match=r"kernel_details\.csv: row 3, column 'Duration\(us\)': "
                                           r"is 'abc'"):
        table_from_profile(root)
    csv_path.write_text(",".join(c for c in cols if c != "Block Num") + "\n")
    with pytest.raises(ProfileError, match=r"header, column 'Block Num': is missing"):
        table_from_profile(root)
    (root / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").unlink()
    with pytest.raises(ProfileError, match=r"kernel_details\.csv: does not exist"):
        table_from_profile(root)


def test_merge_round_trip_and_disagreements(tmp_path, capsys):
    root = write_npu_profile(tmp_path / "p", _steps())
    out = tmp_path / "t.json"
    assert main(["calibrate", "--from-profile", str(root), "--merge", "ascend910b",
                 "--out", str(out)]) == 0
    first = CostTable.load(out, expect_kind="npu")
    shipped = TableCostModel.load("ascend910b").table
    assert first.profile == shipped.profile and first.links == shipped.links
    assert len(first.entries) == 3 and all(e.provenance == "profile" for e in first.entries)
    # merged into itself: the same entries, the report finds every one in common, none differs
    assert main(["calibrate", "--from-profile", str(root), "--merge", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 signatures in common, median profile/table time 1.00; 0 differ" in text
    assert CostTable.load(out).entries == first.entries
    # a table that times one signature 3x slower: reported, and the profile's time wins
    slow = CostTable(device=first.device, profile=first.profile, entries=tuple(
        e if e.op != "aten.nonzero.default" else
        type(e)(**{**e.__dict__, "time_us": 90.0, "median_us": 90.0, "provenance": "microbenchmark"})
        for e in first.entries))
    slow.save(tmp_path / "slow.json")
    assert main(["calibrate", "--from-profile", str(root), "--merge", str(tmp_path / "slow.json"),
                 "--out", str(tmp_path / "t2.json")]) == 0
    text = capsys.readouterr().out
    assert "1 differ by more than 1.5x" in text and "aten.nonzero.default(f16[8, 32]): profile 30.0 us, table 90.0 us" in text
    merged = CostTable.load(tmp_path / "t2.json")
    assert next(e for e in merged.entries if e.op == "aten.nonzero.default").time_us == 30.0


def test_merge_into_another_device_kind_is_refused(tmp_path):
    root = write_npu_profile(tmp_path, _steps()[:1])
    with pytest.raises(ValueError, match="ran on a npu device.*merge into a npu table"):
        table_from_profile(root, merge=TableCostModel.load("cpu").table)


def test_profiled_shares_set_the_simulated_contention(tmp_path):
    """Two independent matmuls on two streams: 12 of 24 cube cores each overlap fully,
    24 of 24 each serialise; the simulator follows the profiled share."""
    def run(blocks: int) -> float:
        sub = tmp_path / f"b{blocks}"
        op = Op("aten::mm", [[8, 64], [64, 32]], ["c10::Half", "c10::Half"],
                [Kernel("MatMulV2", "AI_CORE", 40.0, blocks)], [[64, 1], [32, 1]], ["", ""])
        table = table_from_profile(write_npu_profile(sub, [[op]])).table
        a, b = torch.ones(8, 64, dtype=torch.half), torch.ones(64, 32, dtype=torch.half)
        from torch.fx.experimental.proxy_tensor import make_fx
        gm = make_fx(lambda a, b, c: (a @ b, c @ b), tracing_mode="fake")(a, b, a)
        og = build_op_graph(gm)
        cm = TableCostModel(table)
        est = {n: cm.estimate(d["fx"]) for n, d in og.nodes(data=True)}
        assert sorted(e.share for e in est.values() if e.duration_us) == [blocks / 24] * 2
        problem = build_problem(og, est, 2, 0.0)
        mms = [n for n, d in og.nodes(data=True) if est[n].duration_us]
        stream = {n: (1 if n == mms[1] else 0) for n in og.nodes}
        order = sorted(og.nodes, key=lambda n: og.nodes[n]["order"])
        _, end = simulate(problem, stream, order)
        return max(end.values())
    assert run(12) == pytest.approx(40.0)
    assert run(24) == pytest.approx(80.0)


MODEL_FILE = '''
import torch

def tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval(), (torch.randn(4, 16),)
'''


def test_command_reports_coverage_of_the_models_and_errors(tmp_path, capsys):
    spec = tmp_path / "models.py"
    spec.write_text(MODEL_FILE)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
    trace = _trace(tmp_path, model, (torch.randn(4, 16),), steps=2)
    out = tmp_path / "t.json"
    assert main(["calibrate", "--from-profile", str(trace), f"{spec}:tiny", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "coverage: 2/2 ops of the model (100.0%) have a profiled entry" in text
    assert CostTable.load(out, expect_kind="cpu").entries
    # another model's ops are reported missing, by signature
    trace2 = _trace(tmp_path, torch.nn.Tanh(), (torch.randn(3, 5),), steps=1)
    assert main(["calibrate", "--from-profile", str(trace2), f"{spec}:tiny", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "coverage: 0/2 ops" in text and "missing aten.addmm.default(f32[32], f32[4, 16]" in text
    assert main(["calibrate", "--from-profile", str(tmp_path / "nope.json"), "--out",
                 str(out)]) == 2
    assert "nope.json: does not exist" in capsys.readouterr().err
    assert main(["calibrate", "--from-profile", str(trace), "--runs", "3", "--out", str(out)]) == 2
    assert "--runs apply to timing ops, not to --from-profile" in capsys.readouterr().err


def test_cpu_profile_merged_keeps_the_tables_share_and_split(tmp_path, tiny):
    model, inputs, graphs = tiny
    path = _trace(tmp_path, model, inputs, steps=2)
    first = table_from_profile(path).table
    addmm = next(e for e in first.entries if e.op == "aten.addmm.default")
    assert addmm.share == 1.0 and addmm.split == 1.0  # unknown: the cautious share
    measured = CostTable(device=first.device, profile=first.profile, entries=(
        type(addmm)(**{**addmm.__dict__, "share": 0.3, "split": 1.7, "time_us": 999.0,
                       "provenance": "microbenchmark"}),))
    merged = table_from_profile(path, merge=measured).table
    again = next(e for e in merged.entries if e.key == addmm.key)
    assert (again.share, again.split, again.provenance) == (0.3, 1.7, "profile")
    assert again.time_us != 999.0
