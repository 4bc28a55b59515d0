"""The planner's defaults, in a module light enough for the command line to read.

``torch.compile(backend="autostream")``, the pass and every command plan with these
unless told otherwise, so ``autostream plan SPEC`` previews what compiling does.

>>> DEFAULT_MAX_STREAMS, DEFAULT_SOLVER
(2, 'cpsat')
"""

#: streams a plan may use
DEFAULT_MAX_STREAMS = 2
#: the solver that plans
DEFAULT_SOLVER = "cpsat"
