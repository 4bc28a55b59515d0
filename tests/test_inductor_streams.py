"""``AutoStreamPass(inductor_streams=True)`` as Inductor's ``post_grad_custom_post_pass``.

Checked on CPU: the annotated post-grad graph; the Python wrapper ``get_code`` writes
(Inductor's CPU wrapper with the streams' blocks, waits and record_streams; it is not
run: the CPU wrapper never defines the streams it enters); the scheduler's map from its
streams to Dynamo's objects (what the CUDA wrapper fetches by index); registration by
Dynamo's bytecode on cold and warm caches; refusals.  To get a CPU wrapper at all the
tests use :class:`CpuAccepted`, a pass that accepts the CPU device and refuses every
other case as the real one does.  Not checked here: CUDA (triton) kernels, the CUDA
wrapper's stream fetch lines, timings, numerics (``experiments/inductor_streams.py``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autostream import AutoStreamPass
from autostream.dialects import inductor
from autostream.models.zoo import moe_model
from autostream.passes import Outcome

pytestmark = pytest.mark.skipif(
    bool(inductor.missing_support()),
    reason=f"this torch has no multi-stream Inductor: {inductor.missing_support()}")


class CpuAccepted(AutoStreamPass):
    """The pass, accepting the CPU device so that a wrapper can be generated here."""

    def _inductor_refusal(self, graph, device):
        return super()._inductor_refusal(graph, "cuda")


class TwoChains(nn.Module):
    """Two independent matmul chains joined by an add (one output, for ``get_code``)."""

    def __init__(self, width: int = 128, depth: int = 3) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = nn.ParameterList(nn.Parameter(torch.randn(width, width, generator=g) / 16)
                                  for _ in range(depth))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(width, width, generator=g) / 16)
                                  for _ in range(depth))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for w in self.a:
            x = torch.relu(x @ w)
        for w in self.b:
            y = torch.tanh(y @ w)
        return x + y


class Capture:
    """A post pass after autostream's: keeps each graph's nodes (name, target, stream)."""

    def __init__(self) -> None:
        self.graphs: list[list[tuple[str, object, object]]] = []
        self.subgraph_targets: list[list[object]] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append([(n.name, n.target, n.meta.get("custom", {}).get("stream"))
                            for n in graph.nodes])
        gm = graph.owning_module
        self.subgraph_targets.append(
            [m.target for name, sub in gm.named_children() if name.startswith("subgraph")
             for m in sub.graph.nodes if m.op == "call_function"])

    def uuid(self) -> None:
        return None


@pytest.fixture
def scheduler_streams(monkeypatch):
    """The scheduler's ``stream_idx_to_user_obj_idx`` of each graph it schedules."""
    from torch._inductor.scheduler import Scheduler

    seen: list[dict[int, int]] = []
    original = Scheduler._populate_stream_assignments

    def record(self) -> None:
        original(self)
        seen.append(dict(self.stream_idx_to_user_obj_idx))

    monkeypatch.setattr(Scheduler, "_populate_stream_assignments", record)
    return seen


@pytest.fixture
def scheduled(monkeypatch):
    """Each graph's scheduler nodes after fusion, in launch order: (stream, FX origins)."""
    from torch._inductor.scheduler import Scheduler

    seen: list[list[tuple[int, frozenset[str]]]] = []
    original = Scheduler.codegen

    def record(self):
        seen.append([(self.node_to_stream.get(n, 0),
                      frozenset(o.name for m in n.get_nodes() if m.node is not None
                                for o in m.node.get_origins()))
                     for n in self.nodes])
        return original(self)

    monkeypatch.setattr(Scheduler, "codegen", record)
    return seen


def wrapper_of(model, inputs, p, capture=None, **config) -> str:
    from torch._inductor.utils import get_code

    passes = [p] if capture is None else [p, capture]
    settings = {"post_grad_custom_post_pass": passes, "allow_buffer_reuse": False, **config}
    with torch._inductor.config.patch(**settings), torch.no_grad():
        code = get_code(torch.compile(model), *inputs)
    torch._dynamo.reset()
    return code[0]


def two_chains():
    model = TwoChains().eval()
    g = torch.Generator().manual_seed(1)
    return model, (torch.randn(8, 128, generator=g), torch.randn(8, 128, generator=g))


def test_the_post_grad_graph_carries_the_plan_as_inductor_annotations(scheduler_streams):
    model, inputs = two_chains()
    p, cap = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True), Capture()
    wrapper_of(model, inputs, p, cap)
    report = p.last_report
    assert report.outcome is Outcome.APPLIED and report.target == "inductor", report.reason
    plan, nodes = report.plan, cap.graphs[-1]
    side = {n for n, s in plan.schedule.stream_of.items() if s == 1}
    tags = {name: stream for name, _, stream in nodes}
    index = scheduler_streams[-1][1]  # the object behind the scheduler's stream1
    assert side and all(tags[n] == index for n in side)
    main_ops = [n for n, s in plan.schedule.stream_of.items() if s == 0]
    assert main_ops and all(tags[n] is None for n in main_ops)
    # every sync is a wait_stream inside a control_deps subgraph; none is left bare
    waits = [t for ts in cap.subgraph_targets for t in ts
             if t is torch.ops.streams.wait_stream.default]
    assert len(waits) >= 2  # the fork and the join at least
    assert not any(t is torch.ops.streams.wait_stream.default for _, t, _ in nodes)
    assert sum(t is torch.ops.higher_order.control_deps for _, t, _ in nodes) == len(waits)
    records = [name for name, t, _ in nodes if t is torch.ops.streams.record_stream.default]
    assert records and "record_stream for" in report.reason


def test_the_scheduler_launches_each_stream_after_its_waits(scheduler_streams, scheduled):
    """Backend-independent: the scheduler's nodes (what the wrapper launches, in order)."""
    model, inputs = two_chains()
    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    wrapper_of(model, inputs, p)
    plan = p.last_report.plan
    # views and getitems have no kernel: Inductor inlines them into their users'
    stream_of = {n: s for n, s in plan.schedule.stream_of.items()
                 if not plan.op_graph.nodes[n]["meta_only"]}
    nodes = scheduled[-1]
    waits = [i for i, (_, o) in enumerate(nodes) if any(n.startswith("wait_stream") for n in o)]
    # a sync node's origins (and its passthrough no-ops') name the ops it orders: only
    # compute nodes are checked
    sync = {i for i, (_, o) in enumerate(nodes)
            if any(n.startswith(("wait_stream", "control_deps")) for n in o)}
    compute = [(i, s, o & set(stream_of)) for i, (s, o) in enumerate(nodes)
               if o & set(stream_of) and i not in sync]
    # no scheduler node mixes the plan's streams, and each sits on its plan stream
    assert compute and all(len({stream_of[n] for n in o & set(stream_of)}) == 1
                           and s == stream_of[next(iter(o & set(stream_of)))]
                           for _, s, o in compute)
    side = [i for i, s, _ in compute if s == 1]
    fork, join = waits[0], waits[-1]
    assert len(side) >= 6 and nodes[fork][0] == 1 and fork < min(side)  # fork first
    assert nodes[join][0] == 0 and max(side) < join  # the join after all side work
    add = next(i for i, _, o in compute if any(n.startswith("add") for n in o))
    assert join < add


def test_the_wrapper_has_the_stream_blocks_and_waits_in_place(scheduler_streams):
    """The CPU wrapper's text: blocks, waits, joins, no reuse.  Not its kernels per
    stream: the C++ backend groups consecutive pointwise nodes of both streams into one
    kernel when it writes code (its scheduler keeps them apart, see the test above)."""
    model, inputs = two_chains()
    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    code = wrapper_of(model, inputs, p)
    objects = {obj: f"stream{s}" for s, obj in scheduler_streams[-1].items()}
    s = inductor.wrapper_structure(code, objects)
    index = scheduler_streams[-1][1]
    first_side = next(lines for stream, lines in s.blocks if stream == "stream1")
    assert f"wait_stream.default({index}, 0)" in first_side[0]
    last_stream, last_lines = s.blocks[-1]
    text = "\n".join(last_lines)
    assert last_stream == "default_stream" and "return" in text
    assert text.index(f"wait_stream.default(0, {index})") < text.index("return")
    assert all(block == ("stream1" if w == index else "default_stream")
               for block, w, _ in s.waits)
    assert s.switches >= 2 and s.reuses == []  # allow_buffer_reuse=False: no reuse lines


def test_streams_are_registered_from_the_pool_on_cold_and_warm_caches(scheduler_streams):
    from torch._dynamo import graph_bytecode_inputs as gbi
    from torch._dynamo.utils import counters

    model, inputs = two_chains()
    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    assert p.uuid() is None and AutoStreamPass().uuid() is not None
    counters.clear()
    with torch._inductor.config.patch(fx_graph_cache=True), \
            torch._functorch.config.patch(enable_autograd_cache=True):
        for _ in range(2):  # the second compile would hit a warm cache but for uuid() None
            wrapper_of(model, inputs, p)
            index = scheduler_streams[-1][1]
            # Dynamo's bytecode ran before the (dummy) call and stored the pool's stream
            assert gbi.index_to_external_object_weakref[index]() is \
                inductor.pooled_stream("cpu", 1)
    assert [r.outcome for r in p.reports] == [Outcome.APPLIED, Outcome.APPLIED]
    assert counters["inductor"]["fxgraph_cache_bypass"] >= 2
    assert counters["inductor"]["fxgraph_cache_hit"] == 0


def test_the_zoo_moe_keeps_its_plan_streams_through_the_scheduler(scheduler_streams, scheduled):
    model, inputs = moe_model()
    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    code = wrapper_of(model, inputs, p)
    assert p.last_report.target == "inductor", p.last_report.reason
    plan = p.last_report.plan
    stream_of = {n: s for n, s in plan.schedule.stream_of.items()
                 if not plan.op_graph.nodes[n]["meta_only"]}
    planned = [(s, o & set(stream_of)) for s, o in scheduled[-1] if o & set(stream_of)
               and not any(n.startswith(("wait_stream", "control_deps")) for n in o)]
    mixed = [o for _, o in planned if len({stream_of[n] for n in o}) > 1]
    assert not mixed
    on = {0: 0, 1: 0}
    for s, o in planned:
        assert s == stream_of[next(iter(o))]
        on[s] += 1
    assert on[0] >= 4 and on[1] >= 4, on
    objects = {obj: f"stream{s}" for s, obj in scheduler_streams[-1].items()}
    s = inductor.wrapper_structure(code, objects)
    assert s.switches >= 2 and len(s.waits) >= 2 and s.reuses == []


def _forward_graph(fn, *inputs) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(*inputs)


def _chains(x, w1, w2):
    return torch.relu(x @ w1) @ w1 + torch.tanh(x @ w2) @ w2


def _run_on_graph(p, gm):
    before = [(n.name, n.target) for n in gm.graph.nodes]
    report = p.run(gm.graph)
    assert [(n.name, n.target) for n in gm.graph.nodes] == before
    return report


@pytest.mark.parametrize("setting, phrase", [
    ({"cpp_wrapper": True}, "cpp_wrapper does not fetch"),
    ({"allow_buffer_reuse": True}, "allow_buffer_reuse"),
])
def test_cpp_wrapper_and_buffer_reuse_are_refused_saying_why(setting, phrase):
    gm = _forward_graph(_chains, *(torch.randn(64, 64) for _ in range(3)))
    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    with torch._inductor.config.patch(**{"allow_buffer_reuse": False, **setting}):
        report = _run_on_graph(p, gm)
    assert report.outcome is Outcome.UNSUPPORTED_COMPILER and report.target is None
    assert phrase in report.reason


def test_cpu_graphs_are_refused_saying_why():
    gm = _forward_graph(_chains, *(torch.randn(64, 64) for _ in range(3)))
    p = AutoStreamPass(max_streams=2, cost_table="h200", inductor_streams=True)
    with torch._inductor.config.patch(allow_buffer_reuse=False):
        report = _run_on_graph(p, gm)
    assert report.outcome is Outcome.UNSUPPORTED_COMPILER
    assert "runs on cpu, which has no streams" in report.reason


def test_without_the_option_inductor_graphs_are_left_unchanged():
    gm = _forward_graph(_chains, *(torch.randn(64, 64) for _ in range(3)))
    report = _run_on_graph(AutoStreamPass(max_streams=2, cost_table="h200"), gm)
    assert report.outcome is Outcome.UNSUPPORTED_COMPILER
    assert "inductor_streams=True" in report.reason


def test_a_torch_without_multistream_inductor_is_refused_saying_so(monkeypatch):
    gm = _forward_graph(_chains, *(torch.randn(64, 64) for _ in range(3)))
    monkeypatch.setattr(inductor, "missing_support", lambda: ("torch.ops.streams.wait_stream",))
    report = _run_on_graph(CpuAccepted(cost_table="h200", inductor_streams=True), gm)
    assert "has no multi-stream Inductor (missing: torch.ops.streams.wait_stream)" \
        in report.reason


def test_backward_graphs_are_left_unchanged_saying_why():
    from functorch.compile import aot_function

    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    seen = []

    def forward_compiler(gm, _):
        return gm

    def backward_compiler(gm, _):
        before = [(n.name, n.target) for n in gm.graph.nodes]
        with torch._inductor.config.patch(allow_buffer_reuse=False):
            seen.append(p.run(gm.graph))
        assert [(n.name, n.target) for n in gm.graph.nodes] == before
        return gm

    x, w1, w2 = (torch.randn(64, 64, requires_grad=True) for _ in range(3))
    compiled = aot_function(_chains, forward_compiler, backward_compiler)
    compiled(x, w1, w2).sum().backward()
    assert len(seen) == 1 and seen[0].outcome is Outcome.UNSUPPORTED_COMPILER
    assert "backward graph compiles lazily" in seen[0].reason
    assert w1.grad is not None


def test_the_wrapper_check_finds_a_cross_stream_reuse_without_a_wait():
    bad = "\n".join([
        "with default_stream:",
        "    extern_kernels.mm(arg1_1, arg0_1, out=buf0)",
        "with stream1:",
        "    torch.ops.streams.wait_stream.default(1, 0)",
        "    extern_kernels.mm(arg6_1, arg5_1, out=buf8)",
        "with default_stream:",
        "    extern_kernels.mm(buf0, arg2_1, out=buf9)",
        "with stream1:",
        "    buf10 = buf0; del buf0  # reuse",
        "    extern_kernels.mm(buf8, arg7_1, out=buf10)",
    ])
    s = inductor.wrapper_structure(bad, {1: "stream1"})
    assert s.reuses == [("buf10", "buf0", "stream1", ("default_stream",))]
    # buf0's last read on the main stream (line 6) is not waited for before line 8 and 9
    assert {(h[0], h[1], h[2], h[3], h[4]) for h in s.hazards} == {
        ("buf10", "stream1", 8, "default_stream", 6), ("buf0", "stream1", 8, "default_stream", 6),
        ("buf10", "stream1", 9, "default_stream", 6)}
    fixed = bad.replace("    buf10 = buf0;", "    torch.ops.streams.wait_stream.default(1, 0)\n"
                                               "    buf10 = buf0;")
    checked = inductor.wrapper_structure(fixed, {1: "stream1"})
    assert checked.hazards == [] and checked.checked == 3
    assert inductor.wrapper_structure("", {}).checked == 0


def _pointwise_chain(x, w):
    return torch.tanh(torch.relu(x @ w)) * 2 @ w


def test_pointwise_chains_inductor_fuses_are_costed_as_one_task():
    from autostream.cost import TableCostModel
    from autostream.cost.fused import FusedCosts, fused_producers, split_fusions

    gm = _forward_graph(_pointwise_chain, torch.randn(8, 64), torch.randn(64, 64))
    fused = fused_producers(gm.graph)
    assert fused == {"tanh": "relu", "mul": "tanh"}  # relu follows a matmul: not fused
    base = TableCostModel.load("h200")
    costs = FusedCosts(base, gm.graph)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert costs.estimate(nodes["relu"]) == base.estimate(nodes["relu"])
    assert base.estimate(nodes["tanh"]).duration_us > 0
    assert costs.estimate(nodes["tanh"]).duration_us == 0.0
    assert costs.estimate(nodes["mul"]).note == "fused into tanh by Inductor"
    assert costs.sync_latency_us == base.sync_latency_us and costs.profile is base.profile
    assert split_fusions(fused, {"relu": 0, "tanh": 0, "mul": 1}) == [("mul", "tanh")]


def test_the_report_says_how_many_ops_were_costed_as_fused(scheduler_streams):
    model, inputs = moe_model()
    p = CpuAccepted(max_streams=2, cost_table="h200", inductor_streams=True)
    wrapper_of(model, inputs, p)
    report = p.last_report
    assert report.target == "inductor"
    free = [e for e in report.plan.estimates.values() if e.note.startswith("fused into")]
    assert len(free) >= 10 and f"{len(free)} pointwise ops costed as fused" in report.reason


def test_the_report_names_the_target_torchair_for_a_graph_module():
    gm = _forward_graph(_chains, *(torch.randn(256, 256) for _ in range(3)))
    report = AutoStreamPass(max_streams=2, cost_table="h200").run(gm)
    assert report.applied and report.target == "torchair"
    assert report.figures()["target"] == "torchair"
    refused = AutoStreamPass(max_streams=2, cost_table="h200").run(
        _forward_graph(_chains, *(torch.randn(64, 64) for _ in range(3))).graph)
    assert refused.target is None and refused.figures()["target"] is None


def test_the_option_is_part_of_the_pass_identity_and_checked():
    on, off = AutoStreamPass(inductor_streams=True), AutoStreamPass()
    assert on != off and on.digest() != off.digest() and on.key() == off.key()
    assert on.uuid() is None and off.uuid() == off.digest()
    with pytest.raises(ValueError, match="inductor_streams must be True or False, got 'yes'"):
        AutoStreamPass(inductor_streams="yes")
