"""Model builders seed their weights without moving the caller's random stream.

A builder seeds torch's global generator so its layers' initial weights are the same on
every call; run under :func:`own_rng`, it does so on a fork of the CPU generator, and
the caller's random numbers after the call are those they would have drawn without it.

>>> @own_rng
... def build():
...     torch.manual_seed(0)
...     return torch.nn.Linear(2, 2)
>>> _ = torch.manual_seed(5); expected = torch.rand(2)
>>> _ = torch.manual_seed(5); _ = build(); torch.equal(torch.rand(2), expected)
True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


def own_rng(build: Callable[P, R]) -> Callable[P, R]:
    """``build`` run on a fork of torch's CPU generator (restored after, also on errors)."""
    @functools.wraps(build)
    def seeded(*args: P.args, **kwargs: P.kwargs) -> R:
        with torch.random.fork_rng(devices=[]):
            return build(*args, **kwargs)

    return seeded


__all__ = ["own_rng"]
