"""What a compiler does to a multi-stream schedule after the pass: a :class:`Placement`.

TorchAir's GE mode, for one, moves ops between streams and syncs onto other ops
(``dialects.torchair_modes``).  The planner checks every multi-stream candidate as
placed (:func:`autostream.planning.evaluate.evaluate`): its syncs, predicted time and memory
are those of the placed plan, so the gain bar and the memory budget bind what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from autostream.scheduling.schedule import Schedule, Sync


@dataclass(frozen=True)
class Placement:
    """A compiler's placement of a multi-stream schedule.

    ``place(schedule, deps)`` returns the schedule the compiler will run (streams and
    launch order; its times are recomputed by the caller) and the syncs it needs;
    ``deps`` are the dependences, a plan's memory-ordering edges included.  ``label``
    names it in the planner's notes.

    >>> s = Schedule("x", {"a": 0, "b": 1}, ("a", "b"), {}, {}, 0.0, 0.0)
    >>> on_main = Placement("on one stream", lambda s, deps: (
    ...     Schedule(s.solver, dict.fromkeys(s.stream_of, 0), s.order, {}, {}, 0.0, 0.0), ()))
    >>> on_main.place(s, nx.DiGraph())[0].streams_used
    1
    """

    label: str
    place: Callable[[Schedule, nx.DiGraph], tuple[Schedule, tuple[Sync, ...]]]
