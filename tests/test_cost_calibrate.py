"""Calibration: a tiny model into a valid table, merge, device share, skips, bad devices."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autostream.calibration import calibrate_graphs
from autostream.cli import main
from autostream.cost import CostTable, TableCostModel
from autostream.cost.calibrate import OpCase, calibrate_ops, collect_ops
from autostream.cost.inputs import make_inputs
from autostream.cost.timing import CpuTimer, available_device
from autostream.fx.capture import capture_graphs
from autostream.models.modelspec import load_model_spec

FAST = ["--warmup", "0", "--repeat", "2", "--no-progress"]

MODEL_FILE = '''
import torch

def tiny():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), (torch.randn(2, 8),)

def other():
    return torch.nn.Tanh(), (torch.randn(3, 5),)

def not_a_pair():
    return 42
'''


@pytest.fixture
def spec_file(tmp_path):
    p = tmp_path / "models.py"
    p.write_text(MODEL_FILE)
    return p


def test_calibrate_command_writes_a_valid_table(tmp_path, spec_file, capsys):
    out = tmp_path / "t.json"
    assert main(["calibrate", f"{spec_file}:tiny", "--out", str(out), *FAST]) == 0
    table = CostTable.load(out, expect_kind="cpu")
    ops = {e.op for e in table.entries}
    assert {"aten.addmm.default", "aten.relu.default"} <= ops
    assert all(e.samples == 2 and e.median_us > 0 and 0 <= e.share <= 1 for e in table.entries)
    assert table.profile.origin == "measured" and table.profile.peak_flops["f32"] > 0
    assert table.device["settings"]["repeat"] == 2
    assert all(e.timing == "graph" and e.isolated_us > 0 for e in table.entries)
    assert "wrote" in capsys.readouterr().out
    # the table's own signatures come back as exact hits
    model, inputs = load_model_spec(f"{spec_file}:tiny")
    from autostream.fx.capture import capture_graphs
    gm = capture_graphs(model, inputs)[0]
    cm = TableCostModel.load(out)
    sources = {cm.estimate(n).source for n in gm.graph.nodes if n.op == "call_function"}
    assert "exact" in sources and "roofline" not in sources and "scaled" not in sources


@pytest.mark.slow
def test_merge_keeps_both_models(tmp_path, spec_file):
    out = tmp_path / "t.json"
    assert main(["calibrate", f"{spec_file}:tiny", "--out", str(out), *FAST]) == 0
    assert main(["calibrate", f"{spec_file}:other", "--out", str(out), "--merge", *FAST]) == 0
    table = CostTable.load(out)
    ops = {e.op for e in table.entries}
    assert {"aten.addmm.default", "aten.tanh.default"} <= ops
    assert len(table.device["models"]) == 2
    # without --merge the file is replaced
    assert main(["calibrate", f"{spec_file}:other", "--out", str(out), *FAST]) == 0
    assert "aten.addmm.default" not in {e.op for e in CostTable.load(out).entries}


def test_merge_into_a_table_for_another_device_fails_clearly(tmp_path, spec_file, capsys):
    out = tmp_path / "t.json"
    out.write_text(open(TableCostModel.load("h200").table.source).read())
    assert main(["calibrate", f"{spec_file}:tiny", "--out", str(out), "--merge", *FAST]) == 2
    err = capsys.readouterr().err
    assert "device.kind" in err and str(out) in err


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_unavailable_device_is_a_clear_error(tmp_path, spec_file, capsys, device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    if device == "npu":
        try:
            import torch_npu  # noqa: F401
            pytest.skip("torch_npu is installed")
        except ImportError:
            pass
    out = tmp_path / "t.json"
    assert main(["calibrate", f"{spec_file}:tiny", "--device", device, "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    assert f"'{device}' is not available" in err and "--device cpu" in err
    assert not out.exists()
    with pytest.raises(RuntimeError, match="not available"):
        available_device(device)


def test_bad_model_specs(spec_file):
    with pytest.raises(ValueError, match="module.path:function"):
        load_model_spec("no_colon_here")
    with pytest.raises(ValueError, match="no callable 'missing'"):
        load_model_spec(f"{spec_file}:missing")
    with pytest.raises(ValueError, match=r"\(model, example_inputs\)"):
        load_model_spec(f"{spec_file}:not_a_pair")
    with pytest.raises(FileNotFoundError):
        load_model_spec("nowhere/models.py:tiny")
    model, inputs = load_model_spec("autostream.models.zoo:article_model")
    assert isinstance(model, torch.nn.Module) and isinstance(inputs, tuple)


@torch.library.custom_op("autostream_test::boom", mutates_args=())
def _boom(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("boom: this kernel cannot run")


@_boom.register_fake
def _(x):
    return torch.empty_like(x)


def test_ops_that_cannot_run_are_skipped_with_a_reason():
    gm = make_fx(lambda x: torch.ops.autostream_test.boom(x).relu() + 1,
                 tracing_mode="fake")(torch.ones(4))
    cases = collect_ops([gm])
    relu = next(c for c in cases if c.sig.op == "aten.relu.default")
    data_dep = OpCase(replace(relu.sig, key="f32[u0]", approximate=True), relu.target)
    not_aten = OpCase(replace(relu.sig, op="my.fn", key="f32[4]"), lambda x: x)
    # a collective alone would wait for peers that are not calling it
    comm = OpCase(replace(relu.sig, op="_c10d_functional.all_reduce.default", key="f32[4]"),
                  torch.ops._c10d_functional.all_reduce.default)
    entries, skipped = calibrate_ops([*cases, data_dep, not_aten, comm], torch.device("cpu"),
                                     CpuTimer(scrub_bytes=0), warmup=0, repeat=2, progress=False)
    reasons = {s.op: s.reason for s in skipped}
    assert "boom: this kernel cannot run" in reasons["autostream_test.boom.default"]
    assert "failed on cpu" in reasons["autostream_test.boom.default"]
    assert "data-dependent" in reasons["aten.relu.default"]
    assert "not an ATen op overload" in reasons["my.fn"]
    assert "calibrate --collectives" in reasons["_c10d_functional.all_reduce.default"]
    assert {e.op for e in entries} == {"aten.relu.default", "aten.add.Tensor"}
    # the whole graph cannot run either: its ops keep their isolated times, with a note
    table = calibrate_graphs([gm], "cpu", warmup=0, repeat=2, measure_device=False,
                             progress=False)
    assert "could not run on random inputs" in table.device["notes"]
    assert {e.timing for e in table.entries} == {"isolated"}
    assert "autostream_test.boom.default" in {s.op for s in table.skipped}


class FakeTimer:
    """Scripted timings: alone vs together gives a chosen slowdown."""

    kind = "cpu"

    def __init__(self, slowdown: float) -> None:
        self.slowdown = slowdown

    def samples(self, fn, warmup, repeat):
        fn()
        return [10.0, 12.0, 11.0][:repeat] or [10.0]

    def contention(self, fn, fn2, n):
        # alone, together (at half the threads), alone at half the threads
        return 100.0, 130.0 * self.slowdown, 130.0

    def synchronize(self):
        pass


@pytest.mark.parametrize("slowdown, share", [(2.0, 1.0), (1.5, 0.75), (1.0, 0.5), (3.0, 1.0)])
def test_device_share_reproduces_the_measured_pair_slowdown(slowdown, share):
    gm = make_fx(lambda x: x.relu(), tracing_mode="fake")(torch.ones(4))
    (entry,), _ = calibrate_ops(collect_ops([gm]), torch.device("cpu"), FakeTimer(slowdown),
                                warmup=0, repeat=3, progress=False, rounds=1)
    assert entry.share == pytest.approx(share)
    assert entry.slowdown == pytest.approx(slowdown)
    assert entry.split == pytest.approx(1.3)  # half the threads: 30% slower alone
    assert entry.median_us == 11.0 and entry.spread_us == pytest.approx(1.0)
    assert entry.time_us == 10.0  # the fastest call of the (single) round


def test_inputs_follow_the_signature_including_strides():
    gm = make_fx(lambda a, b: a @ b.t(), tracing_mode="fake")(torch.ones(2, 3), torch.ones(4, 3))
    (case,) = collect_ops([gm])
    (a, b), _ = make_inputs(case.sig, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert a.shape == (2, 3) and b.shape == (3, 4) and not b.is_contiguous()
    assert case.sig.key == "f32[2, 3], f32[3, 4]T"


@pytest.mark.slow
def test_calibrated_cpu_tables_carry_the_runtime_costs(tmp_path):
    gm = make_fx(lambda x, w: torch.tanh(x @ w) + torch.relu(x @ w.t()),
                 tracing_mode="fake")(torch.ones(8, 8), torch.ones(8, 8))
    table = calibrate_graphs([gm], "cpu", warmup=0, repeat=3, progress=False)
    p = table.profile
    costs = (p.runtime_op_us, p.runtime_call_us, p.runtime_segment_us)
    assert min(costs) >= 0 and p.record_wait_us > 0
    assert sum(costs) > 0  # threads and events are never free
    assert p.compile_call_us > 0  # Dynamo's wrapper and guards are not free either
    out = tmp_path / "t.json"
    table.save(out)
    again = CostTable.load(out).profile
    assert (again.runtime_op_us, again.runtime_call_us, again.runtime_segment_us) == costs
    assert again.compile_call_us == p.compile_call_us


def test_compile_call_cost_is_recorded_as_zero_when_torch_compile_fails(monkeypatch, caplog):
    from autostream.cost import calibrate as calibrate_module

    def refuse(*args, **kwargs):
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(calibrate_module.torch, "compile", refuse)
    with caplog.at_level("WARNING", logger="autostream"):
        assert calibrate_module.compile_call_cost(torch.device("cpu"), repeat=4, rounds=1) == 0.0
    assert "Dynamo is not supported" in caplog.text and "recorded as 0" in caplog.text


@pytest.mark.parametrize("nodes, extra, expected", [
    ([10, 40, 160], [150.0, 240.0, 600.0], (3.0, 120.0, 0.0)),
    ([10, 40], [300.0, 200.0], (0.0, 250.0, 0.0)),  # a falling fit is noise: no per-node cost
    ([10, 40], [-5.0, -8.0], (0.0, 0.0, 0.0)),
])
def test_runtime_costs_fit(nodes, extra, expected):
    from autostream.runtime.overhead import fit_runtime_costs

    assert fit_runtime_costs(nodes, extra) == pytest.approx(expected)


def test_runtime_costs_fit_separates_segments_from_nodes():
    from autostream.runtime.overhead import RUNTIME_COST_GRAPHS, fit_runtime_costs

    # the calibration's own design: nodes and segments of each striped graph
    nodes = [2 * d + 1 for d, _ in RUNTIME_COST_GRAPHS]
    segments = [2 * s + 1 for _, s in RUNTIME_COST_GRAPHS]
    extra = [50.0 + 0.5 * n + 80.0 * s for n, s in zip(nodes, segments)]
    assert fit_runtime_costs(nodes, extra, segments) == pytest.approx((0.5, 50.0, 80.0))
    # a negative slope is dropped, the others refitted without it
    falling = [300.0 - 0.5 * n + 80.0 * s for n, s in zip(nodes, segments)]
    per_node, _, per_segment = fit_runtime_costs(nodes, falling, segments)
    assert per_node == 0.0 and per_segment > 0


@pytest.mark.slow
def test_several_runs_keep_the_median_of_each_number(tmp_path, spec_file, capsys):
    out = tmp_path / "t.json"
    assert main(["calibrate", f"{spec_file}:tiny", "--out", str(out), "--runs", "2", *FAST]) == 0
    table = CostTable.load(out)
    assert table.device["settings"]["runs"] == 2
    assert all(e.samples == 4 for e in table.entries)  # 2 timed calls in each of 2 runs
    assert main(["calibrate", f"{spec_file}:tiny", "--out", str(out), "--runs", "0", *FAST]) != 0
    assert "--runs must be >= 1" in capsys.readouterr().err


def test_median_table_takes_each_number_from_the_middle_run():
    from autostream.cost.table import median_table

    gm = make_fx(lambda x: x.relu(), tracing_mode="fake")(torch.ones(4))
    (entry,), _ = calibrate_ops(collect_ops([gm]), torch.device("cpu"), FakeTimer(1.0),
                                warmup=0, repeat=3, progress=False, rounds=1)
    base = CostTable.load(__import__("cost_models").table_path("cpu"))
    runs = [replace(base, entries=(replace(entry, time_us=t, share=s),),
                    profile=replace(base.profile, runtime_call_us=c))
            for t, s, c in ((10.0, 0.9, 300.0), (30.0, 0.5, 100.0), (20.0, 0.7, 200.0))]
    (got,) = median_table(runs).entries
    assert (got.time_us, got.share, got.samples) == (20.0, 0.7, 3 * entry.samples)
    assert median_table(runs).profile.runtime_call_us == 200.0
    with pytest.raises(ValueError, match="at least one table"):
        median_table([])


class MaskedCache(torch.nn.Module):
    """A causal-masked score and a cache written in place: the in-graph timing must run
    on the model's own mask and must leave the model's cache as it was."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("mask", torch.ones(n, n, dtype=torch.bool).triu(1))
        self.register_buffer("cache", torch.zeros(n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(x)
        return x.masked_fill(self.mask, float("-inf")).softmax(-1)


def test_calibrate_model_times_graphs_on_the_models_own_data(monkeypatch):
    import autostream.cost.calibrate as calibrate_mod
    from autostream.calibration import calibrate_model

    seen: list[list] = []

    class Spy(calibrate_mod.GraphTimer):
        def __init__(self, gm, device, inputs=None, seed=0):
            super().__init__(gm, device, inputs, seed)
            seen.append(list(self.args))

    monkeypatch.setattr(calibrate_mod, "GraphTimer", Spy)
    model = MaskedCache(6)
    x = torch.randn(6, 6)
    cache_before = model.cache.clone()
    table = calibrate_model(model, (x,), warmup=1, repeat=2, measure_device=False,
                            progress=False)
    assert {e.timing for e in table.entries} == {"graph"}
    [args] = seen
    masks = [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.bool]
    assert len(masks) == 1 and torch.equal(masks[0], model.mask)  # not a random mask
    # the capture ran the model once (cache += x); the timing runs did not touch it
    torch.testing.assert_close(model.cache, cache_before + x, rtol=0, atol=0)
    # and without the real arguments, the graph runs on random inputs
    seen.clear()
    calibrate_graphs(capture_graphs(MaskedCache(6), (x,)), "cpu", warmup=0, repeat=1,
                     measure_device=False, progress=False)
    [args] = seen
    masks = [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.bool]
    assert not torch.equal(masks[0], model.mask)


def _fake_machine(monkeypatch, others_cores: float) -> None:
    """``runtime.machine.read`` answering a 10 s calibration beside ``others_cores`` busy cores
    of other processes."""
    from autostream.runtime import machine

    readings = iter([machine.Reading(0.0, 0.5, 0.0, 0.0),
                     machine.Reading(10.0, 0.5, 10.0 * others_cores, 0.0)])
    monkeypatch.setattr(machine, "read", lambda: next(readings))


@pytest.mark.parametrize("others, busy", [(1.5, True), (0.0, False)])
def test_calibrate_records_the_load_in_the_table_and_warns_when_busy(tmp_path, spec_file, capsys,
                                                                     monkeypatch, others, busy):
    _fake_machine(monkeypatch, others)
    out = tmp_path / "t.json"
    assert main(["calibrate", f"{spec_file}:tiny", "--out", str(out), "--threads", "1",
                 *FAST]) == 0
    load = CostTable.load(out).device["load"]
    assert (load["busy"], load["others_cores"], load["used_cores"]) == (busy, others, 1)
    err = capsys.readouterr().err
    assert (f"warning: {out} was calibrated while the machine was busy: other processes kept "
            f"1.50 of ") in err if busy else "warning" not in err
    if busy:
        assert "its times and peaks are unreliable (recorded in its device.load)" in err


def test_a_profile_whose_peaks_contradict_each_other_is_measured_again_then_refused(monkeypatch):
    import autostream.cost.calibrate as cal

    # the newcomer's busy calibration: f64 at 107 GFLOP/s against f32 at 13.7
    contradicting = {"f32": 13.7e9, "f64": 107e9}
    monkeypatch.setattr(cal, "measure_peaks", lambda device, timer: dict(contradicting))
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"device profile refused: the f64 peak \(107.0 GFLOP/s"
                                         r"\) is 7.8x the f32 peak \(13.7 GFLOP/s\).* in 3 "
                                         r"measurements.*calibrate on a quiet machine"):
        cal.measure_profile(cpu, CpuTimer(), "cpu")
    # one stalled measurement is measured again, not refused
    answers = iter([contradicting, {"f32": 60e9, "f64": 30e9}])
    monkeypatch.setattr(cal, "measure_peaks", lambda device, timer: next(answers))
    monkeypatch.setattr(cal, "compile_call_cost", lambda device: 0.0)
    assert cal.measure_profile(cpu, CpuTimer(), "cpu").peak_flops == {"f32": 60e9, "f64": 30e9}
