"""Cost table format: strict validation naming file and field, round trip, merge."""

from __future__ import annotations

import json

import pytest

from autostream.cost import CostTable, Entry, Skipped, TableCostModel, TableError
from autostream.cost.profile import GENERIC_CPU


def entry(op="aten.mm.default", sig="f32[2, 2], f32[2, 2]", median=10.0, **kw) -> Entry:
    base = dict(op=op, signature=sig, dtype="f32", flops=16, bytes=48, median_us=median,
                spread_us=1.0, samples=5, share=0.7, slowdown=1.4, flop_formula=True)
    base.update(kw)
    return Entry(**base)


def table(*entries: Entry, **device) -> CostTable:
    dev = {"name": "test-cpu", "kind": "cpu", "origin": "measured", **device}
    return CostTable(device=dev, profile=GENERIC_CPU, entries=entries)


def write(tmp_path, data, name="t.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_round_trip_preserves_entries_and_profile(tmp_path):
    t = table(entry(), entry(sig="f32[4, 4], f32[4, 4]", median=30.0, flops=128))
    p = t.save(tmp_path / "x.json")
    back = CostTable.load(p)
    assert sorted(back.entries, key=lambda e: e.key) == sorted(t.entries, key=lambda e: e.key)
    assert back.profile.record_wait_us == GENERIC_CPU.record_wait_us
    assert back.device["name"] == "test-cpu"


@pytest.mark.parametrize("text", ["{", "", '{"schema": "autostream.cost_table", "ver'])
def test_corrupt_or_truncated_json_names_the_file(tmp_path, text):
    p = write(tmp_path, text)
    with pytest.raises(TableError, match="not valid JSON") as exc:
        CostTable.load(p)
    assert str(p) in str(exc.value)


def test_truncated_valid_prefix_is_still_rejected(tmp_path):
    text = json.dumps(table(entry()).to_json())
    p = write(tmp_path, text[: len(text) // 2])
    with pytest.raises(TableError, match=str(p)):
        CostTable.load(p)


def mutate(tmp_path, fn):
    data = table(entry()).to_json()
    fn(data)
    return write(tmp_path, data)


@pytest.mark.parametrize("fn, field, words", [
    (lambda d: d.update(version=99), "version", "unknown schema version 99"),
    (lambda d: d.update(schema="other"), "schema", "not an autostream cost table"),
    (lambda d: d["entries"][0].update(median_us=-1.0), "entries[0].median_us", "negative"),
    (lambda d: d["entries"][0].pop("median_us"), "entries[0].median_us", "missing"),
    (lambda d: d["entries"][0].update(median_us="fast"), "entries[0].median_us", "finite number"),
    (lambda d: d["entries"][0].update(share=1.5), "entries[0].share", "[0, 1]"),
    (lambda d: d["profile"].update(bandwidth=0), "profile.bandwidth", "> 0"),
    (lambda d: d["profile"].pop("record_wait_us"), "profile.record_wait_us", "missing"),
    (lambda d: d["device"].update(kind="tpu"), "device.kind", "cpu, cuda, npu"),
    (lambda d: d["entries"].append(dict(d["entries"][0])), "entries[1].signature", "duplicates"),
])
def test_bad_fields_are_named(tmp_path, fn, field, words):
    p = mutate(tmp_path, fn)
    with pytest.raises(TableError) as exc:
        CostTable.load(p)
    assert exc.value.field == field
    assert str(p) in str(exc.value) and words in str(exc.value)


def test_table_for_another_device_is_rejected(tmp_path):
    p = table(entry()).save(tmp_path / "cpu.json")
    with pytest.raises(TableError, match="device.kind.*'cpu' device") as exc:
        TableCostModel.load(p, device="cuda")
    assert str(p) in str(exc.value)
    assert TableCostModel.load(p, device="cpu").table.device["kind"] == "cpu"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CostTable.load(tmp_path / "nope.json")


def test_merge_newer_measurement_wins_and_resolves_skips():
    old = CostTable(device={"name": "d", "kind": "cpu", "origin": "measured", "models": ["a:f"]},
                    profile=GENERIC_CPU,
                    entries=(entry(median=10.0), entry(op="aten.abs.default", sig="f32[2]")),
                    skipped=(Skipped("aten.relu.default", "f32[3]", "boom"),))
    new = CostTable(device={"name": "d", "kind": "cpu", "origin": "measured", "models": ["b:g"]},
                    profile=GENERIC_CPU,
                    entries=(entry(median=20.0), entry(op="aten.relu.default", sig="f32[3]")))
    merged = old.merged(new)
    by_key = {e.key: e for e in merged.entries}
    assert by_key[("aten.mm.default", "f32[2, 2], f32[2, 2]")].median_us == 20.0
    assert ("aten.abs.default", "f32[2]") in by_key
    assert merged.skipped == ()
    assert merged.device["models"] == ["a:f", "b:g"]


def test_merge_refuses_another_device():
    a, b = table(entry()), table(entry(), name="other-machine")
    with pytest.raises(TableError, match="device.name"):
        a.merged(b)


@pytest.mark.parametrize("name, kind", [("h200", "cuda"), ("ascend910b", "npu"), ("cpu", "cpu")])
def test_shipped_tables_load_by_name_and_say_where_they_come_from(name, kind):
    cm = TableCostModel.load(name)
    assert cm.table.device["kind"] == kind
    if kind != "cpu":
        assert cm.profile.origin == "spec" and "spec-derived" in cm.describe()
        assert not cm.table.entries
    else:
        assert cm.profile.origin == "measured" and cm.table.entries
        assert cm.table.device.get("host")


def test_unknown_table_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="h200"):
        TableCostModel.load("a100")


@pytest.mark.parametrize("field", ["runtime_op_us", "runtime_call_us", "runtime_segment_us",
                                   "compile_call_us"])
def test_runtime_costs_are_optional_and_must_not_be_negative(tmp_path, field):
    import json

    import cost_models
    from autostream.cost import CostTable, TableError

    data = json.loads(cost_models.table_path("cpu").read_text())
    data["profile"].pop(field, None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert getattr(CostTable.load(old).profile, field) == 0.0
    data["profile"][field] = -1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(TableError, match=f"profile.{field}"):
        CostTable.load(bad)
