"""Two ops sharing the device: pair timings and the device shares they imply.

The planner's contention model (:mod:`autostream.scheduling.simulate`) is processor
sharing: while concurrent ops' shares sum to ``S > 1``, each progresses at rate
``1 / S``.  Two lanes of work alone taking ``Ta <= Tb`` then take, together,

    T = Tb + Ta * (S - 1)   (S > 1; else T = Tb)

so a measured pair gives ``S = 1 + (T - Tb) / Ta`` (:func:`combined_share`; at least 1:
a pair that did not slow down says only that its shares fit side by side).  A pair of
two copies of one op gives that op's share, ``s = S / 2``: ``T = Ta`` (the copies fit
side by side) gives ``0.5``, ``T = 2 Ta`` (fully serialised) gives ``1``.  Pairs of
different ops refine the shares: :func:`fit_shares` solves ``s_a + s_b = S_ab`` over all
pairs by least squares and clips each share to ``[0, 1]``.

>>> fit = fit_shares([PairTiming(("mm", "x"), ("mm", "x"), 100.0, 100.0, 160.0)])
>>> fit.shares[("mm", "x")]
0.8
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PairTiming", "ShareFit", "combined_share", "fit_shares"]

OpKey = tuple[str, str]


@dataclass(frozen=True)
class PairTiming:
    """Two lanes of calls timed alone and together: ``a_us`` is ``a_calls`` calls of op ``a``
    (``(op, signature)``) alone, ``b_us`` the same of ``b``, ``together_us`` both lanes at
    once on two streams."""

    a: OpKey
    b: OpKey
    a_us: float
    b_us: float
    together_us: float
    a_calls: int = 0
    b_calls: int = 0

    @property
    def key(self) -> tuple[OpKey, OpKey]:
        return (self.a, self.b)

    @property
    def is_self(self) -> bool:
        return self.a == self.b

    @property
    def combined_share(self) -> float:
        return combined_share(self.a_us, self.b_us, self.together_us)

    @property
    def slowdown(self) -> float:
        """Together over the longer lane alone (1: full overlap; 2 for a self pair: serialised)."""
        return self.together_us / max(self.a_us, self.b_us)


def combined_share(a_us: float, b_us: float, together_us: float) -> float:
    """``S``, the two ops' summed share, from two lanes timed alone and together (module
    docstring); at least 1.

    >>> combined_share(10.0, 10.0, 10.0), combined_share(10.0, 10.0, 20.0)
    (1.0, 2.0)
    >>> combined_share(10.0, 5.0, 12.0)
    1.4
    >>> combined_share(10.0, 10.0, 9.0)  # faster together: noise, no slowdown
    1.0
    """
    short, long = sorted((a_us, b_us))
    if not short > 0:
        raise ValueError(f"lane times must be > 0, got {a_us} and {b_us}")
    return max(1.0, 1.0 + (together_us - long) / short)


@dataclass(frozen=True)
class ShareFit:
    """Each op's share, and how well ``s_a + s_b`` reproduces the pairs' ``S``: ``residual``
    is the root mean square of ``s_a + s_b - S_ab`` over the pairs, after clipping."""

    shares: dict[OpKey, float]
    residual: float
    pairs: int

    def describe(self) -> str:
        """The fit in words, for a table's notes.

        >>> ShareFit({("a", ""): 0.5}, 0.0, 1).describe()
        'device shares fitted to 1 pair timing (1 op): RMS residual 0.000 of combined share'
        """
        n = len(self.shares)
        return (f"device shares fitted to {self.pairs} pair timing{'s' * (self.pairs != 1)} "
                f"({n} op{'s' * (n != 1)}): RMS residual {self.residual:.3f} of combined share")


def fit_shares(pairs: Sequence[PairTiming]) -> ShareFit:
    """Least-squares shares with ``s_a + s_b = S_ab`` for every pair (``2 s_a = S_aa`` for a
    self pair), each clipped to ``[0, 1]``.

    Consistent pairs are reproduced exactly; inconsistent ones are averaged:

    >>> a, b = ("a", ""), ("b", "")
    >>> fit = fit_shares([PairTiming(a, a, 10, 10, 16), PairTiming(b, b, 10, 10, 12),
    ...                   PairTiming(a, b, 10, 10, 14)])
    >>> {k[0]: round(v, 3) for k, v in fit.shares.items()}, round(fit.residual, 6)
    ({'a': 0.8, 'b': 0.6}, 0.0)
    >>> fit = fit_shares([PairTiming(a, a, 10, 10, 16), PairTiming(b, b, 10, 10, 12),
    ...                   PairTiming(a, b, 10, 10, 10)])
    >>> {k[0]: round(v, 3) for k, v in fit.shares.items()}, round(fit.residual, 3)
    ({'a': 0.733, 'b': 0.533}, 0.189)
    """
    ops: dict[OpKey, int] = {}
    for p in pairs:
        for k in (p.a, p.b):
            ops.setdefault(k, len(ops))
    if not pairs:
        return ShareFit({}, 0.0, 0)
    rows = np.zeros((len(pairs), len(ops)))
    target = np.zeros(len(pairs))
    for i, p in enumerate(pairs):
        rows[i, ops[p.a]] += 1.0
        rows[i, ops[p.b]] += 1.0
        target[i] = p.combined_share
    solution, *_ = np.linalg.lstsq(rows, target, rcond=None)
    clipped = np.clip(solution, 0.0, 1.0)
    residual = math.sqrt(float(np.mean((rows @ clipped - target) ** 2)))
    return ShareFit({k: float(clipped[i]) for k, i in ops.items()}, residual, len(pairs))
