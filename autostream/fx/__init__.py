"""The FX graph and what its ops do: the pipeline's first stage.

``capture`` gets the post-AOT ATen graphs ``torch.compile`` produces, ``graph`` turns
an FX graph into ``OpGraph`` (its ops and their data, memory, effect and
communication dependences), ``call_effects`` traces what a Dynamo call really
reads, writes and draws, and ``thread_state`` carries the thread-local state an op
runs under (grad, inference and autocast modes) to a worker thread, ``intra_op``
sets one thread's intra-op thread count (not the process's); ``device`` reads
the device type a graph runs on.

May import: comm.
"""
