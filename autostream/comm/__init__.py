"""Communication ops: which nodes communicate, how they are ordered and what they cost.

May import: nothing (the graph and the cost model build on its registry).

See ``docs/distributed.md``.  ``register`` adds a vendor op by qualified name:

>>> from autostream.comm import CommRegistry, register
>>> register("npu::my_fused_dispatch", "blocking", "all_to_all", registry=CommRegistry()).qualname
'npu::my_fused_dispatch'
"""

from autostream.comm.ops import CommOp, comm_op, has_communication
from autostream.comm.registry import (
    DEFAULT_REGISTRY,
    CommRegistry,
    CommSpec,
    looks_like_communication,
    register,
)

__all__ = [
    "DEFAULT_REGISTRY", "CommOp", "CommRegistry", "CommSpec", "comm_op", "has_communication",
    "looks_like_communication", "register",
]
