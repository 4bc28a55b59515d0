"""Exact decomposition at separators: plan each distinct piece of a layered graph once.

A *separator* (``_bounds.separators``) is an op that every other op precedes or
follows, e.g. a layer's residual add or the ops of a norm chain between two
residual blocks.  Nothing overlaps a separator: all ops before it have ended when
it starts, all ops after it start after it ends.  So a plan of the whole graph is
the concatenation of plans of its *pieces* (the ops from one separator to the
next, both included), and the makespan is the sum of the pieces' spans (up to
sync latency on edges that skip a separator, which the final simulation of the
whole plan counts).  Pieces of repeated layers are identical: each distinct piece
is solved once and replicated, so the planning time grows with the number of
distinct pieces, not with depth.

>>> import networkx as nx
>>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"),
...                 ("d", "f"), ("e", "g"), ("f", "g")])
>>> nx.set_node_attributes(g, 1.0, "duration")
>>> [list(p) for p in pieces(SchedulingProblem(g, streams=2))]
[['a'], ['a', 'b', 'c', 'd'], ['d', 'e', 'f', 'g']]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autostream.problem import SchedulingProblem
from autostream.schedule import Schedule
from autostream.solvers._bounds import separators


def pieces(
    problem: SchedulingProblem, cuts: Sequence[str] | None = None
) -> list[tuple[str, ...]]:
    """The topological order cut at separators; consecutive pieces share their separator.

    The first piece ends at the first separator (it is that separator alone when the
    graph starts with one); the last starts at the last separator.  ``cuts``: the
    separators, when already known.
    """
    topo = problem.topo_order
    cuts = [problem.topo_index[v] for v in (separators(problem) if cuts is None else cuts)]
    if not cuts:
        return [topo]
    out = [topo[: cuts[0] + 1]]
    out += [topo[a : b + 1] for a, b in zip(cuts, cuts[1:], strict=False)]
    if cuts[-1] < len(topo) - 1:
        out.append(topo[cuts[-1] :])
    return out


def piece_key(problem: SchedulingProblem, ops: Sequence[str]) -> tuple:
    """Everything a piece's plan depends on: durations, shares and inner edges, by position."""
    pos = {v: i for i, v in enumerate(ops)}
    g = problem.graph
    return tuple(
        (
            problem.duration(v),
            problem.share(v),
            tuple(sorted(pos[u] for u in g.predecessors(v) if u in pos)),
        )
        for v in ops
    )


def subproblem(problem: SchedulingProblem, ops: Sequence[str]) -> SchedulingProblem:
    """The piece as a problem of its own (inner edges only, same device)."""
    return SchedulingProblem(
        problem.graph.subgraph(ops).copy(),
        problem.streams,
        problem.sync_latency_us,
        problem.capacity,
    )


def plan_by_pieces(
    problem: SchedulingProblem,
    parts: list[tuple[str, ...]],
    solve_piece: Callable[[SchedulingProblem, float], Schedule],
    time_limit: float,
) -> tuple[dict[str, int], tuple[str, ...], dict[str, object]]:
    """``(stream_of, launch order, stats)`` from one plan per distinct piece.

    ``stats["pieces_bound"]`` is a lower bound on the whole makespan: the sum of the
    pieces' own bounds (each piece spans at least its bound, less its head, which
    the previous piece counted).

    ``solve_piece(sub, seconds)`` plans one piece; the time is shared among the
    distinct non-trivial pieces in proportion to their sizes.  Each piece's streams
    are renumbered so that its first separator keeps the stream the previous piece
    gave it (no sync at the boundary).
    """
    keyed = [(ops, piece_key(problem, ops)) for ops in parts]
    distinct: dict[tuple, tuple[str, ...]] = {}
    for ops, key in keyed:
        if len(ops) > 2 and key not in distinct:
            distinct[key] = ops
    total = sum(len(ops) for ops in distinct.values()) or 1
    plans: dict[tuple, Schedule] = {}
    for key, ops in distinct.items():
        plans[key] = solve_piece(subproblem(problem, ops), time_limit * len(ops) / total)
    stream_of: dict[str, int] = {}
    order: list[str] = []
    bound = 0.0  # each piece spans at least its own bound, less its head
    for ops, key in keyed:
        head = ops[0]
        if head not in stream_of:  # the first piece
            stream_of[head] = 0
            order.append(head)
            bound += problem.duration(head)
        if key not in plans:  # a separator chain: stays on the head's stream
            for v in ops[1:]:
                stream_of[v] = stream_of[head]
                order.append(v)
                bound += problem.duration(v)
            continue
        plan = plans[key]
        bound += plan.lower_bound - problem.duration(head)
        local = {ops[i]: plan.stream_of[distinct[key][i]] for i in range(len(ops))}
        renumber = {local[head]: stream_of[head]}
        spare = iter(s for s in range(problem.streams) if s != stream_of[head])
        for v in ops:
            if local[v] not in renumber:  # lanes (negative) keep their numbers
                renumber[local[v]] = local[v] if local[v] < 0 else next(spare)
        position = {u: i for i, u in enumerate(distinct[key])}
        for u in plan.order:
            v = ops[position[u]]
            if v == head:
                continue
            stream_of[v] = renumber[local[v]]
            order.append(v)
    stats = {
        "pieces": len(parts),
        "pieces_solved": len(plans),
        "piece_sources": sorted({str(p.stats.get("source", p.solver)) for p in plans.values()}),
        "pieces_optimal": all(p.optimal for p in plans.values()),
        "pieces_bound": bound,
        # reproducible only if every piece's plan was (see cpsat's stats["deterministic"])
        "deterministic": all(bool(p.stats.get("deterministic", True)) for p in plans.values()),
    }
    return stream_of, tuple(order), stats
