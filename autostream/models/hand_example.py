"""A hand placement of your own, as ``docs/hand-placements.md`` writes it: two branches of a
model on two streams with TorchAir's ops, checked by ``autostream check``.

The side branch runs in a ``_user_stream_label`` scope (``stream_1``) and waits for the
main stream's ``record`` made before it; the main stream waits for the side's ``record``
before it adds the two.  ``forgotten_wait`` leaves out that last wait: ``check`` then names
the race (the side's ``relu`` against the ``add``) under ``cuda`` and ``acl``; GE orders a
data edge across streams itself, so under ``ge`` there is none.  Without torch-npu,
``air_ops()`` registers stand-ins for ``torch.ops.air`` (``autostream.dialects.torchair``)::

    autostream check autostream.models.hand_example:two_branches --mode ge
    autostream check autostream.models.hand_example:forgotten_wait --mode acl

>>> model, (x,) = two_branches()
>>> torch.equal(model(x), model.main(x).relu() + model.side(x).relu())
True
"""

from __future__ import annotations

import torch

from autostream.dialects.torchair import air_ops

#: the scope key TorchAir's ``npu_stream_switch`` writes, and the side stream's label
STREAM_KEY, SIDE = "_user_stream_label", "stream_1"


class TwoBranches(torch.nn.Module):
    """``main(x).relu() + side(x).relu()``, the side branch on ``stream_1``."""

    def __init__(self, width: int = 64, wait: bool = True) -> None:
        super().__init__()
        self.main, self.side = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.wait = wait

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        air = torch.ops.air
        x_ready = air.record()  # on main: x is ready
        air.scope_enter([STREAM_KEY], [SIDE], True)
        air.wait([x_ready])  # the side stream waits for it
        side = self.side(x).relu()
        side_done = air.record()
        air.scope_exit(True)
        main = self.main(x).relu()
        if self.wait:
            air.wait([side_done])  # main waits for the side branch before reading it
        return main + side


def two_branches() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The placement with every wait: ``check`` finds no race."""
    air_ops()
    return TwoBranches(), (torch.randn(8, 64),)


def forgotten_wait() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The placement without main's wait for the side branch: ``check`` names the race
    (under ``cuda`` and ``acl``)."""
    air_ops()
    return TwoBranches(wait=False), (torch.randn(8, 64),)
