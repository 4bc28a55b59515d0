"""What the planner asks of a cost model: op estimates, a transfer's time, the runtime's costs.

:class:`~autostream.cost.model.TableCostModel` answers from a cost table; a test double
answers with what it is given.  Planning reads nothing else from a cost model.

>>> from autostream.cost.model import TableCostModel
>>> isinstance(TableCostModel.load("h200"), CostModel)
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch.fx

if TYPE_CHECKING:
    from autostream.cost.collectives import TransferCost
    from autostream.cost.model import OpCost

__all__ = ["CostModel"]


@runtime_checkable
class CostModel(Protocol):
    """Estimates for one device; times in microseconds."""

    #: a record/wait between two streams: a blocked waiter's wake-up
    sync_latency_us: float
    #: what the multi-stream runtime adds per op called from Python
    runtime_op_us: float
    #: ... per call (handing work to the side streams and joining them)
    runtime_call_us: float
    #: ... per run of one stream's ops between two of its syncs
    runtime_segment_us: float

    def estimate(self, node: torch.fx.Node) -> OpCost:
        """An op's duration alone, its device share and the source of the figures."""
        ...

    def transfer(self, collective: str, nbytes: int, backend: str | None = None,
                 world_size: int | None = None) -> TransferCost | None:
        """A collective's time on its link, or ``None`` when transfers are not modelled."""
        ...
