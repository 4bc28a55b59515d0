"""The pass plans for what TorchAir does after it, by ``config.mode`` (issue 27)."""

from __future__ import annotations

import pytest
import torch

from autostream import AutoStreamPass
from autostream.dialects.torchair import air_kind, scope_label
from autostream.dialects.torchair_modes import GE_LAZY_VIEWS
from autostream.fx.capture import capture_graphs
from autostream.models import zoo
from autostream.passes import Outcome


class Config:  # what the pass reads of TorchAir's CompilerConfig
    def __init__(self, mode: str) -> None:
        self.mode = mode


def rewritten(factory, mode: str | None, streams: int = 2, table: str = "ascend910b"):
    model, inputs = factory()
    [gm] = capture_graphs(model, inputs)
    autostream_pass = AutoStreamPass(max_streams=streams, cost_table=table)
    autostream_pass(gm, inputs, Config(mode) if mode else None)
    assert autostream_pass.last_report.applied, autostream_pass.last_report.reason
    return gm


def streams_of(gm):
    stack, out = ["main"], {}
    for node in gm.graph.nodes:
        kind = air_kind(node)
        if kind == "scope_enter":
            stack.append(scope_label(node))
        elif kind == "scope_exit":
            stack.pop()
        else:
            out[node] = stack[-1]
    return out


def test_ge_join_wait_precedes_a_main_stream_op_not_output():
    """GE attaches a wait to the next GE op on its stream: nothing follows a wait right
    before ``output``."""
    gm = rewritten(zoo.inception_block, "max-autotune")
    nodes = list(gm.graph.nodes)
    assert air_kind(nodes[-2]) is None and nodes[-2].op == "call_function"
    assert streams_of(gm)[nodes[-2]] == "main"
    waits = [n for n in nodes if air_kind(n) == "wait"]
    after = nodes[nodes.index(waits[-1]) + 1] if waits else None
    assert after is not None and after.op == "call_function" and air_kind(after) is None
    assert streams_of(gm)[after] == "main"


def lazy_views_feeding_side_streams(gm):
    where = streams_of(gm)
    return [n.name for n, stream in where.items()
            if n.op == "call_function" and str(n.target) in GE_LAZY_VIEWS and stream == "main"
            and any(where[u] != "main" for u in n.users)]


def first_consumer_on_a_side_stream(gm):
    """Main-stream lazy views whose first consumer is on a side stream: GE emits them there
    unlabelled."""
    where = streams_of(gm)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    feeding = set(lazy_views_feeding_side_streams(gm))
    return [n.name for n in gm.graph.nodes if n.name in feeding
            and where[min(n.users, key=order.__getitem__)] != "main"]


@pytest.mark.slow
def test_ge_main_stream_lazy_views_are_first_consumed_on_the_main_stream():
    """GE defers ``view/reshape/transpose/...`` on the main stream to their first consumer,
    unlabelled: in GE mode no such view is first consumed on a side stream (it moves into
    that stream), and a record for its side-stream users follows its first consumer.
    Without the mode (CUDA events) the same Llama plan has some."""
    from autostream.models import hf_zoo

    assert first_consumer_on_a_side_stream(rewritten(hf_zoo.llama, None, 4, "h200"))
    gm = rewritten(hf_zoo.llama, "max-autotune", 4, "h200")
    assert first_consumer_on_a_side_stream(gm) == []
    nodes = list(gm.graph.nodes)
    for name in lazy_views_feeding_side_streams(gm):
        [view] = [n for n in nodes if n.name == name]
        assert air_kind(nodes[nodes.index(view) + 1]) != "record", name


def test_without_a_mode_the_join_stays_right_before_output():
    gm = rewritten(zoo.inception_block, None)
    assert air_kind(list(gm.graph.nodes)[-2]) == "wait"


def test_verifier_knows_ge_drops_a_join_wait_before_output():
    """The plan made for CUDA events joins right before ``output``: correct there, but GE
    attaches that wait to nothing, and the verifier in GE mode says so."""
    from autostream.dialects.rewrite import rewrite_graph
    from autostream.dialects.verify import verify_rewrite
    from autostream.planning.plan import PlanOptions, plan_graph

    model, inputs = zoo.inception_block()
    [gm] = capture_graphs(model, inputs)
    plan = plan_graph(gm, PlanOptions(max_streams=2, cost_table="ascend910b"))
    rewrite_graph(gm, plan.schedule, plan.syncs)
    assert verify_rewrite(gm, plan.op_graph).ok
    problems = verify_rewrite(gm, plan.op_graph, "max-autotune").problems
    assert any("not joined" in p for p in problems), problems


@pytest.mark.slow
def test_verifier_knows_ge_defers_main_stream_views():
    """Llama's CUDA plan has main-stream views feeding side streams: GE emits them at their
    first consumer, on the main stream, unordered before the side-stream consumer."""
    from autostream.dialects.rewrite import rewrite_graph
    from autostream.dialects.verify import verify_rewrite
    from autostream.models import hf_zoo
    from autostream.planning.plan import PlanOptions, plan_graph

    model, inputs = hf_zoo.llama()
    [gm] = capture_graphs(model, inputs)
    plan = plan_graph(gm, PlanOptions(max_streams=4, cost_table="h200"))
    rewrite_graph(gm, plan.schedule, plan.syncs)
    views = set(lazy_views_feeding_side_streams(gm))
    assert views
    problems = verify_rewrite(gm, plan.op_graph, "max-autotune").problems
    assert any(p.startswith("dependence") and any(f"{v} ->" in p for v in views)
               for p in problems), problems


def test_acl_mode_charges_each_scope_its_events():
    """An ACL graph adds a tagged-event wait, a record and a wait per scope: the same
    graph is predicted slower with them, and inception's plan trades a sync for them."""
    model, inputs = zoo.moe_model()
    reports = {}
    for mode in (None, "reduce-overhead"):
        [gm] = capture_graphs(model, inputs)
        autostream_pass = AutoStreamPass(max_streams=4, cost_table="ascend910b")
        autostream_pass(gm, inputs, Config(mode) if mode else None)
        reports[mode] = autostream_pass.last_report
    assert reports["reduce-overhead"].plan.predicted_us > reports[None].plan.predicted_us
    syncs = {}
    for mode in (None, "reduce-overhead"):
        model, inputs = zoo.inception_block()
        [gm] = capture_graphs(model, inputs)
        autostream_pass = AutoStreamPass(max_streams=2, cost_table="ascend910b")
        autostream_pass(gm, inputs, Config(mode) if mode else None)
        assert autostream_pass.last_report.applied
        syncs[mode] = len(autostream_pass.last_report.plan.syncs)
    assert syncs["reduce-overhead"] < syncs[None]


def test_acl_mode_orders_readers_of_a_view_before_a_reinplaceable_write():
    """``y.mul(2)`` may become ``y.mul_(2)`` in TorchAir's ACL graph: the reader of a
    view of ``y`` is a dependence of the ``mul`` there (and of ``cos``, which may write
    ``y`` through its view; ``mul`` reads ``y`` after it)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from autostream.dialects.torchair_modes import acl_reinplace_hazards
    from autostream.fx.graph import build_op_graph

    def f(x):
        y = x.exp()
        return y.view(-1).sum(), y.t().cos(), y.mul(2)

    gm = make_fx(f)(torch.ones(4, 4))
    edges = acl_reinplace_hazards(gm, build_op_graph(gm))
    assert edges == [("sum_1", "cos"), ("cos", "mul"), ("sum_1", "mul")]


def test_acl_mode_keeps_a_later_reader_after_a_reinplaceable_write():
    """TorchAir reinplaces ``y.mul(2)`` only when nothing reads ``y`` after it in the order
    it is given; the launch order is not the program's, so a later reader of ``y`` stays
    after ``mul`` (else a plan moving it before could make ``mul`` write ``y`` under it)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from autostream.dialects.torchair_modes import acl_reinplace_hazards
    from autostream.fx.graph import build_op_graph

    def f(x):
        y = x.exp()
        return y.mul(2), y.view(-1).sum()

    gm = make_fx(f)(torch.ones(2, 2))
    assert ("mul", "sum_1") in acl_reinplace_hazards(gm, build_op_graph(gm))


def _op_graph(f, *inputs):
    from torch.fx.experimental.proxy_tensor import make_fx

    from autostream.fx.graph import build_op_graph

    return build_op_graph(make_fx(f)(*inputs))


def _schedule(stream_of):
    from autostream.scheduling.schedule import Schedule

    return Schedule("x", dict(stream_of), tuple(stream_of), {}, {}, 0.0, 0.0)


def test_ge_moves_a_view_op_that_materialises_a_lazy_view_with_it():
    """GE defers a main-stream ``transpose`` to its first consumer; an ``expand`` to the
    same shape then emits no GE op (``ge_converter/aten/expand.py:22``), so a record after
    it follows an earlier op, not the transpose (GPT-OSS at h200).  Both move onto the side
    stream that reads them."""
    import torch

    from autostream.dialects.torchair_modes import ge_safe_schedule

    def f(x):
        return x.exp().transpose(0, 1).expand(4, 4).cos()

    deps = _op_graph(f, torch.ones(4, 4))
    assert [n for n in deps.nodes] == ["exp", "transpose", "expand", "cos"]
    safe = ge_safe_schedule(_schedule({"exp": 0, "transpose": 0, "expand": 0, "cos": 1}), deps)
    assert safe.stream_of["transpose"] == safe.stream_of["expand"] == 1
    assert safe.order.index("expand") == safe.order.index("cos") - 1


def test_ge_moves_an_op_without_tensor_inputs_onto_its_consumer_stream():
    """``scalar_tensor`` lowers to a ``Const`` alone: a record after it on a side stream
    follows no task (GPT-OSS at h200), so it runs on its consumer's stream."""
    import torch

    from autostream.dialects.torchair_modes import ge_safe_schedule

    def f(x):
        return torch.where(x.exp() > 0, x, torch.scalar_tensor(-1.0))

    deps = _op_graph(f, torch.ones(4))
    [factory] = [n for n in deps.nodes if "scalar_tensor" in n]
    streams = {n: 0 for n in deps.nodes}
    streams[factory] = 1
    safe = ge_safe_schedule(_schedule(streams), deps)
    assert safe.stream_of[factory] == 0


def test_ge_wait_moves_to_an_op_whose_first_ge_op_is_a_task():
    """``x.mul(0.5)``'s converter emits a ``Const`` for ``0.5`` first, and GE puts a wait's
    control edges on that ``Const``; the wait moves to the earlier ``exp`` on the same
    stream, whose first GE op is the ``Exp`` itself."""
    import torch

    from autostream.dialects.torchair_modes import ge_wait_targets
    from autostream.scheduling.schedule import Sync

    def f(x, y):
        return y.cos(), x.exp(), y.sin().mul(0.5)

    deps = _op_graph(f, torch.ones(4), torch.ones(4))
    assert list(deps.nodes) == ["cos", "exp", "sin", "mul"]
    schedule = _schedule({"sin": 1, "cos": 0, "exp": 0, "mul": 0})
    assert ge_wait_targets([Sync("sin", "mul")], schedule, deps) == [Sync("sin", "exp")]
    # no task-first op between the record and the consumer: the wait stays
    schedule = _schedule({"cos": 0, "exp": 0, "sin": 1, "mul": 0})
    assert ge_wait_targets([Sync("sin", "mul")], schedule, deps) == [Sync("sin", "mul")]


def test_ge_main_stream_lazy_view_of_a_side_result_runs_on_that_side_stream():
    """GE emits a main-stream ``view`` while its consumer's arguments are prepared, before
    the op the consumer's wait lands on: a view of a side stream's result (GPT-OSS at
    ascend910b, 4 streams) runs on that side stream instead."""
    import torch

    from autostream.dialects.torchair_modes import ge_safe_schedule

    def f(x):
        return x.exp().view(-1).unsqueeze(0).cos()

    deps = _op_graph(f, torch.ones(4, 4))
    assert list(deps.nodes) == ["exp", "view", "unsqueeze", "cos"]
    safe = ge_safe_schedule(_schedule({"exp": 1, "view": 0, "unsqueeze": 0, "cos": 0}), deps)
    assert safe.stream_of["view"] == 1 and safe.stream_of["unsqueeze"] == 0


def test_ge_mode_keeps_the_graph_when_its_placement_costs_the_gain():
    """Inception at 2 streams on the h200 table: the views and waits GE needs moved make
    HEFT's plan slower than one stream, so the graph stays as it was (the CUDA plan is
    applied).  CP-SAT's plan loses its gain the same way; the planner weighs its
    portfolio's plans as placed too, and one keeps a gain (issue 51, item 3)."""
    model, inputs = zoo.inception_block()
    [gm] = capture_graphs(model, inputs)
    autostream_pass = AutoStreamPass(max_streams=2, cost_table="h200")
    autostream_pass(gm, inputs, Config("max-autotune"))
    plan = autostream_pass.last_report.plan
    [own] = [w for w in plan.weighed if w.how.startswith("cpsat plan placed")]
    assert not own.eligible and autostream_pass.last_report.applied
    assert plan.predicted_us < plan.single_stream_us * 0.99
    results = {}
    for mode in (None, "max-autotune"):
        [gm] = capture_graphs(model, inputs)
        before = str(gm.graph)
        autostream_pass = AutoStreamPass(max_streams=2, cost_table="h200", solver="heft")
        autostream_pass(gm, inputs, Config(mode) if mode else None)
        results[mode] = autostream_pass.last_report, str(gm.graph) == before
    cuda, ge = results[None], results["max-autotune"]
    assert cuda[0].applied and not cuda[1]
    report, unchanged = ge
    assert not report.applied and unchanged
    assert report.plan.predicted_us >= report.plan.single_stream_us * 0.99
    assert "not faster than one stream" in report.reason


def _two_chains(x, y):
    s = torch.mm(x, y)
    t = s.exp().cos().sin().tanh()
    d = s.mul(2).sum(0).cos().sin().exp()
    m = torch.mm(y, x).cos().sin().tanh().exp()
    return d, m, t


def _two_chains_plan(monkeypatch, mode, budget):
    """The pass's report on ``_two_chains`` (uniform op costs) and its plan's memory bound,
    checked again from scratch on the schedule and syncs the rewrite emitted."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from autostream.memory.predict import GraphMemory, predict_memory
    from autostream.scheduling.simulate import simulate_plan
    from tests.helpers import UniformCosts

    monkeypatch.setattr(AutoStreamPass, "cost_model_for",
                        lambda self, device, communicates=False: UniformCosts())
    gm = make_fx(_two_chains, tracing_mode="fake")(torch.randn(256, 256), torch.randn(256, 256))
    memory = GraphMemory.from_graph(gm)
    report = AutoStreamPass(max_streams=2, max_memory_increase=budget).run(gm, None, mode)
    plan = report.plan
    timeline = simulate_plan(plan.problem, plan.schedule, plan.syncs)
    return report, predict_memory(memory, plan.schedule, plan.syncs, timeline).bound_bytes


def test_ge_placement_is_checked_against_the_memory_budget(monkeypatch):
    """GE runs the last launched op, a side stream's as solved, on the main stream: the
    syncs change and the plan may hold 1.8 MiB, over a budget of 257 KiB above one
    stream's 1.3 MiB that the plan as solved fits exactly.  The plan GE runs is the one
    checked and repaired, and its figures are those of the plan rewritten."""
    cuda, cuda_bound = _two_chains_plan(monkeypatch, None, "257KiB")
    limit = cuda.plan.memory.single_stream_peak_bytes + 257 * 1024
    assert cuda.applied and not cuda.plan.notes and cuda_bound == limit
    free, free_bound = _two_chains_plan(monkeypatch, "max-autotune", None)
    assert free.applied and free_bound > limit and free.plan.memory.bound_bytes == free_bound
    report, bound = _two_chains_plan(monkeypatch, "max-autotune", "257KiB")
    assert report.applied and report.plan.memory.limit_bytes == limit
    assert bound <= limit and report.plan.memory.bound_bytes == bound
    assert report.plan.notes[0].startswith(
        "cpsat plan placed for TorchAir GE (max-autotune) may peak at 1.8 MiB, over the budget")
    assert report.plan.predicted_us < report.plan.single_stream_us * 0.99


class BufferUpdate(torch.nn.Module):
    """Two branches read a buffer that the graph then overwrites (``copy_`` into an input
    once input mutations are kept, as TorchAir's backend keeps them)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, width)

    def forward(self, buf, x):
        scaled = self.a(x) * buf
        shifted = torch.sigmoid(self.b(x)) + buf
        buf.copy_(torch.tanh(self.a(x)).mean(0))
        return scaled, shifted


def with_input_copy():
    """The graph with ``copy_(buf, value)`` at its end (functionalized, as AOTAutograd
    keeps an input mutation), and its inputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    model = BufferUpdate()
    inputs = (torch.randn(256), torch.randn(64, 256))
    gm = make_fx(torch.func.functionalize(model, remove="mutations_and_views"))(*inputs)
    return model, gm, inputs


def test_ge_orders_readers_of_an_input_before_the_op_bound_to_it():
    """GE binds the value of ``copy_(buf, value)`` to ``buf``: the op computing it writes
    ``buf`` in place, so both branches reading ``buf`` run before it, the copy is launched
    last on the main stream, and the outputs are unchanged."""
    from autostream.dialects.input_mutations import input_mutations, is_input_copy

    model, gm, (buf, x) = with_input_copy()
    [mutation] = input_mutations(gm)
    assert len(mutation.readers) == 2
    expected_buf = buf.clone()
    expected = gm(expected_buf, x)
    autostream_pass = AutoStreamPass(max_streams=2, cost_table="h200")
    report = autostream_pass.run(gm, (buf, x), mode="max-autotune")
    assert report.applied, report.reason
    assert report.mode == "max-autotune"
    edges = report.plan.op_graph.edges
    for reader in mutation.readers:
        assert (reader, mutation.writers[0]) in edges or reader in \
            __import__("networkx").ancestors(report.plan.op_graph, mutation.writers[0])
    launched = [n for n in gm.graph.nodes if n.op == "call_function" and air_kind(n) is None]
    assert is_input_copy(launched[-1]) and streams_of(gm)[launched[-1]] == "main"
    got_buf = buf.clone()
    got = gm(got_buf, x)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert torch.equal(expected_buf, got_buf)


def test_verifier_checks_output_refs_from_the_graph_alone():
    """A rewrite that runs a reader of ``buf`` on a side stream with no sync before the op
    GE binds to ``buf``: ``verify_rewrite`` in GE mode names it and says how many pairs it
    checked; the same rewrite checked for CUDA events (no binding) passes."""
    from autostream.dialects.input_mutations import input_mutations
    from autostream.dialects.rewrite import rewrite_graph
    from autostream.dialects.verify import verify_rewrite
    from autostream.fx.graph import build_op_graph
    from autostream.scheduling.schedule import Schedule
    from autostream.scheduling.sync import compute_syncs

    _, gm, _ = with_input_copy()
    deps = build_op_graph(gm)
    [mutation] = input_mutations(gm)
    reader = mutation.readers[-1]
    order = [n for n in deps if n != reader]
    order.insert(len(order) - 1, reader)  # right before the copy, after the writer
    stream_of = {n: 1 if n == reader else 0 for n in deps}
    schedule = Schedule("x", stream_of, tuple(order), {}, {}, 0.0, 0.0)
    rewrite_graph(gm, schedule, compute_syncs(deps, schedule))
    cuda = verify_rewrite(gm, deps)
    assert cuda.ok, cuda.problems
    ge = verify_rewrite(gm, deps, "max-autotune")
    assert ge.checked["output_refs"] == 2
    assert any(reader in p and "write in place" in p for p in ge.problems), ge.problems


def aot_graph_with_symbols(fn, *inputs):
    """The forward graph AOTAutograd gives a backend for ``fn`` under ``dynamic=True``."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(fn, dynamic=True, backend=aot_autograd(fw_compiler=grab))(*inputs)
    return graphs[0]


def _half_rows(x):
    return x[: x.shape[0] // 2].exp() * 2


def test_symbolic_inputs_are_read_from_sizes_where_used_and_can_be_undone():
    """GE's ``_optimize_sym_input`` reads a symbolic input from a tensor's size at the top of
    the graph, on the main stream; the pass puts one ``sym_size`` before each user instead,
    computing the same values, and takes them out again when it leaves the graph alone."""
    from autostream.dialects.input_mutations import symbolic_inputs_as_sizes

    gm = aot_graph_with_symbols(_half_rows, torch.randn(8, 3))
    args = [8, 3, torch.randn(8, 3)]
    before = gm(*args)
    text = gm.code
    reads = symbolic_inputs_as_sizes(gm)
    [(size, symbol, user)] = reads.replaced
    assert size.target is torch.ops.aten.sym_size.int and symbol.op == "placeholder"
    assert torch.equal(gm(*args)[0], before[0])
    reads.undo(gm)
    assert gm.code == text


def test_ge_keeps_graphs_with_symbolic_size_lists_on_one_stream():
    """A view whose size list holds a symbol: GE packs that list on the main stream wherever
    the view runs, so GE mode keeps the graph on one stream and says why."""
    def two_branches(x):
        return x.view(x.shape[0] * 2, -1).exp().sum(), x.sin().cos().sum()

    gm = aot_graph_with_symbols(two_branches, torch.randn(8, 6))
    report = AutoStreamPass(max_streams=2, cost_table="h200").run(gm, None, mode="max-autotune")
    assert not report.applied and "GE packs the symbolic size lists" in report.reason
    assert report.outcome is Outcome.ONE_STREAM_TARGET  # not "no parallelism": there is
    assert report.figures()["outcome"] == "the target runs this graph on one stream"
    assert not any(n.target is torch.ops.aten.sym_size.int for n in gm.graph.nodes)


def _defective_head_rewrite():
    """A classifier head's tail as the GE plan used to write it: ``mean -> view`` on a side
    stream, the ``addmm`` of the ``Linear`` last on the main stream after the wait."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from autostream.dialects.rewrite import rewrite_graph
    from autostream.fx.graph import build_op_graph
    from autostream.scheduling.schedule import Schedule, Sync

    def head(x, bias, weight):
        return torch.addmm(bias, x.relu().mean([-1, -2], keepdim=True).view(1, 8), weight)

    gm = make_fx(head)(torch.randn(1, 8, 4, 4), torch.randn(10), torch.randn(8, 10))
    deps = build_op_graph(gm)
    assert list(deps.nodes) == ["relu", "mean", "view", "addmm"]
    stream_of = {"relu": 1, "mean": 1, "view": 1, "addmm": 0}
    schedule = Schedule("head", stream_of, tuple(deps), {}, {}, 0.0, 0.0)
    rewrite_graph(gm, schedule, [Sync("view", "addmm")], join_before_last=True)
    return gm, deps


def test_ge_verifier_sees_a_wait_on_addmms_alpha_const():
    """GE puts the wait before ``addmm`` on the ``Const`` its converter makes for ``alpha``
    first; ``MatMulV2`` reads ``view`` before the ``Mul`` that uses it (issue 51): the
    verifier in GE mode names the dependence, CUDA events order it."""
    from autostream.dialects.verify import verify_rewrite

    gm, deps = _defective_head_rewrite()
    assert verify_rewrite(gm, deps).ok
    result = verify_rewrite(gm, deps, "max-autotune")
    assert result.unordered == [("view", "addmm")], result.problems
    assert "Const" in result.problems[0]


def test_ge_verifier_keeps_a_wait_on_an_op_that_reads_its_const_first():
    """``clamp`` and ``mm``: the wait's ``Const`` (or the op itself) comes before every read,
    so the same rewrite is ordered."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from autostream.dialects.rewrite import rewrite_graph
    from autostream.dialects.verify import verify_rewrite
    from autostream.fx.graph import build_op_graph
    from autostream.scheduling.schedule import Schedule, Sync

    for f in (lambda x, w: x.exp().clamp(-1, 1).mm(w), lambda x, w: x.exp().mm(w)):
        gm = make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))
        deps = build_op_graph(gm)
        [first, *_, last] = list(deps.nodes)
        stream_of = {n: 0 for n in deps}
        stream_of[first] = 1
        schedule = Schedule("x", stream_of, tuple(deps), {}, {}, 0.0, 0.0)
        consumer = next(iter(deps.successors(first)))
        rewrite_graph(gm, schedule, [Sync(first, consumer)], join_before_last=True)
        assert verify_rewrite(gm, deps, "max-autotune").ok


def test_check_ge_names_a_wait_on_addmms_alpha_const():
    """``autostream check --mode ge`` on the same graph: the placement waits for ``view``
    before ``addmm``, and GE puts that wait where ``MatMulV2``'s read is not ordered."""
    from autostream.planning.check import check

    gm, _ = _defective_head_rewrite()
    found = check(gm, "ge", "ascend910b", time_limit=0.2)
    assert [(r.ops, r.kind) for r in found.races] == [(("view", "addmm"), "wait on a Const")]
    assert check(gm, "cuda", "ascend910b", time_limit=0.2).races == ()


def waits_left_on_a_const(gm):
    """``(wait, op)``: a wait whose next op on its stream reads, before the ``Const`` the wait
    lands on, an input produced on another stream."""
    from autostream.dialects.torchair_modes import ge_wait_landing

    where = streams_of(gm)
    nodes = list(gm.graph.nodes)
    out = []
    for i, node in enumerate(nodes):
        if air_kind(node) != "wait":
            continue
        op = next(n for n in nodes[i + 1:] if n.op != "call_function" or (
            air_kind(n) is None and where[n] == where[node]))
        missed = ge_wait_landing(op).unordered_inputs if op.op == "call_function" else ()
        if any(where.get(src, "main") != where[op] for src in missed):
            out.append((node.name, op.name))
    return out


@pytest.mark.parametrize("streams,table", [(2, "ascend910b"), (3, "h200"), (4, "h200")])
def test_ge_head_waits_land_on_ops_that_lower_to_their_consumer(streams, table):
    """GoogLeNet's classifier head in GE mode (issue 51): the plan used to put ``mean ->
    view`` on a side stream and the ``addmm`` after a wait on the main stream; the wait
    landed on ``alpha``'s ``Const``.  It now pulls the producers onto the main stream
    until the wait lands on an op that lowers to the consumer itself (``relu``), and the
    pass's own verification in GE mode passes."""
    gm = rewritten(zoo.inception_head, "max-autotune", streams, table)
    assert waits_left_on_a_const(gm) == []
    assert any(air_kind(n) == "scope_enter" for n in gm.graph.nodes)
