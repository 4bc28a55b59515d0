"""A cost table in words: its name, who chose it, measured or spec-derived, and whether it
was made for the device the graph is on (every report and text output names it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from autostream.cost.defaults import DEFAULT_TABLES

if TYPE_CHECKING:
    from autostream.cost.model import TableCostModel


def table_label(model: TableCostModel | Any, name: str | os.PathLike | None, device: str,
                default_of: str | None = None) -> str:
    """The cost table a graph on ``device`` was planned with, in words: its name, whether
    the user gave it or it is the default (of ``default_of``, in words; ``None``: of
    ``device`` graphs), measured or spec-derived, and a warning when it was made for
    another kind of device.

    >>> from autostream.cost import TableCostModel
    >>> table_label(TableCostModel.load("h200"), "h200", "cpu")
    "'h200' (given; cuda, spec-derived, not profiled; made for cuda devices, but the graph is on cpu: its times are not this machine's)"
    """
    table = getattr(model, "table", None)
    if table is None:  # a cost model of the caller's own, not a table
        return f"none: the cost model {type(model).__name__}"
    d = table.device
    kind = d.get("kind", model.profile.kind)
    how = (f"measured on {d['name']}" if model.profile.origin == "measured"
           else "spec-derived, not profiled")
    if "probe" in d:  # cost.fitted
        how = (f"shipped table rescaled to this machine by a {d['probe']['seconds']:.1f} s "
               f"probe; measured on {d['probe']['measured_on']}")
    given = ("given" if name is not None
             else f"the default of {default_of or f'{device} graphs'}")
    label = name if name is not None else DEFAULT_TABLES.get(device, model.profile.name)
    text = f"{os.fspath(label)!r} ({given}; {kind}, {how}"
    mismatch = table_mismatch(kind, device)
    return text + (f"; {mismatch})" if mismatch else ")")


def table_mismatch(table_kind: str, device: str) -> str | None:
    """Why a table of ``table_kind`` devices says little about a graph on ``device``.

    >>> table_mismatch("cpu", "cpu") is None, table_mismatch("npu", "meta") is None
    (True, True)
    """
    if device in ("", "meta") or table_kind == device:
        return None
    return (f"made for {table_kind} devices, but the graph is on {device}: its times are not "
            f"this machine's")
