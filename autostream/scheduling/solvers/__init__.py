"""Solvers: ``solve(problem, **options) -> Schedule``, chosen by name.

Every solver rejects an option it does not have, naming it and the ones it takes.

>>> sorted(SOLVERS)[:3]
['cpsat', 'critical_path', 'heft']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule

#: solver name -> "module:function"; imported lazily so that OR-Tools loads only
#: when ``cpsat`` is used.
SOLVERS: dict[str, str] = {
    "single": "autostream.scheduling.solvers.single:solve",
    "round_robin": "autostream.scheduling.solvers.round_robin:solve",
    "tf_greedy": "autostream.scheduling.solvers.tf_greedy:solve",
    "opara": "autostream.scheduling.solvers.opara:solve",
    "critical_path": "autostream.scheduling.solvers.critical_path:solve",
    "nimble": "autostream.scheduling.solvers.nimble:solve",
    "heft": "autostream.scheduling.solvers.heft:solve",
    "overlap": "autostream.scheduling.solvers.overlap:solve",
    "cpsat": "autostream.scheduling.solvers.cpsat:solve",
}

SolveFn = Callable[..., Schedule]


def check_solver_name(name: str) -> str:
    """Return ``name`` if it is a known solver, else raise ``ValueError`` naming the allowed ones."""
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; allowed: {', '.join(sorted(SOLVERS))}")
    return name


def solver_options(name: str) -> tuple[str, ...]:
    """The options solver ``name`` takes (none for the heuristics).

    >>> solver_options("heft"), "time_limit" in solver_options("cpsat")
    ((), True)
    """
    module = SOLVERS[check_solver_name(name)].split(":")[0]
    return tuple(getattr(importlib.import_module(module), "OPTIONS", ()))


def get_solver(name: str) -> SolveFn:
    """The ``solve`` function of solver ``name``."""
    module, func = SOLVERS[check_solver_name(name)].split(":")
    return getattr(importlib.import_module(module), func)


def solve(problem: SchedulingProblem, solver: str = "heft", **options: object) -> Schedule:
    """Plan ``problem`` with the named solver.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b")])
    >>> nx.set_node_attributes(g, 1.0, "duration")
    >>> solve(SchedulingProblem(g, streams=2), "single").makespan
    2.0
    """
    return get_solver(solver)(problem, **options)
