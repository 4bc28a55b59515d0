"""Hand placements: read into a Schedule, checked (races with source lines), surfaced by the
pass and the CLI, replaced when autostream's plan is predicted faster."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from autostream import check
from autostream.cli import main as cli_main
from autostream.dialects.hand import read_placement
from autostream.models.experts import RECIPES, build
from autostream.passes import AutoStreamPass, Outcome
from autostream.runtime.builder import DialectBuilder
from autostream.scheduling.schedule import JOIN, Sync

aten = torch.ops.aten
#: each recipe's target: TorchAir GE for vLLM-Ascend's, CUDA events for SGLang's
TARGET = {"coarse": "ge", "fine_bf16": "ge", "fine_w8a8": "ge", "mla_decode": "ge",
          "dual_stream": "cuda", "v4_prolog": "ge", "fine_bf16_race": "ge"}


def _two_streams(wait: bool):
    """neg on stream 1, add on main reading it; with or without the wait before the add."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(aten.neg.default, x)
        t = b.record()
    if wait:
        b.wait(t)
    return b.finish(b.call(aten.add.Tensor, x, y))


def test_reads_torchair_scopes_and_record_wait():
    hand = read_placement(_two_streams(wait=True))
    assert hand.stream_of == {"neg_default": 1, "add_tensor": 0}
    assert hand.syncs == (Sync("neg_default", "add_tensor"),)
    assert hand.kinds == ("scopes", "record/wait")
    assert hand.schedule().streams_used == 2


def test_reads_wait_tensor_as_an_ordering_edge():
    layer = build("mla_decode", "deepseek_v3", tokens=8)
    hand = read_placement(layer.gm, "ge")
    assert "wait_tensor" in hand.kinds
    assert hand.labels == {0: "main", 1: "mla_secondary"}
    # the side's KV projection waits for q_a_proj (npu_wait_tensor(x, q_c)), nothing flows
    kv = next(n for n in hand.order if hand.stream_of[n] == 1)
    assert Sync("mm_default", kv) in hand.syncs
    assert not any(n.target == torch.ops.air.wait_tensor.default
                   for n in hand.graph.graph.nodes)


def test_reads_dynamo_user_streams():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    side = g.call_function(aten.neg.default, (x,))
    side.meta["custom"] = {"stream": 3}
    g.call_function(torch.ops.streams.record_event.default, (0, 3))
    main = g.call_function(aten.relu.default, (x,))
    g.call_function(torch.ops.streams.wait_event.default, (0, 1))
    out = g.call_function(aten.add.Tensor, (main, side))
    g.output(out)
    hand = read_placement(torch.fx.GraphModule(torch.nn.Module(), g))
    assert hand.stream_of == {"neg_default": 1, "relu_default": 0, "add_tensor": 0}
    assert hand.syncs == (Sync("neg_default", "add_tensor"),)
    assert hand.kinds == ("dynamo",)


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "fine_bf16_race"])
def test_no_false_races_on_the_experts_recipes(recipe):
    layer = build(recipe, "deepseek_v3", tokens=32)
    result = check(layer.gm, TARGET[recipe], "ascend910b", time_limit=0.3)
    assert result.races == ()
    assert result.problems == () and result.collective_streams == ()
    assert result.dependences_checked > 10
    assert result.hand_streams == 2
    assert 0 < result.bound_us <= result.autostream_us <= result.single_stream_us * 1.0001
    if recipe != "mla_decode":  # record/wait only: race-free under every target
        for mode in {"cuda", "ge", "acl"} - {TARGET[recipe]}:
            assert check(layer.gm, mode, "h200", time_limit=0.3).races == (), mode


def test_the_hidden_race_is_found_with_its_source_line():
    layer = build("fine_bf16_race", "deepseek_v3", tokens=32)
    for mode in ("cuda", "ge", "acl"):
        races = check(layer.gm, mode, "h200", time_limit=0.3).races
        assert len(races) == 1, mode
        race = races[0]
        assert race.storage == "hidden_states" and race.kind == "memory"
        assert race.streams == ("moe_secondary", "main")
        assert race.ops[1] == "combine__default"
        assert "experts.py:" in race.source[1] and "combine_" in race.source[1]
        assert "aten.mm.default, x, sw1" in race.source[0]


def test_a_missing_wait_is_a_race_under_cuda_not_under_ge():
    gm = _two_streams(wait=False)
    assert [r.ops for r in check(gm, "cuda", "h200").races] == [("neg_default", "add_tensor")]
    assert check(gm, "ge", "h200").races == ()  # GE orders cross-stream data edges


def test_collectives_on_two_streams_are_named():
    layer = build("dual_stream", "qwen3_moe", tokens=8)
    gm = layer.gm
    # the alternate stream's local permute becomes an all-to-all dispatch: collectives on
    # two streams (the all-reduce stays on main)
    permute = next(n for n in gm.graph.nodes if n.target == torch.ops.experts.permute.default)
    permute.target = torch.ops.experts.dispatch.default
    result = check(gm, "cuda", "h200", time_limit=0.3)
    assert result.collective_streams == ("main", "alt_stream")


def test_check_cli_writes_the_json_keys(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = cli_main(["check", "autostream.models.experts:fine_bf16_race", "--mode", "ge",
                   "--cost-table", "ascend910b", "--time-limit", "0.3", "--json", str(out)])
    assert rc == 1  # a race
    data = json.loads(out.read_text())
    for key in ("races", "hand_us", "autostream_us", "bound_us", "single_stream_us"):
        assert key in data
    assert set(data["races"][0]) >= {"ops", "streams", "storage", "source"}
    assert data["cost_table"].startswith("'ascend910b' (given; npu, spec-derived")
    printed = capsys.readouterr().out
    assert "race:" in printed and "cost table: 'ascend910b' (given" in printed


def test_check_list_prints_a_working_spec_per_recipe(capsys):
    from autostream.dialects.hand import has_placement
    from autostream.models.modelspec import load_model_spec

    assert cli_main(["check", "--list"]) == 0
    specs = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert specs == [f"autostream.models.experts:{r}" for r in RECIPES]
    for spec in specs:
        gm, _ = load_model_spec(spec)
        assert has_placement(gm.graph.nodes), spec


def test_check_exit_codes_and_the_default_table_per_mode(capsys):
    # a clean placement: 0; TorchAir's modes default to the Ascend table
    assert cli_main(["check", "autostream.models.experts:coarse", "--mode", "ge",
                     "--time-limit", "0.3"]) == 0
    assert ("cost table: 'ascend910b' (the default of mode 'ge': TorchAir's target, Ascend; "
            "npu, spec-derived") in capsys.readouterr().out
    # cuda events on a graph of (fake) CPU tensors: the cpu table, named
    assert cli_main(["check", "autostream.models.experts:fine_bf16_race",
                     "--time-limit", "0.3"]) == 1
    assert "cost table: 'cpu' (the default of cpu graphs" in capsys.readouterr().out
    assert cli_main(["check"]) == 2  # no SPEC
    assert "--list" in capsys.readouterr().err


def test_the_readmes_check_example_tells_its_scaled_link_fit_as_a_note_not_a_warning(
        capsys, caplog):
    import logging

    # the README's example: EP over 32 ranks, the Ascend table's all-to-all fit made at 8
    with caplog.at_level(logging.INFO, logger="autostream"):
        assert cli_main(["check", "autostream.models.experts:fine_bf16_race", "--mode", "ge",
                         "--time-limit", "0.3"]) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    out = capsys.readouterr().out
    assert ("\n  note: link fit of all_to_all on hccl was made at world size 8, the group has "
            "32: ") in out
    assert "npu graphs" not in out  # the graph is on (fake) CPU tensors; the mode chose


def test_check_summary_is_text_and_figures_the_numbers():
    layer = build("fine_bf16_race", "qwen3_moe", tokens=8)
    result = check(layer.gm, "ge", "ascend910b", time_limit=0.3)
    text = result.summary()
    assert isinstance(text, str) and text.splitlines()[0].startswith("hand placement")
    assert "1 race(s)" in text and text.splitlines()[-1].startswith("  cost table: 'ascend910b'")
    figures = result.figures()
    assert figures["hand_us"] == result.hand_us and len(figures["races"]) == 1
    assert repr(result) == f"<HandCheck {text}>"


@pytest.mark.parametrize("mode", ["cuda", "acl"])
def test_the_plan_may_use_fewer_streams_than_the_placement_and_says_so(mode):
    """check's plan may use the placement's streams, uses fewer where they do not pay (a
    neg beside an add: one stream), and the summary tells the count it used."""
    result = check(_two_streams(wait=True), mode, "h200", max_streams=1)
    assert result.hand_streams == 2
    assert result.plan.problem.streams == 2  # offered as many as the placement used
    used = result.plan.schedule.streams_used
    assert used == 1
    assert f"autostream {result.autostream_us:.1f} us ({used} stream(s))" in result.summary()


def test_pass_report_carries_the_check_and_warns(caplog):
    layer = build("fine_bf16_race", "qwen3_moe", tokens=8)
    before = [n.name for n in layer.gm.graph.nodes]
    p = AutoStreamPass(cost_table="ascend910b", time_limit=0.3)
    with caplog.at_level(logging.WARNING, logger="autostream"):
        report = p.run(layer.gm)
    assert report.outcome is Outcome.HAND_TAGGED
    assert [n.name for n in layer.gm.graph.nodes] == before
    assert report.check is not None and len(report.check.races) == 1
    assert "combine__default" in report.reason and "experts.py:" in report.reason
    assert any("hand placement race" in r.message and "experts.py:" in r.message
               for r in caplog.records)
    assert report.figures()["hand_check"]["races"][0]["storage"] == "hidden_states"


def _slow_hand_placement():
    """Two independent matmul chains; the hand placement puts both on the side stream."""
    b = DialectBuilder()
    x, w = b.input("x"), b.input("w")
    with b.stream(1):
        a = b.call(aten.mm.default, x, w)
        a = b.call(aten.mm.default, a, w)
        c = b.call(aten.mm.default, x, w)
        c = b.call(aten.mm.default, c, w)
        t = b.record()
    b.wait(t)
    gm = b.finish(b.call(aten.add.Tensor, a, c))
    xs, ws = torch.randn(256, 256), torch.randn(256, 256) * 0.05
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(gm).propagate(xs, ws)
    return gm, (xs, ws)


def test_replace_hand_tags_replaces_a_slower_placement_and_keeps_outputs():
    gm, inputs = _slow_hand_placement()
    expected = gm(*inputs)[0]
    kept = AutoStreamPass(cost_table="h200", max_memory_increase=None).run(gm)
    assert kept.outcome is Outcome.HAND_TAGGED and kept.check.hand_us > kept.check.autostream_us
    report = AutoStreamPass(cost_table="h200", replace_hand_tags=True,
                            max_memory_increase=None).run(gm)
    assert report.outcome is Outcome.APPLIED, report.reason
    assert report.check.hand_us > report.plan.predicted_us
    labels = [n.args[1][0] for n in gm.graph.nodes
              if n.target == torch.ops.air.scope_enter.default]
    assert labels and set(labels) == {"stream_1"}
    main_mms = [n for n in read_placement(gm).order if n.startswith("mm")
                and read_placement(gm).stream_of[n] == 0]
    assert main_mms  # one chain moved back to main
    assert torch.equal(gm(*inputs)[0], expected)


def test_replace_hand_tags_keeps_a_placement_autostream_does_not_beat():
    gm, inputs = _slow_hand_placement()
    AutoStreamPass(cost_table="h200", replace_hand_tags=True, max_memory_increase=None).run(gm)
    before = [n.name for n in gm.graph.nodes]  # now autostream's own placement
    report = AutoStreamPass(cost_table="h200", replace_hand_tags=True,
                            max_memory_increase=None).run(gm)
    assert report.outcome is Outcome.HAND_TAGGED
    assert report.check.races == () and report.check.hand_us <= report.check.autostream_us
    assert [n.name for n in gm.graph.nodes] == before


def test_a_placement_slower_than_one_stream_is_replaced_by_one_stream():
    gm = _two_streams(wait=True)
    x = torch.randn(8)
    expected = gm(x)[0]
    report = AutoStreamPass(cost_table="h200", replace_hand_tags=True).run(gm)
    assert report.outcome is Outcome.APPLIED and report.plan.is_single_stream
    assert report.check.hand_us > report.check.single_stream_us
    assert not any(n.op == "call_function" and "air" in str(n.target) for n in gm.graph.nodes)
    assert torch.equal(gm(x)[0], expected)


def test_join_is_read_from_a_trailing_wait_and_missing_joins_are_problems():
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(aten.neg.default, x)
        t = b.record()
    z = b.call(aten.relu.default, x)
    b.wait(t)
    assert read_placement(b.finish(y, z)).syncs == (Sync("neg_default", JOIN),)
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        y = b.call(aten.neg.default, x)
    gm = b.finish(y, b.call(aten.relu.default, x))
    problems = check(gm, "cuda", "h200").problems
    assert any("not joined" in p for p in problems)
    assert check(gm, "ge", "h200").problems == ()  # GE joins every stream at the output


def test_wait_tensor_under_acl_is_a_problem_not_a_silent_pass():
    layer = build("mla_decode", "deepseek_v3", tokens=8)
    result = check(layer.gm, "acl", "ascend910b", time_limit=0.3)
    assert any("wait_tensor" in p and "ACL" in p for p in result.problems)
    assert not result.ok
    # ordering nothing there, the side stream's results reach main unordered (as TorchAir's
    # own ACL program leaves them: tests/test_torchair_conformance.py)
    assert {r.ops[1] for r in result.races} >= {"mla_attention_default"}


def test_check_cli_names_a_graph_without_placement(capsys):
    rc = cli_main(["check", "autostream.models.zoo:article_model"])
    assert rc == 2
    assert "nothing placed by hand" in capsys.readouterr().err
