"""The head-body-tail bound: every op splits the graph into what must end before it starts
and what must start after it ends.

For an op ``v``, all its ancestors end before ``v`` starts, so ``v`` cannot start
before the longest path into it, nor before the ancestors' contended work fits in the
device (``work x share / capacity``), their stream work in the streams, or any one
link's transfers among them on that link; its descendants likewise after ``v``
ends.  ``head(v) + duration(v) + tail(v)`` bounds the makespan, for every ``v``,
with heads and tails propagated along the edges (a predecessor's head plus its
duration is a head too).  Between two ops ``u`` and ``v`` on a path, the ops that
descend from ``u`` and lead to ``v`` run after ``u`` ends and before ``v`` starts,
so ``head(v) >= head(u) + duration(u) + their work`` (by the same three measures):
for problems of up to ``PAIRWISE_MAX_OPS`` ops (cubic).

Graham's bound sees each resource's total work but not when it can run.  This bound
sees work that must queue behind an op that overlaps little: an expert-parallel MoE
block, whose routed experts cannot start before the dispatch all-to-all ends, nor the
combine before they all do, has its experts' device time, both transfers and the
ops around them in one chain, which Graham's ``max`` counts separately.

Valid under the simulator's processor sharing: an op never runs faster than its
duration, and the device never does more than ``capacity`` of contended work per
unit of time.  Quadratic in the ops (a boolean ancestor matrix), so it is computed
for problems of up to ``MAX_OPS`` ops (the pieces of a large graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autostream.scheduling.problem import SchedulingProblem

#: problems larger than this get no head-body-tail bound (its matrix is n x n); with
#: MIN_OPS or fewer it cannot beat Graham's (a chain of two is the critical path)
MAX_OPS, MIN_OPS = 3000, 2
#: problems larger than this get no bound between pairs of ops (n x n x n products)
PAIRWISE_MAX_OPS = 400


@dataclass(frozen=True)
class PrecedenceEnergy:
    """What the bound needs of a problem, in topological order, at any capacity."""

    duration: np.ndarray
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    #: per op, its ancestors' (descendants') contended work, at capacity 1
    contended_before: np.ndarray
    contended_after: np.ndarray
    #: per op, the larger of its ancestors' (descendants') stream work over the streams and
    #: their busiest link's work: capacity-free
    queued_before: np.ndarray
    queued_after: np.ndarray
    #: ``[u, v]``: the contended work of the ops between ``u`` and ``v`` at capacity 1,
    #: and the larger of their stream work over the streams and their busiest link's
    #: work; ``None`` beyond ``PAIRWISE_MAX_OPS`` ops
    contended_between: np.ndarray | None = None
    queued_between: np.ndarray | None = None
    ancestors: np.ndarray | None = None

    @classmethod
    def of(cls, problem: SchedulingProblem) -> PrecedenceEnergy | None:
        """``None`` for a problem over ``MAX_OPS`` ops or of ``MIN_OPS`` or fewer."""
        order = problem.topo_order
        n = len(order)
        if n <= MIN_OPS or n > MAX_OPS:
            return None
        index = {v: i for i, v in enumerate(order)}
        preds = tuple(tuple(sorted(index[u] for u in problem.graph.predecessors(v))) for v in order)
        succs = tuple(tuple(sorted(index[w] for w in problem.graph.successors(v))) for v in order)
        ancestors = np.zeros((n, n), dtype=bool)
        for i in range(n):
            for u in preds[i]:
                ancestors[i] |= ancestors[u]
                ancestors[i, u] = True
        # above[v, x]: x precedes v; below[u, x]: x follows u
        above, below = ancestors.astype(float), ancestors.T.astype(float)
        duration = np.array([problem.duration(v) for v in order])
        contended = duration * np.array([problem.share(v) for v in order])
        pinned = problem.pinned
        stream_work = np.where([v not in pinned for v in order], duration, 0.0)
        links = [np.where([pinned.get(v) == k for v in order], duration, 0.0)
                 for k in sorted(set(pinned.values()))]

        def queued(among: np.ndarray) -> np.ndarray:
            out = among @ stream_work / problem.streams
            for work in links:
                out = np.maximum(out, among @ work)
            return out

        def between(work: np.ndarray) -> np.ndarray:  # [u, v]: after u and before v
            return (below * work[None, :]) @ above.T

        pairwise = {}
        if n <= PAIRWISE_MAX_OPS:
            queued_between = between(stream_work) / problem.streams
            for work in links:
                queued_between = np.maximum(queued_between, between(work))
            pairwise = {"contended_between": between(contended),
                        "queued_between": queued_between, "ancestors": ancestors}
        return cls(duration, preds, succs, above @ contended, below @ contended,
                   queued(above), queued(below), **pairwise)

    def bound(self, capacity: float) -> float:
        """``max over ops of head + duration + tail`` at ``capacity``.

        >>> import networkx as nx
        >>> g = nx.DiGraph([("a", "x"), ("b", "x"), ("x", "c"), ("x", "d")])
        >>> nx.set_node_attributes(g, 4.0, "duration"); nx.set_node_attributes(g, 1.0, "share")
        >>> g.nodes["x"]["share"] = 0.0
        >>> p = SchedulingProblem(g, streams=4)
        >>> p.lower_bound(), PrecedenceEnergy.of(p).bound(1.0)
        (16.0, 20.0)
        """
        n = len(self.duration)
        head = self.contended_before / capacity
        head = np.maximum(head, self.queued_before)
        gap = (None if self.contended_between is None else
               self.duration[:, None] + np.maximum(self.contended_between / capacity,
                                                   self.queued_between))
        for i in range(n):
            for u in self.preds[i]:
                head[i] = max(head[i], head[u] + self.duration[u])
            if gap is not None and self.ancestors[i].any():
                above = self.ancestors[i]
                head[i] = max(head[i], float(np.max(head[above] + gap[above, i])))
        tail = np.maximum(self.contended_after / capacity, self.queued_after)
        for i in reversed(range(n)):
            for w in self.succs[i]:
                tail[i] = max(tail[i], tail[w] + self.duration[w])
        return float(np.max(head + self.duration + tail))
