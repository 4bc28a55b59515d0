"""The options of the ``cpsat`` solver, checked where they are given."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from autostream.scheduling.solvers.base import check_options

CONTENTION_MODES = ("auto", "blocking", "relaxed")
#: the time a solve gets without ``time_limit``: ``AUTO_S_PER_SQRT_OP`` times the square
#: root of its op count, less on small graphs (x ``ops / (ops + SMALL_GRAPH_OPS)``), whose
#: pass also pays fixed costs around the solve (CP-SAT's start-up per call, the memory
#: check): 0.32 s at 100 ops, 2.5 s at 4,000.  Pieces that prove optimal stop far
#: sooner, and large graphs are mostly copies of a few pieces
AUTO_S_PER_SQRT_OP = 0.04
SMALL_GRAPH_OPS = 25
#: ``off``: no solve gets a wall-clock cap unless its options ask (the test suite sets it)
WALL_CLOCK_ENV = "AUTOSTREAM_WALL_CLOCK"


def wall_clock_from_environment() -> bool:
    """``wall_clock``'s default: ``True`` unless ``AUTOSTREAM_WALL_CLOCK=off``, which makes
    every solve stop on its deterministic limit alone (the same plans however loaded the
    machine, which may then overrun ``time_limit``).

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {WALL_CLOCK_ENV: "off"}):
    ...     wall_clock_from_environment()
    False
    >>> with mock.patch.dict(os.environ, {WALL_CLOCK_ENV: "sometimes"}):
    ...     wall_clock_from_environment()
    Traceback (most recent call last):
    ...
    ValueError: AUTOSTREAM_WALL_CLOCK='sometimes': use 'off' (deterministic limits alone) or 'on' (the default: a wall-clock cap too)
    """
    value = os.environ.get(WALL_CLOCK_ENV, "on").strip().lower()
    if value in ("on", "1", "true", "yes", ""):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"{WALL_CLOCK_ENV}={os.environ[WALL_CLOCK_ENV]!r}: use 'off' (deterministic "
                     f"limits alone) or 'on' (the default: a wall-clock cap too)")


@dataclass(frozen=True)
class CpsatOptions:
    """What a ``cpsat`` solve may do; equal options give equal plans.

    >>> CpsatOptions(time_limit=0)
    Traceback (most recent call last):
    ...
    ValueError: time_limit must be a number of seconds > 0 (or None: by the graph's size), got 0
    """

    #: the most seconds the whole solve may take (CP-SAT's deterministic clock, with a
    #: wall-clock cap); ``None``: in proportion to the graph's size (see ``seconds``).
    #: A solve that proves its pieces optimal stops earlier.
    time_limit: float | None = None
    #: the most tasks one CP-SAT model holds; larger pieces are solved window by window
    window: int = 150
    seed: int = 0
    #: CP-SAT subsolvers, interleaved (reproducible) on however many cores there are
    workers: int = 8
    #: the share of a piece's time given to minimising cross-stream edges
    sync_share: float = 0.2
    #: also weigh the cheap baseline solvers' plans (the best predicted plan is returned)
    portfolio: bool = True
    #: "blocking" (shares as a cumulative), "relaxed" (shares left to the simulator) or
    #: "auto" (a ladder of capacities, the simulator picks)
    contention: str = "auto"
    #: cut the graph into pieces at ops every other op precedes or follows
    decompose: bool = True
    #: look plans up in, and store them into, the persistent plan cache
    cache: bool = True
    #: ``False``: no wall-clock caps, only the deterministic clock stops a search, so every
    #: rank of a distributed run reaches the same plan (the planner asks for it on graphs
    #: that communicate; a loaded machine may then overrun ``time_limit``); the default
    #: follows ``AUTOSTREAM_WALL_CLOCK`` (:func:`wall_clock_from_environment`)
    wall_clock: bool = field(default_factory=wall_clock_from_environment)

    def __post_init__(self) -> None:
        if self.time_limit is not None and (
                isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float))
                or not self.time_limit > 0):
            raise ValueError(f"time_limit must be a number of seconds > 0 (or None: by the "
                             f"graph's size), got {self.time_limit!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 2:
            raise ValueError(f"window must be an integer >= 2, got {self.window!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {self.workers!r}")
        if not isinstance(self.sync_share, (int, float)) or not 0 <= self.sync_share < 1:
            raise ValueError(f"sync_share must lie in [0, 1), got {self.sync_share!r}")
        if self.contention not in CONTENTION_MODES:
            raise ValueError(f"contention must be 'auto', 'blocking' or 'relaxed', got "
                             f"{self.contention!r}")

    def seconds(self, ops: int) -> float:
        """The time a solve of ``ops`` ops gets: ``time_limit``, or by size without it.

        >>> round(CpsatOptions().seconds(400), 3), CpsatOptions(time_limit=2.0).seconds(400)
        (0.753, 2.0)
        """
        if self.time_limit is not None:
            return float(self.time_limit)
        ops = max(ops, 1)
        return AUTO_S_PER_SQRT_OP * math.sqrt(ops) * ops / (ops + SMALL_GRAPH_OPS)

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> CpsatOptions:
        """Options given by name; an unknown name raises ``ValueError`` naming the allowed ones.

        >>> CpsatOptions.from_options({"time_limt": 1.0})
        Traceback (most recent call last):
        ...
        ValueError: solver 'cpsat' has no option 'time_limt'; allowed: cache, contention, decompose, portfolio, seed, sync_share, time_limit, wall_clock, window, workers
        """
        check_options("cpsat", options, OPTIONS)
        return cls(**options)  # type: ignore[arg-type]


OPTIONS = tuple(f.name for f in dataclasses.fields(CpsatOptions))
