"""Calibration under graph replay, on the fake device: what is captured (R calls after a
warm-up; pairs forked and joined inside the capture), what comes out (replay entries,
shares fitted to pair timings, the graph figures) and the table's new fields."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autostream.calibration import calibrate_graphs, replay_device
from autostream.cli import main
from autostream.cost import CostTable, TableCostModel
from autostream.cost.calibrate import collect_ops
from autostream.cost.pairs import PairTiming, combined_share, fit_shares
from autostream.cost.recorded import recorded_inputs
from autostream.cost.replay import ReplayDevice, ReplaySettings, calibrate_replay, graph_figures
from autostream.cost.table import TableError, median_table
from autostream.fx.capture import capture
from autostream.models.moe_decode import qwen3_moe_decode
from tests.fake_device import FakeCosts, FakeDeviceTimer, LoggedOps, device_time, fake_device

CPU = torch.device("cpu")
MM, RELU, ADD_ = "aten.mm.default", "aten.relu.default", "aten.add_.Tensor"
#: the fake device: a matmul of 100 us that takes 0.8 of the chip, a relu of 10 us taking 0.6
COSTS = FakeCosts(op_us={MM: 100.0, RELU: 10.0}, share={MM: 0.8, RELU: 0.6})
SETTINGS = ReplaySettings(target_us=400.0, max_calls=8, rounds=3, warmup=2, estimate_calls=2,
                          cross_ops=2, tiny_calls=6, call_repeat=3)


def mm_relu_graph() -> torch.fx.GraphModule:
    return make_fx(lambda a, w: torch.relu(a @ w))(torch.randn(4, 8), torch.randn(8, 8))


def replay_on_fake(costs: FakeCosts = COSTS, refuse: str | None = None):
    streams, graphs = fake_device(refuse)
    return streams, ReplayDevice(graphs, streams, FakeDeviceTimer(streams, costs))


def calibrate_on_fake(costs: FakeCosts = COSTS, settings: ReplaySettings = SETTINGS,
                      refuse: str | None = None):
    streams, dev = replay_on_fake(costs, refuse)
    with LoggedOps(streams):
        result = calibrate_replay(collect_ops([mm_relu_graph()]), CPU, dev, settings,
                                  progress=False)
    return streams.log.calls, result


def captures(calls: list[tuple[str, ...]]) -> list[list[tuple[str, ...]]]:
    """The log entries between each ``begin`` and its ``end`` (``begin`` included)."""
    out, current = [], None
    for c in calls:
        if c[0] == "begin":
            current = [c]
        elif c[0] == "end":
            out.append(current)
            current = None
        elif current is not None:
            current.append(c)
    return out


def test_an_op_graph_holds_its_calls_after_a_warm_up_on_the_capture_stream():
    calls, _ = calibrate_on_fake()
    first_mm, first_relu = captures(calls)[:2]
    stream = first_mm[0][2]
    # R from the estimate: 400 us / 100 us per matmul = 4 calls; the relu is capped at 8
    assert [c for c in first_mm if c[0] == "op"] == [("op", MM, stream)] * 4
    assert [c for c in first_relu if c[0] == "op"] == [("op", RELU, stream)] * 8
    begin = calls.index(first_mm[0])
    switch = max(i for i, c in enumerate(calls[:begin]) if c == ("set_stream", stream))
    warm = [c for c in calls[switch:begin] if c[0] == "op"]
    assert warm == [("op", MM, stream)] * (SETTINGS.warmup + SETTINGS.estimate_calls)


def test_entries_come_out_with_replay_timing_and_the_device_times_per_call():
    _, result = calibrate_on_fake()
    by_op = {e.op: e for e in result.entries}
    assert set(by_op) == {MM, RELU} and not result.skipped
    assert all(e.timing == "replay" and e.samples == SETTINGS.rounds and e.split == 1.0
               for e in result.entries)
    assert by_op[MM].time_us == pytest.approx(100.0) and by_op[RELU].time_us == pytest.approx(10.0)
    assert by_op[MM].slowdown == pytest.approx(1.6)  # two copies at 0.8 each: S = 1.6


def test_a_pair_graph_forks_after_begin_and_joins_both_lanes_before_end():
    calls, result = calibrate_on_fake()
    together = [c for c in captures(calls) if any(x[0] == "wait_stream" for x in c)]
    assert len(together) == len(result.pairs) == 3  # mm|mm, relu|relu, mm|relu
    for cap in together:
        capture_stream = cap[0][2]
        waits = [i for i, c in enumerate(cap) if c[0] == "wait_stream"]
        ops = [i for i, c in enumerate(cap) if c[0] == "op"]
        sides = {cap[i][1] for i in waits[:2]}
        assert len(sides) == 2 and capture_stream not in sides
        assert [cap[i] for i in waits[:2]] == [("wait_stream", s, capture_stream)
                                               for s in sorted(sides)]
        assert waits[1] < ops[0] and ops[-1] < waits[2]
        assert {cap[i][1:] for i in waits[2:]} == {(capture_stream, s) for s in sides}
        assert cap[-1] == ("set_stream", capture_stream) or cap[waits[-1]] == cap[-1]
        lanes = {c[2] for c in cap if c[0] == "op"}
        assert lanes == sides


def test_shares_are_recovered_from_the_pair_timings():
    _, result = calibrate_on_fake()
    by_op = {e.op: e for e in result.entries}
    assert by_op[MM].share == pytest.approx(0.8) and by_op[RELU].share == pytest.approx(0.6)
    assert result.fit.residual == pytest.approx(0.0, abs=1e-9)
    cross = [p for p in result.pairs if not p.is_self]
    assert len(cross) == 1 and cross[0].combined_share == pytest.approx(1.4)
    # lanes of about the same length alone: 4 matmuls, 8 (capped) relus
    assert (cross[0].a_calls, cross[0].b_calls) == (4, 8)
    assert any("RMS residual 0.000" in n for n in result.notes)


def test_ops_that_cannot_be_captured_are_skipped_with_the_reason():
    _, result = calibrate_on_fake(refuse="operation not permitted when stream is capturing")
    assert result.entries == () and result.pairs == ()
    assert {s.op for s in result.skipped} == {MM, RELU}
    assert all("cannot be captured in a graph: RuntimeError: operation not permitted" in s.reason
               for s in result.skipped)


def test_graph_figures_per_kernel_per_crossing_and_per_call():
    costs = FakeCosts(op_us={ADD_: 2.0}, sync_us=1.5, call_us=7.0)
    streams, dev = replay_on_fake(costs)
    with LoggedOps(streams):
        figures = graph_figures(dev, CPU, SETTINGS)
    assert figures.kernel_us == pytest.approx(2.0)
    assert figures.sync_us == pytest.approx(1.5)
    assert figures.call_us == pytest.approx(7.0)
    crossing = [c for c in captures(streams.log.calls) if any(x[0] == "wait_event" for x in c)]
    [cap] = crossing
    lanes = [c[2] for c in cap if c[0] == "op"]
    assert len(lanes) == SETTINGS.tiny_calls and all(a != b for a, b in zip(lanes, lanes[1:]))


def test_the_fake_device_shares_the_chip_by_processor_sharing():
    """The synthetic device the tests above rest on: two lanes forked and joined take
    ``Tb + Ta (S - 1)``; a chain alternating streams runs in series plus its waits."""
    c = FakeCosts(op_us={"a": 30.0, "b": 50.0}, share={"a": 0.7, "b": 0.6}, sync_us=1.0)
    lanes = [("op", "a", "s1"), ("op", "b", "s2")]
    assert device_time(lanes, c) == pytest.approx(50 + 30 * 0.3)
    chain = [("op", "a", "s1"), ("record", "e0", "s1"), ("wait_event", "s2", "e0"),
             ("op", "b", "s2")]
    assert device_time(chain, c) == pytest.approx(81.0)


def test_combined_share_and_the_fit_on_synthetic_timings():
    assert combined_share(100.0, 100.0, 150.0) == pytest.approx(1.5)
    assert combined_share(40.0, 100.0, 120.0) == pytest.approx(1.5)
    a, b, c = ("a", "x"), ("b", "y"), ("c", "z")
    true = {a: 0.9, b: 0.7, c: 0.55}

    def timing(p, q, ta=100.0, tb=100.0):
        s = true[p] + true[q]
        short, long = sorted((ta, tb))
        return PairTiming(p, q, ta, tb, long + short * max(s - 1, 0))

    pairs = [timing(a, a), timing(b, b), timing(c, c), timing(a, b, 30.0, 90.0),
             timing(b, c), timing(a, c, 80.0, 20.0)]
    fit = fit_shares(pairs)
    assert fit.shares == pytest.approx(true) and fit.residual == pytest.approx(0.0, abs=1e-9)
    noisy = fit_shares([*pairs[:3], PairTiming(a, b, 100.0, 100.0, 200.0)])
    assert noisy.residual > 0.05 and all(0 <= s <= 1 for s in noisy.shares.values())
    clipped = fit_shares([PairTiming(a, a, 10.0, 10.0, 30.0)])  # slower than serial
    assert clipped.shares[a] == 1.0 and clipped.residual == pytest.approx(1.0)
    with pytest.raises(ValueError, match="lane times must be > 0"):
        combined_share(0.0, 10.0, 10.0)


def test_real_inputs_give_a_grouped_matmul_its_group_offsets():
    model, inputs = qwen3_moe_decode(tokens=4, scale=16)
    with torch.no_grad():
        [graph] = capture(model, inputs)
    found, notes = recorded_inputs([graph.gm], [graph.args], CPU)
    offs = [args[2] for (op, _), (args, _) in found.items() if op == "aten._grouped_mm.default"]
    assert notes == [] and offs
    for o in offs:
        assert o.dtype == torch.int32 and int(o[-1]) == 4 * model.sizes.top_k
        assert bool((o[1:] >= o[:-1]).all()) and int(o.count_nonzero()) > 0


def test_calibrate_graphs_on_the_fake_device_writes_a_replay_table(tmp_path):
    streams, dev = replay_on_fake()
    gm = mm_relu_graph()
    with LoggedOps(streams):
        table = calibrate_graphs([gm], CPU, measure_device=False, progress=False,
                                 graph_args=[(torch.randn(4, 8), torch.randn(8, 8))],
                                 replay=dev, replay_settings=SETTINGS)
    assert {e.timing for e in table.entries} == {"replay"} and len(table.pairs) == 3
    assert table.device["settings"]["timing"] == "replay"
    assert table.device["settings"]["replay"]["max_calls"] == SETTINGS.max_calls
    assert "RMS residual" in table.device["notes"]
    again = CostTable.load(table.save(tmp_path / "t.json"))
    assert set(again.pairs) == set(table.pairs) and set(again.entries) == set(table.entries)
    assert TableCostModel(again).estimate(next(n for n in gm.graph.nodes
                                               if n.target == torch.ops.aten.mm.default)
                                          ).source == "exact"


def test_replay_is_the_default_only_on_devices_with_graph_capture():
    assert replay_device(CPU) is None and replay_device(CPU, False) is None
    with pytest.raises(ValueError, match="no graph capture"):
        replay_device(CPU, True)


def test_isolated_with_eager_timing_on_the_cpu_is_accepted(tmp_path, capsys):
    spec = tmp_path / "m.py"
    spec.write_text("import torch\ndef m():\n    return torch.nn.ReLU(), (torch.randn(3, 4),)\n")
    out = tmp_path / "t.json"
    assert main(["calibrate", f"{spec}:m", "--out", str(out), "--eager", "--isolated",
                 "--warmup", "0", "--repeat", "2", "--no-progress"]) == 0
    assert {e.timing for e in CostTable.load(out).entries} == {"isolated"}


# -- the table's new fields --------------------------------------------------------------

def _pair(a="aten.mm.default", b="aten.mm.default", together=150.0) -> PairTiming:
    return PairTiming((a, "f32[4, 8]"), (b, "f32[4, 8]"), 100.0, 100.0, together, 4, 4)


def test_a_table_with_pairs_and_graph_figures_round_trips(tmp_path):
    base = CostTable.load(TableCostModel.load("h200").table.source)
    profile = replace(base.profile, graph_kernel_us=1.1, graph_sync_us=0.4, graph_call_us=9.0)
    table = replace(base, profile=profile, pairs=(_pair(), _pair(b="aten.relu.default")))
    again = CostTable.load(table.save(tmp_path / "t.json"))
    assert set(again.pairs) == set(table.pairs) and again.digest() == table.digest()
    assert (again.profile.graph_kernel_us, again.profile.graph_sync_us,
            again.profile.graph_call_us) == (1.1, 0.4, 9.0)


def test_old_tables_load_without_pairs_or_graph_figures(tmp_path):
    cpu = TableCostModel.load("cpu").table
    assert cpu.pairs == () and cpu.profile.graph_kernel_us == 0.0
    text = cpu.to_json()
    assert "pairs" not in text and "graph_kernel_us" not in text["profile"]
    assert CostTable.from_json(json.loads(json.dumps(text))).digest() == cpu.digest()


@pytest.mark.parametrize("bad, field, problem", [
    ({"a": ["aten.mm.default"]}, "pairs[0].a", "must be [op, signature]"),
    ({"a_us": -1.0}, "pairs[0].a_us", "must be > 0"),
    ({"together_us": "x"}, "pairs[0].together_us", "finite number"),
])
def test_bad_pairs_are_rejected_naming_the_field(bad, field, problem):
    data = CostTable.from_profile().to_json()
    data["pairs"] = [{"a": ["aten.mm.default", ""], "b": ["aten.mm.default", ""], "a_us": 1.0,
                      "b_us": 1.0, "together_us": 1.5, **bad}]
    with pytest.raises(TableError) as err:
        CostTable.from_json(data)
    assert err.value.field == field and problem in err.value.problem


def test_a_duplicate_pair_is_rejected():
    data = CostTable.from_profile().to_json()
    pair = {"a": ["m", ""], "b": ["m", ""], "a_us": 1.0, "b_us": 1.0, "together_us": 1.5}
    data["pairs"] = [pair, dict(pair)]
    with pytest.raises(TableError, match="duplicates pairs"):
        CostTable.from_json(data)


def test_merge_and_median_keep_pairs():
    old = replace(CostTable.from_profile(), pairs=(_pair(), _pair(b="aten.relu.default")))
    new = replace(CostTable.from_profile(), pairs=(_pair(together=190.0),))
    merged = old.merged(new)
    assert {p.key: p.together_us for p in merged.pairs}[_pair().key] == 190.0
    assert len(merged.pairs) == 2
    med = median_table([replace(old, pairs=(_pair(together=t),)) for t in (120.0, 200.0, 130.0)])
    assert [p.together_us for p in med.pairs] == [130.0]


def test_calibrate_graphs_measures_the_graph_figures_into_the_profile(monkeypatch):
    import autostream.calibration as calibration
    from autostream.cost.profile import GENERIC_CPU

    monkeypatch.setattr(calibration, "measure_profile", lambda *a, **k: GENERIC_CPU)
    monkeypatch.setattr(calibration, "runtime_costs", lambda *a, **k: (0.0, 0.0, 0.0))
    costs = FakeCosts(op_us={**COSTS.op_us, ADD_: 2.0}, share=COSTS.share, sync_us=0.5,
                      call_us=6.0)
    streams, dev = replay_on_fake(costs)
    with LoggedOps(streams):
        table = calibrate_graphs([mm_relu_graph()], CPU, progress=False, replay=dev,
                                 graph_args=[(torch.randn(4, 8), torch.randn(8, 8))],
                                 replay_settings=SETTINGS)
    p = table.profile
    assert (p.graph_kernel_us, p.graph_sync_us, p.graph_call_us) == pytest.approx((2.0, 0.5, 6.0))
    streams, dev = replay_on_fake(costs, refuse="capture refused")
    table = calibrate_graphs([mm_relu_graph()], CPU, progress=False, replay=dev,
                             replay_settings=SETTINGS)
    assert table.entries == () and len(table.skipped) == 2
    assert "graph figures (profile.graph_*) not measured: RuntimeError: capture refused" \
        in table.device["notes"]
    assert table.profile.graph_kernel_us == 0.0


def test_an_op_without_device_time_keeps_no_pair_and_bad_settings_are_named():
    costs = FakeCosts(op_us={MM: 100.0}, share={MM: 0.8})  # the relu costs nothing here
    _, result = calibrate_on_fake(costs)
    assert [p.a[0] for p in result.pairs] == [MM]
    assert {e.op: e.share for e in result.entries}[RELU] == 1.0
    assert any("a lane took no device time" in n for n in result.notes)
    assert any("without a pair timing keep share 1.0" in n and RELU in n for n in result.notes)
    with pytest.raises(ValueError, match="ReplaySettings.rounds must be >= 1"):
        ReplaySettings(rounds=0)
    with pytest.raises(ValueError, match="target_us must be > 0"):
        ReplaySettings(target_us=0.0)


# -- on a real GPU (skipped without one) -------------------------------------------------

@pytest.mark.cuda
def test_replay_calibration_on_a_cuda_device():
    """The real graph API: op graphs captured after warm-ups, pair graphs forked and joined
    inside the capture, graph figures; small settings (a few seconds)."""
    cuda = torch.device("cuda")
    gm = make_fx(lambda a, w: torch.relu(a @ w))(torch.randn(64, 512), torch.randn(512, 512))
    args = [(torch.randn(64, 512, device=cuda), torch.randn(512, 512, device=cuda))]
    small = ReplaySettings(target_us=200.0, max_calls=32, rounds=3, cross_ops=2, tiny_calls=32,
                           call_repeat=10)
    table = calibrate_graphs([gm], cuda, measure_device=False, progress=False,
                             graph_args=args, replay_settings=small)
    assert table.skipped == () and {e.timing for e in table.entries} == {"replay"}
    assert all(0 < e.time_us < 1000 and 0 <= e.share <= 1 for e in table.entries)
    assert len(table.pairs) == 3 and all(p.together_us > 0 for p in table.pairs)
    figures = graph_figures(replay_device(cuda), cuda, small)
    assert 0 < figures.kernel_us < 50 and figures.sync_us >= 0 and figures.call_us >= 0
