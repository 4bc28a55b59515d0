"""Headline rows: the few figures of each experiment atop ``RESULTS.md`` (the first, and
how many targets are met, in the README's summary).

Each experiment script ends with :func:`record`, passing rows it computed from what it
measured in that run (``met`` compares the measured figure with the target; ``None``
where the row only informs).  ``run_all`` points ``AUTOSTREAM_HEADLINES`` at
``experiments/headlines/``, where each script's rows land as ``<script>.json``, and
renders them all as one table.  A script run by hand prints its rows to stderr and
writes nothing, so a partial run never replaces the rows of a full one.

>>> rows = [Headline("two GEMV chains: speed-up", "1.42x", ">= 1.3x", 1.42 >= 1.3)]
>>> print(markdown(rows))
| what | measured | target | met |
|---|---|---|---|
| two GEMV chains: speed-up | 1.42x | >= 1.3x | yes |
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: the directory ``record`` writes to; unset: print only
ENV = "AUTOSTREAM_HEADLINES"
MET = {True: "yes", False: "**no**", None: "-"}


@dataclass(frozen=True)
class Headline:
    """One row: what was measured, the figure, the target and whether the figure meets it."""

    what: str
    measured: str
    target: str
    #: computed from the measured figure; ``None``: informational, no target to meet
    met: bool | None

    def __post_init__(self) -> None:
        if self.met is not None and not isinstance(self.met, bool):
            raise TypeError(f"Headline.met must be True, False or None, got {self.met!r} "
                            "(wrap a comparison of numpy values in bool())")


def record(script: str, rows: Sequence[Headline]) -> Path | None:
    """Write ``rows`` as ``<script stem>.json`` under ``$AUTOSTREAM_HEADLINES``; print them
    to stderr when it is unset.  Returns the file written, if any."""
    where = os.environ.get(ENV)
    if not where:
        print(markdown(rows), file=sys.stderr)
        return None
    path = Path(where) / f"{Path(script).stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return path


def load(path: Path) -> list[Headline]:
    """The rows :func:`record` wrote to ``path``."""
    return [Headline(**row) for row in json.loads(path.read_text())]


def markdown(rows: Sequence[Headline], runs: Sequence[str] | None = None) -> str:
    """One markdown table: what | measured | target | met (| run: each row's run, when given).

    >>> print(markdown([Headline("x", "1", "-", None)], runs=["2026-12-04 15:00 UTC"]))
    | what | measured | target | met | run |
    |---|---|---|---|---|
    | x | 1 | - | - | 2026-12-04 15:00 UTC |
    """
    lines = ["| what | measured | target | met |" + (" run |" if runs is not None else ""),
             "|---|---|---|---|" + ("---|" if runs is not None else "")]
    for i, r in enumerate(rows):
        cells = (r.what, r.measured, r.target, MET[r.met],
                 *((runs[i],) if runs is not None else ()))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
