"""Headline rows: the few figures of each experiment atop ``RESULTS.md`` (the first, and
how many targets are met, in the README's summary).

Each experiment script ends with :func:`record`, passing rows it computed from what it
measured in that run (``met`` compares the measured figure with the target; ``None``
where the row only informs).  A row names the machine its figure was measured on
(``machine``: ``run_all`` fills in the machine it ran the script on where the script
did not) and, for a timing, its load; a figure timed while the machine was busy
(``autostream.runtime.machine``) is ``unreliable``, with the reason, and meets no target.  ``run_all`` points ``AUTOSTREAM_HEADLINES`` at
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
    #: the machine the figure was measured on, and its load while timed ("" unknown)
    machine: str = ""
    #: why the figure is unreliable (the machine was busy while it was timed); such a
    #: figure never meets its target: ``met`` is then ``False`` (or ``None``)
    unreliable: str = ""

    def __post_init__(self) -> None:
        if self.met is not None and not isinstance(self.met, bool):
            raise TypeError(f"Headline.met must be True, False or None, got {self.met!r} "
                            "(wrap a comparison of numpy values in bool())")
        if self.unreliable and self.met:
            object.__setattr__(self, "met", False)

    @property
    def shown(self) -> str:
        """The measured figure as printed: marked when unreliable.

        >>> Headline("x", "7.01x", ">= 1.3x", True, unreliable="busy: load 3.1").shown
        '7.01x (unreliable, busy: load 3.1)'
        """
        return f"{self.measured} (unreliable, {self.unreliable})" if self.unreliable else self.measured


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
    """One markdown table: what | measured | target | met (| run | machine: each row's run
    and machine, when runs are given).  An unreliable figure says so and why.

    >>> print(markdown([Headline("x", "1", "-", None, "AMD EPYC, 2 cores")],
    ...                runs=["2026-12-04 15:00 UTC"]))
    | what | measured | target | met | run | machine |
    |---|---|---|---|---|---|
    | x | 1 | - | - | 2026-12-04 15:00 UTC | AMD EPYC, 2 cores |
    """
    lines = ["| what | measured | target | met |" + (" run | machine |" if runs is not None else ""),
             "|---|---|---|---|" + ("---|---|" if runs is not None else "")]
    for i, r in enumerate(rows):
        cells = (r.what, r.shown, r.target, MET[r.met],
                 *((runs[i], r.machine or "-") if runs is not None else ()))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
