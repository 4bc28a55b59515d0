"""Local search on the simulated makespan: move a task to another stream while it pays.

CP-SAT's models approximate the simulator where ops share the device (processor
sharing) and round times to units; the simulator is the judge.  Starting from the
best plan of a piece, each pass tries every task (an op with the zero-duration ops
merged into it, :func:`.tasks.task_groups`) on every other stream, keeping the
launch order, and keeps a move when the simulated makespan drops.  The search stops
after a pass without a gain or after ``evaluations`` simulations: it counts
simulations, not seconds, so it makes the same moves on every machine.
"""

from __future__ import annotations

from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule
from autostream.scheduling.solvers.base import assignment_timeline
from autostream.scheduling.solvers.cpsat.tasks import task_groups


def improve(problem: SchedulingProblem, schedule: Schedule, evaluations: int) -> Schedule:
    """``schedule`` or a faster plan found by moving tasks between streams.

    >>> import networkx as nx
    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> nx.set_node_attributes(g, 2.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> from autostream.scheduling.solvers.base import schedule_from_assignment
    >>> one = schedule_from_assignment(p, dict.fromkeys("abcd", 0), "single")
    >>> one.makespan, improve(p, one, 20).makespan
    (8.0, 6.0)
    """
    best = schedule
    groups = [g for g in task_groups(problem, collapse_chains=False)  # lanes stay pinned
              if any(problem.duration(v) > 0 and v not in problem.pinned for v in g)]
    left = evaluations
    improved = True
    while improved and left > 0:
        improved = False
        for group in groups:
            for s in range(problem.streams):
                if left <= 0 or s == best.stream_of[group[0]]:
                    continue
                left -= 1
                stream_of = {**best.stream_of, **dict.fromkeys(group, s)}
                trial = assignment_timeline(problem, stream_of, best.order)
                if trial.makespan < best.makespan - 1e-9:
                    best, improved = trial.schedule(problem, best.order, best.solver), True
    return best
