"""Metadata-only ops: views and tuple access that launch no kernel and cost nothing.

>>> import torch
>>> is_free_target(torch.ops.aten.view.default), is_free_target(torch.ops.aten.mm.default)
(True, False)
"""

from __future__ import annotations

import operator
from typing import Any

import torch

#: ATen op packets (names without overload) whose result is a view or alias
FREE_PACKETS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "expand_as", "permute", "transpose", "t",
    "squeeze", "unsqueeze", "slice", "select", "alias", "as_strided", "detach", "unflatten",
    "flatten", "view_as", "narrow", "split", "split_with_sizes", "unbind", "chunk",
    "tensor_split", "movedim", "diagonal", "unfold", "lift_fresh", "view_as_real",
    "view_as_complex", "_reshape_alias", "numpy_T", "mT", "mH", "adjoint", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "dim",
})

_FREE_CALLABLES = (operator.getitem,)

#: namespaces of the stream ops a rewrite inserts (TorchAir's and autostream's own)
STREAM_NAMESPACES = frozenset({"air", "autostream"})


def is_free_target(target: Any) -> bool:
    """True when a call_function target only changes metadata (views, getitem)."""
    if target in _FREE_CALLABLES:
        return True
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace in STREAM_NAMESPACES:
            return True  # scope/record/wait: priced by sync_latency_us and stream_switch_us
        return target.namespace == "aten" and target._opname in FREE_PACKETS
    # symbolic-shape arithmetic (operator.mul on SymInts, sym_size) runs on the host
    return getattr(target, "__module__", None) in ("_operator", "operator", "math")
