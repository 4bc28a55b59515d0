"""Reports a user can reach: ``autostream.last_report()``, ``backend(...).last_report``, a
readable ``summary()`` and repr, one log line per compiled graph, ``AUTOSTREAM_VERBOSE``."""

from __future__ import annotations

import gc
import logging
import sys

import torch

import autostream
from autostream.backend import BackendReport
from autostream.fx.capture import capture
from autostream.models.zoo import two_branch_gemv
from autostream.passes import AutoStreamPass
from autostream.runtime.baseline import eager_candidates
from autostream.runtime.choice import MeasuredChoice


def _run(compiled, inputs, calls: int) -> None:
    with torch.no_grad():
        for _ in range(calls):
            compiled(*inputs)


def test_the_backend_named_by_a_string_leaves_its_report_reachable(caplog):
    model, inputs = two_branch_gemv(depth=2)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="autostream", options={"measure": 3})
    with caplog.at_level(logging.INFO, logger="autostream"):
        _run(compiled, inputs, 1)
        report = autostream.last_report()
        lines = report.summary().splitlines()
        assert lines[0].startswith("autostream backend, Dynamo graph of ")
        assert "(cpu, inference): applied: 2 streams" in lines[0]
        assert "cost table 'cpu' (the default of cpu graphs; cpu, measured on" in lines[1]
        assert "cost sources: exact" in lines[1]
        # eager also at the fewer intra-op threads the plan's streams use (runtime/baseline.py)
        names = ["streams", "eager", *eager_candidates(abs, "threads", report.streams_used)]
        calls = 2 * 3 * len(names)
        assert lines[-1] == (f"  measuring: {' against '.join(names)} in 3 interleaved rounds "
                             f"({calls} calls)")
        _run(compiled, inputs, calls - 1)
    # the same object, now with the measured choice: times with spread, the variant and why,
    # then the fastest single stream and the load (marked unreliable when the machine was busy)
    assert autostream.last_report() is report
    *_, measured, baseline = (line.strip() for line in report.summary().splitlines())
    assert measured == report.measured_line()
    assert f"measured over 3 interleaved rounds ({calls} calls): streams " in measured
    assert measured.startswith("unreliable (busy: ") is report.choice.load.busy
    assert " us +- " in measured and f"; runs {report.choice.choice}: " in measured
    assert baseline.startswith(f"fastest single stream: {report.baseline[0]}")
    assert "load average " in baseline
    # one line when compiled, one when the choice is made, in the summary's words
    told = [r for r in caplog.records if r.getMessage().startswith("autostream backend")]
    assert len(told) == 1 and told[0].levelno == logging.INFO
    assert told[0].getMessage() == "; ".join(line.strip() for line in lines)
    assert sum(r.getMessage() == f"autostream: {measured}" for r in caplog.records) == 1
    # the figures stay available as a dict
    figures = report.figures()
    assert figures["applied"] and figures["kept"] == report.choice.choice
    assert figures["calls_to_decision"] == calls
    del compiled
    torch._dynamo.reset()


def test_the_backend_object_has_last_report_and_the_repr_is_short():
    model, inputs = two_branch_gemv(depth=2)
    torch._dynamo.reset()
    be = autostream.backend(measure=0)
    assert be.last_report is None
    compiled = torch.compile(model, backend=be)
    _run(compiled, inputs, 1)
    assert be.last_report is autostream.last_report() and be.last_report.applied
    assert be.last_report.summary().endswith("not measured: measure=0 trusts the plan; runs "
                                             "the plan")
    text = repr(be.last_report)
    assert text.startswith("<BackendReport autostream backend") and len(text.splitlines()) <= 6
    assert len(text) < 1000
    torch._dynamo.reset()


def test_a_report_lives_as_long_as_what_it_describes():
    model, inputs = two_branch_gemv(depth=2)
    torch._dynamo.reset()
    # (the sequential runtime: a threads runtime lives until its workers are closed)
    compiled = torch.compile(model, backend=autostream.backend(measure=0, runtime="sequential"))
    _run(compiled, inputs, 1)
    assert autostream.last_report() is not None
    del compiled
    torch._dynamo.reset()
    gc.collect()
    gone = autostream.last_report()  # a weak reference: nothing kept alive
    assert not gone and not gone.applied and gone.summary().startswith(
        "autostream: the latest report is gone with what it described")


def test_before_the_first_call_the_last_report_says_nothing_is_compiled_yet(monkeypatch):
    from autostream.report import latest

    monkeypatch.setattr(latest, "_LATEST", latest._Latest())  # a process that compiled nothing
    model, inputs = two_branch_gemv(depth=2)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="autostream")  # compiles at its first call
    report = autostream.last_report()
    assert not report and not report.applied and report.plan is None
    assert report.summary() == ("autostream: no graph compiled yet in this process: "
                                "torch.compile compiles a model at its first call (call the "
                                "compiled model, then ask again)")
    assert report.figures() == {"applied": False, "reason": report.summary()}
    with torch.no_grad():
        compiled(*inputs)
    assert autostream.last_report() and autostream.last_report().summary().startswith(
        "autostream backend, Dynamo graph of ")
    del compiled
    torch._dynamo.reset()


def test_grad_enabled_calls_say_that_nothing_is_measured():
    model, inputs = two_branch_gemv(depth=2)
    torch._dynamo.reset()
    be = autostream.backend(measure=3)
    compiled = torch.compile(model, backend=be)
    compiled(*inputs)  # grad enabled, parameters require grad: compiled for autograd
    report = be.last_report
    assert report.training and not be.measured_choices
    assert "(cpu, training)" in report.summary().splitlines()[0]
    assert report.summary().endswith(
        "not measured: compiled for autograd (grad enabled and a parameter or input requires "
        "grad); call under torch.no_grad() or torch.inference_mode() to measure; runs the plan "
        "(multi-stream)")
    torch._dynamo.reset()


def test_the_pass_report_is_the_latest_and_verbose_prints_it(monkeypatch, capsys):
    monkeypatch.setenv("AUTOSTREAM_VERBOSE", "1")
    [c] = capture(*two_branch_gemv(depth=2))
    p = AutoStreamPass(max_streams=2, cost_table="h200")
    report = p.run(c.gm)
    assert autostream.last_report() is report is p.last_report
    printed = capsys.readouterr().err
    assert printed == report.summary() + "\n"
    lines = printed.splitlines()
    assert lines[0].startswith("autostream pass, graph of ") and "applied: 2 streams" in lines[0]
    # a table for another device than the graph's tensors is named as such
    assert "cost table 'h200' (given; cuda, spec-derived, not profiled; made for cuda " \
           "devices, but the graph is on cpu" in lines[1]
    assert repr(report) == f"<PassReport {report.summary()}>"
    assert report.figures()["outcome"] == "applied"


def test_a_table_for_another_device_warns_once_where_the_graph_runs(caplog):
    be = autostream.backend(cost_table="h200", measure=0)
    with caplog.at_level(logging.WARNING, logger="autostream"):
        for depth in (2, 3):  # two graphs compiled by one backend
            torch._dynamo.reset()
            model, inputs = two_branch_gemv(depth=depth)
            _run(torch.compile(model, backend=be), inputs, 1)
    torch._dynamo.reset()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["autostream: cost_table='h200': made for cuda devices, but the graph "
                        "is on cpu: its times are not this machine's; pass cost_table=None (the "
                        "default table of the graph's device) or a table `autostream calibrate` "
                        "measured here"]
    # planning for another device from a graph captured here is told, not warned
    [c] = capture(*two_branch_gemv(depth=2))
    with caplog.at_level(logging.WARNING, logger="autostream"):
        caplog.clear()
        report = AutoStreamPass(cost_table="ascend910b").run(c.gm)
    assert not caplog.records and "made for npu devices" in report.summary()


def _decided(eager_s: float, streams_s: float) -> MeasuredChoice:
    choose = MeasuredChoice({"streams": abs, "eager": abs}, trials=1, default="eager",
                            settle_s=0.0, clock=iter([0, 0, 0, streams_s, 0, 0, 0, eager_s]
                                                     ).__next__)
    for _ in range(4):
        choose(1)
    return choose


def test_a_cost_table_far_from_the_measurement_warns(caplog):
    from types import SimpleNamespace

    backend_module = sys.modules["autostream.backend"]  # the package exports the function
    lifted = SimpleNamespace(single_stream_us=2205.0, describe=lambda: "lifted")
    table = SimpleNamespace(applied=True, cost_table="'cpu' (the default of cpu graphs)")
    for eager_s, far in ((200e-6, True), (1800e-6, False)):
        report = BackendReport(10, "cpu", False, [table], lifted, _decided(eager_s, 1e-4))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="autostream"):
            backend_module._chosen(report)
        assert report.prediction_check()[1] is far
        assert ("one stream predicted 2205 us, measured "
                f"{eager_s * 1e6:.0f} us") in report.measured_line()
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == far
        if far:
            assert "autostream: the cost table 'cpu' (the default of cpu graphs) is far from " \
                   "this machine: one stream predicted 2205 us, measured 200 us " \
                   "(11.03x); plans rest on its figures: measure the model here with " \
                   "`autostream calibrate SPEC --device cpu" in warned[0]
