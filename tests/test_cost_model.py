"""CostModel lookup chain: free ops, exact hits, scaling, roofline, symbolic shapes."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autostream.cost import (
    CostModel,
    CostTable,
    Entry,
    OpCost,
    TableCostModel,
    node_signature,
    source_breakdown,
)
from autostream.cost.profile import GENERIC_CPU


def calls(fn, *inputs, mode="fake"):
    gm = make_fx(fn, tracing_mode=mode)(*inputs)
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def first(fn, *inputs, target=None, mode="fake"):
    nodes = calls(fn, *inputs, mode=mode)
    return next(n for n in nodes if target is None or n.target == target)


def mm_node(m, k, n, dtype=torch.float32):
    return first(lambda a, b: a @ b, torch.ones(m, k, dtype=dtype), torch.ones(k, n, dtype=dtype))


def entry_for(node, median, share=0.6) -> Entry:
    sig = node_signature(node)
    return Entry(op=sig.op, signature=sig.key, dtype="f32" if sig.dtype == torch.float32 else "bf16",
                 flops=sig.flops, bytes=sig.bytes, median_us=median, spread_us=0.0, samples=3,
                 share=share, flop_formula=sig.has_flop_formula)


def model(*entries: Entry) -> CostModel:
    dev = {"name": "t", "kind": "cpu", "origin": "measured"}
    return TableCostModel(CostTable(device=dev, profile=GENERIC_CPU, entries=entries))


def test_views_and_getitem_are_free():
    def f(x):
        y = x.view(4, 4).t().reshape(16).unsqueeze(0).expand(2, 16)[0]
        return y.permute(0), torch.split(x, 8)[1], x.detach()

    nodes = calls(f, torch.ones(16))
    cm = model()
    paid = [n.target for n in nodes if cm.estimate(n).source != "free"]
    # reshape of a transposed view copies: that clone is real work, every other op is free
    assert paid == [torch.ops.aten.clone.default]
    free = [n for n in nodes if n.target not in paid]
    assert all(cm.estimate(n) == OpCost(0.0, 0.0, "free") for n in free)
    free_targets = {n.target for n in free}
    # make_fx records x.detach() as aten.detach before torch 2.14, as aten.alias since
    detached = {torch.ops.aten.detach.default, torch.ops.aten.alias.default} & free_targets
    assert operator.getitem in free_targets and len(detached) == 1


def test_exact_hit_returns_the_measured_time_and_share():
    node = mm_node(8, 16, 32)
    cm = model(entry_for(node, 123.0, share=0.8))
    assert cm.estimate(node) == OpCost(123.0, 0.8, "exact")


def test_a_work_bound_reference_scales_about_linearly():
    ref = mm_node(256, 256, 256)  # 33.5 MFLOP: 335 us at GENERIC_CPU's peak, 5 us launch
    cm = model(entry_for(ref, 700.0))
    big, small = cm.estimate(mm_node(512, 256, 256)), cm.estimate(mm_node(128, 256, 256))
    assert big.source == small.source == "scaled"
    # twice (half) the FLOPs: the part above the launch nearly doubles (halves)
    lo = GENERIC_CPU.launch_overhead_us
    assert big.duration_us == pytest.approx(lo + 2 * (700.0 - lo), rel=0.02)
    assert small.duration_us == pytest.approx(lo + 0.5 * (700.0 - lo), rel=0.02)
    assert "FLOPs" in big.note and node_signature(ref).key in big.note


def test_a_launch_bound_reference_grows_by_the_roofline_not_by_the_work_ratio():
    # the shipped cpu table's zeros_like f32[8, 4] (21 us, 256 bytes) and a 32x256 op:
    # 256x the bytes must not make 256x the time above the launch (5,000 us)
    ref = first(lambda x: torch.zeros_like(x), torch.ones(8, 4))
    cm = model(entry_for(ref, 21.43))
    query = first(lambda x: torch.zeros_like(x), torch.ones(32, 256))
    est = cm.estimate(query)
    extra_bytes = node_signature(query).bytes - node_signature(ref).bytes
    at_bandwidth = 1e6 * extra_bytes / GENERIC_CPU.bandwidth  # 6.5 us
    assert est.source == "scaled" and "bytes" in est.note
    assert 21.43 + at_bandwidth <= est.duration_us <= 21.43 + 4 * at_bandwidth
    # and down: a smaller op costs about the same, never less than the launch
    tiny = cm.estimate(first(lambda x: torch.zeros_like(x), torch.ones(2)))
    assert GENERIC_CPU.launch_overhead_us <= tiny.duration_us <= 21.43


def test_shipped_cpu_table_prices_a_larger_zeros_like_near_its_reference():
    cm = TableCostModel.load("cpu")
    sig = node_signature(first(lambda x: torch.zeros_like(x), torch.ones(8, 4)))
    ref = cm.estimate_signature(sig)
    assert ref.source == "exact"
    est = cm.estimate(first(lambda x: torch.zeros_like(x), torch.ones(32, 256)))
    assert est.source == "scaled" and sig.key in est.note
    assert ref.duration_us < est.duration_us < 2 * ref.duration_us


def test_two_references_fit_an_affine_rate_above_the_largest():
    a, b = mm_node(128, 256, 256), mm_node(256, 256, 256)  # 16.8 and 33.5 MFLOP
    cm = model(entry_for(a, 200.0), entry_for(b, 400.0))
    rate = 200.0 / (node_signature(b).flops - node_signature(a).flops)  # us per FLOP
    big = cm.estimate(mm_node(512, 256, 256))
    assert big.duration_us == pytest.approx(400.0 + rate * node_signature(b).flops)
    assert "affine fit over 2 references" in big.note
    # below the smallest: its time beyond the launch in proportion to the work
    small = cm.estimate(mm_node(64, 256, 256))
    assert small.duration_us == pytest.approx(5.0 + (200.0 - 5.0) / 2)
    assert "affine fit" not in small.note and "in proportion to the work" in small.note


def test_scaling_down_stays_between_the_launch_and_the_reference():
    lo = GENERIC_CPU.launch_overhead_us
    cm = model(entry_for(mm_node(256, 256, 256), 300.0))
    tiny = cm.estimate(mm_node(1, 16, 32))  # 1/65,536 of the reference's FLOPs
    assert lo < tiny.duration_us < lo + 0.01
    # a reference faster than the launch overhead: smaller ops cost what it does
    fast = model(entry_for(mm_node(8, 16, 32), 3.0)).estimate(mm_node(2, 16, 32))
    assert fast.duration_us == 3.0


def test_a_fit_through_launch_bound_references_is_not_trusted():
    # two tiny references 7 us apart: their difference is noise, not a rate to extrapolate
    a, b = (first(lambda x: x.relu(), torch.ones(n)) for n in (32, 64))
    cm = model(entry_for(a, 18.0), entry_for(b, 25.0))
    query = first(lambda x: x.relu(), torch.ones(8192))
    est = cm.estimate(query)
    assert "affine fit" not in est.note
    at_bandwidth = 1e6 * (node_signature(query).bytes - node_signature(b).bytes) / GENERIC_CPU.bandwidth
    # the noisy slope would give 25 + 7 * 127 = 914 us
    assert 25.0 + at_bandwidth <= est.duration_us <= 25.0 + 5 * at_bandwidth


def test_scaled_interpolates_between_bracketing_references():
    a, b = mm_node(8, 16, 32), mm_node(32, 16, 32)
    cm = model(entry_for(a, 10.0, share=0.4), entry_for(b, 40.0, share=0.8))
    mid = cm.estimate(mm_node(16, 16, 32))  # 1/3 of the way from a to b in FLOPs
    assert mid.source == "scaled"
    assert mid.duration_us == pytest.approx(20.0)
    assert mid.share == pytest.approx(0.4 + 0.4 / 3)


def test_elementwise_ops_scale_by_bytes():
    ref = first(lambda x: x.relu(), torch.ones(100))
    cm = model(entry_for(ref, 25.0))
    est = cm.estimate(first(lambda x: x.relu(), torch.ones(400)))
    assert est.source == "scaled" and "bytes" in est.note
    assert est.duration_us > 25.0


def test_other_dtype_or_unknown_op_falls_back_to_roofline():
    cm = model(entry_for(mm_node(8, 16, 32), 50.0))
    bf = cm.estimate(mm_node(8, 16, 32, dtype=torch.bfloat16))
    assert bf.source == "roofline"
    add = cm.estimate(first(lambda x: x + 1, torch.ones(64)))
    assert add.source == "roofline" and add.duration_us >= GENERIC_CPU.launch_overhead_us


def test_roofline_is_monotone_in_work_and_uses_the_device_profile():
    cm = model()
    small, big = cm.estimate(mm_node(8, 64, 64)), cm.estimate(mm_node(256, 64, 64))
    assert big.duration_us > small.duration_us > 0
    h200 = TableCostModel.load("h200")
    assert h200.estimate(mm_node(256, 64, 64)).duration_us < big.duration_us


def test_symbolic_shapes_use_hints_and_match_concrete_signatures():
    sym = first(lambda a, b: a @ b, torch.ones(8, 16), torch.ones(16, 32), mode="symbolic",
                target=torch.ops.aten.mm.default)
    concrete = mm_node(8, 16, 32)
    assert node_signature(sym).key == node_signature(concrete).key
    cm = model(entry_for(concrete, 77.0))
    assert cm.estimate(sym) == OpCost(77.0, 0.6, "exact")


def test_size_without_hint_falls_back_to_roofline_and_says_so():
    node = mm_node(8, 16, 32)
    sig = node_signature(node)
    from dataclasses import replace
    approx = replace(sig, approximate=True)
    cm = model(entry_for(node, 77.0))
    est = cm.estimate_signature(approx)
    assert est.source == "roofline" and "hint" in est.note


def test_odd_nodes_never_crash():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    weird = g.call_function(torch.ops.aten.relu.default, (x,))  # no meta["val"] anywhere
    g.output(weird)
    cm = model()
    assert cm.estimate(weird).source == "roofline"
    assert cm.estimate(x).source == "free"


def test_source_breakdown_weights_by_predicted_time():
    b = source_breakdown([OpCost(6, 1, "exact"), OpCost(3, 1, "scaled"), OpCost(1, 0, "roofline"),
                          OpCost(0, 0, "free")])
    assert b.fraction("exact") == pytest.approx(0.6)
    assert b.fraction("scaled") == pytest.approx(0.3)
    assert b.counts == {"exact": 1, "scaled": 1, "roofline": 1, "free": 1}
    assert "exact 60.0%" in str(b)
    assert source_breakdown([]).fraction("exact") == 0.0


def test_each_signature_is_looked_up_once_and_estimates_are_deterministic(monkeypatch):
    def f(x):
        for _ in range(50):
            x = (x * 1.5 + 1.0).relu() @ torch.eye(8)
        return x

    nodes = calls(f, torch.ones(8, 8))
    cm = TableCostModel.default()
    looked_up = []
    real = cm._lookup
    monkeypatch.setattr(cm, "_lookup", lambda sig: looked_up.append(sig) or real(sig))
    first_pass = [cm.estimate(n) for n in nodes]
    # 50 identical iterations of 5 ops: only the first iteration's signatures reach the table
    assert len(nodes) == 250
    assert len(looked_up) == len({(s.op, s.key) for s in looked_up}) == 5
    assert first_pass == [TableCostModel.default().estimate(n) for n in nodes]


def test_a_repeated_signature_is_estimated_without_counting_its_work(monkeypatch):
    import autostream.cost.model as cost_model
    from autostream.cost.signature import node_cost_key

    nodes = calls(lambda x: (x @ x) @ (x @ x), torch.ones(8, 8))
    assert all(node_cost_key(n) == (node_signature(n).op, node_signature(n).key) for n in nodes)
    signed = []
    real = cost_model.node_signature
    monkeypatch.setattr(cost_model, "node_signature", lambda n: signed.append(n) or real(n))
    cm = TableCostModel.default()
    costs = [cm.estimate(n) for n in nodes]
    assert len(nodes) == 3 and signed == nodes[:1]
    assert costs == [TableCostModel.default().estimate_signature(real(n)) for n in nodes]


def test_default_and_device_level_costs():
    cm = TableCostModel.default()
    assert cm.sync_latency_us >= 0 and cm.launch_overhead_us >= 0 and cm.stream_switch_us >= 0
    assert cm.table.device["kind"] == "cpu"
    assert isinstance(cm.describe(), str) and cm.table.device["name"] in cm.describe()


def test_scaling_prefers_references_of_the_same_family():
    plain = mm_node(8, 16, 32)
    trans = first(lambda a, b: a @ b.t(), torch.ones(8, 16), torch.ones(32, 16),
                  target=torch.ops.aten.mm.default)
    cm = model(entry_for(plain, 10.0), entry_for(trans, 100.0))
    query = first(lambda a, b: a @ b.t(), torch.ones(16, 16), torch.ones(32, 16),
                  target=torch.ops.aten.mm.default)
    est = cm.estimate(query)
    assert est.source == "scaled" and node_signature(trans).key in est.note
    assert est.duration_us >= 100.0  # grown from the transposed 100 us, not the plain 10 us


def test_stream_ops_of_a_rewritten_graph_are_free():
    from autostream.dialects.torchair import air_ops

    ops = air_ops()
    g = torch.fx.Graph()
    nodes = [g.call_function(op, ()) for op in (ops.scope_exit, ops.record)]
    assert [model().estimate(n).source for n in nodes] == ["free", "free"]
