"""A plan's memory: when values are dropped, the predicted peak, its bounds and the budget.

``lifetimes`` is the rule every runtime follows to drop a value, ``predict`` the
predicted peak of a plan (``GraphMemory``, ``predict_memory``), ``bound`` the most any
interleaving of the threads may hold, ``cap`` a replay of a schedule under a memory
cap, and ``budget`` the ``max_memory_increase`` option.  The planner repairs a plan
whose peak exceeds it (``autostream.planning.fit``).

May import: comm, cost, scheduling.
"""
