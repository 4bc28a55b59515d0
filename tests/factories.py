"""Graphs, scheduling problems and captured models that many tests build: one builder each.

Random graphs draw from ``random.Random(seed)`` in a fixed order (every node first,
then the edges), so a seed names one graph for good.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import networkx as nx
import torch
from hypothesis import strategies as st

from autostream.fx.capture import capture_graphs
from autostream.fx.graph import build_op_graph
from autostream.planning.plan import build_problem
from autostream.scheduling.problem import SchedulingProblem


def random_dag(seed: int, nodes: int, *, max_parents: int = 2,
               edge_probability: float | None = None, max_duration: int = 20,
               shares: Sequence[float] = (0.0,), kinds: Sequence[str] = (),
               prefix: str = "n") -> nx.DiGraph:
    """A random DAG whose node ``{prefix}{i}`` comes ``i``-th in program order.

    Each node gets an integer ``duration`` in ``1..max_duration``, a ``share`` drawn
    from ``shares`` (no draw for a single value) and, with ``kinds``, the ``target``
    ``aten.<kind>.default``.  Edges only go forward: node ``j`` gets up to
    ``max_parents`` random earlier parents, or, with ``edge_probability``, every
    earlier node ``i`` is its parent with that probability.

    >>> g = random_dag(0, 6, edge_probability=0.5, max_duration=9)
    >>> list(g)[:3], nx.is_directed_acyclic_graph(g)
    (['n0', 'n1', 'n2'], True)
    """
    rng = random.Random(seed)
    g = nx.DiGraph()
    for i in range(nodes):
        attrs = {"duration": float(rng.randint(1, max_duration)),
                 "share": rng.choice(list(shares)) if len(shares) > 1 else shares[0],
                 "order": i}
        if kinds:
            attrs["target"] = f"aten.{rng.choice(list(kinds))}.default"
        g.add_node(f"{prefix}{i}", **attrs)
    if edge_probability is None:
        for j in range(1, nodes):
            for i in rng.sample(range(j), k=min(j, rng.randint(0, max_parents))):
                g.add_edge(f"{prefix}{i}", f"{prefix}{j}")
    else:
        for i in range(nodes):
            for j in range(i + 1, nodes):
                if rng.random() < edge_probability:
                    g.add_edge(f"{prefix}{i}", f"{prefix}{j}")
    return g


def random_problem(seed: int, nodes: int = 24, *, streams: int = 3, latency: float = 0.0,
                   **dag) -> SchedulingProblem:
    """:func:`random_dag` (``dag``: its options) on ``streams`` streams.

    >>> random_problem(1, 5, streams=2).streams
    2
    """
    return SchedulingProblem(random_dag(seed, nodes, **dag), streams=streams,
                             sync_latency_us=latency)


def fork_join(branches: Sequence[float], *, share: float = 0.0, streams: int = 4,
              latency: float = 0.0) -> SchedulingProblem:
    """``src -> (b0, b1, ...) -> dst``: one branch op per duration in ``branches``; the
    source and the sink take 1 us.

    >>> p = fork_join([10.0, 8.0, 6.0])
    >>> sorted(p.graph.successors("src")), p.single_stream_time()
    (['b0', 'b1', 'b2'], 26.0)
    """
    g = nx.DiGraph()
    g.add_node("src", duration=1.0, share=share, order=0)
    for i, duration in enumerate(branches):
        g.add_node(f"b{i}", duration=float(duration), share=share, order=i + 1)
        g.add_edges_from([("src", f"b{i}"), (f"b{i}", "dst")])
    g.add_node("dst", duration=1.0, share=share, order=len(branches) + 1)
    return SchedulingProblem(g, streams=streams, sync_latency_us=latency)


def identical_layers(layers: int) -> nx.DiGraph:
    """Identical layers, each a fork of 4 chains of 3 ops (2, 3, 4 and 5 us) joined by
    ``L<k>.join`` (1 us), which the next layer's chains start from."""
    g = nx.DiGraph()
    prev = None
    for layer in range(layers):
        join = f"L{layer}.join"
        g.add_node(join, duration=1.0, share=0.0, order=len(g))
        for b in range(4):
            last = prev
            for k in range(3):
                n = f"L{layer}.b{b}.{k}"
                g.add_node(n, duration=2.0 + b, share=0.0, order=len(g))
                if last is not None:
                    g.add_edge(last, n)
                last = n
            g.add_edge(last, join)
        prev = join
    return g


def layers_with_weights(layers: int, latency: float = 1.0) -> SchedulingProblem:
    """Like a transformer's post-AOT graph: per layer a fork of two branches joined by a
    residual add, each branch's matmul fed by a weight transpose (a source of zero
    duration) and the first branch by a mask built once from a constant."""
    g = nx.DiGraph()

    def op(name, duration, *inputs):
        g.add_node(name, duration=duration, share=0.0, order=len(g))
        g.add_edges_from((i, name) for i in inputs)
        return name

    mask = op("mask.fill", 0.0, op("mask.arange", 2.0))
    x = op("embed", 2.0)
    for k in range(layers):
        a = op(f"L{k}.a.mm", 4.0, x, op(f"L{k}.a.wt", 0.0), mask)
        b = op(f"L{k}.b.mm", 3.0, x, op(f"L{k}.b.wt", 0.0))
        x = op(f"L{k}.add", 1.0, op(f"L{k}.a.act", 2.0, a), b)
    return SchedulingProblem(g, streams=2, sync_latency_us=latency)


@st.composite
def problems(draw, max_nodes: int = 9, shares: bool = True) -> SchedulingProblem:
    """Hypothesis: small random problems (zero durations, shares and latency included)."""
    n = draw(st.integers(1, max_nodes))
    g = nx.DiGraph()
    share_values = [0.0, 0.3, 0.5, 1.0] if shares else [0.0]
    for i in range(n):
        g.add_node(f"n{i}", duration=float(draw(st.integers(0, 9))),
                   share=draw(st.sampled_from(share_values)), order=i)
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.booleans()) and draw(st.booleans()):
                g.add_edge(f"n{i}", f"n{j}")
    return SchedulingProblem(
        g, streams=draw(st.integers(1, 4)), sync_latency_us=draw(st.sampled_from([0.0, 1.0]))
    )


@st.composite
def comm_problems(draw, max_nodes: int = 8) -> SchedulingProblem:
    """Hypothesis: small random problems with 1-3 collectives: launch -> transfer (on one
    of two links) -> wait, the wait's reader a later op; launches chained in program
    order, each link's transfers in launch order (what ``transfers.add_transfers``
    builds); zero durations and shares included, a zero-duration ``getitem`` between
    some transfers and their waits."""
    n = draw(st.integers(2, max_nodes))
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(f"n{i}", duration=float(draw(st.integers(0, 9))),
                   share=draw(st.sampled_from([0.0, 0.5, 1.0])), order=10 * i)
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.booleans()) and draw(st.booleans()):
                g.add_edge(f"n{i}", f"n{j}")
    launch, last_on = None, {}
    points = sorted(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3)))
    for k, at in enumerate(points):  # launches in program order
        reader = draw(st.integers(at, n))  # n: the result is only an output
        link = f"link:{draw(st.integers(0, 1))}"
        ar, xfer, wait = f"ar{k}", f"ar{k}.transfer", f"wait{k}"
        g.add_node(ar, duration=float(draw(st.integers(0, 3))), share=0.3, order=10 * at + 2 + k)
        g.add_node(xfer, duration=float(draw(st.integers(0, 30))),
                   share=draw(st.sampled_from([0.0, 0.2])), lane=link, order=10 * at + 5 + k)
        g.add_node(wait, duration=float(draw(st.integers(0, 2))), order=10 * at + 8 + k)
        g.add_edges_from([(f"n{at}", ar), (ar, xfer), (ar, wait)])
        if draw(st.booleans()):
            g.add_node(f"get{k}", duration=0.0, order=10 * at + 7 + k)
            g.add_edges_from([(xfer, f"get{k}"), (f"get{k}", wait)])
        else:
            g.add_edge(xfer, wait)
        if at < reader < n:
            g.add_edge(wait, f"n{reader}")
        if launch is not None:
            g.add_edge(launch, ar)
        if link in last_on:
            g.add_edge(last_on[link], xfer)
        launch, last_on[link] = ar, xfer
    return SchedulingProblem(g, streams=draw(st.integers(1, 3)),
                             sync_latency_us=draw(st.sampled_from([0.0, 1.0])))


def largest_graph(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """The largest post-AOT graph of ``model`` (Dynamo may split it)."""
    return max(capture_graphs(model, inputs), key=lambda gm: len(gm.graph.nodes))


def model_problem(model: torch.nn.Module, inputs: Sequence[torch.Tensor], costs,
                  streams: int) -> SchedulingProblem:
    """The split problem the pass would solve for ``model``'s largest graph under ``costs``."""
    ops = build_op_graph(largest_graph(model, inputs))
    estimates = {n: costs.estimate(d["fx"]) for n, d in ops.nodes(data=True)}
    return build_problem(ops, estimates, streams, costs.sync_latency_us, split=True)
