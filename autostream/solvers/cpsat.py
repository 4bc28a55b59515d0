"""``cpsat``: optimal stream assignment with OR-Tools CP-SAT, warm-started from HEFT.

The model (per window of tasks, see below):

- one interval per task, and one optional interval per candidate stream with
  ``add_exactly_one`` over the presence literals; ``add_no_overlap`` per stream;
- precedence ``end_u + latency * different(u, v) <= start_v`` on the edges of the
  transitive reduction (the other edges are implied);
- contention: ``add_cumulative`` of the device shares against the capacity, when
  any task has a non-zero share (an op with share 1 overlaps nothing);
- makespan ``add_max_equality`` over the ends, bounded below by
  ``max(critical path, work / streams, contended work / capacity)``, summed over
  the segments between separator ops (``_bounds.segmented_lower_bound``), so CP-SAT
  can prove optimality, and above by the hint's makespan (never worse than it);
- objective, lexicographic, as two solves: (1) minimise the makespan; (2) with the
  makespan fixed at the best found, minimise ``(streams + 1) * cross + used``,
  where ``cross`` counts the reduced edges whose ends are on different streams (a
  proxy for the syncs left after the sync reduction) and ``used`` the streams
  used.  The second solve gets ``sync_share`` of the time, at most as much as the
  first one took (at least 0.2 s);
- symmetry breaking: streams are used in order (``used_s >= used_{s+1}``) and the
  i-th task (topological order) may only use streams ``0..i``;
- the hint is HEFT's placement (``heft_placement``) when it is feasible in the
  integer model and better than the window's own HEFT-like greedy plan.

Without sync latency the streams are identical machines, and solve (1) uses the
equivalent, much stronger model: one interval per task and a cumulative of
capacity ``streams`` (RCPSP); the timeline is then coloured onto streams, each task
preferring a predecessor's stream (no sync).  Solve (2) uses the stream model.

Contention (``contention=``): ``"blocking"`` is the cumulative above; the
simulator, though, shares the device (processor sharing: oversubscribed ops slow
down instead of waiting), where overlapping ops beyond the capacity often pays
off.  ``"relaxed"`` drops the shares from the model and lets the simulator judge;
``"auto"`` (default, when any share is non-zero) solves the ladder
``CONTENTION_LADDER`` of capacities (1x, 1.5x, no limit), a share of the time each,
and the simulator picks the best plan.  The oversubscribed and relaxed models
are approximations anyway, so they use the machines model below with the sync
latency added after colouring.

Times are integers: ``_tasks.time_scale`` picks the units (exact when the
durations allow it, e.g. 1 unit = 1 us on STG, else 0.1 us-1 ns).  Time and
determinism: ``time_limit`` seconds become ``time_limit * DET_PER_SECOND`` of
CP-SAT's deterministic clock (reproducible), with a fixed ``seed`` and
``interleave_search`` for ``workers > 1`` with one task per worker per batch
(default 8 workers, interleaved on however many cores there are: a broader portfolio
of CP-SAT's subsolvers; with the reproducible batch size, 8 workers reached the best
known makespan on 176 of the 180 STG 100-task/4-stream cases and planned the
5,032-op decoder 2.4% above its bound, against 174-176 and 3.7-3.9% with 4 workers
(163 with 4 workers and a batch of 2); a wall-clock cap (``1.5 x`` a solve's
budget, and a deadline that leaves the Python work after the solves, such as
simulating the candidates, inside ``time_limit``) keeps a loaded machine on time,
at the price of determinism (``stats["deterministic"]`` says whether it cut in, in
any solve whose plan could be kept: every mode of the contention ladder counts, and a
solve that proved its result was not cut).  Ladder modes solve one after another and
a mode's wall cap reaches into what earlier modes left unused: on the 2-core CI VM
one interleaved batch of the 1.5x mode on the zoo's heads block took 1.6 s, its cap
was 1.67 s, and a cut that came in one compilation out of four changed the plan
(1 sync or 5) between two compilations in one process.
``DET_PER_SECOND`` is set so that the deterministic limit binds first on the 2-core
CI machine class for budgets of a few seconds; a 1 s budget still overshoots (one
interleaved batch of ~0.1 deterministic s took longer than its wall cap there).

Scale: a graph with more than ``window`` ops is first cut at its separators
(``_segments``: ops every other op precedes or follows, such as a layer's residual
add); each distinct piece between two separators is planned once by this solver
(time shared by size) and replicated to the identical pieces, streams renumbered
so that no sync crosses a separator.  The pieces' bounds add up to the reported
bound.  A large graph without separators gets its linear chains collapsed (a
chain has no inner parallelism; the task takes the largest share of its ops) and
is solved in windows of at most ``window`` consecutive tasks along the
topological order, cut after a bottleneck task when possible.  Each window is
warm-started from its greedy plan given what the earlier windows left (stream
free times, producers' ends and streams, running load) and gets a share of the
total time; a window whose tasks and boundary are identical to an earlier one
reuses that solution.  Windows use one solve with the objective
``makespan * (E + 1) + cross``; share-free windows with sync latency use the
machines model (solved without latency, coloured, re-timed with it), whose
tenfold smaller model CP-SAT handles within a window's budget.

Collectives (``problem.pinned``: each transfer a task on its process group's
link): the model plans a transfer as a task on a stream, the stream that waits for
it, serialised per link by the problem's chain edges; the plan returned puts it
back on its link, where the simulator re-times it beside the compute (the model is
pessimistic, and its bound is not claimed).  ``wall_clock=False`` drops the
wall-clock caps: only the deterministic clock stops a solve, so every rank of a
distributed run reaches the same plan (the planner asks for it on graphs that
communicate; it may then overrun ``time_limit`` on a loaded machine).

Whatever the model says, the plan returned is the best predicted one (the
timeline simulator) among the CP-SAT plans, the HEFT plan, ``single`` and the
cheap baselines (``portfolio=True``); ties go to fewer cross-stream edges, then
fewer streams, so a plan no faster than one stream comes back single-stream with
``stats["source"] == "single"``.  The reported ``lower_bound`` bounds the
simulator's timeline: the segmented Graham bound, the pieces' bounds, or CP-SAT's
proven bound when its model is exact for the simulator (no shares, no rounding, no
chain collapsing); ``optimal`` means the plan meets it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from ortools.sat.python import cp_model

from autostream.problem import SchedulingProblem
from autostream.schedule import Schedule
from autostream.solvers import critical_path, heft, nimble, opara, round_robin, single, tf_greedy
from autostream.solvers._bounds import segmented_lower_bound, separators
from autostream.solvers._graphs import cross_stream_edges, transitive_reduction_edges
from autostream.solvers._segments import pieces, plan_by_pieces
from autostream.solvers._tasks import SHARE_UNITS, TaskGraph, build_tasks
from autostream.solvers._window import Placed, Window, greedy_window
from autostream.solvers.base import schedule_from_assignment

log = logging.getLogger("autostream")

_PORTFOLIO_MAX_OPS = 1000

#: Device capacities (x the real one) that ``contention="auto"`` plans with, each in
#: its own solve: 1 never oversubscribes; the simulator's processor sharing rewards
#: some overlap beyond it (oversubscribed ops slow down but the device stays busy),
#: and ``inf`` ignores the shares.  The simulator picks the best.
CONTENTION_LADDER = (1.0, 1.5, math.inf)


def _mode_name(factor: float) -> str:
    """The candidate name of a ladder step: cpsat, cpsat_x1.5, cpsat_relaxed."""
    return {1.0: "cpsat", math.inf: "cpsat_relaxed"}.get(factor, f"cpsat_x{factor:g}")
_BASELINES = {
    "round_robin": round_robin.solve,
    "tf_greedy": tf_greedy.solve,
    "opara": opara.solve,
    "critical_path": critical_path.solve,
    "nimble": nimble.solve,
}


@dataclass(frozen=True)
class CpResult:
    """One window's CP-SAT answer (``stream``/``start`` empty when none was found)."""

    status: str
    stream: dict[int, int]
    start: dict[int, int]
    makespan: int
    bound: int
    wall: float
    det_time: float
    hit_wall: bool = False


# -- model --------------------------------------------------------------------------


def _window_bound(tg: TaskGraph, win: Window, streams: int) -> int:
    """Work bounds for the window's makespan (Graham + contended work)."""
    work = sum(tg.duration[v] for v in win.tasks) + sum(f - win.lo for f in win.free)
    bound = win.lo + math.ceil(work / streams)
    contended = sum(tg.duration[v] * tg.share[v] for v in win.tasks)
    contended += sum((e - s) * r for s, e, r in win.loads)
    return max(bound, win.lo + math.ceil(contended / tg.capacity))


#: CP-SAT deterministic time per second of ``time_limit``.  Low enough that on the
#: 2-core CI machine class the deterministic limit (reproducible) binds before the
#: wall-clock cap of ``1.5 * budget`` and the per-mode deadline: there the
#: deterministic clock advances at 0.19-0.25 of the wall with 8 workers, and CP-SAT
#: checks it only between interleaved batches (~0.1 deterministic s each).  On the
#: first 8 STG 100-task graphs at 2, 8 and 16 streams, 0.25 stopped on the
#: deterministic clock in 7 of 24 cases and 0.1 in 19, with the same makespans (and
#: the same 5,032-op decoder plan).  On an overloaded machine the wall cap still
#: cuts in (``stats["deterministic"]`` then says False).  All solves of one plan
#: together stop at ``time_limit`` wall seconds; windows left after that keep their
#: greedy plan.
DET_PER_SECOND = 0.1
_WALL_FACTOR = 1.5
#: No CP-SAT solve starts with less wall-clock time than this, and none gets a smaller
#: wall cap.  OR-Tools 9.15 aborts the whole process (``Check failed: solution->size()
#: == postsolve_mapping.size()``, not an exception) when the wall-clock limit stops a
#: hinted interleaved solve at the wrong moment, early in the search: a stream model
#: of 126 variables aborted within 1,000 solves with a 0.01 s cap, one of 250 with 0.03
#: s; stopped by the deterministic clock (wall cap 10 s) or with 0.05-0.1 s caps they
#: ran 1,000-2,000 solves each without one.  Our own caps fell to 0.01 s when a
#: plan's time was nearly spent; the full test suite aborted once that way.
_MIN_WALL_S = 0.25


def _parameters(
    budget: float, seed: int, workers: int, wall_left: float = float("inf")
) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.random_seed = seed
    p.num_workers = workers
    p.interleave_search = workers > 1  # deterministic portfolio
    # Interleaved search is deterministic only with one task per worker per batch: the
    # default batch size (0) and 12 both gave two different optimal plans over repeated
    # solves of one 10-task graph with 4 workers (OR-Tools 9.15); 4 gave one over 30.
    # (STG 100 tasks / 4 streams: 174 of 180 cases at the best known makespan, against
    # 178 with the non-reproducible default.)
    p.interleave_batch_size = workers
    p.max_deterministic_time = max(budget, 0.02) * DET_PER_SECOND
    # callers start no solve with less than _MIN_WALL_S left (see there); an infinite
    # ``wall_left`` means no wall-clock cap at all (``solve(wall_clock=False)``)
    if math.isfinite(wall_left):
        p.max_time_in_seconds = min(max(budget * _WALL_FACTOR, _MIN_WALL_S), wall_left)
    return solver


def _hit_wall(solver: cp_model.CpSolver, status: int) -> bool:
    """Did the wall-clock cap (not the deterministic clock) stop the search?

    A proof (optimal, infeasible) means the search ran to its end, cap or not.
    """
    if status in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
        return False
    return solver.wall_time >= solver.parameters.max_time_in_seconds - 1e-3


def _stream_model(
    tg: TaskGraph, win: Window, streams: int, horizon: int, mk_floor: int,
    hint: tuple[Mapping[int, int], Mapping[int, int]],
) -> tuple[cp_model.CpModel, dict, dict, list, list, cp_model.IntVar]:
    """The stream-assignment model, with a complete hint: ``(model, start, x, cross, used, makespan)``."""
    hs, ht = hint
    tasks = win.tasks
    inside = set(tasks)
    lat = tg.latency
    allowed = win.allowed_streams(streams)
    m = cp_model.CpModel()
    start, x, intervals = {}, {}, {}
    per_stream: dict[int, list] = {s: [] for s in range(streams)}
    for i, v in enumerate(tasks):
        d = tg.duration[v]
        start[v] = m.new_int_var(win.lo, horizon - d, f"s{v}")
        intervals[v] = m.new_fixed_size_interval_var(start[v], d, f"i{v}")
        x[v] = {}
        for s in allowed[i]:
            lit = m.new_bool_var(f"x{v}_{s}")
            x[v][s] = lit
            per_stream[s].append(m.new_optional_fixed_size_interval_var(start[v], d, lit, f"o{v}_{s}"))
        m.add_exactly_one(x[v].values())
    for s, ivs in per_stream.items():
        if win.free[s] > win.lo:
            ivs.append(m.new_fixed_size_interval_var(win.lo, win.free[s] - win.lo, f"busy{s}"))
        if len(ivs) > 1:
            m.add_no_overlap(ivs)
    cross = []
    for v in tasks:
        for u in tg.preds[v]:
            if u not in inside:
                continue
            c = m.new_bool_var(f"c{u}_{v}")
            m.add_hint(c, hs[u] != hs[v])
            for s in x[u]:
                m.add(c >= x[u][s] - (x[v][s] if s in x[v] else 0))
            cross.append(c)
            m.add(start[v] >= start[u] + tg.duration[u] + lat * c)
        for e, ps in win.ext[v]:
            if ps in x[v]:
                # the latency applies unless v runs on its producer's stream
                m.add(start[v] + lat * x[v][ps] >= e + lat)
                cross.append(x[v][ps].negated())
            else:
                m.add(start[v] >= e + lat)
    _add_device(m, tg, win, intervals)
    used = [m.new_bool_var(f"used{s}") for s in range(streams)]
    for v in tasks:
        for s, lit in x[v].items():
            m.add_implication(lit, used[s])
    for a, b in pairwise(win.fresh):
        m.add(used[a] >= used[b])
    for s in range(streams):
        m.add_hint(used[s], any(hs[v] == s for v in tasks))
    mk = m.new_int_var(mk_floor, horizon, "mk")
    m.add_max_equality(mk, [start[v] + tg.duration[v] for v in tasks])
    m.add_hint(mk, max(ht[v] + tg.duration[v] for v in tasks))
    _hint(m, tasks, start, x, hs, ht)
    return m, start, x, cross, used, mk


def _add_device(m: cp_model.CpModel, tg: TaskGraph, win: Window, intervals: dict) -> None:
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


def _machines_model(
    tg: TaskGraph, win: Window, streams: int, horizon: int, mk_floor: int
) -> tuple[cp_model.CpModel, dict, cp_model.IntVar]:
    """Without sync latency, streams are identical machines: a cumulative of capacity
    ``streams`` replaces the per-stream choice exactly (any such timeline colours onto
    the streams), which CP-SAT solves much faster."""
    tasks = win.tasks
    inside = set(tasks)
    m = cp_model.CpModel()
    start, intervals = {}, {}
    for v in tasks:
        d = tg.duration[v]
        start[v] = m.new_int_var(win.lo, horizon - d, f"s{v}")
        intervals[v] = m.new_fixed_size_interval_var(start[v], d, f"i{v}")
        for u in tg.preds[v]:
            if u in inside:
                m.add(start[v] >= start[u] + tg.duration[u])
        for e, _ in win.ext[v]:
            m.add(start[v] >= e)
    ivs = [intervals[v] for v in tasks if tg.duration[v] > 0]
    for s, f in enumerate(win.free):
        if f > win.lo:
            ivs.append(m.new_fixed_size_interval_var(win.lo, f - win.lo, f"busy{s}"))
    m.add_cumulative(ivs, [1] * len(ivs), streams)
    _add_device(m, tg, win, intervals)
    mk = m.new_int_var(mk_floor, horizon, "mk")
    m.add_max_equality(mk, [start[v] + tg.duration[v] for v in tasks])
    return m, start, mk


def colour(tg: TaskGraph, win: Window, streams: int, start: Mapping[int, int]) -> dict[int, int]:
    """Streams for a timeline with at most ``streams`` tasks running at once.

    Tasks in start order; each takes the free stream of a predecessor if one is
    free (no sync needed), else the used stream that freed last, else the first
    fresh stream.
    """
    free = list(win.free)
    fresh = list(win.fresh)
    stream: dict[int, int] = {}
    inside = set(win.tasks)
    for v in sorted(win.tasks, key=lambda v: (start[v], v)):
        t = start[v]
        pred_streams = [stream[u] for u in tg.preds[v] if u in inside] + [s for _, s in win.ext[v]]
        options = [s for s in pred_streams if free[s] <= t]
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
    """Earliest times for a stream assignment and launch order (by ``start``), with latency.

    Capacity is not re-checked: the caller uses it for share-free windows.
    """
    lat = tg.latency
    free = list(win.free)
    out: dict[int, int] = {}
    for v in sorted(win.tasks, key=lambda v: (start[v], v)):
        s = stream[v]
        t = max(win.lo, free[s])
        for e, ps in win.ext[v]:
            t = max(t, e + (lat if ps != s else 0))
        for u in tg.preds[v]:
            if u in out:
                t = max(t, out[u] + tg.duration[u] + (lat if stream[u] != s else 0))
        out[v] = t
        free[s] = t + tg.duration[v]
    return out


def solve_window(
    tg: TaskGraph,
    win: Window,
    streams: int,
    hint: tuple[dict[int, int], dict[int, int]],
    budget: float,
    *,
    seed: int = 0,
    workers: int = 1,
    lower_bound: int = 0,
    sync_budget: float = 0.0,
    wall_left: float = float("inf"),
    approximate: bool = False,
) -> CpResult:
    """Solve one window; ``sync_budget > 0`` adds the second (sync/stream) solve.

    ``wall_left`` caps the wall-clock seconds of both solves together.
    ``approximate`` uses the machines model even with sync latency: the timeline
    is solved without latency, coloured onto streams, then re-timed with it.
    """
    tasks = win.tasks
    hint_stream, hint_start = hint
    horizon = max(hint_start[v] + tg.duration[v] for v in tasks)
    mk_floor = max(win.lo, lower_bound, _window_bound(tg, win, streams))
    machines = tg.latency == 0 or approximate
    if machines:
        m, start, mk = _machines_model(tg, win, streams, horizon, mk_floor)
        x: dict = {}
        cross: list = []
    else:
        m, start, x, cross, _, mk = _stream_model(tg, win, streams, horizon, mk_floor, hint)
    if machines:
        _hint(m, tasks, start, x, hint_stream, hint_start)
        m.add_hint(mk, horizon)
    weighted = bool(cross) and sync_budget <= 0
    if weighted:  # windows: one solve, makespan first
        m.minimize(mk * (len(cross) + 1) + sum(cross))
    else:
        m.minimize(mk)
    solver = _parameters(budget, seed, workers, wall_left)
    status = solver.solve(m)
    wall, det = solver.wall_time, solver.deterministic_time
    hit_wall = _hit_wall(solver, status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpResult(solver.status_name(status), {}, {}, 0, 0, wall, det, hit_wall)
    best_mk = solver.value(mk)
    bound = int(math.ceil(solver.best_objective_bound - 1e-9))
    if weighted:  # objective = mk * (E + 1) + cross with cross <= E
        bound = bound // (len(cross) + 1)
    bound = best_mk if status == cp_model.OPTIMAL else max(bound, mk_floor)
    name = solver.status_name(status)
    starts = {v: solver.value(start[v]) for v in tasks}
    if machines:
        stream = colour(tg, win, streams, starts)
        if tg.latency:
            starts = retime(tg, win, stream, starts)
            best_mk = max(starts[v] + tg.duration[v] for v in tasks)
            if best_mk > bound:
                name = "FEASIBLE"
    else:
        stream = _read_streams(solver, tasks, x)
    if sync_budget > 0 and streams > 1 and wall_left - solver.wall_time < _MIN_WALL_S:
        hit_wall = True  # no time left for the second solve: the wall clock decided
    elif sync_budget > 0 and streams > 1:
        # cheap problems get a cheap second solve
        sync_budget = min(sync_budget, max(0.2, det / DET_PER_SECOND))
        m, start, x, cross, used, mk = _stream_model(
            tg, win, streams, best_mk, mk_floor, (stream, starts)
        )
        m.minimize(sum(cross) * (streams + 1) + sum(used))
        second = _parameters(sync_budget, seed, workers, wall_left - solver.wall_time)
        status2 = second.solve(m)
        wall += second.wall_time
        det += second.deterministic_time
        hit_wall = hit_wall or _hit_wall(second, status2)
        if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            stream = _read_streams(second, tasks, x)
            starts = {v: second.value(start[v]) for v in tasks}
    return CpResult(name, stream, starts, best_mk, bound, wall, det, hit_wall)


def _hint(m: cp_model.CpModel, tasks, start, x, hint_stream, hint_start) -> None:
    for v in tasks:
        m.add_hint(start[v], hint_start[v])
        for s, lit in x.get(v, {}).items():
            m.add_hint(lit, s == hint_stream[v])


def _read_streams(solver: cp_model.CpSolver, tasks, x) -> dict[int, int]:
    return {v: next(s for s, lit in x[v].items() if solver.boolean_value(lit)) for v in tasks}


def _feasible(tg: TaskGraph, win: Window, stream: Mapping[int, int], start: Mapping[int, int]) -> bool:
    """Does an integer placement of a window satisfy the model (for HEFT's hint)?"""
    inside = set(win.tasks)
    lat = tg.latency
    for v in win.tasks:
        if start[v] < win.lo or start[v] < win.free[stream[v]]:
            return False
        for u in tg.preds[v]:
            if u in inside and start[v] < start[u] + tg.duration[u] + (lat if stream[u] != stream[v] else 0):
                return False
        for e, ps in win.ext[v]:
            if start[v] < e + (lat if ps != stream[v] else 0):
                return False
    by_stream: dict[int, list[tuple[int, int]]] = {}
    for v in win.tasks:
        by_stream.setdefault(stream[v], []).append((start[v], start[v] + tg.duration[v]))
    for ivs in by_stream.values():
        ivs.sort()
        if any(a[1] > b[0] and b[1] > b[0] and a[1] > a[0] for a, b in pairwise(ivs)):
            return False
    events = [(s, r) for s, e, r in win.loads] + [(e, -r) for s, e, r in win.loads]
    for v in win.tasks:
        if tg.share[v] > 0 and tg.duration[v] > 0:
            events += [(start[v], tg.share[v]), (start[v] + tg.duration[v], -tg.share[v])]
    load = 0
    for _, r in sorted(events, key=lambda e: (e[0], e[1])):
        load += r
        if load > tg.capacity:
            return False
    return True


def _heft_hint(tg: TaskGraph, streams: int) -> tuple[dict[int, int], dict[int, int]]:
    """HEFT's placement of the task graph, streams renumbered by first use in task order."""
    import networkx as nx

    g = nx.DiGraph()
    for v in range(len(tg)):
        g.add_node(v, duration=float(tg.duration[v]), share=tg.share[v] / SHARE_UNITS, order=v)
    g.add_edges_from(tg.edges)
    p = SchedulingProblem(g, streams, float(tg.latency), tg.capacity / SHARE_UNITS)
    placement = heft.heft_placement(p)
    renumber: dict[int, int] = {}
    stream = {}
    for v in range(len(tg)):
        stream[v] = renumber.setdefault(placement.stream_of[v], len(renumber))
    return stream, {v: int(round(placement.start[v])) for v in range(len(tg))}


def _upward_rank(tg: TaskGraph, streams: int) -> list[float]:
    lat = tg.latency * (streams - 1) / streams
    rank = [0.0] * len(tg)
    for v in reversed(range(len(tg))):
        rank[v] = tg.duration[v] + max((lat + rank[s] for s in tg.succs[v]), default=0.0)
    return rank


def _windows(tg: TaskGraph, size: int) -> list[tuple[int, ...]]:
    """Consecutive task runs of at most ``size``, cut where no edge jumps over the cut if possible."""
    n = len(tg)
    # cut_before[i]: every edge from a task before i - 1 lands at or before i - 1,
    # so task i - 1 is a bottleneck (e.g. a layer's residual add) and ends a window.
    cut_before = [False] * (n + 1)
    furthest = -1
    for i in range(n):
        cut_before[i + 1] = furthest <= i
        furthest = max(furthest, max(tg.succs[i], default=i))
    cut_before[n] = True
    out = []
    lo = 0
    while lo < n:
        hi = min(n, lo + size)
        if hi < n:
            cuts = [i for i in range(lo + max(1, size // 3), hi + 1) if cut_before[i]]
            if cuts:
                hi = cuts[-1]
        out.append(tuple(range(lo, hi)))
        lo = hi
    return out


# -- orchestration ------------------------------------------------------------------


def _plan_tasks(
    tg: TaskGraph, streams: int, time_limit: float, window: int, seed: int, workers: int,
    lower_bound: int, sync_share: float, approximate: bool = False,
    deadline: float = float("inf"), wall_clock: bool = True,
) -> tuple[dict[int, int], dict[int, int], dict[str, object]]:
    """Integer plan of the whole task graph: ``(stream, start, stats)``.

    ``approximate`` solves every window with the machines model (latency added after
    colouring), for relaxed contention models the simulator judges anyway.
    ``deadline`` (``time.perf_counter()`` seconds) caps the wall clock of all solves.
    """
    rank = _upward_rank(tg, streams)
    parts = _windows(tg, window)
    placed = Placed()
    memo: dict[tuple, tuple[dict[int, int], dict[int, int]]] = {}
    stats: dict[str, object] = {"tasks": len(tg), "windows": len(parts), "window_reuses": 0}
    statuses: list[str] = []
    wall = det = 0.0
    hit_wall = False
    bound = None
    remaining_tasks = len(tg)
    for tasks in parts:
        win = Window.make(tg, tasks, placed, streams)
        key = win.key(tg)
        # The caller's deadline, when given, is this plan's share of the wall clock,
        # including what earlier ladder modes left unused: a solve stopped by the wall
        # cap is not reproducible, so every wall second available goes to the caps.
        wall_left = (math.inf if not wall_clock
                     else deadline - time.perf_counter() if deadline < math.inf
                     else time_limit - wall)
        if key not in memo and wall_left < _MIN_WALL_S:  # out of time: the greedy plan
            memo[key] = _relative(tasks, *greedy_window(tg, win, streams, rank), win.lo)
            stats["windows_greedy"] = int(stats.get("windows_greedy", 0)) + 1
            stats["window_reuses"] = int(stats["window_reuses"]) - 1
            hit_wall = True  # the wall clock chose the greedy plan
        if key in memo:
            rel_stream, rel_start = memo[key]
            stream = {v: rel_stream[i] for i, v in enumerate(tasks)}
            start = {v: rel_start[i] + win.lo for i, v in enumerate(tasks)}
            stats["window_reuses"] = int(stats["window_reuses"]) + 1
        else:
            hint = greedy_window(tg, win, streams, rank)
            if len(parts) == 1:
                h = _heft_hint(tg, streams)
                if _feasible(tg, win, *h) and _mk(tg, h[1]) < _mk(tg, hint[1]):
                    hint = h
                    stats["hint"] = "heft"
                else:
                    stats["hint"] = "greedy"
            left = time_limit - det / DET_PER_SECOND
            # A quarter of what is left at least: later windows are often reuses.
            budget = max(0.05, left * len(tasks) / remaining_tasks, left / 4)
            single = len(parts) == 1
            res = solve_window(
                tg, win, streams, hint,
                budget * (1 - sync_share) if single else budget,
                seed=seed, workers=workers,
                lower_bound=lower_bound if single else 0,
                sync_budget=budget * sync_share if single and streams > 1 else 0.0,
                wall_left=wall_left,
                approximate=approximate or (not single and not any(tg.share[v] for v in tasks)),
            )
            statuses.append(res.status)
            wall, det = wall + res.wall, det + res.det_time
            hit_wall = hit_wall or res.hit_wall
            if single:
                bound = res.bound if res.stream else None
            if res.stream and _mk(tg, res.start) <= _mk(tg, hint[1]):
                stream, start = res.stream, res.start
            else:
                stream, start = hint
            memo[key] = _relative(tasks, stream, start, win.lo)
        for v in tasks:
            placed.put(v, stream[v], start[v], tg.duration[v])
        remaining_tasks -= len(tasks)
    stats.update(
        status=_summarise(statuses),
        solve_seconds=round(wall, 4),
        deterministic_time=round(det, 4),
        deterministic=not hit_wall,
    )
    if bound is not None:
        stats["bound_units"] = bound
    return placed.stream, placed.start, stats


def _relative(
    tasks: tuple[int, ...], stream: Mapping[int, int], start: Mapping[int, int], lo: int
) -> tuple[list[int], list[int]]:
    return [stream[v] for v in tasks], [start[v] - lo for v in tasks]


def _mk(tg: TaskGraph, start: Mapping[int, int]) -> int:
    return max((start[v] + tg.duration[v] for v in start), default=0)


def _summarise(statuses: list[str]) -> str:
    if not statuses:
        return "REUSED"
    for s in ("UNKNOWN", "MODEL_INVALID", "INFEASIBLE", "FEASIBLE"):
        if s in statuses:
            return s
    return "OPTIMAL"


def solve(
    problem: SchedulingProblem,
    *,
    time_limit: float = 10.0,
    window: int = 150,
    seed: int = 0,
    workers: int = 8,
    sync_share: float = 0.2,
    portfolio: bool = True,
    contention: str = "auto",
    decompose: bool = True,
    wall_clock: bool = True,
    **_: object,
) -> Schedule:
    """Plan with CP-SAT within ``time_limit`` seconds (CP-SAT's deterministic clock).

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> nx.set_node_attributes(g, {"a": 1.0, "b": 3.0, "c": 3.0, "d": 1.0}, "duration")
    >>> s = solve(SchedulingProblem(g, streams=2), time_limit=1.0)
    >>> s.makespan, s.optimal, s.streams_used
    (5.0, True, 2)
    """
    if not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise ValueError(f"time_limit must be a number of seconds > 0, got {time_limit!r}")
    if not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an integer >= 2, got {window!r}")
    if not 0 <= sync_share < 1:
        raise ValueError(f"sync_share must lie in [0, 1), got {sync_share!r}")
    if contention not in ("auto", "blocking", "relaxed"):
        raise ValueError(f"contention must be 'auto', 'blocking' or 'relaxed', got {contention!r}")
    t0 = time.perf_counter()
    n = len(problem.graph)
    candidates: dict[str, Schedule] = {"single": single.solve(problem)}
    if n <= window:  # HEFT is the hint; beyond a window, the windows' greedy plans are
        candidates["heft"] = heft.solve(problem)
    if portfolio:
        candidates.update(
            (name, fn(problem)) for name, fn in _BASELINES.items()
            if n <= _PORTFOLIO_MAX_OPS or name != "nimble"  # nimble's closure is quadratic
        )
    stats: dict[str, object] = {}
    exact = False
    cuts = separators(problem)  # one reachability walk for the bounds and the pieces
    lower = segmented_lower_bound(problem, cuts=cuts)
    any_share = any(problem.share(n) > 0 for n in problem.graph)
    factors = {"auto": CONTENTION_LADDER if any_share else (1.0,),
               "blocking": (1.0,), "relaxed": (math.inf,)}[contention]
    parts = pieces(problem, cuts) if decompose and n > window and problem.streams > 1 else []
    if len(parts) > 1:
        def solve_piece(sub: SchedulingProblem, seconds: float) -> Schedule:
            return solve(sub, time_limit=max(seconds, 0.05), window=window, seed=seed,
                         workers=workers, sync_share=sync_share, portfolio=portfolio,
                         contention=contention, decompose=False, wall_clock=wall_clock)

        stream_of, order, stats = plan_by_pieces(problem, parts, solve_piece, time_limit)
        candidates["cpsat_pieces"] = schedule_from_assignment(problem, stream_of, "cpsat", order=order)
    elif problem.streams > 1 and n > 1:
        # Python work after the solves (simulating the candidates) stays inside time_limit.
        deadline = t0 + time_limit - min(0.25 * time_limit, 0.2 + 2e-4 * n)
        reproducible = True
        for k, factor in enumerate(factors):
            now = time.perf_counter()
            tg = build_tasks(problem, collapse=n > window, shares=factor != math.inf,
                             capacity_factor=1.0 if factor == math.inf else factor)
            mode_lower = lower if factor == 1.0 else segmented_lower_bound(problem, factor, cuts)
            lb = int(math.ceil(mode_lower * tg.scale - 1e-6)) if tg.exact else 0
            stream, start, mode_stats = _plan_tasks(
                tg, problem.streams, time_limit / len(factors), window, seed, workers, lb, sync_share,
                approximate=factor != 1.0,
                deadline=now + (deadline - now) / (len(factors) - k), wall_clock=wall_clock,
            )
            order = tuple(
                n for v in sorted(stream, key=lambda v: (start[v], v)) for n in tg.members[v]
            )
            stream_of = {n: stream[v] for v in stream for n in tg.members[v]}
            name = _mode_name(factor)
            candidates[name] = schedule_from_assignment(problem, stream_of, "cpsat", order=order)
            mode_stats["time_scale"] = tg.scale
            reproducible = reproducible and bool(mode_stats["deterministic"])
            if factor == 1.0:
                stats = mode_stats
                exact = (tg.exact and stats["status"] == "OPTIMAL" and "bound_units" in stats
                         and not problem.links)  # lanes: the model waits on a stream
            else:
                stats[name.removeprefix("cpsat_")] = {
                    k: mode_stats[k] for k in ("status", "solve_seconds", "deterministic")
                }
            if mode_stats["status"] in ("UNKNOWN", "INFEASIBLE", "MODEL_INVALID"):
                log.warning("cpsat: CP-SAT found no plan in %.3g s (%s, %s); using its warm start",
                            time_limit, mode_stats["status"], name)
        # any mode's plan may be the one kept: the plan is reproducible only if all were
        stats["deterministic"] = reproducible
    edges = transitive_reduction_edges(problem.graph, problem.topo_order)
    preference = ["single", "cpsat_pieces", *map(_mode_name, CONTENTION_LADDER), "heft",
                  *_BASELINES]
    if "cpsat" not in candidates and "heft" not in candidates:
        candidates["heft"] = heft.solve(problem)  # the warm-start plan, as promised

    def rank(name: str) -> tuple[float, int, int, int]:
        s = candidates[name]
        return (
            round(s.makespan, 6),
            cross_stream_edges(edges, dict(s.stream_of)),
            s.streams_used,
            preference.index(name),
        )

    best = min(candidates, key=rank)
    chosen = candidates[best]
    bound_us = lower
    if "pieces_bound" in stats:  # bounds the simulator's timeline, shares or not
        bound_us = max(lower, float(stats["pieces_bound"]))
    units = stats.pop("bound_units", None)
    if units is not None and exact and not any_share:  # else CP-SAT's model is not the simulator's
        bound_us = max(lower, int(units) / float(stats["time_scale"]))
    optimal = chosen.makespan <= bound_us + 1e-6
    stats.update(
        source=best,
        bound=bound_us,
        gap=(chosen.makespan / bound_us - 1.0) if bound_us > 0 else 0.0,
        cross_edges=cross_stream_edges(edges, dict(chosen.stream_of)),
        single_stream_us=candidates["single"].makespan,
        hint_makespan=candidates["heft"].makespan if "heft" in candidates else None,
        plan_seconds=round(time.perf_counter() - t0, 4),
    )
    return dataclasses.replace(
        chosen,
        solver="cpsat",
        lower_bound=bound_us,
        optimal=optimal,
        stats={**dict(chosen.stats), **stats},
    )
