"""Graph helpers shared by the solvers: reachability bitsets, transitive reduction.

Bitsets are Python ints indexed by topological position, which keeps the
reduction of a 5,000-op graph well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx


def reachability(graph: nx.DiGraph, topo: Sequence[str]) -> dict[str, int]:
    """Bitset of the ops reachable from each op (itself included), bit i = ``topo[i]``.

    >>> g = nx.DiGraph([("a", "b"), ("b", "c")])
    >>> bin(reachability(g, ["a", "b", "c"])["a"])
    '0b111'
    """
    index = {n: i for i, n in enumerate(topo)}
    reach: dict[str, int] = {}
    for n in reversed(topo):
        bits = 1 << index[n]
        for s in graph.successors(n):
            bits |= reach[s]
        reach[n] = bits
    return reach


def transitive_reduction_edges(graph: nx.DiGraph, topo: Sequence[str]) -> list[tuple[str, str]]:
    """The edges of ``graph`` not implied by a longer path, in topological order of the source.

    >>> g = nx.DiGraph([("a", "b"), ("b", "c"), ("a", "c")])
    >>> transitive_reduction_edges(g, ["a", "b", "c"])
    [('a', 'b'), ('b', 'c')]
    """
    index = {n: i for i, n in enumerate(topo)}
    reach = reachability(graph, topo)
    kept: list[tuple[str, str]] = []
    for u in topo:
        covered = 0
        # A successor reachable from an earlier successor is redundant; earlier
        # successors (by topological position) are the only ones that can reach it.
        for v in sorted(graph.successors(u), key=index.__getitem__):
            if not (covered >> index[v]) & 1:
                kept.append((u, v))
            covered |= reach[v]
    return kept


def cross_stream_edges(edges: Sequence[tuple[str, str]], stream_of: dict[str, int]) -> int:
    """How many of ``edges`` join ops on different streams."""
    return sum(1 for u, v in edges if stream_of[u] != stream_of[v])
