"""The integer task graph CP-SAT works on: chains collapsed, times scaled to integers.

CP-SAT needs integer times.  Durations are microseconds (floats); the *scale* is
the number of time units per microsecond: the smallest of 1, 10, 100, 1000 at
which every duration and the sync latency are integers, else the finest of those
that keeps the total work under ``MAX_UNITS`` units (rounded, so the model is then
approximate; the final makespan always comes from the simulator).  Device shares
become integers out of ``SHARE_UNITS``.

A linear chain (``u`` has the single successor ``v`` and ``v`` the single
predecessor ``u``) has no parallelism inside it; with ``collapse=True`` it
becomes one task whose share is the largest of its members' (a conservative
choice: the collapsed task never over-subscribes the device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from autostream.problem import SchedulingProblem
from autostream.solvers._graphs import transitive_reduction_edges

SHARE_UNITS = 1000
MAX_UNITS = 10_000_000


@dataclass(frozen=True)
class TaskGraph:
    """Tasks ``0..n-1`` in topological order, with integer durations and shares."""

    members: tuple[tuple[str, ...], ...]
    duration: tuple[int, ...]
    share: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]  # transitive reduction, ascending
    succs: tuple[tuple[int, ...], ...]
    scale: float  # time units per microsecond
    latency: int
    capacity: int
    exact: bool  # True when no rounding and no chain collapsing happened

    def __len__(self) -> int:
        return len(self.members)

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(u, v) for v in range(len(self)) for u in self.preds[v]]

    def to_units(self, us: float) -> int:
        return int(round(us * self.scale))


def time_scale(problem: SchedulingProblem) -> tuple[float, bool]:
    """``(units per microsecond, exact)`` for ``problem``'s durations and sync latency.

    >>> g = nx.DiGraph(); g.add_node("a", duration=1.5)
    >>> time_scale(SchedulingProblem(g, streams=1))
    (10.0, True)
    """
    values = [problem.duration(n) for n in problem.graph] + [problem.sync_latency_us]
    total = max(sum(values), 1e-9)
    for scale in (1.0, 10.0, 100.0, 1000.0):
        if total * scale > MAX_UNITS:
            break
        if all(abs(v * scale - round(v * scale)) <= 1e-6 * max(1.0, v * scale) for v in values):
            return scale, True
    finest = 1.0
    for scale in (10.0, 100.0, 1000.0):
        if total * scale <= MAX_UNITS:
            finest = scale
    if total * finest > MAX_UNITS:
        finest = MAX_UNITS / total
    return finest, False


def linear_chains(problem: SchedulingProblem) -> list[list[str]]:
    """Maximal linear chains (singletons included), ordered by their head's topological position.

    >>> g = nx.DiGraph([("a", "b"), ("b", "c"), ("b", "d")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> linear_chains(SchedulingProblem(g, streams=2))
    [['a', 'b'], ['c'], ['d']]
    """
    g = problem.graph
    chains: list[list[str]] = []
    chain_of: dict[str, list[str]] = {}
    for n in problem.topo_order:
        preds = list(g.predecessors(n))
        if len(preds) == 1 and g.out_degree(preds[0]) == 1:
            chain = chain_of[preds[0]]
            chain.append(n)
        else:
            chain = [n]
            chains.append(chain)
        chain_of[n] = chain
    return chains


def build_tasks(
    problem: SchedulingProblem, collapse: bool, shares: bool = True, capacity_factor: float = 1.0
) -> TaskGraph:
    """The integer task graph of ``problem`` (chains collapsed when ``collapse``).

    ``shares=False`` drops the device shares (contention left to the simulator);
    ``capacity_factor > 1`` lets the model oversubscribe the device by that factor
    (the simulator's processor sharing then slows the overlapping ops down).
    """
    scale, exact = time_scale(problem)
    if collapse:
        groups = linear_chains(problem)
        exact = exact and all(len(c) == 1 for c in groups)
    else:
        groups = [[n] for n in problem.topo_order]
    task_of = {n: k for k, group in enumerate(groups) for n in group}
    tg = nx.DiGraph()
    tg.add_nodes_from(range(len(groups)))
    tg.add_edges_from(
        (task_of[u], task_of[v]) for u, v in problem.graph.edges if task_of[u] != task_of[v]
    )
    # Task ids follow the heads' topological order, which is a topological order of tg.
    reduced = transitive_reduction_edges(tg, list(range(len(groups))))
    preds: list[list[int]] = [[] for _ in groups]
    succs: list[list[int]] = [[] for _ in groups]
    for u, v in reduced:
        preds[v].append(u)
        succs[u].append(v)
    capacity = int(math.floor(problem.capacity * capacity_factor * SHARE_UNITS + 1e-9))
    return TaskGraph(
        members=tuple(tuple(group) for group in groups),
        duration=tuple(
            int(round(sum(problem.duration(n) for n in group) * scale)) for group in groups
        ),
        share=tuple(  # an op wider than the device still runs, alone
            min(capacity, int(math.ceil(max(problem.share(n) for n in group) * SHARE_UNITS - 1e-9)))
            if shares else 0
            for group in groups
        ),
        preds=tuple(tuple(sorted(p)) for p in preds),
        succs=tuple(tuple(sorted(s)) for s in succs),
        scale=scale,
        latency=int(round(problem.sync_latency_us * scale)),
        capacity=capacity,
        exact=exact,
    )
