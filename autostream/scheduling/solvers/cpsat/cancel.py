"""Stopping the CP-SAT searches of one thread from another: a background plan cancelled
(its graph dropped, the interpreter exiting) must not run its searches to their limits.

A thread that plans inside :func:`cancellable` registers every solver it makes
(:func:`watch`); :meth:`CancelScope.cancel` stops the searches under way
(``CpSolver.stop_search``, safe from another thread) and makes the next ``watch`` raise
:class:`Cancelled`.  A solve under a cancelled scope is not stored in the plan cache: a
stopped search is not the plan its options give.  A scope with a ``fallback`` answers
every solve from the plan cache, else with ``fallback`` (a fast solver), and notes the
miss (``missed``): the compile's fast plan, which is CP-SAT's wherever the cache has it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # OR-Tools loads only to solve (``tests/test_import_cost.py``)
    from ortools.sat.python import cp_model


class Cancelled(Exception):
    """The scope was cancelled: the plan is abandoned."""


class CacheMiss(Exception):
    """A scope with a ``fallback`` needed a CP-SAT search its fallback cannot stand for."""


class CancelScope:
    """The searches of one plan, stoppable from any thread.

    >>> scope = CancelScope()
    >>> scope.cancel(); scope.cancelled
    True
    """

    def __init__(self, fallback: Callable[..., Any] | None = None,
                 deterministic: bool = False) -> None:
        #: the solver that answers a solve the plan cache cannot (``None``: CP-SAT searches)
        self.fallback = fallback
        #: the searches stop on CP-SAT's deterministic clock alone (``wall_clock=False``): a
        #: background plan has no caller waiting, and must be the plan its options give
        self.deterministic = deterministic
        #: whether some solve was answered by ``fallback``
        self.missed = False
        self._event = threading.Event()
        self._solvers: weakref.WeakSet[cp_model.CpSolver] = weakref.WeakSet()
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        """Stop the searches under way; later ones raise :class:`Cancelled`."""
        with self._lock:
            self._event.set()
            solvers = list(self._solvers)
        for solver in solvers:
            solver.stop_search()

    def add(self, solver: cp_model.CpSolver) -> None:
        with self._lock:
            if self._event.is_set():
                raise Cancelled("the plan was cancelled")
            if self.fallback is not None:
                raise CacheMiss("the plan needs a CP-SAT search (not in the plan cache)")
            self._solvers.add(solver)


_local = threading.local()


@contextlib.contextmanager
def cancellable(scope: CancelScope) -> Iterator[CancelScope]:
    """The solves this thread makes inside the block belong to ``scope``."""
    previous = getattr(_local, "scope", None)
    _local.scope = scope
    try:
        yield scope
    finally:
        _local.scope = previous


def current() -> CancelScope | None:
    """The scope of this thread's solves, or ``None``."""
    return getattr(_local, "scope", None)


def watch(solver: cp_model.CpSolver) -> cp_model.CpSolver:
    """Register ``solver`` with this thread's scope (raises :class:`Cancelled` once it is
    cancelled); without a scope, nothing."""
    scope = current()
    if scope is not None:
        scope.add(solver)
    return solver
