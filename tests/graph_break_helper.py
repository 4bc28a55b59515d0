"""A helper with a graph break inside, in a module of its own (issue 51 item 2): Dynamo
keeps the compiled function of the code after the break in this module's globals
(``__compiled_fn_N_...``), as in transformers' Qwen2-VL vision tower (``grid_thw.tolist()``)."""

from __future__ import annotations

import torch


def scaled_by_sizes(x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """``x`` through two branches, scaled by the sum of ``sizes`` read on the host.

    >>> scaled_by_sizes(torch.ones(2, 2), torch.tensor([1, 2])).shape
    torch.Size([2, 2])
    """
    total = sum(sizes.tolist())  # a graph break: the host reads the tensor
    return (x.relu() * total) @ x.t() + (x.sigmoid() * total) @ x.t()
