"""Plan a task graph window by window, each window warm-started from its greedy plan.

A task graph of at most ``window`` tasks is one window: CP-SAT solves it whole,
hinted with the better of HEFT's plan and its own greedy plan, and the proven
bound is kept.  A larger one is cut into consecutive windows (``cut_windows``)
solved one after the other, each given what the earlier ones left behind; a
window whose tasks and boundary equal an earlier one's reuses its solution
(``Window.key``), and a window met when the time is spent keeps its greedy plan.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import networkx as nx

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers import heft
from autostream.scheduling.solvers.cpsat.clock import DET_PER_SECOND
from autostream.scheduling.solvers.cpsat.model import (
    Hint,
    SolveLimits,
    WindowResult,
    retime,
    solve_window,
    violation,
)
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.solvers.cpsat.tasks import SHARE_UNITS, TaskGraph
from autostream.scheduling.solvers.cpsat.windows import (
    Placed,
    Window,
    cut_windows,
    greedy_window,
    upward_rank,
)

log = logging.getLogger("autostream")

#: the least budget a window of a many-window plan gets (s): later windows are often
#: reuses, so an early one may take more than its share
MIN_WINDOW_S = 0.05
#: CP-SAT statuses, worst first: a plan's status is the worst of its windows'
_STATUSES = ("UNKNOWN", "MODEL_INVALID", "INFEASIBLE", "FEASIBLE", "OPTIMAL")


@dataclass(frozen=True)
class TaskPlan:
    """An integer plan of a task graph and how it was found."""

    stream: dict[int, int]
    start: dict[int, int]
    status: str  # the worst CP-SAT status over the windows solved ("REUSED": none solved)
    bound: int | None  # proven lower bound of the makespan (units), one-window plans only
    windows: int
    windows_reused: int
    windows_greedy: int  # windows that kept their greedy plan: the time was spent
    solve_seconds: float  # CP-SAT wall time
    deterministic_time: float
    deterministic: bool  # no search was cut by the wall clock
    #: a one-window plan before its cross-edge solve, when it ran (``WindowResult.unsynced``)
    unsynced: tuple[dict[int, int], dict[int, int]] | None = None

    @property
    def found(self) -> bool:
        return self.status not in ("UNKNOWN", "MODEL_INVALID", "INFEASIBLE")


@dataclass
class _Progress:
    """What the windows solved so far used and found."""

    statuses: list[str]
    wall: float = 0.0
    det: float = 0.0
    reused: int = 0
    greedy: int = 0
    hit_wall: bool = False
    bound: int | None = None
    unsynced: tuple[dict[int, int], dict[int, int]] | None = None

    def add(self, res: WindowResult) -> None:
        self.statuses.append(res.status)
        self.wall += res.wall
        self.det += res.det_time
        self.hit_wall = self.hit_wall or res.hit_wall


def plan_tasks(
    tg: TaskGraph, streams: int, budget: float, opts: CpsatOptions, *,
    lower_bound: int = 0, approximate: bool = False, deadline: float = math.inf,
    warm: Schedule | None = None,
) -> TaskPlan:
    """Integer plan of the whole task graph within ``budget`` seconds (deterministic clock).

    ``approximate`` solves every window with the machines model (latency added
    after colouring), for relaxed contention models the simulator judges anyway.
    ``deadline`` (``time.perf_counter()`` seconds) caps the wall clock of all solves.
    ``warm``: a plan of the same ops that also competes for the hint of a one-window
    plan.
    """
    rank = upward_rank(tg, streams)
    parts = cut_windows(tg, opts.window)
    single = len(parts) == 1
    placed = Placed()
    memo: dict[tuple, tuple[list[int], list[int]]] = {}
    progress = _Progress([])
    remaining = len(tg)
    for tasks in parts:
        win = Window.make(tg, tasks, placed, streams)
        key = win.key(tg)
        if key in memo:
            progress.reused += 1
        elif deadline <= time.perf_counter():  # out of time: the greedy plan
            memo[key] = _relative(tasks, *greedy_window(tg, win, streams, rank), win.lo)
            progress.greedy += 1
            progress.hit_wall = True  # the wall clock chose the greedy plan
        else:
            left = budget - progress.det / DET_PER_SECOND
            # a quarter of what is left at least: later windows are often reuses
            share = left if single else max(MIN_WINDOW_S, left * len(tasks) / remaining, left / 4)
            greedy = greedy_window(tg, win, streams, rank)
            hint = _hint(tg, win, streams, greedy, warm if single else None)
            limits = SolveLimits(
                share * (1 - opts.sync_share) if single else share, opts.seed, opts.workers,
                deadline - time.perf_counter(),
                share * opts.sync_share if single and streams > 1 else 0.0)
            res = solve_window(tg, win, streams, hint, limits,
                               lower_bound=lower_bound if single else 0,
                               approximate=approximate or (not single and not tg.contended))
            progress.add(res)
            better = res.stream and (hint is None or _mk(tg, res.start) <= _mk(tg, hint[1]))
            if single and res.stream:
                progress.bound = res.bound
                progress.unsynced = res.unsynced if better else None
            # without a hint and a solution, greedy's plan: a launch order all the same,
            # which the simulator re-times
            memo[key] = _relative(tasks, *((res.stream, res.start) if better else hint or greedy),
                                  win.lo)
        rel_stream, rel_start = memo[key]
        for i, v in enumerate(tasks):
            placed.put(v, rel_stream[i], rel_start[i] + win.lo, tg.duration[v])
        remaining -= len(tasks)
    return TaskPlan(placed.stream, placed.start, worst_status(progress.statuses), progress.bound,
                    len(parts), progress.reused, progress.greedy, round(progress.wall, 4),
                    round(progress.det, 4), not progress.hit_wall, progress.unsynced)


def _hint(tg: TaskGraph, win: Window, streams: int, greedy: Hint,
          warm: Schedule | None) -> Hint | None:
    """The fastest of the candidates that satisfy the model: the window's ``greedy`` plan
    and, for a one-window plan, HEFT's plan of the task graph and ``warm`` re-timed in
    the model; ``None`` (the window solved without a hint) when none does, which
    :func:`.windows.greedy_window` should rule out: the debug log says why."""
    hints = {"greedy": greedy}
    if len(win.tasks) == len(tg):
        hints["heft"] = heft_hint(tg, streams)
        if warm is not None:
            hints["warm"] = _retimed(tg, win, warm)
    broken = {name: violation(tg, win, *h) for name, h in hints.items()}
    ok = [h for name, h in hints.items() if broken[name] is None]
    if not ok:
        log.debug("cpsat: a window of %d tasks solved without a hint: no candidate satisfies "
                  "the model (%s)", len(win.tasks),
                  "; ".join(f"{name}: {why}" for name, why in broken.items()))
        return None
    return min(ok, key=lambda h: _mk(tg, h[1]))


def _retimed(tg: TaskGraph, win: Window,
             plan: Schedule) -> tuple[dict[int, int], dict[int, int]]:
    """``plan`` as a task placement: each task on its first op's stream, in ``plan``'s
    order, at the earliest integer times the model allows."""
    position = {v: i for i, v in enumerate(plan.order)}
    first = {v: min(position[n] for n in tg.members[v]) for v in win.tasks}
    own = {v: plan.stream_of[tg.members[v][0]] for v in win.tasks}
    renumber: dict[int, int] = {}  # streams by first use in task order (the model's symmetry)
    for v in win.tasks:
        if not tg.on_lane(v):
            renumber.setdefault(own[v], len(renumber))
    stream = {v: tg.lane[v] if tg.on_lane(v) else renumber[own[v]] for v in win.tasks}
    return stream, retime(tg, win, stream, _topological_rank(tg, first))


def _topological_rank(tg: TaskGraph, priority: Mapping[int, int]) -> dict[int, int]:
    """A topological order of the tasks, earliest ``priority`` first among the ready ones."""
    indegree = {v: len(tg.preds[v]) for v in range(len(tg))}
    ready = [(priority[v], v) for v, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    rank: dict[int, int] = {}
    while ready:
        _, v = heapq.heappop(ready)
        rank[v] = len(rank)
        for w in tg.succs[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, (priority[w], w))
    return rank


def heft_hint(tg: TaskGraph, streams: int) -> tuple[dict[int, int], dict[int, int]]:
    """HEFT's placement of the task graph, streams renumbered by first use in task order
    (a transfer on its link)."""
    g = nx.DiGraph()
    for v in range(len(tg)):
        g.add_node(v, duration=float(tg.duration[v]), share=tg.share[v] / SHARE_UNITS, order=v)
        if tg.on_lane(v):
            g.nodes[v]["lane"] = f"link{-tg.lane[v]:06d}"
    g.add_edges_from(tg.edges)
    p = SchedulingProblem(g, streams, float(tg.latency), max(tg.capacity, 1) / SHARE_UNITS)
    placement = heft.heft_placement(p)
    renumber: dict[int, int] = {}
    stream = {v: tg.lane[v] if tg.on_lane(v) else
              renumber.setdefault(placement.stream_of[v], len(renumber)) for v in range(len(tg))}
    return stream, {v: int(round(placement.start[v])) for v in range(len(tg))}


def _relative(tasks: tuple[int, ...], stream: Mapping[int, int], start: Mapping[int, int],
              lo: int) -> tuple[list[int], list[int]]:
    return [stream[v] for v in tasks], [start[v] - lo for v in tasks]


def _mk(tg: TaskGraph, start: Mapping[int, int]) -> int:
    return max((start[v] + tg.duration[v] for v in start), default=0)


def worst_status(statuses: Iterable[str]) -> str:
    """The worst CP-SAT status of ``statuses`` (``"REUSED"`` when there is none)."""
    seen = set(statuses)
    return next((s for s in _STATUSES if s in seen), "REUSED")
