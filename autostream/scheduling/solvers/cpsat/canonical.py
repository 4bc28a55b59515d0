"""The canonical form of a scheduling problem: its content by position, not by op name.

Two problems with the same canonical form get the same plan (up to renaming): the
ops in topological order (ties by program order), each with its duration, device
share, the positions of its predecessors and its lane (a collective's transfer on a
process group's link), plus the stream count, the sync
latency and the capacity.  Identical layers of a model have identical forms: their
ops come from the same code, with the same shapes, so the same costs.  The digest
keys both the in-process reuse of pieces and the persistent plan cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from autostream.scheduling.problem import SchedulingProblem


def canonical_form(problem: SchedulingProblem) -> list:
    """``[streams, latency, capacity, [[duration, share, [pred positions]], ...]]``.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("x", "y")]); nx.set_node_attributes(g, 1.5, "duration")
    >>> canonical_form(SchedulingProblem(g, streams=2))
    [2, 0.0, 1.0, [[1.5, 0.0, []], [1.5, 0.0, [0]]]]
    """
    pos = problem.topo_index
    g = problem.graph
    ops = [
        [problem.duration(v), problem.share(v), sorted(pos[u] for u in g.predecessors(v)),
         *([problem.lane(v)] if problem.lane(v) is not None else [])]  # a link's transfer
        for v in problem.topo_order
    ]
    return [problem.streams, problem.sync_latency_us, problem.capacity, ops]


def digest(problem: SchedulingProblem, extra: Iterable[object] = ()) -> str:
    """sha256 hex of the canonical form and ``extra`` (JSON-able): equal for renamed copies.

    >>> import networkx as nx
    >>> a = nx.DiGraph([("x", "y")]); nx.set_node_attributes(a, 1.0, "duration")
    >>> b = nx.relabel_nodes(a, {"x": "p", "y": "q"})
    >>> digest(SchedulingProblem(a, 2)) == digest(SchedulingProblem(b, 2))
    True
    """
    text = json.dumps([canonical_form(problem), list(extra)], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
