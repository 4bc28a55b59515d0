"""Rewritten graphs through TorchAir 2.14's real Python lowering (issue 27).

The torch-npu wheel is fetched once into pytest's cache (``experiments.torchair_real``);
without the package index these tests skip and say why, and so they do on torch other
than 2.14, the only release TorchAir 2.14 runs beside.  Each case runs in a process of
its own: importing TorchAir registers its ``torch.ops.air`` ops and would change what the
rest of the suite sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(scope="module")
def torchair_cache(request):
    from experiments.torchair_real import CACHE_ENV, TorchAirUnavailable, fetch_torchair

    if torch_release() < (2, 14):
        pytest.skip(f"TorchAir 2.14 runs beside torch 2.14 only (torch-npu 2.14.0 pins "
                    f"torch==2.14.0.*), this is torch {torch.__version__}: run the suite in "
                    "a torch 2.14 environment (CI's .venv214) for these tests")
    cache = Path(os.environ.get(CACHE_ENV) or request.config.cache.mkdir("torchair"))
    try:
        fetch_torchair(cache)
    except TorchAirUnavailable as exc:
        pytest.skip(f"TorchAir 2.14 unavailable: {exc}")
    return {CACHE_ENV: str(cache)}


def run_whole_case(env, model, streams, table, mode, *flags):
    """One case through TorchAir's front door, in a process of its own: ``{"graphs": [...],
    "results_compared": n, "results_differing": [...]}``."""
    cmd = [sys.executable, "-W", "ignore", "-m", "experiments.torchair_conformance", "--case",
           model, str(streams), table, mode, *flags]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_case(env, model, streams, table, mode, drop_sync=False, without_mode=False):
    """The graphs of one case; the run's results must equal the model's compiled without
    the pass, bit for bit."""
    flags = (["--drop-sync"] if drop_sync else []) + (["--without-mode"] if without_mode else [])
    case = run_whole_case(env, model, streams, table, mode, *flags)
    assert case["results_compared"] > 0 and case["results_differing"] == [], case
    return case["graphs"]


def total(cases, key):
    return sum(len(c[key]) for c in cases)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_programs_of_a_rewritten_moe_are_covered_in_both_modes(torchair_cache, mode):
    [case] = run_case(torchair_cache, "moe", 4, "h200", mode)
    assert case["applied"]
    assert case["scopes"] > 0 and case["syncs"] > 0
    for key in ("uncovered", "unlabelled_views", "dropped_joins", "uncovered_output_refs"):
        assert case[key] == [], (key, case[key][:3])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_negative_control_deleting_one_sync_is_caught(torchair_cache, mode):
    """The same graph with its first ``air.wait`` deleted after the pass: TorchAir lowers
    it without complaint (``_valid_graph`` passes), and the harness finds the hole."""
    [case] = run_case(torchair_cache, "moe", 4, "h200", mode, drop_sync=True)
    assert case["uncovered"] or case["dropped_joins"]


@pytest.mark.slow
def test_ge_join_wait_survives_only_when_the_pass_sees_the_mode(torchair_cache):
    """GE attaches a wait's control edges to the next GE op on its stream: the CUDA plan's
    join right before ``output`` attaches to nothing (the side stream's last op is
    unordered before ``NetOutput``); the plan made for GE joins before a real op."""
    [cuda] = run_case(torchair_cache, "inception", 2, "ascend910b", "max-autotune",
                      without_mode=True)
    assert any("NetOutput" in line for line in cuda["dropped_joins"])
    [ge] = run_case(torchair_cache, "inception", 2, "ascend910b", "max-autotune")
    assert ge["applied"] and ge["dropped_joins"] == [] and ge["uncovered"] == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("model", ["inception", "parallel", "llama"])
def test_programs_are_covered(torchair_cache, model, mode):
    cases = run_case(torchair_cache, model, 4, "h200", mode)
    assert all(c["applied"] for c in cases)
    for key in ("uncovered", "unlabelled_views", "dropped_joins", "uncovered_output_refs"):
        assert total(cases, key) == 0, [c[key][:3] for c in cases]


DIGESTS = """
import json, sys
from experiments.torchair_real import torchair_or_reason
torchair_or_reason()
from torchair.inference._cache_compiler import _get_code_digest
from autostream.passes import AutoStreamPass
passes = [AutoStreamPass(), AutoStreamPass(), AutoStreamPass(max_streams=3),
          AutoStreamPass(cost_table="h200"), AutoStreamPass(cost_table=sys.argv[1]),
          AutoStreamPass(solver="heft"), AutoStreamPass(max_memory_increase=None)]
print(json.dumps([_get_code_digest(p) for p in passes]))
"""


@pytest.mark.slow
def test_torchair_compile_cache_key_follows_options_and_table_content(torchair_cache, tmp_path):
    """TorchAir keys a custom pass on ``md5(dis.dis(pass))`` (``_get_code_digest``): equal
    passes share a key, every option and the table's content change it."""
    import cost_models

    table = json.loads(cost_models.table_path("h200").read_text())
    table["profile"]["peak_flops"]["f32"] *= 2
    edited = tmp_path / "h200_edited.json"
    edited.write_text(json.dumps(table))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", DIGESTS, str(edited)], cwd=ROOT,
                          env={**os.environ, **torchair_cache}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    keys = json.loads(done.stdout.strip().splitlines()[-1])
    assert keys[0] == keys[1]
    assert len(set(keys[1:])) == len(keys) - 1, keys


SCHEMAS = """
import json, sys, torch
if sys.argv[1] == "torchair":
    from experiments.torchair_real import torchair_or_reason
    torchair_or_reason()
    __import__("torchair.scope._wait_tensor")
    assert not __import__("autostream.dialects.torchair", fromlist=["_STANDIN"])._STANDIN
else:
    from autostream.dialects.torchair import air_ops, wait_tensor_op
    air_ops(), wait_tensor_op()
ops = [torch.ops.air.scope_enter.default, torch.ops.air.scope_exit.default,
       torch.ops.air.record.default, torch.ops.air.wait.default,
       torch.ops.air.wait_tensor.default]
enter = torch.ops.air.scope_enter(["_user_stream_label"], ["stream_1"], True)
if sys.argv[1] == "torchair":
    from torchair.scope._scope_attr import local
    stack = [dict(d) for d in local.scope_attr.scope_attr_info()]
else:
    from autostream.dialects.torchair import scope_stack
    stack = [dict(d) for d in scope_stack()]
torch.ops.air.scope_exit(True)
token = torch.ops.air.record()
print(json.dumps({"schemas": [str(op._schema) for op in ops], "enter": repr(enter),
                  "stack": stack, "token": [str(token.dtype), list(token.shape)],
                  "wait": repr(torch.ops.air.wait([token]))}))
"""


@pytest.mark.slow
def test_stand_ins_behave_like_torchair_2_14(torchair_cache):
    """Schemas, return values and ``need_execute``'s scope stack, TorchAir's own ops against
    autostream's stand-ins (each in a fresh process: TorchAir registers its ops first)."""
    seen = {}
    for side in ("torchair", "standin"):
        done = subprocess.run([sys.executable, "-W", "ignore", "-c", SCHEMAS, side], cwd=ROOT,
                              env={**os.environ, **torchair_cache}, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        seen[side] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["torchair"]["stack"] == [{"_user_stream_label": "stream_1"}]
    assert seen["standin"] == seen["torchair"]


@pytest.mark.slow
def test_acl_reinplace_race_is_gone_when_the_pass_sees_the_mode(torchair_cache):
    """GPT-OSS's CUDA plan races in TorchAir's ACL graph: the reinplace pass turns a
    ``clamp`` into ``clamp_`` on a side stream while the main stream still reads the same
    storage through a view.  The plan made for the ACL graph orders those readers first."""
    cuda = run_case(torchair_cache, "gpt_oss", 4, "h200", "reduce-overhead", without_mode=True)
    assert total(cuda, "uncovered") > 0
    acl = run_case(torchair_cache, "gpt_oss", 4, "h200", "reduce-overhead")
    assert all(c["applied"] for c in acl)
    assert total(acl, "uncovered") == 0 and total(acl, "dropped_joins") == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_core_budgets_pass_both_modes_as_limit_core_num(torchair_cache, mode, tmp_path):
    """The budget scope nested in the stream scope: GE keeps its keys as the side op's
    attributes, the ACL graph turns it into ``set_stream_limit`` on the side stream (and
    back at its exit), and every dependence stays covered."""
    from experiments.core_budget_demo import demo_table

    table = demo_table(tmp_path / "demo.json")
    [case] = run_whole_case(torchair_cache, "core_budget_demo", 2, str(table), mode,
                            "--core-budgets")["graphs"]
    assert case["applied"] and case["core_budgets"] == {"1": 0.75}
    for key in ("uncovered", "unlabelled_views", "dropped_joins", "uncovered_output_refs"):
        assert case[key] == [], (key, case[key][:3])
    if mode == "max-autotune":
        assert case["core_limits"] == [
            "stream_1: MatMul_1 (MatMul) _op_aicore_num=18, _op_vectorcore_num=36"]
    else:  # set at the scope's entry, the stream's own limits restored at its exit
        assert case["core_limits"] == ["stream_1: set_stream_limit('18', '36')",
                                       "stream_1: set_stream_limit('getitem', 'getitem_1')"]


@pytest.mark.slow
@pytest.mark.parametrize("streams", [2, 4])
def test_ge_gpt_oss_records_follow_a_task(torchair_cache, streams):
    """GPT-OSS at h200 in GE mode: a main-stream ``transpose`` deferred to an ``expand`` to
    the same shape (no GE op of its own) was emitted after the op a record pointed at, a
    record after ``scalar_tensor`` pointed at a ``Const``, and a wait landed on ``addmm``'s
    ``alpha`` ``Const`` while its ``MatMul`` read the awaited tensor.  The plan made for GE
    leaves none of them."""
    cases = run_case(torchair_cache, "gpt_oss", streams, "h200", "max-autotune")
    assert all(c["applied"] for c in cases)
    for key in ("uncovered", "unlabelled_views", "dropped_joins", "uncovered_output_refs",
                "waits_off_compute"):
        assert total(cases, key) == 0, (key, [c[key][:3] for c in cases])


@pytest.mark.slow
def test_ge_wait_before_the_last_op_lands_on_a_task(torchair_cache):
    """Multihead's last op is an ``addmm`` fed by one side stream: its converter emits the
    ``alpha`` ``Const`` first, which takes the join's control edges while the ``MatMul``
    reads the side stream's result unordered.  GE mode runs that producer on the main
    stream instead."""
    [case] = run_case(torchair_cache, "multihead", 2, "h200", "max-autotune")
    assert case["applied"] and case["scopes"] > 0
    for key in ("uncovered", "dropped_joins", "waits_off_compute"):
        assert case[key] == [], (key, case[key][:3])


class _GeOp:
    """The part of a GE ``OpDef`` the harness reads."""

    def __init__(self, name, type_, inputs=(), stream=None):
        from types import SimpleNamespace

        self.name, self.type, self.input = name, type_, list(inputs)
        self.attr = {} if stream is None else {
            "_user_stream_label": SimpleNamespace(s=stream.encode())}


def test_harness_a_const_is_no_stream_task():
    """A wait's control edges on a ``Const`` order only the ops the ``Const`` feeds, not the
    ops after it on its stream: ``Read`` (main) reads ``P`` (stream_1) unordered, while
    ``Mul`` consuming the ``Const`` is ordered, and so is ``Read2`` after it.  A ``Const`` whose control edges reach no
    compute op of its own FX node is a wait off the compute op."""
    import torch

    from experiments.torchair_conformance import ge_findings

    fx = torch.fx.symbolic_trace(lambda x: x)
    ops = [_GeOp("P", "Exp", [], "stream_1"), _GeOp("C", "Const", ["P:-1"]),
           _GeOp("Read", "MatMul", ["P:0"]), _GeOp("Mul", "Mul", ["Read:0", "C:0"]),
           _GeOp("C2", "Const", ["P:-1"]), _GeOp("Read2", "Cos", ["P:0"])]
    origin = {"C": "addmm", "Read": "addmm", "Mul": "addmm", "C2": "mul", "Read2": "cos"}
    found = ge_findings(ops, origin, fx, {})
    [line] = found.uncovered  # Read2 comes after Mul, a task, on the main stream
    assert line.startswith("P (stream_1) -> Read (main)")
    assert len(found.waits_on_const) == 2
    assert [line.split(" ")[0] for line in found.waits_off_compute] == ["C2"]
    ordered = ge_findings(ops[:2] + [_GeOp("Read", "MatMul", ["P:0", "C:0"])], origin, fx, {})
    assert ordered.uncovered == [] and ordered.waits_off_compute == []


PROBLEMS = ("uncovered", "unlabelled_views", "dropped_joins", "uncovered_output_refs",
            "waits_off_compute")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("model", ["buffer_update", "batchnorm_train", "llama_decode"])
def test_front_door_input_mutations_are_ordered(torchair_cache, model, mode):
    """Graphs TorchAir's own backend hands the pass keep input mutations
    (``keep_inference_input_mutations``): a buffer updated with ``add_``, a train-mode batch
    norm's running statistics, a static KV cache.  Every reader of an input's old value runs
    before the op TorchAir lets write it, and the check saw such pairs."""
    cases = run_case(torchair_cache, model, 4, "h200", mode)
    assert sum(c["checked_output_refs"] for c in cases) > 0
    for key in PROBLEMS:
        assert total(cases, key) == 0, (key, [c[key][:3] for c in cases])


@pytest.mark.slow
def test_negative_control_without_output_ref_edges_is_caught(torchair_cache):
    """A module updating its buffer, at 2 streams, planned without the order edges of GE's
    output refs (and without ``verify_rewrite``'s check of them): the readers of the
    buffer's old value race the op GE binds to it, and the harness names them."""
    [case] = run_whole_case(torchair_cache, "buffer_update", 2, "h200", "max-autotune",
                            "--drop-ref-edges")["graphs"]
    assert case["applied"] and case["uncovered_output_refs"], case
    [kept] = run_case(torchair_cache, "buffer_update", 2, "h200", "max-autotune")
    assert kept["applied"] and kept["checked_output_refs"] > 0
    assert kept["uncovered_output_refs"] == []


@pytest.mark.slow
@pytest.mark.parametrize("streams", [2, 4])
def test_front_door_training_step_joins_every_side_stream_in_ge(torchair_cache, streams):
    """A training step: forward and backward graphs, each rewritten; in GE every side-stream
    op that feeds an output (gradient ``t``/``view`` ops included) is joined before
    ``NetOutput``, and the gradients equal those of the model compiled without the pass."""
    cases = run_case(torchair_cache, "mlp_train", streams, "h200", "max-autotune")
    assert [c["phase"] for c in cases] == ["forward", "backward"]
    assert all(c["applied"] for c in cases)
    assert sum(c["checked_joins"] for c in cases) >= 2
    for key in PROBLEMS:
        assert total(cases, key) == 0, (key, [c[key][:3] for c in cases])


@pytest.mark.slow
def test_npugraph_ex_options_path_reaches_the_pass_with_its_mode(torchair_cache):
    """``torch.compile(model, backend="npugraph_ex", options={"post_grad_custom_pre_pass":
    pass})``: torch-npu's own ``npugraph_ex`` package compiles it, and the pass plans for
    ``mode == "npugraph_ex"`` (the ACL graph)."""
    cases = run_case(torchair_cache, "batchnorm_train", 4, "h200", "npugraph_ex")
    assert [c["mode_seen"] for c in cases] == ["npugraph_ex"]
    assert all(c["applied"] for c in cases)
    assert sum(c["checked_output_refs"] for c in cases) > 0
    for key in PROBLEMS:
        assert total(cases, key) == 0, (key, [c[key][:3] for c in cases])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("model", ["static_cache_decode", "slice_kv_cache",
                                   "token_dispatch_moe"])
def test_dynamic_shapes_keep_the_plan_correct_at_every_length(torchair_cache, model, mode):
    """``torch.compile(dynamic=True)``: one graph with symbolic sizes serves 3 lengths.  Its
    rewrite is not rejected, TorchAir's program leaves nothing uncovered, and the results at
    every length equal the model's compiled without the pass."""
    cases = run_case(torchair_cache, model, 4, "h200", mode)
    assert all(c["outcome"] != "REWRITE_REJECTED" for c in cases), cases
    assert any(c["applied"] for c in cases)
    assert sum(c["checked_views"] + c["checked_joins"] for c in cases) > 0
    for key in PROBLEMS:
        assert total(cases, key) == 0, (key, [c[key][:3] for c in cases])


EXPERTS = """
import json
from experiments.torchair_real import torchair_or_reason
torchair_or_reason()
from experiments.torchair_conformance import findings
from experiments.torchair_frontdoor import lower_as_it_stands as lower

from autostream.models.experts import RECIPES, build
from autostream.planning.check import check
out = {}
for recipe in RECIPES:
    layer = build(recipe, "deepseek_v3", tokens=8, scale=64)
    for mode, target in (("reduce-overhead", "acl"), ("max-autotune", "ge")):
        found = findings(lower(layer.gm, layer.inputs(64), mode))
        races = check(layer.gm, target, "ascend910b", time_limit=0.2).races
        out[f"{recipe} {target}"] = {
            "torchair": [u.split(" ")[0] + " " + u.split("-> ")[1].split(" ")[0]
                         for u in found.uncovered],
            "checker": [" ".join(r.ops) for r in races]}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_hand_placements_checked_as_torchair_lowers_them(torchair_cache):
    """The experts' recipes through TorchAir's own lowering: what its final program leaves
    unordered against what ``autostream.check`` reports, under the same mode."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", EXPERTS], cwd=ROOT,
                          env={**os.environ, **torchair_cache}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for recipe in ("coarse", "fine_bf16", "fine_w8a8", "dual_stream", "v4_prolog"):
        for target in ("acl", "ge"):
            assert seen[f"{recipe} {target}"] == {"torchair": [], "checker": []}, recipe
    # vLLM #28942's race: the ACL program leaves it, the checker names it, in both modes
    race = "mm_default_1 combine__default"
    assert seen["fine_bf16_race acl"] == {"torchair": [race], "checker": [race]}
    assert seen["fine_bf16_race ge"]["checker"] == [race]
    # npu_wait_tensor orders nothing in an ACL graph: what the program leaves, the checker
    # names (and more: the harness does not follow data through wait_tensor)
    mla = seen["mla_decode acl"]
    assert mla["torchair"] and set(mla["torchair"]) <= set(mla["checker"])


WAIT_LANDINGS = """
import json, torch
from experiments.torchair_real import torchair_or_reason
torchair_or_reason()
from torch.fx.experimental.proxy_tensor import make_fx
from experiments.torchair_conformance import findings
from experiments.torchair_frontdoor import lower_as_it_stands as lower
from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.torchair_modes import ge_wait_landing
from autostream.scheduling.schedule import Schedule, Sync
aten = torch.ops.aten
m = torch.randn(4, 4)
cases = {
    "addmm mat1": (lambda p, b: aten.addmm(b, p, b), m),
    "addmm alpha beta": (lambda p, b: aten.addmm(b, b, p, beta=2.0, alpha=3.0), m),
    "addmm self": (lambda p, b: aten.addmm(p, b, b), m),
    "addmm f16 bias": (lambda p, b: aten.addmm(b[0], p, b), m.half()),
    "baddbmm": (lambda p, b: aten.baddbmm(b[None], p[None], b[None], alpha=2.0), m),
    "add alpha": (lambda p, b: aten.add(b, p, alpha=2), m),
    "sub alpha": (lambda p, b: aten.sub(b, p, alpha=2), m),
    "sub alpha self": (lambda p, b: aten.sub(p, b, alpha=2), m),
    "clamp": (lambda p, b: aten.clamp(p, -0.5, 0.5), m),
    "where scalar": (lambda p, b: aten.where(b > 0, p, aten.scalar_tensor(0.5)), m),
    "lerp": (lambda p, b: aten.lerp(b, p, 0.3), m),
    "index_add": (lambda p, b: aten.index_add(b, 0, torch.arange(4), p, alpha=2), m),
    "addcmul": (lambda p, b: aten.addcmul(b, p, b, value=2.0), m),
    "mean": (lambda p, b: aten.mean(p, [-1], True), m),
}
out = {}
for name, (fn, x) in cases.items():
    def f(x, b, fn=fn):
        return (fn(x.exp(), b),)
    gm = make_fx(lambda x, b: f(x, b))(x, x.clone())
    order = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    exp = next(n for n in gm.graph.nodes if n.name == order[0])
    consumer = min(exp.users, key=lambda u: order.index(u.name))
    stream_of = dict.fromkeys(order, 0) | {exp.name: 1}
    landing = ge_wait_landing(consumer)
    rewrite_graph(gm, Schedule("x", stream_of, tuple(order), {}, {}, 0, 0),
                  [Sync(exp.name, u.name) for u in exp.users])
    found = findings(lower(gm, [x, x.clone()], "max-autotune"))
    out[name] = {"torchair": sorted({u.split("[fx ")[1].split(" ")[0] for u in found.uncovered}),
                 "model": sorted({n.name for n in landing.unordered_inputs} & {exp.name}),
                 "on_const": len(found.waits_on_const)}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_ge_wait_landing_matches_torchairs_converters(torchair_cache):
    """A side stream's ``exp`` read by each op GE makes a scalar ``Const`` for (issue 51),
    with a wait right before that op: what TorchAir's own converters leave unordered is what
    ``ge_wait_landing`` says the wait misses.  Only ``addmm`` reading it as ``mat1`` or
    ``mat2`` (its ``MatMulV2`` comes before the ``Mul`` by ``alpha``, also with a 1-D f16 bias
    folded into the ``MatMulV2``) and ``index_add`` do; the others feed the ``Const`` to the
    op reading the tensor."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", WAIT_LANDINGS], cwd=ROOT,
                          env={**os.environ, **torchair_cache}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k for k, v in seen.items() if v["torchair"]} == {
        "addmm mat1", "addmm alpha beta", "addmm f16 bias", "index_add"}, seen
    assert all(v["model"] == v["torchair"] for v in seen.values()), seen
    assert sum(v["on_const"] > 0 for v in seen.values()) >= 10, seen


@pytest.mark.slow
@pytest.mark.parametrize("model,streams,table", [
    ("inception_head", 2, "ascend910b"), ("inception_head", 3, "ascend910b"),
    ("inception_head", 4, "h200"), ("inception_head_batches", 4, "h200")])
def test_ge_classifier_head_leaves_nothing_uncovered(torchair_cache, model, streams, table):
    """GoogLeNet's classifier head through TorchAir's front door in GE mode (issue 51): the
    plan used to put ``mean -> view`` on a side stream and the wait before ``addmm`` on
    ``alpha``'s ``Const``, leaving ``Reshape (stream_1) -> MatMulV2 (main)`` unordered.
    Static and ``dynamic=True`` at 3 batch sizes (kept on one stream: its ``view`` takes a
    symbolic size list), nothing is left uncovered and no rewrite is rejected."""
    cases = run_case(torchair_cache, model, streams, table, "max-autotune")
    assert all(c["outcome"] != "REWRITE_REJECTED" for c in cases), cases
    if model == "inception_head":
        assert all(c["applied"] and c["scopes"] > 0 for c in cases)
    for key in PROBLEMS:
        assert total(cases, key) == 0, (key, [c[key][:3] for c in cases])
