"""The scheduling problem and its answers: which stream runs each op, in which order.

``problem`` holds ``SchedulingProblem`` (ops, durations, device shares, streams,
collective links), ``schedule`` a plan's ``Schedule`` and ``Sync``, ``solvers/`` the
solvers chosen by name, ``sync`` the minimal syncs of a schedule, ``waits`` each
collective wait moved to the stream that launched it, ``transfers`` the collectives as
tasks on their group's link, ``simulate`` and ``timeline`` the
predicted run on a modelled device, and ``core_budgets`` the side streams' core
budgets searched on that model.

May import: comm, cost.
"""
