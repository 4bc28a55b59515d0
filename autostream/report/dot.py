"""Graph dump of a plan in Graphviz DOT, like TorchAir's max-autotune dump.

Every stream is a cluster (``stream_k``, the main stream is ``main (0)``), data
dependences are solid edges, and every sync is exactly one dashed red control edge
from the op after which the event is recorded to the op before which it is waited
for.  Join syncs point at an ``<output>`` node on the main stream.  When Graphviz's
``dot`` is on ``PATH`` an SVG is rendered beside the DOT file.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from autostream.report.kinds import kind_colours, op_kinds, stream_name
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule, Sync


def _q(name: object) -> str:
    """A DOT double-quoted ID; a newline becomes DOT's ``\\n`` line break.

    >>> print(_q('a"b' + chr(10) + 'c'))
    "a\\"b\\nc"
    """
    text = str(name).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def rendering() -> str:
    """Whether graph dumps are rendered to SVG here, in words (outputs say it)."""
    if shutil.which("dot"):
        return "*_graph.dot with *_graph.svg rendered by Graphviz"
    return ("*_graph.dot (Graphviz's `dot` is not installed, so no SVG: install graphviz, or "
            "render one with `dot -Tsvg FILE.dot -o FILE.svg`)")


def graph_dot(
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] = (),
    *,
    kinds: Mapping[str, str] | None = None,
    name: str = "autostream",
) -> str:
    """The plan as DOT text: one cluster per stream, one dashed edge per sync.

    >>> import networkx as nx
    >>> from autostream.scheduling.schedule import Sync
    >>> from autostream.scheduling.solvers.base import schedule_from_assignment
    >>> g = nx.DiGraph([("a", "b")]); nx.set_node_attributes(g, 1.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> s = schedule_from_assignment(p, {"a": 0, "b": 1}, "demo")
    >>> text = graph_dot(p, s, [Sync("a", "b"), Sync("b", "<output>")])
    >>> text.count("style=dashed")
    2
    """
    syncs = list(syncs)
    kind = op_kinds(problem, kinds)
    colours = kind_colours(kind)
    lines = [f"digraph {_q(name)} {{", "  rankdir=TB;", "  newrank=true;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [color="#555555"];']
    need_output = any(s.consumer == JOIN for s in syncs)
    for stream, ops in sorted(schedule.stream_sequences().items()):
        cluster = f"cluster_stream_{stream}" if stream >= 0 else f"cluster_link_{-stream}"
        lines.append(f"  subgraph {cluster} {{")
        lines.append(f"    label={_q(stream_name(stream))}; style=rounded; color=\"#999999\";")
        for n in ops:
            label = f"{n}\n{kind[n]} {problem.duration(n):.1f} us"
            lines.append(f"    {_q(n)} [label={_q(label)}, fillcolor={_q(colours[kind[n]] + '55')}];")
        if stream == 0 and need_output:
            lines.append(f"    {_q(JOIN)} [shape=oval, style=solid];")
            need_output = False
        lines.append("  }")
    if need_output:  # no op on the main stream: the output still lives there
        lines.append(f"  {_q(JOIN)} [shape=oval, style=solid];")
    position = {n: i for i, n in enumerate(schedule.order)}
    for u, v in sorted(problem.graph.edges, key=lambda e: (position[e[0]], position[e[1]])):
        lines.append(f"  {_q(u)} -> {_q(v)};")
    for s in syncs:
        # A join edge may pull <output> below the side streams; other syncs must not
        # distort the data-flow layout.
        constraint = "true" if s.consumer == JOIN else "false"
        lines.append(f"  {_q(s.producer)} -> {_q(s.consumer)} "
                     f'[style=dashed, color="#D62728", constraint={constraint}, '
                     'label="record/wait", fontsize=8];')
    main_ops = schedule.stream_sequences().get(0, [])
    if main_ops and any(s.consumer == JOIN for s in syncs):
        # Layout only: the output comes after the main stream's last op.
        lines.append(f"  {_q(main_ops[-1])} -> {_q(JOIN)} [style=invis];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(
    path: str | Path,
    problem: SchedulingProblem,
    schedule: Schedule,
    syncs: Iterable[Sync] = (),
    *,
    kinds: Mapping[str, str] | None = None,
    svg: bool = True,
) -> list[Path]:
    """Write ``path`` (``.dot``) and, when Graphviz's ``dot`` is installed, the SVG beside it.

    Returns the files written; the SVG is silently skipped without Graphviz.
    """
    path = Path(path)
    if path.suffix != ".dot":
        path = path.with_suffix(".dot")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(graph_dot(problem, schedule, syncs, kinds=kinds, name=schedule.solver))
    written = [path]
    exe = shutil.which("dot") if svg else None
    if exe:
        out = path.with_suffix(".svg")
        done = subprocess.run([exe, "-Tsvg", str(path), "-o", str(out)],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            written.append(out)
    return written
