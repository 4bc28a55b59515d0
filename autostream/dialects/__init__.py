"""Dialects: the FX ops a rewritten graph uses for streams and syncs.

May import: comm, fx, memory, scheduling.

The only dialect is TorchAir's (``torch.ops.air.*``): on Ascend the real TorchAir
ops lower it to GE / ACL graphs; elsewhere autostream defines stand-ins with the
same schemas and its runtimes interpret them.  ``reinplace`` rewrites a functional
all-reduce into the in-place op where no other value sees its buffer.
"""

from autostream.dialects.torchair import (
    STREAM_LABEL_KEY,
    AirOps,
    air_ops,
    is_stream_op,
    stream_index,
    stream_label,
)

__all__ = ["STREAM_LABEL_KEY", "AirOps", "air_ops", "is_stream_op", "stream_label", "stream_index"]
