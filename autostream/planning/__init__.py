"""The planner: an FX graph and a cost model to a ``Plan``, and that plan on Dynamo's graph.

``plan`` runs the stages (graph, costs, scheduling problem, solver, syncs, memory
fit) and returns a ``Plan`` (``plan_graph``, ``plan_model``); ``evaluate`` checks each
candidate plan as it would run (syncs, simulated time, predicted memory), and ``fit``
repairs or replaces one over its memory budget (ordering edges, other solvers, fewer
streams); ``lift`` carries a plan made on the post-AOT ATen graph back to the Dynamo
graph it came from and rewrites it; ``agree`` checks, out of band, that ranks planned a
graph alike.

May import: comm, cost, dialects, fx, memory, scheduling, stages.
"""
