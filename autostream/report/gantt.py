"""Gantt chart of a plan: one lane per stream, ops coloured by kind, sync arrows.

The picture is drawn with matplotlib's Agg backend (no display needed): the
makespan, the lower bound and (when given and larger) the plan's predicted time with the
runtime's host costs are vertical lines, each named with its figure in the legend; each sync is an arrow from the
producer's end (the ``record``) to the consumer's start (the ``wait``), and a join
sync points at the graph's output on the main stream (a dotted line, when the join
ends after the makespan).  The legend names the kinds of the ops drawn with time
(the rest: "other ops") and the syncs; the memory panel's axis spans the curve, so a
rise of 1% shows.  Large plans stay fast: bars
are drawn as one artist per lane and colour, and beyond 200 syncs the arrows become
plain lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from autostream.memory.budget import format_bytes
from autostream.memory.predict import MemoryProfile
from autostream.report.kinds import kind_colours, op_kinds, stream_name
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.timeline import Timeline

#: Ops are labelled with their name only when the chart has at most this many.
_LABEL_LIMIT = 60
#: Beyond this many syncs, they are drawn as thin lines without arrow heads (speed).
_ARROW_LIMIT = 200
#: Kinds with a colour (and a legend entry) of their own; the rest are "other ops".
LEGEND_KINDS = 10
OTHER = "#BBBBBB"


def gantt_figure(
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] = (),
    *,
    timeline: Timeline | None = None,
    title: str | None = None,
    kinds: Mapping[str, str] | None = None,
    memory: MemoryProfile | None = None,
    predicted_us: float | None = None,
):
    """Build the Gantt chart as a matplotlib ``Figure`` (not attached to pyplot).

    With ``memory``, a second panel under the lanes draws the predicted live bytes
    over the same time axis, with the peak marked.  ``predicted_us``: the plan's predicted
    time when it is more than the makespan (``Plan.predicted_us``: the multi-stream
    runtime's host costs added), drawn as a line of its own, named in the legend.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    tl = timeline or Timeline.from_schedule(schedule, syncs, problem.sync_latency_us)
    kind = op_kinds(problem, kinds)
    timed = {op: kind[op] for op, span in tl.spans.items() if span.duration > 0}
    colours = {k: c for k, c in kind_colours(timed, LEGEND_KINDS).items() if c != OTHER}
    lanes = sorted(set(tl.streams) | {0}, key=lambda s: (s < 0, abs(s)))  # links last
    lane_y = {s: len(lanes) - 1 - i for i, s in enumerate(lanes)}  # main stream on top
    with_runtime = (predicted_us if predicted_us is not None
                    and predicted_us > tl.makespan * (1 + 1e-9) else None)
    horizon = max(tl.makespan, tl.output, schedule.lower_bound, with_runtime or 0.0, 1e-9)

    height = 1.6 + 0.55 * len(lanes)
    fig = Figure(figsize=(11, height + (1.6 if memory is not None else 0.0)), dpi=110)
    if memory is not None:
        grid = fig.add_gridspec(2, 1, height_ratios=[height, 1.6])
        ax = fig.add_subplot(grid[0])
        _memory_panel(fig.add_subplot(grid[1], sharex=ax), memory, horizon)
    else:
        ax = fig.add_subplot(1, 1, 1)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for span in tl.spans.values():
        width = max(span.duration, horizon * 1e-3)  # keep zero-time ops visible
        bars.setdefault((span.stream, colours.get(kind[span.op], OTHER)), []).append(
            (span.start, width))
    for (stream, colour), xs in sorted(bars.items()):  # one artist per lane and colour
        y = lane_y[stream]
        ax.broken_barh(xs, (y - 0.38, 0.76), facecolors=colour, edgecolors="white",
                       linewidth=0.5)
    segments = []
    for ev in tl.syncs:
        if ev.producer not in tl.spans:
            continue
        y0 = lane_y[ev.producer_stream]
        if ev.consumer == JOIN:
            x1, y1 = tl.output, lane_y[0]
        elif ev.consumer in tl.spans:
            x1, y1 = tl.spans[ev.consumer].start, lane_y[ev.consumer_stream]
        else:
            continue
        segments.append(((ev.record, y0), (x1, y1)))
    if segments and tl.output > tl.makespan * (1 + 1e-9):
        ax.axvline(tl.output, color="#D62728", lw=0.8, ls=":",
                   label=f"outputs joined {_us(tl.output)}")
    if len(segments) <= _ARROW_LIMIT:
        for a, b in segments:
            ax.annotate("", xy=b, xytext=a,
                        arrowprops={"arrowstyle": "->", "color": "#D62728", "lw": 0.9,
                                    "shrinkA": 0, "shrinkB": 0})
    else:  # thousands of arrow patches are slow to draw: plain lines instead
        from matplotlib.collections import LineCollection

        ax.add_collection(LineCollection(segments, colors="#D62728", linewidths=0.4,
                                         alpha=0.6))
    ax.axvline(tl.makespan, color="#D62728", lw=1.2,
               label=f"makespan {_us(tl.makespan)} (ops and syncs)")
    if with_runtime is not None:
        ax.axvline(with_runtime, color="#9467BD", lw=1.2, ls="-.",
                   label=f"predicted {_us(with_runtime)} (the makespan and the runtime's "
                         f"host costs)")
    ax.axvline(schedule.lower_bound, color="#2CA02C", lw=1.2, ls="--",
               label=f"lower bound {_us(schedule.lower_bound)}")
    ax.set_yticks([lane_y[s] for s in lanes])
    ax.set_yticklabels([stream_name(s) for s in lanes])
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.set_xlim(0, horizon * 1.04)
    ax.set_xlabel("" if memory is not None else "time (us)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"{schedule.solver}: {counted(len(tl.spans), 'op')} on "
                 f"{counted(len(tl.streams), 'stream')}, {counted(len(tl.syncs), 'sync')}",
                 fontsize=10)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    if any(colour == OTHER for _, colour in bars):
        handles.append(Patch(color=OTHER, label="other ops"))
    if segments:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="#D62728", lw=0.9, marker=">", markersize=4,
                              label=f"sync ({len(segments)})"))
    line_handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=line_handles + handles, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize=7, frameon=False)
    fig.tight_layout()
    if len(tl.spans) <= _LABEL_LIMIT:
        _label_bars(fig, ax, [sp for sp in tl.spans.values() if sp.duration > 0], lane_y)
    return fig


def counted(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless one.

    >>> counted(1, "stream"), counted(3, "sync")
    ('1 stream', '3 syncs')
    """
    return f"{n} {word}{'s' * (n != 1)}"


def _us(x: float) -> str:
    """Every figure of a chart in one form.

    >>> _us(7720.84), _us(3.0)
    ('7,720.8 us', '3.0 us')
    """
    return f"{x:,.1f} us"


def _label_bars(fig, ax, spans, lane_y: Mapping[int, int]) -> None:
    """Each op's name inside its bar, cut to the bar's width (ending in "…"), or none where
    not even two characters fit: a label never runs over its neighbours.  Measured on the
    laid-out chart, so call it after ``tight_layout``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = (fig.canvas if isinstance(fig.canvas, FigureCanvasAgg)
                else FigureCanvasAgg(fig)).get_renderer()
    for span in spans:
        (x0, _), (x1, _) = ax.transData.transform([(span.start, 0.0), (span.end, 0.0)])
        room = x1 - x0 - 2.0  # pixels, one of margin each side
        name = str(span.op)
        text = ax.text((span.start + span.end) / 2, lane_y[span.stream], name, ha="center",
                       va="center", fontsize=6, clip_on=True)
        width = text.get_window_extent(renderer).width
        keep = len(name) if width <= room else int(len(name) * room / max(width, 1e-9))
        while keep >= 2 and width > room:
            text.set_text(name[:keep - 1] + "…")
            width = text.get_window_extent(renderer).width
            keep -= 1
        if width > room:
            text.remove()


def _memory_panel(ax, memory: MemoryProfile, horizon: float) -> None:
    """Live bytes (MiB) as a step curve, the peak as a dashed line."""
    times = [min(t, horizon * 1.04) for t, _ in memory.curve] + [horizon * 1.04]
    mib = [b / 2**20 for _, b in memory.curve]
    low, high = min(mib), max(mib)
    pad = max(0.1 * (high - low), 1e-3 * high, 1e-6)
    floor = max(0.0, low - pad)  # the axis spans the curve: a small rise stays visible
    ax.step(times, [*mib, mib[-1]], where="post", color="#1F77B4", lw=1.0)
    ax.fill_between(times, [*mib, mib[-1]], floor, step="post", color="#1F77B4", alpha=0.15)
    ax.set_ylim(floor, high + pad)
    ax.axhline(memory.peak_bytes / 2**20, color="#1F77B4", lw=0.8, ls="--",
               label=f"peak {format_bytes(memory.peak_bytes)}")
    ax.set_ylabel("live MiB", fontsize=8)
    ax.set_xlabel("time (us)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)


def gantt_png(
    path: str | Path,
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] = (),
    *,
    timeline: Timeline | None = None,
    title: str | None = None,
    kinds: Mapping[str, str] | None = None,
    memory: MemoryProfile | None = None,
    predicted_us: float | None = None,
) -> Path:
    """Write the Gantt chart of ``schedule`` to ``path`` (PNG) and return the path.

    >>> import networkx as nx, tempfile, os
    >>> from autostream.scheduling.solvers import solve
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> out = gantt_png(os.path.join(tempfile.mkdtemp(), "g.png"), p, solve(p, "heft"))
    >>> out.stat().st_size > 1000
    True
    """
    fig = gantt_figure(problem, schedule, syncs, timeline=timeline, title=title, kinds=kinds,
                       memory=memory, predicted_us=predicted_us)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
