"""What every solver shares: checking its options, building a ``Schedule`` from a stream
assignment."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule, SolverStats
from autostream.scheduling.simulate import simulate


@dataclass(frozen=True)
class VirtualStreamStats(SolverStats):
    """A solver that first plans on unbounded virtual streams, then folds them."""

    virtual_streams: int  # virtual streams the plan needed before folding


def check_options(solver: str, options: Mapping[str, object], allowed: Iterable[str] = ()) -> None:
    """Raise ``ValueError`` naming every option ``solver`` does not have, and the allowed ones.

    >>> check_options("heft", {"time_limit": 1.0})
    Traceback (most recent call last):
    ...
    ValueError: solver 'heft' has no option 'time_limit'; it takes no options
    """
    allowed = sorted(allowed)
    unknown = sorted(k for k in options if k not in allowed)
    if not unknown:
        return
    names = ", ".join(repr(k) for k in unknown)
    plural = "s" if len(unknown) > 1 else ""
    known = f"allowed: {', '.join(allowed)}" if allowed else "it takes no options"
    raise ValueError(f"solver {solver!r} has no option{plural} {names}; {known}")


def launch_order(
    problem: SchedulingProblem,
    start: Mapping[str, float],
    tiebreak: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """Ops sorted by predicted start, ties broken by ``tiebreak`` (default: topological index).

    A dependence ``u -> v`` has ``start[u] <= start[v]`` in any valid timeline, so
    with a topological tiebreak the result is a topological order.
    """
    idx = tiebreak if tiebreak is not None else problem.topo_index
    return tuple(sorted(problem.graph, key=lambda n: (start[n], idx[n])))


def schedule_from_assignment(
    problem: SchedulingProblem,
    stream_of: Mapping[str, int],
    solver: str,
    order: tuple[str, ...] | None = None,
    stats: SolverStats | None = None,
) -> Schedule:
    """Predict the timeline of a stream assignment and wrap it as a ``Schedule``.

    Streams are renumbered by first appearance so that the first stream used is
    stream 0 (the main stream). ``order`` defaults to the topological order.  Lane
    tasks (``problem.pinned``) go to their lanes whatever ``stream_of`` says: a
    solver that does not know lanes plans a transfer as if a stream waited for it.
    """
    order = tuple(order) if order is not None else problem.topo_order
    timed = assignment_timeline(problem, stream_of, order)
    return timed.schedule(problem, order, solver, stats)


@dataclass(frozen=True)
class Timed:
    """A stream assignment (lanes placed, streams renumbered) and its simulated times."""

    stream_of: dict[str, int]
    start: dict[str, float]
    end: dict[str, float]

    @property
    def makespan(self) -> float:
        return max(self.end.values(), default=0.0)

    def schedule(self, problem: SchedulingProblem, order: tuple[str, ...], solver: str,
                 stats: SolverStats | None = None) -> Schedule:
        """The ``Schedule`` of this timeline, launched as simulated (ties: ``order``)."""
        return Schedule(
            solver=solver,
            stream_of=self.stream_of,
            order=launch_order(problem, self.start, {n: i for i, n in enumerate(order)}),
            start=self.start,
            end=self.end,
            makespan=self.makespan,
            lower_bound=problem.lower_bound(),
            optimal=False,
            stats=stats,
        )


def assignment_timeline(problem: SchedulingProblem, stream_of: Mapping[str, int],
                        order: tuple[str, ...]) -> Timed:
    """The simulated times of a stream assignment launched in ``order``, without the
    ``Schedule`` around them (the local search judges many it throws away)."""
    stream_of = canonical_streams({**stream_of, **problem.pinned}, order)
    start, end = simulate(problem, stream_of, order)
    return Timed(stream_of, start, end)


def canonical_streams(stream_of: Mapping[str, int], order: tuple[str, ...]) -> dict[str, int]:
    """Renumber streams 0..k-1 by the first op (in ``order``) that uses each; lanes
    (negative numbers) keep theirs."""
    renumber: dict[int, int] = {}
    for n in order:
        s = stream_of[n]
        if s not in renumber:
            renumber[s] = s if s < 0 else sum(1 for k in renumber if k >= 0)
    return {n: renumber[stream_of[n]] for n in order}
