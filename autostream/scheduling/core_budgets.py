"""Core budgets per side stream, chosen by CP-SAT together with the streams.

A stream's budget caps the fraction of the chip its ops may occupy (TorchAir's
``limit_core_num``): each side stream gets one of ``LEVELS`` (quarters of the chip),
the main stream keeps the whole chip.  An op of share ``s`` on a stream of budget
``b < s`` runs on ``b`` of the chip and takes ``s / b`` times as long (linear in
blocks: the profile gives no better law), so its work, share times duration, is
unchanged; what a budget changes is who waits under contention.  Budgets never
shorten an op, so the plan's lower bound (ops at their own speed) stays valid.

:func:`plan_budgets` builds the integer model of :mod:`autostream.scheduling.solvers.cpsat.core_resources`
(an op demands its share of the cube and of the vector cores, rounded to blocks),
warm-started from a plan without budgets, and replays its answer on the simulator:
the budgets are kept only when the simulator predicts them strictly faster than both
that plan and the same streams and order without budgets, so a plan with budgets is
never predicted slower than the same plan without.  Only the ``cpsat`` solver plans
with budgets (``PlanOptions.core_budgets``).

A side op of the whole chip (``b``) beside the critical chain ``a -> c`` (``c`` uses a
quarter of the chip): without a budget ``a`` and ``b`` run at half speed; with three
quarters of the chip for ``b``, ``a`` gets four sevenths of it while they overlap and
``c`` all it needs afterwards.

>>> import networkx as nx
>>> from autostream.scheduling.problem import SchedulingProblem
>>> from autostream.scheduling.solvers import solve
>>> g = nx.DiGraph([("a", "c")])
>>> g.add_node("a", duration=10.0, share=1.0); g.add_node("b", duration=10.0, share=1.0)
>>> g.add_node("c", duration=20.0, share=0.25)
>>> p = SchedulingProblem(g, 2)
>>> plain = solve(p, "heft")
>>> choice = plan_budgets(p, plain, {"cube": 24, "vector": 48}, time_s=1.0)
>>> choice.without_us, choice.budgets, choice.with_us
(40.0, {1: 0.75}, 37.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.simulate import simulate

#: the budgets a side stream may get: quarters of the chip
LEVELS = (0.25, 0.5, 0.75, 1.0)
#: the model's time unit is the warm plan's makespan over this many units
RESOLUTION = 1000
#: the most ops one budget model holds (the whole graph in one model: no pieces)
MAX_OPS = 2000
#: the least (deterministic) seconds CP-SAT searches the budget model of a graph
BUDGET_MIN_S = 1.0


def budgeted(problem: SchedulingProblem, stream_of: Mapping[str, int],
             budgets: Mapping[int, float]) -> SchedulingProblem:
    """``problem`` with each op on a budgeted stream capped to its budget (share ``b``,
    duration stretched by ``s / b``); streams without a budget, lanes and ops within
    their budget are unchanged; the graph's ``core_budgets`` attribute names the budgets.

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_node("x", duration=4.0, share=0.8)
    >>> p = budgeted(SchedulingProblem(g, 2), {"x": 1}, {1: 0.5})
    >>> p.durations["x"], p.shares["x"]
    (6.4, 0.5)
    """
    for s, b in budgets.items():
        if not 0 < b <= 1:
            raise ValueError(f"stream {s}'s budget is {b}; a budget is a fraction of the chip "
                             "in (0, 1]")
    g = problem.graph.copy()
    for n, data in g.nodes(data=True):
        b = budgets.get(stream_of.get(n, 0))
        share = float(data.get("share", 0.0))
        if b is not None and share > b:
            data["duration"] = float(data["duration"]) * share / b
            data["share"] = b
    g.graph["core_budgets"] = dict(sorted(budgets.items()))
    return replace(problem, graph=g)


@dataclass(frozen=True)
class BudgetChoice:
    """A plan with side-stream budgets, or the plan it started from when none helps."""

    stream_of: dict[str, int]
    order: tuple[str, ...]
    budgets: dict[int, float]  # side stream -> budget; streams left whole are not listed
    with_us: float  # simulated makespan of this plan with its budgets
    without_us: float  # simulated makespan of the plan without budgets it started from
    same_plan_without_us: float  # these streams and order without budgets
    optimal: bool  # CP-SAT proved the model's optimum

    @property
    def gain(self) -> float:
        """``without / with``: 1.0 when no budget helps."""
        return self.without_us / self.with_us if self.with_us > 0 else 1.0


def _makespan(problem: SchedulingProblem, stream_of: Mapping[str, int],
              order: Sequence[str]) -> float:
    _, end = simulate(problem, stream_of, order)
    return max(end.values(), default=0.0)


def check_cores(cores: Mapping[str, int]) -> tuple[int, int]:
    """``(cube, vector)`` core counts of a device profile, or a ``ValueError`` saying what
    is missing and how to fix it.

    >>> check_cores({"sm": 132})
    Traceback (most recent call last):
    ...
    ValueError: the device profile has no cube and vector core counts (profile.cores); core budgets need them: use a table with profile.cores (ascend910b has them) or drop core_budgets
    """
    if not cores.get("cube") or not cores.get("vector"):
        raise ValueError("the device profile has no cube and vector core counts "
                         "(profile.cores); core budgets need them: use a table with "
                         "profile.cores (ascend910b has them) or drop core_budgets")
    return int(cores["cube"]), int(cores["vector"])


def cores_missing(cost_model: Any) -> str | None:
    """Why ``cost_model``'s device profile cannot hold core budgets (:func:`check_cores`),
    ``None`` when it can: the one message for a table given with ``core_budgets``
    (an error) and a default table without core counts (a note on the plan).

    >>> cores_missing(None).startswith("the device profile has no cube and vector core counts")
    True
    """
    try:
        check_cores(getattr(getattr(cost_model, "profile", None), "cores", None) or {})
    except ValueError as exc:
        return str(exc)
    return None


def plan_budgets(problem: SchedulingProblem, plan: Schedule, cores: Mapping[str, int],
                 levels: Sequence[float] = LEVELS, time_s: float = 1.0,
                 seed: int = 0) -> BudgetChoice:
    """Streams and side-stream budgets from CP-SAT's model, warm-started from ``plan``
    (streams and launch order without budgets), checked on the simulator."""
    from autostream.scheduling.solvers.cpsat.core_resources import CoreTasks, solve_cores

    cube_vector = check_cores(cores)
    without = _makespan(problem, plan.stream_of, plan.order)
    keep = BudgetChoice(dict(plan.stream_of), tuple(plan.order), {}, without, without, without,
                        False)
    if problem.streams < 2 or without <= 0:
        return keep
    names = list(problem.topo_order)
    index = {n: i for i, n in enumerate(names)}
    unit = without / RESOLUTION
    pinned = problem.pinned
    lat = problem.sync_latency_us
    tasks = CoreTasks(
        durations=tuple(round(problem.durations[n] / unit) for n in names),
        blocks=tuple(_blocks(problem.shares[n], cube_vector) for n in names),
        preds=tuple(tuple(sorted(index[p] for p in problem.graph.predecessors(n)))
                    for n in names),
        streams=problem.streams, latency=max(1, round(lat / unit)) if lat > 0 else 0,
        cores=cube_vector, levels=tuple(sorted(set(levels))),
        lanes=tuple((index[n], -s - 1) for n, s in pinned.items()))
    sol = solve_cores(tasks, [max(plan.stream_of[n], 0) for n in names],
                      [index[n] for n in plan.order], time_s, seed)
    order = tuple(sorted(names, key=lambda n: (sol.start[index[n]], index[n])))
    renumber: dict[int, int] = {}
    for n in order:
        if n not in pinned:
            renumber.setdefault(sol.stream[index[n]], len(renumber))
    stream_of = {n: pinned[n] if n in pinned else renumber[sol.stream[index[n]]] for n in names}
    budgets = {renumber[s]: b for s, b in enumerate(sol.budgets)
               if s in renumber and renumber[s] != 0 and b < 1.0}
    same = _makespan(problem, stream_of, order)
    with_us = _makespan(budgeted(problem, stream_of, budgets), stream_of, order)
    if not budgets or with_us >= min(without, same) - 1e-9 * max(1.0, without):
        return replace(keep, optimal=sol.optimal)
    return BudgetChoice(stream_of, order, dict(sorted(budgets.items())), with_us, without, same,
                        sol.optimal)


def _blocks(share: float, cores: tuple[int, int]) -> tuple[int, int]:
    """An op's share of the chip as blocks of each core kind (at least one when it has one).

    >>> _blocks(0.3, (24, 48)), _blocks(0.0, (24, 48)), _blocks(0.001, (24, 48))
    ((8, 15), (0, 0), (1, 1))
    """
    if share <= 0:
        return 0, 0
    return tuple(max(1, min(c, math.ceil(share * c - 1e-9))) for c in cores)  # type: ignore[return-value]


def scope_keys(budget: float, cores: Mapping[str, int]) -> dict[str, str]:
    """The scope keys TorchAir's ``limit_core_num(aicore, vectorcore)`` emits for a
    budget of ``budget`` of a chip with ``cores`` (``cube``, ``vector``): its values are
    strings, as ``limit_core_num`` writes them.

    >>> scope_keys(0.25, {"cube": 24, "vector": 48})
    {'_op_aicore_num': '6', '_op_vectorcore_num': '12'}
    """
    from autostream.scheduling.solvers.cpsat.core_resources import budget_cores

    cube, vector = budget_cores(budget, check_cores(cores))
    return {"_op_aicore_num": str(cube), "_op_vectorcore_num": str(vector)}
