"""The CP-SAT models of one window of tasks, and one solve of a window.

*Stream model*: one interval per task and one optional interval per candidate
stream, ``add_exactly_one`` over the presence literals, ``add_no_overlap`` per
stream; precedence ``end_u + latency * cross(u, v) <= start_v`` on the reduced
edges; contention as ``add_cumulative`` of the device shares against the
capacity when any task has a share; the makespan is the largest end.  Symmetry
breaking: streams are used in order, and the i-th task may use only the first
``i + 1`` fresh streams.

*Links*: a collective's transfer (``TaskGraph.on_lane``) has no stream to choose:
its interval is mandatory, in its link's ``add_no_overlap``, beside every stream,
and in the device cumulative with its share.  Edges to and from it pay no sync
latency (the collective orders them), so its launch's successors may start at the
launch's end on any stream, and its readers right at its end.  In the solutions
and hints a transfer's stream is its link's (negative) number.

The stream model is solved by one CP-SAT worker without its linear relaxation:
the relaxation of the cross-stream literals is weak, and on the latency-bound
pieces of real models propagation and search prove optima an order of magnitude
sooner than an interleaved portfolio (``docs/cpsat.md``).

*Machines model*: without sync latency the streams are identical machines, and a
cumulative of capacity ``streams`` replaces the stream choice exactly (any such
timeline colours onto the streams): a tenfold smaller model.  Relaxed contention
modes use it with the latency added after colouring (an approximation).

A window solve minimises the makespan; with ``sync_budget > 0`` a second solve
keeps that makespan and minimises ``(streams + 1) * cross + used`` (cross-stream
edges, a proxy for the syncs left after sync reduction, then streams used).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from ortools.sat.python import cp_model

from autostream.scheduling.solvers.cpsat.clock import DET_PER_SECOND, hit_wall, make_solver
from autostream.scheduling.solvers.cpsat.tasks import TaskGraph
from autostream.scheduling.solvers.cpsat.windows import Window, clash, earliest_start

Hint = tuple[Mapping[int, int], Mapping[int, int]]  # (stream, start) per task


@dataclass(frozen=True)
class WindowResult:
    """One window's CP-SAT answer (``stream``/``start`` empty when none was found)."""

    status: str
    stream: dict[int, int]
    start: dict[int, int]
    makespan: int
    bound: int  # proven lower bound of the window's makespan, in units
    wall: float
    det_time: float
    hit_wall: bool = False
    #: the makespan solve's own plan ``(stream, start)`` when a cross-edge solve followed:
    #: it may run faster in the simulator, which the model does not see exactly
    unsynced: tuple[dict[int, int], dict[int, int]] | None = None


@dataclass(frozen=True)
class SolveLimits:
    """How long one window may search, and how."""

    budget: float  # seconds of deterministic-clock budget for the makespan solve
    seed: int = 0
    workers: int = 1
    wall_left: float = float("inf")  # wall-clock seconds left for all its solves
    sync_budget: float = 0.0  # seconds for the second (sync) solve; 0: none


def window_bound(tg: TaskGraph, win: Window, streams: int) -> int:
    """Graham's bounds of the window's makespan: longest path, stream work, each link's
    work, contended work."""
    work = sum(tg.duration[v] for v in win.tasks if not tg.on_lane(v))
    work += sum(f - win.lo for f in win.free)
    links: dict[int, int] = {}
    for v in win.tasks:
        if tg.on_lane(v):
            links[tg.lane[v]] = links.get(tg.lane[v], 0) + tg.duration[v]
    bound = max(win.lo + math.ceil(work / streams), _longest_path(tg, win),
                win.lo + max(links.values(), default=0))
    contended = sum(tg.duration[v] * tg.share[v] for v in win.tasks)
    contended += sum((e - s) * r for s, e, r in win.loads)
    if tg.capacity > 0:
        bound = max(bound, win.lo + math.ceil(contended / tg.capacity))
    return bound


def _longest_path(tg: TaskGraph, win: Window) -> int:
    """The latest end of a window task when every task starts as early as its inputs allow."""
    end: dict[int, int] = {}
    for v in win.tasks:  # ascending ids: a topological order
        ready = max([win.lo] + [e for e, _ in win.ext[v]]
                    + [end[u] for u in tg.preds[v] if u in end])
        end[v] = ready + tg.duration[v]
    return max(end.values(), default=win.lo)


def stream_model(
    tg: TaskGraph, win: Window, streams: int, horizon: int, mk_floor: int, hint: Hint | None,
    cuts: bool = True,
) -> tuple[cp_model.CpModel, dict, dict, list, list, cp_model.IntVar]:
    """The stream-assignment model with a complete hint (``None``: none):
    ``(model, start, x, cross, used, mk)``.

    ``cuts``: add the fork/join cuts (they speed up proving a makespan, not the search
    for fewer cross-stream edges at a fixed one).
    """
    m = cp_model.CpModel()
    start, x, intervals = _stream_intervals(m, tg, win, streams, horizon)
    cross = _precedences(m, tg, win, start, x, hint[0] if hint else None)
    if cuts:
        _forks_and_joins(m, tg, win, start)
    add_device(m, tg, win, intervals)
    used = [m.new_bool_var(f"used{s}") for s in range(streams)]
    for v in x:
        for s, lit in x[v].items():
            m.add_implication(lit, used[s])
    for a, b in pairwise(win.fresh):
        m.add(used[a] >= used[b])
    mk = _makespan(m, tg, win, start, mk_floor, horizon)
    if hint is not None:
        hs, ht = hint
        for s in range(streams):
            m.add_hint(used[s], any(hs[v] == s for v in win.tasks))
        m.add_hint(mk, max(ht[v] + tg.duration[v] for v in win.tasks))
        add_hint(m, win.tasks, start, x, hs, ht)
    return m, start, x, cross, used, mk


def _stream_intervals(m: cp_model.CpModel, tg: TaskGraph, win: Window, streams: int,
                      horizon: int) -> tuple[dict, dict, dict]:
    """Every task's start and interval; a stream task's stream literals (``x``, keyed by
    task: transfers have none); no overlap per stream and per link."""
    start, x, intervals = {}, {}, {}
    per_stream: dict[int, list] = {s: [] for s in range(streams)}
    per_link: dict[int, list] = {}
    for v, allowed in zip(win.tasks, win.allowed_streams(streams)):
        d = tg.duration[v]
        start[v] = m.new_int_var(win.lo, horizon - d, f"s{v}")
        intervals[v] = m.new_fixed_size_interval_var(start[v], d, f"i{v}")
        if tg.on_lane(v):
            per_link.setdefault(tg.lane[v], []).append(intervals[v])
            continue
        x[v] = {s: m.new_bool_var(f"x{v}_{s}") for s in allowed}
        for s, lit in x[v].items():
            per_stream[s].append(m.new_optional_fixed_size_interval_var(start[v], d, lit, f"o{v}_{s}"))
        m.add_exactly_one(x[v].values())
    for s, ivs in per_stream.items():
        if win.free[s] > win.lo:
            ivs.append(m.new_fixed_size_interval_var(win.lo, win.free[s] - win.lo, f"busy{s}"))
        if len(ivs) > 1:
            m.add_no_overlap(ivs)
    _links_serial(m, per_link)
    return start, x, intervals


def _links_serial(m: cp_model.CpModel, per_link: dict[int, list]) -> None:
    """A link runs one transfer at a time (the problem's edges chain them already)."""
    for ivs in per_link.values():
        if len(ivs) > 1:
            m.add_no_overlap(ivs)


def _precedences(m: cp_model.CpModel, tg: TaskGraph, win: Window, start: dict, x: dict,
                 hint_stream: Mapping[int, int] | None) -> list:
    """Edges inside the window and from placed tasks; returns the cross-stream literals."""
    inside = set(win.tasks)
    lat = tg.latency
    cross = []
    for v in win.tasks:
        for u in tg.preds[v]:
            if u not in inside:
                continue
            if u not in x or v not in x:  # to or from a link: no sync
                m.add(start[v] >= start[u] + tg.duration[u])
                continue
            c = m.new_bool_var(f"c{u}_{v}")
            if hint_stream is not None:
                m.add_hint(c, hint_stream[u] != hint_stream[v])
            for s in x[u]:
                m.add(c >= x[u][s] - (x[v][s] if s in x[v] else 0))
            cross.append(c)
            m.add(start[v] >= start[u] + tg.duration[u] + lat * c)
        for e, ps in win.ext[v]:
            if v not in x or ps < 0:  # to or from a link: no sync
                m.add(start[v] >= e)
            elif ps in x[v]:  # the latency applies unless v runs on its producer's stream
                m.add(start[v] + lat * x[v][ps] >= e + lat)
                cross.append(x[v][ps].negated())
            else:
                m.add(start[v] >= e + lat)
    return cross


def _forks_and_joins(m: cp_model.CpModel, tg: TaskGraph, win: Window, start: dict) -> None:
    """Redundant cuts: after a fork, at most one successor starts within ``gap`` of its end;
    before a join, at most one predecessor ends within ``gap`` of its start.

    A second successor either runs on the fork's stream after the first (``gap`` is
    at most the shortest successor) or on another stream (``gap`` is at most the
    latency).  Propagation alone does not see this; with it, CP-SAT proves the
    latency-bound pieces of real models optimal many times faster.  Transfers are left
    out on both sides: an edge to or from a link pays no latency.
    """
    inside = {v for v in win.tasks if not tg.on_lane(v)}
    for u in (v for v in win.tasks if v in inside):  # in task order: a deterministic model
        succs = [v for v in tg.succs[u] if v in inside]
        gap = min([tg.latency] + [tg.duration[v] for v in succs])
        if len(succs) > 1 and gap > 0:
            early = [m.new_bool_var(f"early{u}_{v}") for v in succs]
            for v, lit in zip(succs, early):
                m.add(start[v] >= start[u] + tg.duration[u] + gap).only_enforce_if(~lit)
            m.add_at_most_one(early)
        preds = [w for w in tg.preds[u] if w in inside]
        gap = min([tg.latency] + [tg.duration[w] for w in preds])
        if len(preds) > 1 and gap > 0:
            late = [m.new_bool_var(f"late{w}_{u}") for w in preds]
            for w, lit in zip(preds, late):
                m.add(start[w] + tg.duration[w] + gap <= start[u]).only_enforce_if(~lit)
            m.add_at_most_one(late)


def _makespan(m: cp_model.CpModel, tg: TaskGraph, win: Window, start: dict, floor: int,
              horizon: int) -> cp_model.IntVar:
    mk = m.new_int_var(min(floor, horizon), horizon, "mk")
    m.add_max_equality(mk, [start[v] + tg.duration[v] for v in win.tasks])
    return mk


def add_device(m: cp_model.CpModel, tg: TaskGraph, win: Window, intervals: dict) -> None:
    """Contention: the shares of concurrent tasks fit in the device capacity."""
    loaded = [v for v in win.tasks if tg.share[v] > 0 and tg.duration[v] > 0]
    if not loaded:
        return
    ivs = [intervals[v] for v in loaded]
    demands = [tg.share[v] for v in loaded]
    for k, (s0, e0, r) in enumerate(win.loads):
        ivs.append(m.new_fixed_size_interval_var(s0, e0 - s0, f"load{k}"))
        demands.append(r)
    m.add_cumulative(ivs, demands, tg.capacity)


def machines_model(
    tg: TaskGraph, win: Window, streams: int, horizon: int, mk_floor: int
) -> tuple[cp_model.CpModel, dict, cp_model.IntVar]:
    """Streams as identical machines (no latency): ``(model, start, mk)``."""
    inside = set(win.tasks)
    m = cp_model.CpModel()
    start, intervals = {}, {}
    per_link: dict[int, list] = {}
    for v in win.tasks:
        d = tg.duration[v]
        start[v] = m.new_int_var(win.lo, horizon - d, f"s{v}")
        intervals[v] = m.new_fixed_size_interval_var(start[v], d, f"i{v}")
        if tg.on_lane(v):
            per_link.setdefault(tg.lane[v], []).append(intervals[v])
        for u in tg.preds[v]:
            if u in inside:
                m.add(start[v] >= start[u] + tg.duration[u])
        for e, _ in win.ext[v]:
            m.add(start[v] >= e)
    ivs = [intervals[v] for v in win.tasks if tg.duration[v] > 0 and not tg.on_lane(v)]
    for s, f in enumerate(win.free):
        if f > win.lo:
            ivs.append(m.new_fixed_size_interval_var(win.lo, f - win.lo, f"busy{s}"))
    m.add_cumulative(ivs, [1] * len(ivs), streams)
    _links_serial(m, per_link)
    add_device(m, tg, win, intervals)
    return m, start, _makespan(m, tg, win, start, mk_floor, horizon)


def add_hint(m: cp_model.CpModel, tasks, start, x, hint_stream, hint_start) -> None:
    for v in tasks:
        m.add_hint(start[v], hint_start[v])
        for s, lit in x.get(v, {}).items():
            m.add_hint(lit, s == hint_stream[v])


def read_streams(solver: cp_model.CpSolver, tg: TaskGraph, tasks, x) -> dict[int, int]:
    """Each task's stream in the solution (a transfer's: its link's)."""
    return {v: tg.lane[v] if tg.on_lane(v) else
            next(s for s, lit in x[v].items() if solver.boolean_value(lit)) for v in tasks}


def colour(tg: TaskGraph, win: Window, streams: int, start: Mapping[int, int]) -> dict[int, int]:
    """Streams for a timeline with at most ``streams`` tasks running at once.

    Tasks in start order; each takes the free stream of a predecessor if one is
    free (no sync needed), else the used stream that freed last, else the first
    fresh stream.  A transfer keeps its link.
    """
    free = list(win.free)
    fresh = list(win.fresh)
    stream: dict[int, int] = {}
    inside = set(win.tasks)
    for v in sorted(win.tasks, key=lambda v: (start[v], v)):
        if tg.on_lane(v):
            stream[v] = tg.lane[v]
            continue
        t = start[v]
        pred_streams = [stream[u] for u in tg.preds[v] if u in inside] + [s for _, s in win.ext[v]]
        options = [s for s in pred_streams if s >= 0 and free[s] <= t]
        if not options:
            options = [s for s in range(streams) if free[s] <= t and s not in fresh]
        if options:
            s = max(options, key=lambda s: (free[s], -s))
        elif fresh:
            s = fresh[0]
        else:  # only a zero-duration task can find every stream busy
            s = min(range(streams), key=lambda s: (free[s], s))
        if s in fresh:
            fresh.remove(s)
        stream[v] = s
        free[s] = max(free[s], t + tg.duration[v])
    return stream


def retime(
    tg: TaskGraph, win: Window, stream: Mapping[int, int], start: Mapping[int, int]
) -> dict[int, int]:
    """Earliest times for a stream assignment and launch order (by ``start``), with latency,
    each task waiting as well for the device capacity to hold its share.

    The capacity matters to the windows after this one: a boundary left over it (the
    loads still running at their origin) is one no placement of theirs can satisfy.
    """
    free = dict(enumerate(win.free))  # and each link's, as its transfers are placed
    loads = list(win.loads)
    out: dict[int, int] = {}
    for v in sorted(win.tasks, key=lambda v: (start[v], v)):
        s, d, r = stream[v], tg.duration[v], tg.share[v]
        t = max(win.lo, free.get(s, win.lo))
        for e, ps in win.ext[v]:
            t = max(t, e + tg.latency_between(ps, s))
        for u in tg.preds[v]:
            if u in out:
                t = max(t, out[u] + tg.duration[u] + tg.latency_between(stream[u], s))
        t = earliest_start([], loads, t, d, r, tg.capacity)
        out[v] = t
        free[s] = t + d
        if r > 0 and d > 0:
            loads.append((t, t + d, r))
    return out


def solve_window(
    tg: TaskGraph, win: Window, streams: int, hint: Hint | None, limits: SolveLimits, *,
    lower_bound: int = 0, approximate: bool = False,
) -> WindowResult:
    """Solve one window: makespan first, then (``limits.sync_budget > 0``) cross edges.

    ``hint``: a placement that satisfies the model (:func:`feasible`), whose makespan
    bounds the search; ``None``: none, the search bounded by :func:`serial_horizon`.
    ``approximate`` uses the machines model even with sync latency: the timeline is
    solved without latency, coloured onto streams, then re-timed with it.
    """
    horizon = (max(hint[1][v] + tg.duration[v] for v in win.tasks) if hint is not None
               else serial_horizon(tg, win))
    mk_floor = max(win.lo, lower_bound, window_bound(tg, win, streams))
    machines = tg.latency == 0 or approximate
    first = _first_solve(tg, win, streams, hint, limits, horizon, mk_floor, machines)
    if not first.stream or limits.sync_budget <= 0 or streams <= 1:
        return first
    if limits.wall_left - first.wall <= 0:  # no time left: the wall clock decided
        return _replace(first, hit_wall=True)
    return _sync_solve(tg, win, streams, limits, first, mk_floor)


def serial_horizon(tg: TaskGraph, win: Window) -> int:
    """A makespan some placement of the window always meets: every task one after the
    other, each paying the sync latency, after all the window waits for.

    >>> import networkx as nx
    >>> from autostream.scheduling.problem import SchedulingProblem
    >>> from autostream.scheduling.solvers.cpsat.tasks import build_tasks
    >>> from autostream.scheduling.solvers.cpsat.windows import Placed, Window
    >>> g = nx.DiGraph([("a", "b")]); nx.set_node_attributes(g, 2.0, "duration")
    >>> tg = build_tasks(SchedulingProblem(g, streams=2, sync_latency_us=1.0))
    >>> serial_horizon(tg, Window.make(tg, (0, 1), Placed(), 2))
    6
    """
    waits = [win.lo, *win.free, *(e for s, e, r in win.loads),
             *(e for v in win.tasks for e, _ in win.ext[v])]
    return max(waits) + sum(tg.duration[v] + tg.latency for v in win.tasks)


def _first_solve(tg: TaskGraph, win: Window, streams: int, hint: Hint | None, limits: SolveLimits,
                 horizon: int, mk_floor: int, machines: bool) -> WindowResult:
    tasks = win.tasks
    x: dict = {}
    cross: list = []
    if machines:
        m, start, mk = machines_model(tg, win, streams, horizon, mk_floor)
        if hint is not None:
            add_hint(m, tasks, start, x, *hint)
            m.add_hint(mk, horizon)
    else:
        m, start, x, cross, _, mk = stream_model(tg, win, streams, horizon, mk_floor, hint)
    weighted = bool(cross) and limits.sync_budget <= 0
    # windows of a large graph: one solve, the makespan first, then cross edges
    m.minimize(mk * (len(cross) + 1) + sum(cross) if weighted else mk)
    solver = _solver(limits, limits.budget, limits.wall_left, machines)
    status = solver.solve(m)
    wall, det, cut = solver.wall_time, solver.deterministic_time, hit_wall(solver, status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return WindowResult(solver.status_name(status), {}, {}, 0, 0, wall, det, cut)
    best = solver.value(mk)
    bound = int(math.ceil(solver.best_objective_bound - 1e-9))
    if weighted:  # objective = mk * (E + 1) + cross with cross <= E
        bound //= len(cross) + 1
    bound = best if status == cp_model.OPTIMAL else max(bound, mk_floor)
    name = solver.status_name(status)
    starts = {v: solver.value(start[v]) for v in tasks}
    if not machines:
        return WindowResult(name, read_streams(solver, tg, tasks, x), starts, best, bound, wall, det,
                            cut)
    stream = colour(tg, win, streams, starts)
    if tg.latency:
        starts = retime(tg, win, stream, starts)
        best = max(starts[v] + tg.duration[v] for v in tasks)
        name = "FEASIBLE" if best > bound else name
    return WindowResult(name, stream, starts, best, bound, wall, det, cut)


def _sync_solve(tg: TaskGraph, win: Window, streams: int, limits: SolveLimits,
                first: WindowResult, mk_floor: int) -> WindowResult:
    """Keep the makespan found, minimise cross-stream edges then streams used."""
    # cheap problems get a cheap second solve
    budget = min(limits.sync_budget, max(0.2, first.det_time / DET_PER_SECOND))
    m, start, x, cross, used, mk = stream_model(
        tg, win, streams, first.makespan, min(mk_floor, first.makespan),
        (first.stream, first.start), cuts=False)
    m.minimize(sum(cross) * (streams + 1) + sum(used))
    solver = _solver(limits, budget, limits.wall_left - first.wall, portfolio=False)
    status = solver.solve(m)
    wall = first.wall + solver.wall_time
    det = first.det_time + solver.deterministic_time
    cut = first.hit_wall or hit_wall(solver, status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _replace(first, wall=wall, det_time=det, hit_wall=cut)
    return _replace(first, stream=read_streams(solver, tg, win.tasks, x),
                    start={v: solver.value(start[v]) for v in win.tasks},
                    wall=wall, det_time=det, hit_wall=cut, unsynced=(first.stream, first.start))


def _solver(limits: SolveLimits, budget: float, wall_left: float,
            portfolio: bool) -> cp_model.CpSolver:
    """The interleaved portfolio for the machines model, one worker without the linear
    relaxation for the stream model."""
    if portfolio:
        return make_solver(budget, limits.seed, limits.workers, wall_left)
    return make_solver(budget, limits.seed, 1, wall_left, use_lp=False)


def _replace(r: WindowResult, **changes) -> WindowResult:
    return dataclasses.replace(r, **changes)


def feasible(tg: TaskGraph, win: Window, stream: Mapping[int, int],
             start: Mapping[int, int]) -> bool:
    """Does an integer placement of a window satisfy the model (for a hint)?

    >>> import networkx as nx
    >>> from autostream.scheduling.problem import SchedulingProblem
    >>> from autostream.scheduling.solvers.cpsat.tasks import build_tasks
    >>> from autostream.scheduling.solvers.cpsat.windows import Placed, Window
    >>> g = nx.DiGraph([("a", "b")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> tg = build_tasks(SchedulingProblem(g, streams=2))
    >>> win = Window.make(tg, (0, 1), Placed(), 2)
    >>> feasible(tg, win, {0: 0, 1: 0}, {0: 0, 1: 1}), feasible(tg, win, {0: 0, 1: 0}, {0: 0, 1: 0})
    (True, False)
    """
    return violation(tg, win, stream, start) is None


def violation(tg: TaskGraph, win: Window, stream: Mapping[int, int],
              start: Mapping[int, int]) -> str | None:
    """The first constraint of the model an integer placement of a window breaks, in
    words (``None``: it satisfies them all).

    Streams follow CP-SAT's no-overlap (:func:`.windows.clash`): a zero-duration task
    may sit at either end of another task's interval, not strictly inside it, so one
    may start at the window's origin on a stream still busy from earlier windows (the
    model's busy interval starts there), as :func:`.windows.greedy_window` places it.
    """
    inside = set(win.tasks)
    for v in win.tasks:
        s, t, d = stream[v], start[v], tg.duration[v]
        if (s < 0) != tg.on_lane(v):
            return f"task {v} is on {'a link' if s < 0 else 'a stream'}, not its own resource"
        if t < win.lo:
            return f"task {v} starts at {t}, before the window's origin {win.lo}"
        if s >= 0 and clash(win.lo, win.free[s] - win.lo, t, d):
            return f"task {v} starts at {t} on stream {s}, busy until {win.free[s]}"
        for u in tg.preds[v]:
            if u in inside and t < start[u] + tg.duration[u] + tg.latency_between(stream[u], s):
                return f"task {v} starts at {t}, before its predecessor {u} allows"
        for e, ps in win.ext[v]:
            if t < e + tg.latency_between(ps, s):
                return f"task {v} starts at {t}, before its placed predecessor allows ({e})"
    return _overlap(tg, win, stream, start) or _overload(tg, win, start)


def _overlap(tg: TaskGraph, win: Window, stream: Mapping[int, int],
             start: Mapping[int, int]) -> str | None:
    """Two tasks that clash on one stream or link (:func:`.windows.clash`), in words."""
    by_stream: dict[int, list[tuple[int, int, int]]] = {}
    for v in win.tasks:
        by_stream.setdefault(stream[v], []).append((start[v], tg.duration[v], v))
    for s, ivs in by_stream.items():
        ivs.sort()
        for k, (a, da, u) in enumerate(ivs):
            for b, db, v in ivs[k + 1:]:
                if b >= a + da:  # sorted by start: nothing later starts inside u
                    break
                if clash(a, da, b, db):
                    return f"tasks {u} and {v} overlap on stream {s}"
    return None


def _overload(tg: TaskGraph, win: Window, start: Mapping[int, int]) -> str | None:
    """The first time the device shares exceed the capacity, in words."""
    events = [(s, r) for s, e, r in win.loads] + [(e, -r) for s, e, r in win.loads]
    for v in win.tasks:
        if tg.share[v] > 0 and tg.duration[v] > 0:
            events += [(start[v], tg.share[v]), (start[v] + tg.duration[v], -tg.share[v])]
    load = 0
    for t, r in sorted(events, key=lambda e: (e[0], e[1])):
        load += r
        if load > tg.capacity:
            return f"the device is over its capacity at {t} ({load} > {tg.capacity})"
    return None
