"""Plain data produced by the planning stages: a ``Schedule`` and its ``Sync`` pairs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Consumer name used for the syncs that join a side stream back to the main
#: stream before the graph's ``output``.
JOIN = "<output>"


@dataclass(frozen=True)
class SolverStats:
    """Typed figures a solver reports about one solve; each solver subclasses it.

    >>> @dataclass(frozen=True)
    ... class Counted(SolverStats):
    ...     tries: int
    >>> Counted(3).as_dict()
    {'tries': 3}
    """

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (nested records as dicts), for JSON and reports."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Schedule:
    """Where and in which order every op runs, with the predicted timeline.

    ``stream_of`` maps op -> stream (0 is the main stream; a negative number is a
    lane, e.g. a process group's link, see ``problem.lane_stream``); ``order`` is the
    launch order (a topological order of the dependences); ``start``/``end`` are
    predicted times in microseconds.

    >>> s = Schedule("single", {"a": 0}, ("a",), {"a": 0.0}, {"a": 1.0}, 1.0, 1.0)
    >>> s.streams_used
    1
    """

    solver: str
    stream_of: Mapping[str, int]
    order: tuple[str, ...]
    start: Mapping[str, float]
    end: Mapping[str, float]
    makespan: float
    lower_bound: float
    optimal: bool = False
    #: what the solver reports about how it found the schedule (``None``: nothing)
    stats: SolverStats | None = None

    @property
    def streams_used(self) -> int:
        """Streams holding at least one op (lanes do not count)."""
        return len({s for s in self.stream_of.values() if s >= 0})

    @property
    def gap(self) -> float:
        """Relative distance of the makespan above the lower bound."""
        if self.lower_bound <= 0:
            return 0.0
        return self.makespan / self.lower_bound - 1.0

    def stream_sequences(self) -> dict[int, list[str]]:
        """Ops of each stream (and lane), in launch order."""
        seqs: dict[int, list[str]] = {}
        for n in self.order:
            seqs.setdefault(self.stream_of[n], []).append(n)
        return seqs


@dataclass(frozen=True, order=True)
class Sync:
    """``record`` right after ``producer`` on its stream; ``wait`` right before ``consumer``.

    ``consumer == JOIN`` joins the producer's stream back to the main stream before
    the graph's output.
    """

    producer: str
    consumer: str
