"""A plan's memory: when values are dropped, the predicted peak, the budget and the repair.

``lifetimes`` is the rule every runtime follows to drop a value, ``predict`` the
predicted peak of a plan (``GraphMemory``, ``predict_memory``), ``bound`` the most any
interleaving of the threads may hold, ``cap`` a replay of a schedule under a memory
cap, ``budget`` the ``max_memory_increase`` option, and ``fit`` the repair of a plan
whose peak exceeds it (ordering edges, other solvers, fewer streams).

May import: comm, cost, scheduling.
"""
