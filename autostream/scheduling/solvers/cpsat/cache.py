"""The persistent plan cache: a problem planned before is looked up, not solved again.

The key is the sha256 of the problem's canonical form (:mod:`.canonical`: op
content by position, independent of op names, so a recompiled or renamed graph
hits), the options that shape the plan, the OR-Tools version and a digest of the
solver's own source (a changed solver never serves an old plan).  The entry holds
every op's stream and the launch order by position, the bound and the solve's
statistics, and the plan's simulated times: the key covers the durations and the
simulator's source, so a hit returns exactly the schedule the solve returned
without simulating it again.  Only
reproducible solves are stored (none cut by the wall clock): a hit must equal
what a solve would give, on every rank.

Location: ``$AUTOSTREAM_PLAN_CACHE`` when set (``off`` disables the cache), else
``$XDG_CACHE_HOME/autostream/plans``, else ``~/.cache/autostream/plans``.  Entries
are written atomically (a temporary file renamed into place); an entry that cannot
be read, or reads as no plan of the problem (an op off its streams, a launch order that
is no topological order of every op), is a miss and is replaced.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

from ortools import __version__ as ortools_version

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.cpsat.canonical import digest
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.solvers.cpsat.stats import CpsatStats

ENV = "AUTOSTREAM_PLAN_CACHE"
_OFF = ("off", "0", "false", "no", "none")
FORMAT = 2


@dataclasses.dataclass(frozen=True)
class PlanCache:
    """Plans on disk under ``root``, one JSON file per key."""

    root: Path

    @classmethod
    def from_environment(cls) -> PlanCache | None:
        """The cache the environment asks for, or ``None`` when it is switched off.

        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {ENV: "off"}):
        ...     PlanCache.from_environment() is None
        True
        """
        where = os.environ.get(ENV)
        if where is not None and where.strip().lower() in _OFF:
            return None
        if where:
            return cls(Path(where).expanduser())
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return cls(Path(base) / "autostream" / "plans")

    def path(self, problem: SchedulingProblem, opts: CpsatOptions) -> Path:
        """Where the plan of ``problem`` under ``opts`` is kept (hashes the problem)."""
        # only solves no wall clock cut are stored, and those are the same with or without
        # the cap: ``wall_clock`` shapes no stored plan
        shaping = {k: v for k, v in dataclasses.asdict(opts).items()
                   if k not in ("cache", "wall_clock")}
        key = digest(problem, [FORMAT, shaping, ortools_version, _source_digest()])
        return self.root / key[:2] / f"{key}.json"

    @staticmethod
    def load(path: Path, problem: SchedulingProblem) -> Schedule | None:
        """The plan of ``problem`` kept at ``path`` (:meth:`path`), or ``None``."""
        try:
            entry = json.loads(path.read_text())
            return _schedule(problem, entry)
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None

    @staticmethod
    def store(path: Path, problem: SchedulingProblem, schedule: Schedule) -> None:
        """Keep ``schedule`` for ``problem`` at ``path``; a cache that cannot be written is
        skipped.  Its times are kept too: the key covers the durations and the simulator's
        source, so they are what re-timing the plan would give."""
        pos = problem.topo_index
        entry = {
            "format": FORMAT,
            "stream": [schedule.stream_of[v] for v in problem.topo_order],
            "order": [pos[v] for v in schedule.order],
            "start": [schedule.start[v] for v in problem.topo_order],
            "end": [schedule.end[v] for v in problem.topo_order],
            "lower_bound": schedule.lower_bound,
            "optimal": schedule.optimal,
            "stats": schedule.stats.as_dict() if schedule.stats is not None else None,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False,
                                             suffix=".tmp") as fh:
                json.dump(entry, fh)
            os.replace(fh.name, path)
        except OSError:
            return


def _schedule(problem: SchedulingProblem, entry: dict) -> Schedule:
    topo = problem.topo_order
    if entry["format"] != FORMAT or len(entry["stream"]) != len(topo):
        raise ValueError("stale cache entry")
    stream_of = {v: int(s) for v, s in zip(topo, entry["stream"], strict=True)}
    start = {v: float(t) for v, t in zip(topo, entry["start"], strict=True)}
    end = {v: float(t) for v, t in zip(topo, entry["end"], strict=True)}
    order = tuple(topo[int(i)] for i in entry["order"])
    _check_plan(problem, stream_of, order)
    stats = dict(entry["stats"])
    stats["piece_sources"] = tuple(stats["piece_sources"])
    return Schedule(
        solver="cpsat",
        stream_of=stream_of,
        order=order,
        start=start,
        end=end,
        makespan=max(end.values(), default=0.0),
        lower_bound=float(entry["lower_bound"]),
        optimal=bool(entry["optimal"]),
        stats=CpsatStats(**stats),
    )


def _check_plan(problem: SchedulingProblem, stream_of: dict[str, int],
                order: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``stream_of`` and ``order`` are a plan of ``problem``:
    an entry damaged on disk that still parses must be a miss, not the graph's plan."""
    pinned = problem.pinned
    for v, s in stream_of.items():
        if s != pinned.get(v, s) or (v not in pinned and not 0 <= s < problem.streams):
            raise ValueError(f"op {v!r} on stream {s}")
    if len(order) != len(stream_of) or set(order) != set(stream_of):
        raise ValueError("the launch order is not one of every op")
    position = {v: i for i, v in enumerate(order)}
    if any(position[u] > position[v] for u, v in problem.graph.edges):
        raise ValueError("the launch order runs an op before one it depends on")


@functools.cache
def _source_digest() -> str:
    """sha256 of the solvers' and the simulator's source: what a plan depends on."""
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "solvers").rglob("*.py")) + [root / "simulate.py", root / "timeline.py",
                                                      root / "problem.py"]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()
