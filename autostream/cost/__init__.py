"""Op costs for the planner: signatures, cost tables, lookup and calibration.

May import: comm, fx, stages.

>>> cm = TableCostModel.load("h200")
>>> cm.profile.origin
'spec'
"""

from autostream.cost.free import is_free_target
from autostream.cost.model import SOURCES, OpCost, SourceBreakdown, TableCostModel, source_breakdown
from autostream.cost.profile import GENERIC_CPU, DeviceProfile
from autostream.cost.protocol import CostModel
from autostream.cost.signature import OpSignature, TensorSpec, node_signature
from autostream.cost.table import CostTable, Entry, Skipped, TableError

__all__ = [
    "SOURCES", "CostModel", "CostTable", "TableCostModel", "DeviceProfile", "Entry", "GENERIC_CPU", "OpCost",
    "OpSignature", "Skipped", "SourceBreakdown", "TableError", "TensorSpec", "is_free_target",
    "node_signature", "source_breakdown",
]
