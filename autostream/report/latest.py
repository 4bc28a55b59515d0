"""The most recent report of any pass or backend in this process: ``autostream.last_report()``.

A report is kept alive by what it describes (the pass's ``reports``, the compiled
graph the backend returned to Dynamo); this module holds only a weak reference to the
newest one, so a report outlives nothing it describes.  That one reference (``_LATEST``)
is the package's only process-wide state besides its caches: ``last_report()`` must
answer where the user holds no object (``backend="autostream"``).

Every report is also told once, in one log line (INFO, or WARNING for outcomes the user
should hear about), and printed to stderr when ``AUTOSTREAM_VERBOSE=1``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("autostream")

VERBOSE_ENV = "AUTOSTREAM_VERBOSE"


class Report(Protocol):
    def summary(self) -> str: ...


class _Latest:
    """A weak reference to the newest report."""

    def __init__(self) -> None:
        self._ref: weakref.ref | None = None
        self._lock = threading.Lock()

    @property
    def told(self) -> bool:
        """Whether any report was set in this process."""
        return self._ref is not None

    def set(self, report: Any) -> None:
        with self._lock:
            self._ref = weakref.ref(report)

    def get(self) -> Any:
        with self._lock:
            return None if self._ref is None else self._ref()


_LATEST = _Latest()

#: what ``last_report()`` says before the first report, and once its graph is gone
NOT_COMPILED = ("autostream: no graph compiled yet in this process: torch.compile compiles "
                "a model at its first call (call the compiled model, then ask again)")
GONE = ("autostream: the latest report is gone with what it described (the compiled model "
        "or the pass was deleted, or torch._dynamo.reset() ran)")


@dataclass(frozen=True)
class NoReport:
    """What ``last_report()`` returns when there is no report to give: false in a test, with
    a ``summary()`` that says why, and nothing applied.

    >>> report = NoReport(NOT_COMPILED)
    >>> bool(report), report.applied, report.summary()[:46]
    (False, False, 'autostream: no graph compiled yet in this proc')
    """

    reason: str
    applied: bool = False
    plan: None = None

    def __bool__(self) -> bool:
        return False

    def summary(self) -> str:
        return self.reason

    def figures(self) -> dict[str, Any]:
        return {"applied": False, "reason": self.reason}


def last_report() -> Any:
    """The most recent report of any ``AutoStreamPass`` or ``autostream.backend`` in this
    process; before the first (``torch.compile`` compiles at the model's first call), or
    once what it described is gone, a false :class:`NoReport` whose summary says so.

    >>> import torch, autostream
    >>> compiled = torch.compile(torch.nn.Linear(4, 4), backend="autostream")
    >>> with torch.no_grad():
    ...     _ = compiled(torch.randn(2, 4))
    >>> report = autostream.last_report()
    >>> report.summary().splitlines()[0][:62]
    'autostream backend, Dynamo graph of 5 nodes (cpu, inference): '
    >>> report.applied, "cost table 'cpu' (the default of cpu graphs" in report.summary()
    (False, True)
    """
    return _LATEST.get() or NoReport(GONE if _LATEST.told else NOT_COMPILED)


def verbose() -> bool:
    """Whether ``AUTOSTREAM_VERBOSE`` asks for every report to be printed."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def one_line(text: str) -> str:
    """A report's summary as one log line.

    >>> one_line("a: b\\n  c\\n  d")
    'a: b; c; d'
    """
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def announce(report: Report, level: int = logging.INFO) -> None:
    """Make ``report`` the latest, log its summary in one line, print it when verbose."""
    _LATEST.set(report)
    text = report.summary()
    log.log(level, "%s", one_line(text))
    if verbose():
        print(text, file=sys.stderr)


def tell(line: str, level: int = logging.INFO) -> None:
    """A later line about a report (a measured choice made), logged and printed alike."""
    log.log(level, "%s", line)
    if verbose():
        print(line, file=sys.stderr)
