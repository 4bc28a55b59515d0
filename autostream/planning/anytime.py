"""Anytime planning: a heuristic plan at once, CP-SAT's plan of the same graph in a thread.

The backend's compile returns with a fast plan (the best predicted of HEFT and the cheap
baselines, :func:`fast_solve`; then the memory fit, verified like any plan; CP-SAT's own
plan wherever the plan cache has it); a :class:`BackgroundPlan` then runs the synchronous pass on a copy of the graph
taken before the rewrite (:func:`copy_module`), so its plan is the one a synchronous
compile with the same options gives (the same function on the same graph; CP-SAT stops on
its deterministic clock), and its CP-SAT solves fill the plan cache as a synchronous solve
would.  OR-Tools releases the GIL while it searches.

Safety (``docs/design.md``):

1. **Lifetime.**  The thread is a daemon; :meth:`BackgroundPlan.cancel` stops its CP-SAT
   searches at once (``solvers.cpsat.cancel``) and discards the result.  The backend
   cancels a graph's plan when Dynamo drops the graph (a ``weakref.finalize``), and every
   plan still running is cancelled and joined (at most ``JOIN_AT_EXIT_S``) at exit.
2. **Fork.**  In a child process no plan thread exists: every plan the parent had is
   ``forked`` there (never started, never waited for); the child runs the fast plans.
3. **Ranks.**  The pass plans graphs that communicate synchronously: every rank reaches
   the same plan before its first call (``passes.AutoStreamPass``).

``AUTOSTREAM_ANYTIME=off`` plans every graph synchronously (the test suite sets it, so
that no result depends on when a thread finishes).
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.fx
from torch.fx._lazy_graph_module import _make_graph_module

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers import get_solver
from autostream.scheduling.solvers.cpsat.cancel import Cancelled, CancelScope, cancellable

log = logging.getLogger("autostream")

ANYTIME_ENV = "AUTOSTREAM_ANYTIME"
#: the solvers whose best predicted plan a compile returns with, while CP-SAT plans in the
#: background: HEFT and the two of the cheap baselines CP-SAT's own choice weighs that won
#: on the zoo (opara: parallel, multihead; critical_path: two_branch_gemv), in the order
#: ties go (one stream is the planner's own candidate)
FAST_SOLVERS = ("heft", "critical_path", "opara")
#: the longest the interpreter's exit waits for a cancelled plan's thread (seconds)
JOIN_AT_EXIT_S = 5.0


def anytime_from_environment() -> bool:
    """Whether the backend plans in the background (``AUTOSTREAM_ANYTIME``, default on).

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {ANYTIME_ENV: "off"}):
    ...     anytime_from_environment()
    False
    >>> with mock.patch.dict(os.environ, {ANYTIME_ENV: "later"}):
    ...     anytime_from_environment()
    Traceback (most recent call last):
    ...
    ValueError: AUTOSTREAM_ANYTIME='later': use 'on' (the default: CP-SAT improves a fast plan in the background) or 'off' (plan synchronously)
    """
    value = os.environ.get(ANYTIME_ENV, "on").strip().lower()
    if value in ("on", "1", "true", "yes", ""):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"{ANYTIME_ENV}={os.environ[ANYTIME_ENV]!r}: use 'on' (the default: "
                     f"CP-SAT improves a fast plan in the background) or 'off' (plan "
                     f"synchronously)")


def fast_solve(problem: SchedulingProblem) -> Schedule:
    """The fastest predicted plan of ``FAST_SOLVERS`` (ties: fewer streams, then their
    order): CP-SAT's candidates without its searches, in hundredths of a second.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 10.0, "duration")
    >>> s = fast_solve(SchedulingProblem(g, streams=2))
    >>> s.makespan, s.streams_used
    (20.0, 2)
    """
    plans = [get_solver(name)(problem) for name in FAST_SOLVERS]
    return min(plans, key=lambda s: (round(s.makespan, 6), s.streams_used))


def load_cpsat() -> None:
    """Import what a CP-SAT solve imports on use (a ``BackgroundPlan``'s ``prepare``)."""
    import autostream.scheduling.solvers.cpsat.planner  # noqa: F401


def copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with its own graph (same node names and meta, shared parameters),
    which a rewrite of ``gm`` leaves as it is.

    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    >>> twin = copy_module(gm)
    >>> [n.name for n in twin.graph.nodes] == [n.name for n in gm.graph.nodes]
    True
    >>> twin.graph is gm.graph
    False
    """
    graph = torch.fx.Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    out, node = graph.graph_copy(gm.graph, {}, return_output_node=True)
    new = graph.output(out, type_expr=node.type)
    new.meta = copy.copy(node.meta)
    return _make_graph_module(gm, graph)  # generates its code when first called


# every plan not yet finished or cancelled: cancelled and joined at exit, forked in a child
_LIVE: weakref.WeakSet[BackgroundPlan] = weakref.WeakSet()


class BackgroundPlan:
    """``work()`` (a synchronous plan) run once, in a daemon thread, on :meth:`start`.

    ``state``: ``waiting`` (not started), ``running``, ``done`` (``result`` set),
    ``failed`` (``error`` set), ``cancelled`` or ``forked`` (started in a parent process:
    no thread here).

    >>> job = BackgroundPlan(lambda: 6 * 7)
    >>> job.start(); job.wait(10), job.state, job.result
    (True, 'done', 42)
    """

    def __init__(self, work: Callable[[], Any], gm: torch.fx.GraphModule | None = None,
                 prepare: Callable[[], Any] | None = None) -> None:
        self._work: Callable[[], Any] | None = work
        #: run by :meth:`start` in the caller's thread: the modules ``work`` imports, which a
        #: thread must not import while the caller imports others (Python's per-module
        #: import locks, taken in another order, hand one of them a half-initialised module)
        self._prepare = prepare
        #: the graph ``work`` plans (and rewrites), when it is a graph's plan
        self.gm = gm
        self._scope = CancelScope(deterministic=True)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = "waiting"
        self.result: Any = None
        self.error: BaseException | None = None
        #: seconds the plan took in its thread (``None`` until it ends)
        self.seconds: float | None = None
        _LIVE.add(self)

    @property
    def finished(self) -> bool:
        """Whether the plan has ended (done or failed; not cancelled or forked)."""
        return self.state in ("done", "failed")

    def start(self) -> None:
        """Start the thread (once; a cancelled or forked plan stays so)."""
        if self.state != "waiting":
            return
        if self._prepare is not None:
            self._prepare()
        self.state = "running"
        self._thread = threading.Thread(target=self._run, name="autostream-plan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        work, self._work = self._work, None
        try:
            with cancellable(self._scope):
                result = work()
            if self._scope.cancelled:
                raise Cancelled("the plan was cancelled")
            self.result, self.state = result, "done"
        except Cancelled:
            self.state = "cancelled"
        except BaseException as exc:  # told where the plan would be adopted
            self.error, self.state = exc, "cancelled" if self._scope.cancelled else "failed"
        finally:
            self.seconds = time.perf_counter() - started
            self._done.set()
            _LIVE.discard(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; whether it has (``False`` if never started)."""
        if self.state in ("waiting", "forked"):
            return False
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """Stop the plan: its searches end at once and its result is discarded."""
        if self.state == "waiting":
            self.state, self._work = "cancelled", None
            _LIVE.discard(self)
            return
        self._scope.cancel()

    def _forked(self) -> None:
        """In a forked child: the thread does not exist here."""
        if self.state in ("waiting", "running"):
            self.state, self._work = "forked", None
            self._done.set()


def _cancel_all_at_exit() -> None:
    live = list(_LIVE)
    for job in live:
        job.cancel()
    deadline = time.perf_counter() + JOIN_AT_EXIT_S
    for job in live:
        if job._thread is not None:
            job._thread.join(max(0.0, deadline - time.perf_counter()))


def _after_fork_in_child() -> None:
    for job in list(_LIVE):
        job._forked()
    _LIVE.clear()


atexit.register(_cancel_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
