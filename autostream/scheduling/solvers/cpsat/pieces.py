"""Pieces: the graph cut at ops that nothing overlaps, each distinct piece planned once.

A *cut* is an op that every other op precedes or follows (a layer's residual add,
the ops of a norm between two blocks).  Nothing overlaps a cut, so a plan of the
graph is the concatenation of plans of its *pieces*: the ops from one cut (the
piece's *head*, placed by the previous piece) to the next.  The pieces of repeated
layers have the same canonical form (:mod:`.canonical`): each distinct piece is
solved once and stamped onto its copies, so planning time grows with the number
of distinct pieces, not with depth.

Real graphs have almost no strict cuts.  A weight's transpose, a position
``arange`` or a mask built from constants waits for no activation, so it is
unordered with every layer before its consumer; a cache output is unordered with
every layer after its producer.  So ``cut_into_pieces`` also cuts at an op ``c``
when each op unordered with it can be *moved* without lengthening the critical
path: an op that does not follow the previous cut moves after ``c`` (into the
piece of its first consumer: it only waits for inputs), an op that follows the
previous cut moves before ``c``.  Moved ops are *loose* in their piece.  The
piece's plan places them (its problem orders a loose op that does not precede the
closing cut before it); its lower bound leaves them out.  Dropping ops relaxes the
problem and leaves every cut a strict one, so the pieces' bounds still add up to
a lower bound of the whole graph (:func:`pieces_lower_bound`).

>>> import networkx as nx
>>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"),
...                 ("d", "f"), ("e", "g"), ("f", "g")])
>>> nx.set_node_attributes(g, 1.0, "duration")
>>> [p.ops for p in cut_into_pieces(SchedulingProblem(g, streams=2))]
[('a',), ('a', 'b', 'c', 'd'), ('d', 'e', 'f', 'g')]
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import networkx as nx

from autostream.scheduling.problem import SchedulingProblem

_EPS = 1e-9


@dataclass(frozen=True)
class Piece:
    """The ops between two consecutive cuts, in topological order."""

    ops: tuple[str, ...]  # the head first (when there is one), the closing cut included
    head: str | None  # the previous cut, placed by the previous piece (None: first piece)
    tail: str | None  # the cut that closes the piece (None: the last piece)
    loose: frozenset[str] = frozenset()  # ops moved into this piece

    @property
    def own(self) -> tuple[str, ...]:
        """The ops this piece places (all but its head)."""
        return self.ops[1:] if self.head is not None else self.ops


@dataclass
class _Reach:
    """Reachability bitsets (bit i: ``topo[i]``) and longest paths of a problem."""

    anc: list[int]  # ancestors, itself included
    desc: list[int]  # descendants, itself included
    head: list[float]  # longest path from a source to the op's start
    tail: list[float]  # longest path from the op's start to a sink (its duration included)

    @property
    def critical_path(self) -> float:
        return max((h + t for h, t in zip(self.head, self.tail)), default=0.0)


def _reach(problem: SchedulingProblem) -> _Reach:
    topo, index, g = problem.topo_order, problem.topo_index, problem.graph
    n = len(topo)
    d = [problem.duration(v) for v in topo]
    anc, desc, head, tail = [0] * n, [0] * n, [0.0] * n, [0.0] * n
    for i, v in enumerate(topo):
        bits, h = 1 << i, 0.0
        for u in g.predecessors(v):
            j = index[u]
            bits, h = bits | anc[j], max(h, head[j] + d[j])
        anc[i], head[i] = bits, h
    for i in reversed(range(n)):
        bits, t = 1 << i, 0.0
        for w in g.successors(topo[i]):
            j = index[w]
            bits, t = bits | desc[j], max(t, tail[j])
        desc[i], tail[i] = bits, t + d[i]
    return _Reach(anc, desc, head, tail)


def _bits(x: int):
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


class _Cutter:
    """The greedy scan for cuts along the topological order (see the module docstring)."""

    def __init__(self, problem: SchedulingProblem, strict: bool) -> None:
        self.strict = strict  # cut only where nothing has to move
        self.d = [problem.duration(v) for v in problem.topo_order]
        self.r = _reach(problem)
        self.cp = self.r.critical_path
        self.n = len(self.d)
        self.full = (1 << self.n) - 1
        # ops that feed no op of the main output (the op with the most ancestors), such
        # as cache writes: the only ops that may move before a cut
        main = max(range(self.n), key=lambda j: (self.r.anc[j].bit_count(), -j), default=0)
        self.dead_ends = self.full & ~self.r.anc[main] if self.n else 0
        self.placed = 0  # ops in the pieces closed so far
        self.after_cut = 0  # descendants of the last cut (0 before the first)
        # every op by decreasing tail: the longest path an op moved after a cut starts
        self.by_tail = sorted(range(self.n), key=lambda j: (-self.r.tail[j], j))
        self.first_open = 0

    def pieces(self) -> list[tuple[int | None, list[int]]]:
        """``(cut index or None for the last piece, the piece's op indices)``."""
        out: list[tuple[int | None, list[int]]] = []
        for i in range(self.n):
            placed = self.placed >> i & 1
            follows = not self.after_cut or self.after_cut >> i & 1
            if placed or not follows or self.r.head[i] + self.d[i] <= 0:
                continue  # an op that ends at time 0 cuts nothing: it would only move ops
            if self.strict and self.full & ~self.r.anc[i] & ~self.r.desc[i] & ~self.placed:
                continue
            before = self._moved_before(i)
            if before is None or not self._can_move_after(i):
                continue
            old = self.placed
            self.placed |= self.r.anc[i]
            for u in before:
                self.placed |= self.r.anc[u]
            out.append((i, sorted(_bits(self.placed & ~old))))
            self.after_cut = self.r.desc[i]
        rest = self.full & ~self.placed
        if rest:
            out.append((None, sorted(_bits(rest))))
        return out

    def _moved_before(self, i: int) -> list[int] | None:
        """The ops after the last cut unordered with ``i``, if all can move before it."""
        r = self.r
        unordered = self.full & ~r.anc[i] & ~r.desc[i] & ~self.placed & self.after_cut
        limit = self.cp - r.tail[i] + _EPS
        moved = []
        if unordered & ~self.dead_ends:
            return None
        for u in _bits(unordered):
            if r.head[u] + self.d[u] > limit:
                return None
            moved.append(u)
        if moved:  # none of them may wait for an op that moves after i
            after = self.full & ~r.anc[i] & ~r.desc[i] & ~self.placed & ~self.after_cut
            if any(r.anc[u] & after for u in moved):
                return None
        return moved

    def _can_move_after(self, i: int) -> bool:
        """Do the ops that do not follow the last cut, unordered with ``i``, fit after it?"""
        r = self.r
        while self.first_open < self.n and self.placed >> self.by_tail[self.first_open] & 1:
            self.first_open += 1
        skip = r.anc[i] | r.desc[i] | self.placed | self.after_cut
        limit = self.cp - r.head[i] - self.d[i] + _EPS
        for j in self.by_tail[self.first_open:]:
            if r.tail[j] <= limit:
                return True
            if not skip >> j & 1:
                return False
        return True


def cut_into_pieces(problem: SchedulingProblem, strict: bool = False) -> list[Piece]:
    """The pieces of ``problem``, in order; consecutive pieces share their cut.

    ``strict``: cut only at ops every other op precedes or follows (no op moves, no
    piece has loose ops).
    """
    topo = problem.topo_order
    cutter = _Cutter(problem, strict)
    anc, desc = cutter.r.anc, cutter.r.desc
    out: list[Piece] = []
    head: int | None = None
    for cut, members in cutter.pieces():
        # loose: not between the two cuts in the graph itself
        loose = frozenset(topo[i] for i in members
                          if (head is not None and not desc[head] >> i & 1)
                          or (cut is not None and not anc[cut] >> i & 1))
        ops = ([head] if head is not None else []) + members
        out.append(Piece(tuple(topo[i] for i in ops), None if head is None else topo[head],
                         None if cut is None else topo[cut], loose))
        head = cut
    return out


def piece_problem(problem: SchedulingProblem, piece: Piece) -> SchedulingProblem:
    """The piece as a problem of its own: its inner edges, and each loose op that does
    not precede the closing cut ordered before it, where the plan of the whole graph
    runs it.  A loose op that does not follow the head is free to start with the head:
    every stream is idle when a cut starts."""
    g = problem.graph.subgraph(piece.ops).copy()
    if piece.tail is not None:
        g.add_edges_from((v, piece.tail) for v in sorted(piece.loose)
                         if not nx.has_path(problem.graph, v, piece.tail))
    return SchedulingProblem(g, problem.streams, problem.sync_latency_us, problem.capacity)


def core_problem(problem: SchedulingProblem, piece: Piece) -> SchedulingProblem:
    """The piece without its loose ops: what lies between its two cuts in the graph."""
    ops = [v for v in piece.ops if v not in piece.loose]
    return SchedulingProblem(problem.graph.subgraph(ops).copy(), problem.streams,
                             problem.sync_latency_us, problem.capacity)


def piece_key(problem: SchedulingProblem, piece: Piece) -> str:
    """Everything a piece's plan and bound depend on, by position in ``piece.ops``:
    equal keys, equal plans (the copies of a repeated layer)."""
    pos = {v: i for i, v in enumerate(piece.ops)}
    g = problem.graph
    form = [
        [problem.duration(v), problem.share(v), v in piece.loose,
         sorted(pos[u] for u in g.predecessors(v) if u in pos), problem.lane(v)]
        for v in piece.ops
    ]
    text = json.dumps([piece.head is not None, piece.tail is not None, form],
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


