"""Random inputs for an op signature: tensors with the graph's shapes, dtypes and strides.

>>> import torch
>>> spec = TensorSpec((2, 3), torch.float32, (1, 2))
>>> make_tensor(spec, torch.device("cpu"), torch.Generator().manual_seed(0)).stride()
(1, 2)
"""

from __future__ import annotations

from typing import Any

import torch

from autostream.cost.signature import OpSignature, TensorSpec

__all__ = ["make_inputs", "make_tensor"]


def _fill(numel: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point or dtype.is_complex:
        try:
            return torch.randn(numel, generator=gen, dtype=dtype)
        except (RuntimeError, TypeError):
            return torch.randn(numel, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.rand(numel, generator=gen) < 0.5
    # integer tensors are mostly indices: zero is valid for every indexed size
    return torch.zeros(numel, dtype=dtype)


def make_tensor(spec: TensorSpec, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """A random tensor with ``spec``'s shape, dtype and strides on ``device``."""
    if spec.contiguous or spec.stride is None:
        return _fill(spec.numel, spec.dtype, gen).reshape(spec.shape).to(device)
    if any(s == 0 for s in spec.shape):
        return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=device)
    storage = 1 + sum((s - 1) * st for s, st in zip(spec.shape, spec.stride, strict=True))
    return _fill(storage, spec.dtype, gen).to(device).as_strided(spec.shape, spec.stride)


def make_inputs(sig: OpSignature, device: torch.device, gen: torch.Generator
                ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Real ``(args, kwargs)`` for ``sig``: random tensors where the graph had tensors."""
    def build(v: Any) -> Any:
        if isinstance(v, TensorSpec):
            return make_tensor(v, device, gen)
        if isinstance(v, list):
            return [build(x) for x in v]
        if isinstance(v, tuple):
            return tuple(build(x) for x in v)
        if isinstance(v, torch.device):
            return device
        return v

    return build(sig.args), {k: build(v) for k, v in sig.kwargs.items()}
