"""``nimble``: Nimble's stream assignment (Kwon et al., NeurIPS 2020).

1. Transitive reduction of the DAG (Nimble's minimum equivalent graph).
2. Maximum bipartite matching on the reduced edges (out-copy -> in-copy): matched
   edges link ops into chains; each unmatched reduced edge is a sync.
3. Chains merged by a second maximum matching on the chain DAG's transitive
   closure (chain ``A`` may precede chain ``B`` on one stream when ``A``'s tail
   reaches ``B``'s head), for a minimum chain cover: the fewest streams that keep
   the maximum logical concurrency.

The two matchings do not always reach that minimum: the first can fix chains that
every minimum cover splits (the property test found a 9-op DAG of width 4 covered
by 5).  When they fall short, the streams are the chains of one maximum matching
on the whole DAG's transitive closure (Fulkerson's construction of Dilworth's
minimum), which Nimble's stated goal calls for.

Nimble does not cap the number of streams.  When it needs more than
``problem.streams``, merged chain ``k`` (ordered by its head's program position)
runs on stream ``k mod streams``; ``stats.streams_needed`` says how
many it wanted.  Nimble is not makespan-aware: it ignores the op costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule, SolverStats
from autostream.scheduling.solvers._graphs import reachability, transitive_reduction_edges
from autostream.scheduling.solvers.base import check_options, schedule_from_assignment


@dataclass(frozen=True)
class NimbleStats(SolverStats):
    """How many streams Nimble's chain cover asked for."""

    streams_needed: int  # chains in the cover: more than ``streams`` get folded


def _match(left: list, edges: list[tuple]) -> dict:
    """Maximum matching left -> right of a bipartite edge list.

    Nodes are relabelled to integers first: networkx's Hopcroft-Karp iterates over
    sets, whose order for strings changes with every process (hash randomisation),
    while for integers it is reproducible.
    """
    index = {x: i for i, x in enumerate(left)}
    rights = list(dict.fromkeys(v for _, v in edges))
    rindex = {x: len(left) + i for i, x in enumerate(rights)}
    b = nx.Graph()
    b.add_nodes_from(range(len(left) + len(rights)))
    b.add_edges_from((index[u], rindex[v]) for u, v in edges)
    matching = nx.bipartite.hopcroft_karp_matching(b, range(len(left)))
    return {left[u]: rights[v - len(left)] for u, v in matching.items() if u < len(left)}


def nimble_streams(problem: SchedulingProblem) -> list[list[str]]:
    """The merged chains (streams) in Nimble's minimum chain cover, ops in program order.

    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> len(nimble_streams(SchedulingProblem(g, streams=4)))  # the widest antichain: b, c
    2
    """
    topo, idx = problem.topo_order, problem.topo_index
    reduced = transitive_reduction_edges(problem.graph, topo)
    chains = _chains(topo, _match(list(topo), reduced))
    reach = reachability(problem.graph, topo)
    head_chain = {idx[c[0]]: k for k, c in enumerate(chains)}
    heads = sum(1 << i for i in head_chain)
    chain_edges = []
    for a, chain in enumerate(chains):
        bits = reach[chain[-1]] & heads & ~(1 << idx[chain[-1]])
        while bits:
            low = bits & -bits
            chain_edges.append((a, head_chain[low.bit_length() - 1]))
            bits ^= low
    follow = _match(list(range(len(chains))), chain_edges)
    followed = set(follow.values())
    streams: list[list[str]] = []
    for a in range(len(chains)):
        if a in followed:
            continue
        ops: list[str] = []
        k: int | None = a
        while k is not None:
            ops.extend(chains[k])
            k = follow.get(k)
        streams.append(sorted(ops, key=idx.__getitem__))
    closure = [(u, v) for u in topo for v in _members(reach[u] & ~(1 << idx[u]), topo)]
    nxt_closure = _match(list(topo), closure)
    if len(streams) > len(topo) - len(nxt_closure):  # not minimal: Dilworth's cover
        streams = _chains(topo, nxt_closure)
    return sorted(streams, key=lambda s: idx[s[0]])


def _members(bits: int, topo) -> list:
    """The ops whose topological index is set in ``bits``."""
    out = []
    while bits:
        low = bits & -bits
        out.append(topo[low.bit_length() - 1])
        bits ^= low
    return out


def _chains(topo, nxt: dict) -> list[list[str]]:
    """Chains that follow ``nxt`` (op -> its successor on the chain) from each head."""
    has_prev = set(nxt.values())
    chains = []
    for n in topo:
        if n in has_prev:
            continue
        chain = [n]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        chains.append(chain)
    return chains


def solve(problem: SchedulingProblem, **options: object) -> Schedule:
    """Nimble's chain cover, folded modulo ``streams`` when it needs more.

    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> solve(SchedulingProblem(g, streams=1)).stats.streams_needed
    2
    """
    check_options("nimble", options)
    streams = nimble_streams(problem)
    stream_of = {n: k % problem.streams for k, ops in enumerate(streams) for n in ops}
    return schedule_from_assignment(problem, stream_of, "nimble",
                                    stats=NimbleStats(streams_needed=len(streams)))
