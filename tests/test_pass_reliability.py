"""The pass and backend as users meet them: loud configuration errors, cache keys that follow
the cost table's content, the device's default table, bounded history, Inductor."""

import json
import logging

import pytest
import torch

import autostream
import autostream.passes as passes_module
import cost_models
from autostream.cost import TableCostModel
from autostream.fx.capture import capture
from autostream.models.zoo import article_model, multihead_block, two_branch_gemv
from autostream.passes import AutoStreamPass, Outcome


def _table_file(tmp_path, name="t.json", **profile):
    data = json.loads(cost_models.table_path("h200").read_text())
    data["profile"].update(profile)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("content,problem", [
    (None, "does not exist"),
    ("", "not valid JSON"),
    ("{broken", "not valid JSON"),
    ('{"schema": "something else"}', "not an autostream cost table"),
    ('{"schema": "autostream.cost_table", "version": 1}', "device"),
])
def test_a_cost_table_that_cannot_be_used_fails_when_the_pass_is_built(tmp_path, content,
                                                                       problem):
    path = tmp_path / "my_table.json"
    if content is not None:
        path.write_text(content)
    for build in (lambda: AutoStreamPass(cost_table=str(path)),
                  lambda: autostream.backend(cost_table=str(path))):
        with pytest.raises(ValueError, match=problem) as info:
            build()
        assert str(path) in str(info.value) and "Fix:" in str(info.value)


def test_an_unknown_table_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="no shipped cost table named 'h20'.*ascend910b, cpu, h200"):
        autostream.backend(cost_table="h20")


def test_invalid_option_combinations_fail_at_construction():
    with pytest.raises(ValueError, match="sanitize=True checks the threads runtime"):
        autostream.backend(sanitize=True, runtime="sequential")
    with pytest.raises(ValueError, match="unknown option max_stream;.*max_streams"):
        autostream.backend(max_stream=2)
    with pytest.raises(ValueError, match="history must be an integer >= 1"):
        AutoStreamPass(history=0)


def test_the_digest_follows_the_tables_content_and_the_version(tmp_path, monkeypatch):
    a = AutoStreamPass(cost_table=str(_table_file(tmp_path, "a.json")))
    same = AutoStreamPass(cost_table=str(_table_file(tmp_path, "b.json")))
    recalibrated = AutoStreamPass(cost_table=str(_table_file(tmp_path, "a.json",
                                                             record_wait_us=7.5)))
    assert a.digest() == same.digest()  # the name does not matter
    assert recalibrated.digest() != a.digest()
    assert a.uuid() == a.digest()
    before = AutoStreamPass().digest()
    monkeypatch.setattr(passes_module, "__version__", "99.0")
    assert AutoStreamPass().digest() != before


def test_cost_table_digest_is_the_sha256_of_its_sorted_json():
    import hashlib

    table = TableCostModel.load("cpu").table
    expected = hashlib.sha256(json.dumps(table.to_json(), sort_keys=True).encode()).hexdigest()
    assert table.digest() == expected


def _estimates(plan):
    return {n: e.duration_us for n, e in plan.estimates.items()}


@pytest.mark.parametrize("device,table", [("cpu", "cpu"), ("cuda", "h200"), ("npu", "ascend910b")])
def test_the_default_table_follows_the_graphs_device(monkeypatch, caplog, device, table):
    from autostream.planning.plan import PlanOptions, plan_graph

    monkeypatch.setattr(passes_module, "graph_device", lambda graph, inputs=None: device)
    p = AutoStreamPass(max_streams=2)
    with caplog.at_level(logging.WARNING, logger="autostream"):
        for _ in range(2):
            [c] = capture(*two_branch_gemv(depth=2))
            report = p.run(c.gm)
    [c] = capture(*two_branch_gemv(depth=2))
    expected = plan_graph(c.gm, PlanOptions(max_streams=2), TableCostModel.load(table))
    assert _estimates(report.plan) == _estimates(expected)
    spec = [r.getMessage() for r in caplog.records if "spec-derived" in r.getMessage()]
    assert len(spec) == (0 if device == "cpu" else 1)  # once per pass and device


def test_an_unprofiled_device_gets_a_roofline_and_a_warning(caplog):
    p = AutoStreamPass()
    with caplog.at_level(logging.WARNING, logger="autostream"):
        model = p.cost_model_for("xpu")
    assert model.profile.origin == "spec" and "no cost table for 'xpu'" in caplog.text


def test_the_graph_device_comes_from_its_inputs():
    [c] = capture(*article_model())
    assert passes_module.graph_device(c.gm.graph) == "cpu"


def test_reports_are_bounded():
    p = AutoStreamPass(max_streams=2, cost_table="h200", history=2)
    sizes = []
    for depth in (1, 2, 3):
        gm = capture(*two_branch_gemv(depth=depth))[0].gm
        sizes.append(len(gm.graph.nodes))
        p(gm)
    assert [r.graph_nodes for r in p.reports] == sizes[1:]


def test_the_backends_lifts_and_choices_are_bounded():
    be = autostream.backend(max_streams=2, cost_table="h200", measure=1, history=1)
    with torch.no_grad():
        for depth in (2, 3):
            torch._dynamo.reset()
            model, inputs = two_branch_gemv(depth=depth)
            torch.compile(model, backend=be)(*inputs)
    torch._dynamo.reset()
    assert len(be.autostream_pass.reports) == 1
    assert len(be.lifts) == 1 and len(be.measured_choices) == 1


def test_the_outcome_is_typed_and_chooses_the_log_level(caplog):
    [c] = capture(*multihead_block())
    p = AutoStreamPass(max_streams=2, cost_table="h200")
    with caplog.at_level(logging.INFO, logger="autostream"):
        report = p.run(c.gm)
    assert report.outcome is Outcome.APPLIED and report.applied
    assert caplog.records[-1].levelno == logging.INFO
    assert report.figures()["outcome"] == "applied"
    assert {o: o.log_level for o in Outcome}[Outcome.REWRITE_REJECTED] == logging.WARNING


@pytest.mark.slow
def test_the_pass_works_as_an_inductor_custom_graph_pass(caplog):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    model, inputs = multihead_block()
    p = AutoStreamPass(max_streams=2, cost_table="h200")
    assert isinstance(p, CustomGraphPass)
    torch._dynamo.reset()
    # no cached compile: the pass must run (a cache hit would skip it, rightly)
    with torch._inductor.config.patch(post_grad_custom_pre_pass=p, fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False), torch.no_grad(), \
            caplog.at_level(logging.WARNING, logger="autostream"):
        got = torch.compile(model)(*inputs)
        expected = model(*inputs)
    torch._dynamo.reset()
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert [r.outcome for r in p.reports] == [Outcome.UNSUPPORTED_COMPILER]
    assert "Inductor cannot run autostream's stream ops" in caplog.text


def test_the_pass_rejects_what_is_not_a_graph():
    with pytest.raises(TypeError, match="torch.fx.GraphModule .* or a torch.fx.Graph"):
        AutoStreamPass()(torch.nn.Linear(2, 2))
