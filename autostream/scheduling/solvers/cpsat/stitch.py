"""Stitch the plans of the pieces into one plan of the whole graph.

Each distinct piece was planned once, as a problem of its own; its plan is kept
by position in ``Piece.ops`` (``PieceLayout``) and stamped onto every copy.  A
piece's streams are renumbered so that its head keeps the stream the previous
piece gave it (no sync at the cut) and its other streams take the remaining ones
in order; its ops are launched in the piece plan's order, after the previous
piece's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.cpsat.pieces import Piece


@dataclass(frozen=True)
class PieceLayout:
    """A piece's plan by position in ``Piece.ops``."""

    stream: tuple[int, ...]  # the stream of each op
    order: tuple[int, ...]  # the launch order, as positions

    @classmethod
    def of(cls, piece: Piece, schedule: Schedule) -> PieceLayout:
        pos = {v: i for i, v in enumerate(piece.ops)}
        return cls(tuple(schedule.stream_of[v] for v in piece.ops),
                   tuple(pos[v] for v in schedule.order))


def stitch(pieces: Sequence[Piece], layouts: Sequence[PieceLayout | None],
           streams: int) -> tuple[dict[str, int], tuple[str, ...]]:
    """``(stream_of, launch order)`` of the whole graph; a piece without a layout
    (one op after its head) runs on its head's stream (on stream 0 after a head on a
    link: a collective's transfer has no stream to hand on).

    >>> a, b = Piece(("x", "y"), None, "y"), Piece(("y", "z", "w"), "y", None)
    >>> stitch([a, b], [None, PieceLayout((1, 1, 0), (0, 2, 1))], streams=2)
    ({'x': 0, 'y': 0, 'w': 1, 'z': 0}, ('x', 'y', 'w', 'z'))
    """
    stream_of: dict[str, int] = {}
    order: list[str] = []
    for piece, layout in zip(pieces, layouts, strict=True):
        if layout is None:
            s = max(stream_of[piece.head], 0) if piece.head is not None else 0
            for v in piece.own:
                stream_of[v] = s
                order.append(v)
            continue
        renumber = _renumber(piece, layout, stream_of, streams)
        for i in layout.order:
            v = piece.ops[i]
            if v != piece.head:
                stream_of[v] = renumber[layout.stream[i]]
                order.append(v)
    return stream_of, tuple(order)


def _renumber(piece: Piece, layout: PieceLayout, stream_of: dict[str, int],
              streams: int) -> dict[int, int]:
    """Local streams -> global ones: the head's keeps the head's, the others take the rest.
    Lanes (negative) stay as they are (the caller pins their ops again); a head on a
    lane (a collective's transfer) has no stream to carry over the cut, so the piece's
    streams stay as they are too."""
    renumber = {s: s for s in layout.stream if s < 0}
    if piece.head is None or layout.stream[0] < 0 or stream_of[piece.head] < 0:
        return {**renumber, **{s: s for s in range(streams)}}
    renumber[layout.stream[0]] = stream_of[piece.head]
    spare = iter(s for s in range(streams) if s != stream_of[piece.head])
    for i in layout.order:
        s = layout.stream[i]
        if s not in renumber:
            renumber[s] = next(spare)
    return renumber
