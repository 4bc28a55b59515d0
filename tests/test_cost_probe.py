"""The default CPU table fitted to this machine: the rescaling rule, the per-machine cache,
when the probe runs (never in a test unless it asks), the label, and the probe itself on a
table labelled as another machine and slowed 4x."""

from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from autostream.cost import CostTable, TableCostModel
from autostream.cost import fitted as fitted_module
from autostream.cost.defaults import default_table
from autostream.cost.fitted import PROBE_ENV, cache_path, fitted_table, probe_enabled
from autostream.cost.label import table_label
from autostream.cost.probe import Probe, ProbePoint, ProbeStarved
from autostream.cost.rescale import bound, rescaled

SHIPPED = TableCostModel.load("cpu").table
L = SHIPPED.profile.launch_overhead_us


def fake_probe(rho: float = 0.5, compute: float = 0.25, memory: float = 0.5,
               seconds: float = 0.3) -> Probe:
    """A probe of a machine whose launch is ``rho`` of the shipped one's and whose work
    runs ``compute`` / ``memory`` of the time: one probe op of each bound, both in the
    table (so no probe entry joins it)."""
    mm = next(e for e in SHIPPED.entries if e.signature == "f32[8, 256], f32[256, 256]T")
    add = next(e for e in SHIPPED.entries if e.signature == "f32[8, 256], f32[8, 256]")
    assert bound(SHIPPED.profile, mm.flops, mm.bytes) == "compute"
    assert bound(SHIPPED.profile, add.flops, add.bytes) == "memory"

    def point(e, ratio):
        there = e.isolated_us
        return ProbePoint(e.op, e.signature, e.flops, e.bytes, e.flop_formula,
                          L * rho + (there - L) * ratio, there)

    return Probe("a test CPU", L * rho, 20.0, 0.1, 4e11, 3e10,
                 (point(mm, compute), point(add, memory)), seconds)


class Counting:
    """A probe function that counts its calls."""

    def __init__(self, result: Probe | Exception) -> None:
        self.result, self.calls = result, 0

    def __call__(self, shipped: CostTable) -> Probe:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


# -- the rescaling rule ---------------------------------------------------------------------
def test_overhead_compute_and_memory_scale_by_their_own_ratios():
    table = rescaled(SHIPPED, fake_probe(rho=0.5, compute=0.25, memory=0.5), "cpu")
    new = {e.key: e for e in table.entries}
    checked = 0
    for e in SHIPPED.entries:
        kind = bound(SHIPPED.profile, e.flops, e.bytes)
        r = 0.25 if kind == "compute" else 0.5
        want = min(e.time_us, L) * 0.5 + max(0.0, e.time_us - L) * r
        assert new[e.key].time_us == pytest.approx(want, abs=1e-3), e.key
        assert (new[e.key].share, new[e.key].split) == (e.share, e.split)
        checked += 1
    assert checked == len(SHIPPED.entries) == len(table.entries)  # both probe ops were entries
    assert table.profile.launch_overhead_us == pytest.approx(L * 0.5)
    assert table.profile.peak_flops["f32"] == 4e11 and table.profile.bandwidth == 3e10
    ratio = 4e11 / SHIPPED.profile.peak_flops["f32"]
    assert table.profile.peak_flops["bf16"] == pytest.approx(SHIPPED.profile.peak_flops["bf16"]
                                                             * ratio)
    assert table.profile.runtime_call_us == pytest.approx(SHIPPED.profile.runtime_call_us * 0.5,
                                                          abs=1e-3)


def test_a_probe_that_measures_the_shipped_machine_keeps_its_times():
    table = rescaled(SHIPPED, fake_probe(rho=1.0, compute=1.0, memory=1.0), "cpu")
    for old, new in zip(SHIPPED.entries, table.entries, strict=True):
        assert new.time_us == pytest.approx(old.time_us, abs=1e-3)


def test_probe_ops_the_table_lacks_join_it_and_the_table_round_trips(tmp_path):
    probe = fake_probe()
    big = ProbePoint("aten.mm.default", "f32[64, 512], f32[512, 1024]T", 67108864, 2490368,
                     True, 250.0, 975.0)
    probe = dataclasses.replace(probe, points=(*probe.points, big))
    table = rescaled(SHIPPED, probe, "cpu")
    added = [e for e in table.entries if e.provenance == "probe"]
    assert [(e.signature, e.time_us, e.timing) for e in added] == [
        ("f32[64, 512], f32[512, 1024]T", 250.0, "isolated")]
    back = CostTable.load(table.save(tmp_path / "t.json"))
    assert back.digest() == table.digest()
    assert back.device["probe"]["measured_on"] == SHIPPED.device["name"]
    assert back.device["name"] == "a test CPU"


# -- the cache ------------------------------------------------------------------------------
def test_the_first_fit_probes_and_the_next_reads_the_cache(tmp_path):
    probe = Counting(fake_probe())
    first = fitted_table(SHIPPED, "cpu", machine="a test CPU", root=tmp_path, probe=probe)
    again = fitted_table(SHIPPED, "cpu", machine="a test CPU", root=tmp_path, probe=probe)
    assert probe.calls == 1
    assert again.digest() == first.digest() != SHIPPED.digest()
    assert cache_path(SHIPPED, "cpu", "a test CPU", tmp_path).is_file()
    other = fitted_table(SHIPPED, "cpu", machine="another CPU", root=tmp_path, probe=probe)
    assert probe.calls == 2 and other.digest() == first.digest()  # its own file, probed anew


def test_a_corrupt_cache_file_is_a_miss_with_a_warning(tmp_path, caplog):
    path = cache_path(SHIPPED, "cpu", "a test CPU", tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema": "autostream.cost_table", "vers')
    probe = Counting(fake_probe())
    with caplog.at_level(logging.WARNING, logger="autostream"):
        table = fitted_table(SHIPPED, "cpu", machine="a test CPU", root=tmp_path, probe=probe)
    assert probe.calls == 1 and "probe" in table.device
    assert "cannot be read" in caplog.text and str(path) in caplog.text
    assert CostTable.load(path).digest() == table.digest()  # replaced


def test_a_table_fitted_from_another_shipped_table_is_a_miss(tmp_path):
    probe = Counting(fake_probe())
    fitted_table(SHIPPED, "cpu", machine="a test CPU", root=tmp_path, probe=probe)
    path = cache_path(SHIPPED, "cpu", "a test CPU", tmp_path)
    stale = CostTable.load(path)
    stale.device["probe"]["shipped_digest"] = "0" * 64
    stale.save(path)
    fitted_table(SHIPPED, "cpu", machine="a test CPU", root=tmp_path, probe=probe)
    assert probe.calls == 2


def test_a_starved_probe_plans_with_the_shipped_table_and_is_not_kept(tmp_path, caplog):
    probe = Counting(ProbeStarved("aten.mm.default(...) took 9000 us"))
    with caplog.at_level(logging.WARNING, logger="autostream"):
        table = fitted_table(SHIPPED, "cpu", machine="a starved CPU", root=tmp_path, probe=probe)
        again = fitted_table(SHIPPED, "cpu", machine="a starved CPU", root=tmp_path, probe=probe)
    assert table is SHIPPED and again is SHIPPED and probe.calls == 1  # once per process
    assert not cache_path(SHIPPED, "cpu", "a starved CPU", tmp_path).exists()
    assert "could not be fitted" in caplog.text and "next one probes again" in caplog.text


# -- when it runs ---------------------------------------------------------------------------
def refuse(shipped: CostTable) -> Probe:
    raise AssertionError("the probe ran")


def test_the_suite_never_probes(monkeypatch):
    from autostream.passes import AutoStreamPass
    from autostream.planning.plan import load_cost_model

    assert os.environ[PROBE_ENV] == "off" and not probe_enabled()
    monkeypatch.setattr(fitted_module, "run_probe", refuse)
    assert default_table("cpu").model.table.digest() == SHIPPED.digest()
    assert load_cost_model(None).table.digest() == SHIPPED.digest()
    assert AutoStreamPass().cost_model_for("cpu").table.digest() == SHIPPED.digest()


def test_with_probing_on_the_default_cpu_table_is_fitted_and_named(monkeypatch, tmp_path):
    monkeypatch.setenv(PROBE_ENV, "on")
    monkeypatch.setattr(fitted_module, "this_machine", lambda: "a test CPU")
    monkeypatch.setattr(fitted_module, "run_probe", Counting(fake_probe(seconds=1.4)))
    model = default_table("cpu").model
    assert model.table.device["name"] == "a test CPU"
    assert table_label(model, None, "cpu") == (
        "'cpu' (the default of cpu graphs; cpu, shipped table rescaled to this machine by a "
        f"1.4 s probe; measured on {SHIPPED.device['name']})")


def test_the_machine_the_table_was_measured_on_is_not_probed(monkeypatch):
    monkeypatch.setenv(PROBE_ENV, "on")
    monkeypatch.setattr(fitted_module, "this_machine", lambda: SHIPPED.device["name"])
    monkeypatch.setattr(fitted_module, "run_probe", refuse)
    assert default_table("cpu").model.table.digest() == SHIPPED.digest()


def test_a_bad_probe_setting_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(PROBE_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"AUTOSTREAM_COST_PROBE='sometimes': set it to on .* or off"):
        default_table("cpu")


def test_plan_names_the_fitted_table(monkeypatch, capsys):
    from autostream.cli import main

    monkeypatch.setenv(PROBE_ENV, "on")
    monkeypatch.setattr(fitted_module, "this_machine", lambda: "a test CPU")
    monkeypatch.setattr(fitted_module, "run_probe", Counting(fake_probe(seconds=1.4)))
    assert main(["plan", "autostream.models.zoo:article_model", "--streams", "2",
                 "--solver", "heft"]) == 0
    out = capsys.readouterr().out
    assert "cost table         'cpu' (the default of cpu graphs; cpu, shipped table rescaled " \
           "to this machine by a 1.4 s probe;" in out


# -- the probe itself (this test asks for it) ------------------------------------------------
@pytest.mark.slow  # two captures, four eager timings and the probe: 5 s on an idle 2-core VM
def test_the_probe_brings_a_table_of_a_4x_slower_machine_back_within_3x():
    from autostream.cost.probe import run_probe
    from autostream.fx.capture import capture_graphs
    from experiments.default_costs import (
        TARGET,
        eager_us,
        plausible_eager_us,
        predicted_us,
        slowed,
        small_models,
        within,
    )

    elsewhere = slowed(SHIPPED, 4.0)
    models = small_models((32,))
    graphs = {k: max(capture_graphs(m, x), key=lambda g: len(g.graph.nodes))
              for k, (m, x) in models.items()}
    measured = {k: eager_us(m, x) for k, (m, x) in models.items()}
    busy = [k for k, gm in graphs.items() if measured[k] > plausible_eager_us(gm)]
    if busy:
        pytest.skip(f"the machine is too busy to time {busy} eagerly: {measured} us")
    before = {k: predicted_us(TableCostModel(elsewhere), gm) / measured[k]
              for k, gm in graphs.items()}
    assert not all(map(within, before.values())), before  # the slowed table is off
    try:
        probe = run_probe(elsewhere)
    except ProbeStarved as exc:
        pytest.skip(f"the machine is too busy to probe: {exc}")
    fitted = TableCostModel(rescaled(elsewhere, probe, "cpu"))
    # other processes only ever add time: the fastest of two timings, before and after the probe
    measured = {k: min(t, eager_us(*models[k])) for k, t in measured.items()}
    after = {k: predicted_us(fitted, gm) / measured[k] for k, gm in graphs.items()}
    assert all(map(within, after.values())), (after, TARGET)
    assert probe.seconds <= 2.0


def test_graphs_that_communicate_are_planned_with_the_shipped_table(monkeypatch):
    """Every rank must plan a graph with collectives from the same table, and ranks on
    other machines would fit other tables: such graphs keep the shipped one."""
    from autostream.passes import AutoStreamPass

    monkeypatch.setenv(PROBE_ENV, "on")
    monkeypatch.setattr(fitted_module, "this_machine", lambda: "a test CPU")
    monkeypatch.setattr(fitted_module, "run_probe", Counting(fake_probe()))
    stream_pass = AutoStreamPass()
    assert stream_pass.cost_model_for("cpu").table.device["name"] == "a test CPU"
    shipped = stream_pass.cost_model_for("cpu", communicates=True).table
    assert shipped.device["name"] == SHIPPED.device["name"]
    assert [e.isolated_us for e in shipped.entries] == [e.isolated_us for e in SHIPPED.entries]
