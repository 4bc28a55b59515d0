"""Core budgets per side stream, searched on the contention model after the streams are chosen.

A stream's budget caps the fraction of the chip its ops may occupy (TorchAir's
``limit_core_num``).  An op of share ``s`` on a stream of budget ``b < s`` runs on
``b`` of the chip and takes ``s / b`` times as long (linear in blocks: the profile
gives no better law), so its work, share times duration, is unchanged; what a
budget changes is who waits under contention: the processor-sharing model slows
every running op while their shares sum past the capacity, and a capped side stream
leaves the rest to the critical path.  Budgets never shorten an op, so the planner's
lower bound (ops at their own speed) stays valid.

The main stream keeps the whole chip; each side stream's budget is one of ``LEVELS``
(quarters of the chip), all tuples tried on the simulator (4^3 = 64 at four
streams) and the shortest kept, ties to the larger budgets.  The tuple of whole-chip
budgets is the plan without budgets, so a plan with budgets is never predicted
slower than the same plan without.

This is a search after the streams are fixed, not budgets chosen in CP-SAT's model
together with the streams, and nothing emits the budgets into the graph yet
(:func:`scope_keys` gives the scope keys ``limit_core_num`` uses).

A side op of the whole chip (``b``) beside the critical chain ``a -> c`` (``c`` uses a
quarter of the chip): without a budget ``a`` and ``b`` run at half speed; with half
the chip for ``b`` the chain gets two thirds of it while they overlap.

>>> import networkx as nx
>>> from autostream.problem import SchedulingProblem
>>> g = nx.DiGraph([("a", "c")])
>>> g.add_node("a", duration=10.0, share=1.0); g.add_node("b", duration=10.0, share=1.0)
>>> g.add_node("c", duration=20.0, share=0.25)
>>> choice = choose_budgets(SchedulingProblem(g, 2), {"a": 0, "b": 1, "c": 0}, ["a", "b", "c"])
>>> choice.without_us, choice.budgets, choice.with_us
(40.0, {1: 0.5}, 35.0)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autostream.problem import SchedulingProblem
from autostream.simulate import simulate

#: the budgets a side stream may get: quarters of the chip
LEVELS = (0.25, 0.5, 0.75, 1.0)


def budgeted(problem: SchedulingProblem, stream_of: Mapping[str, int],
             budgets: Mapping[int, float]) -> SchedulingProblem:
    """``problem`` with each op on a budgeted stream capped to its budget (share ``b``,
    duration stretched by ``s / b``); streams without a budget, lanes and ops within
    their budget are unchanged.

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
    return replace(problem, graph=g)


@dataclass(frozen=True)
class BudgetChoice:
    """The budgets chosen for a plan's side streams and the makespans with and without."""

    budgets: dict[int, float]  # side stream -> budget; streams left whole are not listed
    with_us: float
    without_us: float

    @property
    def gain(self) -> float:
        """``without / with``: 1.0 when no budget helps."""
        return self.without_us / self.with_us if self.with_us > 0 else 1.0


def _makespan(problem: SchedulingProblem, stream_of: Mapping[str, int],
              order: Sequence[str]) -> float:
    _, end = simulate(problem, stream_of, order)
    return max(end.values(), default=0.0)


def choose_budgets(problem: SchedulingProblem, stream_of: Mapping[str, int],
                   order: Sequence[str], levels: Sequence[float] = LEVELS) -> BudgetChoice:
    """The side-stream budgets from ``levels`` that the simulator predicts shortest for
    this plan (every tuple tried; ties to the larger budgets)."""
    if 1.0 not in levels:
        raise ValueError("levels must include 1.0 (the whole chip: no budget)")
    side = sorted({s for s in stream_of.values() if s > 0})
    without = _makespan(problem, stream_of, order)
    best, best_us = {}, without
    for combo in itertools.product(sorted(levels, reverse=True), repeat=len(side)):
        budgets = {s: b for s, b in zip(side, combo, strict=True) if b < 1.0}
        if not budgets:
            continue
        us = _makespan(budgeted(problem, stream_of, budgets), stream_of, order)
        if us < best_us - 1e-9:
            best, best_us = budgets, us
    return BudgetChoice(best, best_us, without)


def scope_keys(budget: float, cores: Mapping[str, int]) -> dict[str, str]:
    """The scope keys TorchAir's ``limit_core_num(aicore, vectorcore)`` emits for a
    budget of ``budget`` of a chip with ``cores`` (``cube``, ``vector``).

    >>> scope_keys(0.25, {"cube": 24, "vector": 48})
    {'_op_aicore_num': '6', '_op_vectorcore_num': '12'}
    """
    if not cores.get("cube") or not cores.get("vector"):
        raise ValueError("the device profile has no cube and vector core counts "
                         "(profile.cores); core budgets need them")
    return {"_op_aicore_num": str(max(1, int(budget * cores["cube"]))),
            "_op_vectorcore_num": str(max(1, int(budget * cores["vector"])))}
