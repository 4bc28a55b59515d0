"""Which cost table plans a graph when the user names none: the one of the graph's device.

A CUDA graph planned with CPU timings would put ops on streams by the wrong costs, so
the default follows the device: ``cpu`` -> the shipped measured ``cpu`` table,
``cuda`` -> ``h200``, ``npu`` -> ``ascend910b``.  On a CPU other than the one the ``cpu``
table was measured on, the table is first fitted to this machine by a short probe, kept in
a cache (``cost.fitted``; ``AUTOSTREAM_COST_PROBE=off`` keeps the shipped table as it
is).  The accelerator tables are
spec-derived (datasheet peaks, never profiled), and a device type without a shipped
table gets a roofline on a generic CPU profile: both come with a warning that says how
to measure the device.

>>> choice = default_table("cuda")
>>> choice.name, choice.model.profile.origin, "calibrate" in choice.warning
('h200', 'spec', True)
>>> default_table("cpu").warning is None  # fitted to this machine unless probing is off
True
"""

from __future__ import annotations

from dataclasses import dataclass

from autostream.cost.fitted import fitted_table, measured_here, probe_enabled
from autostream.cost.model import TableCostModel
from autostream.cost.profile import GENERIC_CPU
from autostream.cost.table import CostTable

#: the shipped table that plans a graph of each device type
DEFAULT_TABLES = {"cpu": "cpu", "cuda": "h200", "npu": "ascend910b"}


@dataclass(frozen=True)
class DefaultTable:
    """The cost model for a device type, and a warning when it was not measured there."""

    name: str
    model: TableCostModel
    warning: str | None


def default_table(device_type: str, fitted: bool = True) -> DefaultTable:
    """The default cost model of graphs on ``device_type`` (``"cpu"``, ``"cuda"``, ...);
    ``fitted=False`` keeps the shipped table as it is (graphs that communicate: every rank
    must plan them from the same table, and ranks on other machines would fit others)."""
    how = (f"measure the device with `autostream calibrate MODEL_SPEC --device "
           f"{device_type if device_type in DEFAULT_TABLES else 'cpu|cuda|npu'} --out my.json` "
           f"and pass cost_table='my.json'")
    name = DEFAULT_TABLES.get(device_type)
    if name is None:
        return DefaultTable("generic-cpu", TableCostModel(CostTable.from_profile(GENERIC_CPU)),
                            f"no cost table for {device_type!r} devices: planning with a roofline "
                            f"on a generic CPU profile; {how}")
    model = TableCostModel.load(name)
    if fitted and device_type == "cpu" and probe_enabled() and not measured_here(model.table):
        model = TableCostModel(fitted_table(model.table, name))
    warning = None
    if model.profile.origin != "measured":
        warning = (f"the default cost table of {device_type} graphs, {name!r}, is spec-derived "
                   f"(published peaks, never profiled): plans rest on roofline estimates; {how}")
    return DefaultTable(name, model, warning)
