"""MoE decode layers: outputs against a plain loop, capturable (no host sync), the shared
expert independent of the routed path, bitwise repeatable."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from torch.nn import functional as F

from autostream.fx.capture import capture
from autostream.models.experts import DEEPSEEK_V3, QWEN3_MOE
from autostream.models.moe_decode import (
    ALIGN,
    DEEPSEEK_V3_SHAPE,
    QWEN3_SHAPE,
    MoEDecodeLayer,
    deepseek_v3_decode,
    qwen3_moe_decode,
    sizes_of,
)
from autostream.planning.plan import plan_model

SPECS = {"qwen3": qwen3_moe_decode, "deepseek": deepseek_v3_decode}
#: ATen ops that read a device value on the host (or size their output by one)
HOST_SYNC = {"aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default",
             "aten.bincount.default", "aten.unique_consecutive.default", "aten._unique2.default",
             "aten.masked_select.default", "aten.repeat_interleave.Tensor",
             "aten.equal.default", "aten.is_nonzero.default"}


def reference(model: MoEDecodeLayer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(routed, shared)`` token by token, slot by slot, in float32 from the layer's weights
    and routing."""
    weights, ids = model.route(x)
    inter = model.sizes.inter
    out = torch.zeros(x.shape, dtype=torch.float32)
    shared = torch.zeros(x.shape, dtype=torch.float32)
    w13, w2 = model.w13.float(), model.w2.float()
    for t in range(x.shape[0]):
        xt = x[t].float()
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gu = xt @ w13[e]
            out[t] += float(weights[t, j]) * ((F.silu(gu[:inter]) * gu[inter:]) @ w2[e])
        gate, up = (xt @ model.shared_gate_up.float().T).chunk(2)
        shared[t] = (F.silu(gate) * up) @ model.shared_down.float().T
    return out, shared


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("tokens", [1, 5])
def test_output_matches_a_loop_over_tokens_and_experts(name, tokens):
    model, (x,) = SPECS[name](tokens=tokens, scale=16)
    with torch.no_grad():
        out = model(x).float()
        routed, shared = reference(model, x)
    ref = routed + shared
    # bfloat16 rounds the grouped matmuls' outputs, SwiGLU and the weighted sum (8 bits of
    # mantissa): about 1%; the routed part is far larger, so a slot sent to the wrong token
    # or expert, or weighted wrongly, is caught
    err = (out - ref).abs().max() / ref.abs().max()
    assert err < 0.02, f"relative error {err:.3g}"
    assert routed.abs().max() > 0.2 * ref.abs().max()


@pytest.mark.parametrize("name", SPECS)
def test_routing_picks_the_top_k_scores_normalised(name):
    model, (x,) = SPECS[name](tokens=4, scale=16)
    with torch.no_grad():
        weights, ids = model.route(x)
        logits = F.linear(x, model.gate).float()
    scores = logits.softmax(-1) if model.sizes.routing == "softmax" else logits.sigmoid()
    assert ids.shape == (4, model.sizes.top_k) and weights.dtype == torch.bfloat16
    assert torch.equal(ids, scores.topk(model.sizes.top_k, -1).indices)
    torch.testing.assert_close(weights.float().sum(-1), torch.full((4,), model.sizes.routed_scale),
                               rtol=1e-2, atol=0)


@pytest.mark.parametrize("name", SPECS)
def test_the_captured_graph_has_no_host_sync_and_static_shapes(name):
    model, inputs = SPECS[name](tokens=8)
    with torch.no_grad():
        [graph] = capture(model, inputs)
    ops = [n for n in graph.gm.graph.nodes if n.op == "call_function"]
    targets = {str(n.target) for n in ops}
    assert "aten._grouped_mm.default" in targets and "aten.sort.stable" in targets
    assert targets & HOST_SYNC == set()
    for n in ops:
        for v in n.meta["val"] if isinstance(n.meta["val"], (tuple, list)) else [n.meta["val"]]:
            if isinstance(v, torch.Tensor):
                assert all(isinstance(s, int) for s in v.shape), f"{n.name}: data-dependent size"


def _shared_and_routed(gm: torch.fx.GraphModule, args, model: MoEDecodeLayer
                       ) -> tuple[list[str], list[str]]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    shared_ptrs = {model.shared_gate_up.data_ptr(), model.shared_down.data_ptr()}
    shared_weights = {p for p, a in zip(placeholders, args, strict=True)
                      if isinstance(a, torch.Tensor) and a.data_ptr() in shared_ptrs}
    assert len(shared_weights) == 2
    shared = [n.name for n in gm.graph.nodes if n.target == torch.ops.aten.mm.default
              and any(w in n.all_input_nodes or any(w in a.all_input_nodes
                                                    for a in n.all_input_nodes)
                      for w in shared_weights)]
    routed = [n.name for n in gm.graph.nodes if n.target == torch.ops.aten._grouped_mm.default]
    return shared, routed


@pytest.mark.parametrize("name", SPECS)
def test_the_planner_finds_the_shared_expert_independent_of_the_routed_path(name):
    model, inputs = SPECS[name](tokens=8)
    with torch.no_grad():
        [graph] = capture(model, inputs)
        plan = plan_model(model, inputs, max_streams=2)
    shared, routed = _shared_and_routed(graph.gm, graph.args, model)
    assert len(shared) == 2 and len(routed) == 2
    g = plan.op_graph
    assert set(shared + routed) <= set(g.nodes)
    for s in shared:
        for r in routed:
            assert not nx.has_path(g, s, r) and not nx.has_path(g, r, s), (s, r)


@pytest.mark.parametrize("name", SPECS)
def test_outputs_are_bitwise_identical_across_calls(name):
    model, inputs = SPECS[name](tokens=8)
    with torch.no_grad():
        [graph] = capture(model, inputs)
        eager = [model(*inputs) for _ in range(2)]
        compiled = [graph.gm(*graph.args)[0] for _ in range(2)]
    assert torch.equal(eager[0], eager[1]) and torch.equal(compiled[0], compiled[1])
    assert torch.equal(eager[0], compiled[0])


def test_weights_are_seeded_and_scaled_by_fan_in():
    a, _ = qwen3_moe_decode(tokens=1, scale=16, seed=3)
    b, _ = qwen3_moe_decode(tokens=1, scale=16, seed=3)
    c, _ = qwen3_moe_decode(tokens=1, scale=16, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.w13, c.w13)
    h, i = a.sizes.hidden, a.sizes.inter
    assert float(a.w13.abs().max()) <= h ** -0.5 and float(a.w2.abs().max()) <= i ** -0.5
    assert float(a.w2.abs().max()) > 0.9 * i ** -0.5


def test_the_shapes_are_those_of_the_experts_layers():
    for shape, config in ((QWEN3_SHAPE, QWEN3_MOE), (DEEPSEEK_V3_SHAPE, DEEPSEEK_V3)):
        assert shape == type(shape)(**{f: getattr(config, f) for f in shape.__dataclass_fields__})


@pytest.mark.parametrize("scale", [1, 2, 3, 8, 16, 64, 1000])
def test_scaled_sizes_stay_aligned_for_grouped_mm(scale):
    for config, routing in ((QWEN3_SHAPE, "softmax"), (DEEPSEEK_V3_SHAPE, "sigmoid")):
        s = sizes_of(config, routing, scale)
        assert all(n % ALIGN == 0 and n >= ALIGN for n in (s.hidden, s.inter, s.shared_inter))
        assert s.top_k <= s.experts <= config.experts
    assert sizes_of(DEEPSEEK_V3_SHAPE, "sigmoid", 1).hidden == 7168
    assert sizes_of(QWEN3_SHAPE, "softmax", 1).experts == 128


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="bfloat16"):
        qwen3_moe_decode(scale=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="scale must be a positive integer"):
        deepseek_v3_decode(scale=0)
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        qwen3_moe_decode(tokens=0)
    with pytest.raises(ValueError, match="routing"):
        sizes_of(QWEN3_SHAPE, "relu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", SPECS)
def test_on_cuda_no_host_sync_and_a_captured_replay_is_bitwise_eager(name):
    model, (x,) = SPECS[name](tokens=8, scale=8, device="cuda")
    with torch.no_grad():
        torch.cuda.set_sync_debug_mode("error")  # a host sync raises
        try:
            eager = model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static = model(x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(static, eager) and torch.equal(model(x), eager)
