"""Op kinds (for colours and trace categories) from the task graph's node attributes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from autostream.scheduling.problem import SchedulingProblem

#: Kind used when a node has neither ``kind`` nor ``target``.
DEFAULT_KIND = "op"
OTHER_KIND = "other"

# Colour-blind-friendly qualitative palette (Okabe-Ito, then tab10 extras).
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
    "#D55E00", "#F0E442", "#8C564B", "#7F7F7F", "#17BECF",
)


def short_kind(target: str) -> str:
    """``"aten.mm.default"`` -> ``"mm"``; ``"aten.add.Tensor"`` -> ``"add"`` (overload dropped).

    >>> short_kind("aten.mm.default"), short_kind("operator.getitem"), short_kind("relu")
    ('mm', 'getitem', 'relu')
    """
    parts = str(target).split(".")
    if len(parts) >= 3:
        return parts[-2]
    return parts[-1]


def op_kinds(
    problem: SchedulingProblem, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Kind of every op: ``overrides`` first, then node attr ``kind``, then ``target``.

    Dotted ATen targets are shortened (``aten.mm.default`` -> ``mm``).

    >>> import networkx as nx
    >>> g = nx.DiGraph(); g.add_node("a", duration=1.0, target="aten.mm.default")
    >>> g.add_node("b", duration=1.0)
    >>> op_kinds(SchedulingProblem(g, streams=1))
    {'a': 'mm', 'b': 'op'}
    """
    out: dict[str, str] = {}
    for n, data in problem.graph.nodes(data=True):
        if overrides and n in overrides:
            out[n] = str(overrides[n])
        elif data.get("kind") is not None:
            out[n] = short_kind(str(data["kind"]))
        elif data.get("target") is not None:
            out[n] = short_kind(str(data["target"]))
        else:
            out[n] = DEFAULT_KIND
    return out


def kind_colours(kinds: Mapping[str, str], limit: int = len(PALETTE) - 1) -> dict[str, str]:
    """Colour per kind: the ``limit`` most frequent kinds get their own, the rest share grey.

    Deterministic: ties in frequency are broken by name.

    >>> kind_colours({"a": "mm", "b": "mm", "c": "add"})
    {'mm': '#0072B2', 'add': '#E69F00'}
    """
    counts = Counter(kinds.values())
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    colours = {k: PALETTE[i] for i, k in enumerate(ranked[:limit])}
    for k in ranked[limit:]:
        colours[k] = "#BBBBBB"
    return colours


def stream_name(stream: int) -> str:
    """Display name of a stream: ``"main (0)"``, TorchAir's ``"stream_k"``, or a
    process group's link (a lane, negative numbers: ``problem.links``).

    >>> stream_name(0), stream_name(2), stream_name(-1)
    ('main (0)', 'stream_2', 'link_1')
    """
    if stream < 0:
        return f"link_{-stream}"
    return "main (0)" if stream == 0 else f"stream_{stream}"
