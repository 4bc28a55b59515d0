"""Chrome / Perfetto trace JSON of a plan (open it in https://ui.perfetto.dev).

Format: the Trace Event Format's JSON object form, ``{"traceEvents": [...]}``.
Every timeline is one process (``pid``): the prediction is pid 1 and a measured
run, when given, pid 2.  Every stream is one thread (``tid`` = stream index) named
by a ``thread_name`` metadata event.  Ops are complete (``"X"``) events with
``ts``/``dur`` in microseconds; each sync is a flow (``"s"`` on the producer's
slice, ``"f"`` on the consumer's), drawn by Perfetto as an arrow.  Join syncs
(consumer ``<output>``) have no slice to land on and are listed in ``args``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from autostream.report.kinds import op_kinds, stream_name
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.timeline import Timeline

PREDICTED_PID = 1
MEASURED_PID = 2


def _process_events(
    timeline: Timeline, pid: int, name: str, kinds: Mapping[str, str],
    problem: SchedulingProblem, flow_base: int,
) -> list[dict[str, Any]]:
    # A measured run starts at an arbitrary clock value: shift it to start at 0.
    origin = min((s.start for s in timeline.spans.values()), default=0.0)
    origin = min(origin, 0.0) if pid == PREDICTED_PID else origin
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}},
    ]
    for s in timeline.streams:
        events.append({"ph": "M", "pid": pid, "tid": s, "name": "thread_name",
                       "args": {"name": stream_name(s)}})
        events.append({"ph": "M", "pid": pid, "tid": s, "name": "thread_sort_index",
                       "args": {"sort_index": s}})
    for span in timeline.spans.values():
        graph_data = problem.graph.nodes[span.op] if span.op in problem.graph else {}
        events.append({
            "ph": "X", "pid": pid, "tid": span.stream, "name": str(span.op),
            "cat": kinds.get(span.op, "op"),
            "ts": span.start - origin, "dur": max(span.duration, 0.0),
            "args": {"stream": span.stream,
                     "modelled_us": graph_data.get("duration"),
                     "share": graph_data.get("share", 0.0)},
        })
    flow = flow_base
    for ev in timeline.syncs:
        if ev.consumer == JOIN or ev.consumer not in timeline.spans:
            continue
        p, c = timeline.spans[ev.producer], timeline.spans[ev.consumer]
        flow += 1
        common = {"pid": pid, "name": "record/wait", "cat": "sync", "id": flow}
        # Flow events bind to the slice enclosing their timestamp: use slice midpoints.
        events.append({**common, "ph": "s", "tid": p.stream,
                       "ts": (p.start + p.end) / 2 - origin})
        events.append({**common, "ph": "f", "bp": "e", "tid": c.stream,
                       "ts": (c.start + c.end) / 2 - origin})
    return events


def chrome_trace(
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] = (),
    *,
    measured: Timeline | None = None,
    timeline: Timeline | None = None,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The trace of the predicted timeline (and of ``measured`` when given) as a dict.

    >>> import networkx as nx
    >>> from autostream.scheduling.solvers import solve
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> t = chrome_trace(p, solve(p, "heft"))
    >>> sorted({e["tid"] for e in t["traceEvents"] if e["ph"] == "X"})
    [0, 1]
    """
    syncs = list(syncs)
    tl = timeline or Timeline.from_schedule(schedule, syncs, problem.sync_latency_us)
    kind = op_kinds(problem, kinds)
    events = _process_events(tl, PREDICTED_PID, f"predicted: {schedule.solver}", kind, problem, 0)
    if measured is not None:
        events += _process_events(measured, MEASURED_PID, f"measured: {measured.label}", kind,
                                  problem, len(events))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "solver": schedule.solver,
            "predicted_makespan_us": schedule.makespan,
            "lower_bound_us": schedule.lower_bound,
            "measured_makespan_us": measured.makespan if measured is not None else None,
            "syncs": len(syncs),
            "join_syncs": [s.producer for s in syncs if s.consumer == JOIN],
        },
    }


def write_trace(
    path: str | Path,
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] = (),
    *,
    measured: Timeline | None = None,
    timeline: Timeline | None = None,
    kinds: Mapping[str, str] | None = None,
) -> Path:
    """Write :func:`chrome_trace` as JSON to ``path`` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = chrome_trace(problem, schedule, syncs, measured=measured, timeline=timeline,
                        kinds=kinds)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path
