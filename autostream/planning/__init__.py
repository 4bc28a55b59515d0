"""The planner: an FX graph and a cost model to a ``Plan``, and that plan on Dynamo's graph.

``plan`` runs the stages (graph, costs, scheduling problem, solver, syncs, memory
fit) and returns a ``Plan`` (``plan_graph``, ``plan_model``); ``lift`` carries a plan
made on the post-AOT ATen graph back to the Dynamo graph it came from and rewrites it.

May import: comm, cost, dialects, fx, memory, scheduling, stages.
"""
