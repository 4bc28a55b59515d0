"""Streams and per-stream core budgets in one CP-SAT model, cube and vector cores as resources.

The instance is integer (:class:`CoreTasks`): each task demands ``blocks`` cube and
vector cores while it runs, the chip has ``cores`` of each.  A side stream's budget
is one of ``levels`` (fractions of the chip, ``1.0`` among them: no budget) and caps
the blocks its tasks may occupy at ``budget_cores``; a capped task runs its blocks in
waves on the cores it gets, so its time stretches linearly in blocks (by the larger
ratio of the two kinds).  The main stream keeps the whole chip.  Budgets only
lengthen tasks, so any lower bound of the plan without budgets stays valid.

The model: one start per task; per task and stream one optional interval per
distinct (demand, duration) the stream's budget can give it, its literal "task on
this stream and the budget in that group"; per stream a no-overlap; two
cumulatives (cube, vector); ``end_u + latency * cross <= start_v`` on the edges;
tasks with a ``lane`` (a collective's transfer) on their link, uncapped, without
latency.  It is warm-started from a plan without budgets (:func:`serial_schedule`
places it), so its answer is never longer than that plan in the model's terms.

>>> t = CoreTasks(durations=(4, 4), blocks=((24, 48), (24, 48)), preds=((), ()),
...               streams=2, latency=0, cores=(24, 48), levels=(0.5, 1.0))
>>> solve_cores(t, (0, 0), (0, 1), budget_s=1.0).makespan  # one full-chip op after the other
8
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autostream.scheduling.solvers.cpsat.clock import make_solver

Blocks = tuple[int, int]  # (cube, vector)


@dataclass(frozen=True)
class CoreTasks:
    """An integer instance: tasks ``0..n-1`` in a topological order."""

    durations: tuple[int, ...]
    blocks: tuple[Blocks, ...]
    preds: tuple[tuple[int, ...], ...]
    streams: int
    latency: int
    cores: Blocks
    levels: tuple[float, ...]
    #: task -> its link (a serial lane beside the streams); absent: a stream task
    lanes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if 1.0 not in self.levels or any(not 0 < b <= 1 for b in self.levels):
            raise ValueError(f"levels {self.levels} must be fractions of the chip in (0, 1] "
                             "and include 1.0 (the whole chip: no budget)")
        if min(self.cores) < 1:
            raise ValueError(f"cores {self.cores}: a chip has at least one cube and one "
                             "vector core")


def budget_cores(budget: float, cores: Blocks) -> Blocks:
    """The cores of each kind a stream of ``budget`` may use (what ``limit_core_num`` gets).

    >>> budget_cores(0.25, (24, 48)), budget_cores(0.01, (24, 48))
    ((6, 12), (1, 1))
    """
    return max(1, int(budget * cores[0])), max(1, int(budget * cores[1]))


def capped(duration: int, blocks: Blocks, cap: Blocks) -> tuple[int, Blocks]:
    """A task's ``(duration, blocks)`` on a stream allowed ``cap`` cores of each kind.

    >>> capped(10, (24, 48), (12, 24)), capped(10, (4, 8), (12, 24)), capped(10, (0, 48), (6, 12))
    ((20, (12, 24)), (10, (4, 8)), (40, (0, 12)))
    """
    got = (min(blocks[0], cap[0]), min(blocks[1], cap[1]))
    stretch = max([b / g for b, g in zip(blocks, got, strict=True) if b > 0], default=1.0)
    return (math.ceil(duration * stretch - 1e-9) if stretch > 1 else duration), got


def modes(t: CoreTasks, task: int, stream: int) -> list[tuple[tuple[int, ...], int, Blocks]]:
    """The distinct ``(levels, duration, blocks)`` of ``task`` on ``stream``: the level
    indices that give it that duration and demand (the main stream: only ``1.0``)."""
    if stream == 0:
        return [((t.levels.index(1.0),), t.durations[task], t.blocks[task])]
    out: dict[tuple[int, Blocks], list[int]] = {}
    for k, b in enumerate(t.levels):
        key = capped(t.durations[task], t.blocks[task], budget_cores(b, t.cores))
        out.setdefault(key, []).append(k)
    return [(tuple(ks), d, blk) for (d, blk), ks in out.items()]


@dataclass(frozen=True)
class CoreSolution:
    """The model's answer: each task's stream and start, each stream's budget."""

    stream: tuple[int, ...]
    start: tuple[int, ...]
    budgets: tuple[float, ...]  # per stream; the main stream's is 1.0
    makespan: int
    optimal: bool


def serial_schedule(t: CoreTasks, stream: Sequence[int], order: Sequence[int],
                    budgets: Sequence[float] | None = None) -> CoreSolution:
    """Place the tasks in ``order`` (a topological order), each at the earliest time its
    inputs, its stream (any gap) and both core kinds allow: the serial schedule
    generation scheme, whose schedules over all orders include an optimal one.

    >>> t = CoreTasks((3, 3), ((24, 48), (12, 24)), ((), ()), 2, 0, (24, 48), (0.5, 1.0))
    >>> serial_schedule(t, (0, 1), (0, 1)).start, serial_schedule(t, (0, 1), (0, 1), (1.0, 0.5)).makespan
    ((0, 3), 6)
    """
    budgets = tuple(budgets) if budgets is not None else (1.0,) * t.streams
    lane = dict(t.lanes)
    dur, dem = {}, {}
    for v in range(len(t.durations)):
        cap = budget_cores(budgets[stream[v]], t.cores) if v not in lane and stream[v] > 0 \
            else t.cores
        dur[v], dem[v] = capped(t.durations[v], t.blocks[v], cap)
    start: dict[int, int] = {}
    placed: list[int] = []
    for v in order:
        queue = ("lane", lane[v]) if v in lane else ("stream", stream[v])
        ready = max([start[u] + dur[u] + _lat(t, lane, stream, u, v) for u in t.preds[v]],
                    default=0)
        for s in sorted({ready, *(start[u] + dur[u] for u in placed
                                  if start[u] + dur[u] > ready)}):
            if _fits(t, lane, stream, start, dur, dem, placed, queue, v, s):
                start[v] = s
                break
        placed.append(v)
    n = len(t.durations)
    return CoreSolution(tuple(stream[v] if v not in lane else -1 for v in range(n)),
                        tuple(start[v] for v in range(n)), budgets,
                        max((start[v] + dur[v] for v in range(n)), default=0), False)


def _lat(t: CoreTasks, lane: dict, stream: Sequence[int], u: int, v: int) -> int:
    return t.latency if u not in lane and v not in lane and stream[u] != stream[v] else 0


def _fits(t: CoreTasks, lane: dict, stream: Sequence[int], start: dict, dur: dict, dem: dict,
          placed: list[int], queue: tuple[str, int], v: int, s: int) -> bool:
    e = s + dur[v]
    if dur[v] == 0:
        return True
    over = [u for u in placed if dur[u] > 0 and start[u] < e and s < start[u] + dur[u]]
    if any((("lane", lane[u]) if u in lane else ("stream", stream[u])) == queue for u in over):
        return False
    for k in (0, 1):  # the load only rises at starts: check each start inside [s, e)
        points = {s, *(start[u] for u in over if start[u] > s)}
        for p in points:
            load = dem[v][k] + sum(dem[u][k] for u in over if start[u] <= p < start[u] + dur[u])
            if load > t.cores[k]:
                return False
    return True


def solve_cores(t: CoreTasks, stream: Sequence[int], order: Sequence[int], budget_s: float,
                seed: int = 0, workers: int = 1) -> CoreSolution:
    """The best plan with budgets CP-SAT finds in ``budget_s`` (deterministic) seconds,
    warm-started from the plan ``stream``/``order`` without budgets (returned as is when
    CP-SAT finds nothing better)."""
    warm = serial_schedule(t, stream, order)
    n = len(t.durations)
    if n == 0:
        return warm
    horizon = warm.makespan
    lane = dict(t.lanes)
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon, f"s{v}") for v in range(n)]
    end = [m.new_int_var(0, horizon, f"e{v}") for v in range(n)]
    level = {s: [m.new_bool_var(f"b{s}_{k}") for k in range(len(t.levels))]
             for s in range(1, t.streams)}
    for lits in level.values():
        m.add_exactly_one(lits)
        for k, lit in enumerate(lits):
            m.add_hint(lit, t.levels[k] == 1.0)
    on: dict[int, dict[int, cp_model.IntVar]] = {}
    per_queue: dict[tuple[str, int], list] = {}
    cumulative: tuple[list, list] = ([], [])
    demands: tuple[list, list] = ([], [])
    for v in range(n):
        m.add_hint(start[v], warm.start[v])
        if v in lane:
            d = t.durations[v]
            m.add(end[v] == start[v] + d)
            iv = m.new_interval_var(start[v], d, end[v], f"i{v}")
            per_queue.setdefault(("lane", lane[v]), []).append(iv)
            _demand(cumulative, demands, iv, t.blocks[v])
            continue
        on[v] = {s: m.new_bool_var(f"x{v}_{s}") for s in range(t.streams)}
        m.add_exactly_one(on[v].values())
        terms = []
        for s, x in on[v].items():
            m.add_hint(x, s == stream[v])
            for ks, d, blk in modes(t, v, s):
                lit = x if s == 0 or len(ks) == len(t.levels) else _both(m, x, level[s], ks)
                if lit is not x:
                    m.add_hint(lit, s == stream[v] and t.levels.index(1.0) in ks)
                iv = m.new_optional_fixed_size_interval_var(start[v], d, lit, f"o{v}_{s}_{ks[0]}")
                terms.append(d * lit)
                per_queue.setdefault(("stream", s), []).append(iv)
                _demand(cumulative, demands, iv, blk)
        m.add(end[v] == start[v] + sum(terms))  # one mode holds: its duration
    for ivs in per_queue.values():
        m.add_no_overlap(ivs)
    for k in (0, 1):
        if cumulative[k]:
            m.add_cumulative(cumulative[k], demands[k], t.cores[k])
    for v in range(n):
        for u in t.preds[v]:
            if t.latency and u in on and v in on:
                cross = m.new_bool_var(f"c{u}_{v}")
                for s in range(t.streams):
                    m.add(cross >= on[u][s] - on[v][s])
                m.add(start[v] >= end[u] + t.latency * cross)
            else:
                m.add(start[v] >= end[u])
    mk = m.new_int_var(0, horizon, "mk")
    m.add_max_equality(mk, end)
    m.minimize(mk)
    solver = make_solver(budget_s, seed, workers)
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or solver.value(mk) >= warm.makespan \
            and status != cp_model.OPTIMAL:
        return warm
    budgets = (1.0, *(t.levels[next(k for k, lit in enumerate(level[s])
                                    if solver.boolean_value(lit))] for s in range(1, t.streams)))
    return CoreSolution(
        tuple(-1 if v in lane else next(s for s, x in on[v].items() if solver.boolean_value(x))
              for v in range(n)),
        tuple(solver.value(start[v]) for v in range(n)), budgets, solver.value(mk),
        status == cp_model.OPTIMAL)


def _both(m: cp_model.CpModel, x: cp_model.IntVar, levels: list, ks: tuple[int, ...]):
    """A literal for "``x`` and the stream's budget is one of levels ``ks``"."""
    lit = m.new_bool_var("")
    any_level = sum(levels[k] for k in ks)
    m.add(lit <= x)
    m.add(lit <= any_level)
    m.add(lit >= x + any_level - 1)
    return lit


def _demand(cumulative: tuple[list, list], demands: tuple[list, list], iv, blocks: Blocks) -> None:
    for k in (0, 1):
        if blocks[k] > 0:
            cumulative[k].append(iv)
            demands[k].append(blocks[k])
