"""MoE decode layers at real sizes that a CUDA graph can capture: Qwen3-MoE and DeepSeek-V3 shaped.

One layer of each, with its shared expert, for ``tokens`` decode tokens (the whole
expert set on one device, no expert parallelism), in bfloat16:

- router gate (``H -> E``), then Qwen3's softmax over all experts with the top-k
  weights renormalised, or DeepSeek-V3's sigmoid scores with the top-k weights
  renormalised and scaled by its ``routed_scaling_factor`` (2.5).  DeepSeek's routing
  is simplified: no score-correction bias and no group-limited selection (its 8 expert
  groups, top-4 groups), so the experts chosen are those of the plain top-k;
- routed experts, computed without a host sync and with deterministic results: the
  ``T * k`` (token, expert) slots sorted by expert (``argsort(stable=True)``), the
  per-expert counts by ``scatter_add_`` on integers (``bincount`` would sync with the
  host), their cumulative sum as the group offsets of ``torch._grouped_mm`` (gate and
  up projections as one ``[E, H, 2I]`` weight), SwiGLU, ``_grouped_mm`` (down,
  ``[E, I, H]``), each slot scaled by its routing weight, put back in token order by
  the inverse permutation and summed over the ``k`` slots of each token (no
  ``index_add_``, whose atomics would make the sum's order, and so its rounding,
  vary between calls);
- the shared expert, a SwiGLU MLP (``gate_up: H -> 2S``, ``down: S -> H``), beside the
  routed path (nothing flows between them until the final add);
- output = routed + shared.

Sizes (those of ``autostream.models.experts``' ``QWEN3_MOE`` and ``DEEPSEEK_V3``, restated
in :data:`QWEN3_SHAPE` and :data:`DEEPSEEK_V3_SHAPE`: that module has a layer of its own):
Qwen3 hidden 4096, 128 experts of width 1536, top-8, shared 1536 (Qwen2-MoE style; the
real Qwen3-MoE has none); DeepSeek-V3 hidden 7168, 256 experts of width 2048, top-8,
shared 2048.  At ``scale=1`` DeepSeek's experts hold 22.5 GB of bfloat16 weights:
weights are allocated on the target device and filled there by a generator seeded from
``seed`` (nothing is built on the CPU first), uniform in ``+-1/sqrt(fan_in)``.  The same
seed gives the same weights on the same device type.

``scale`` divides the hidden size, the widths and the number of experts (kept at least
``top_k``) for CPU runs; sizes are rounded up to multiples of 16, so every row of the
grouped matmuls stays 16-byte aligned as CUDA's ``_grouped_mm`` requires (its strides
must be multiples of 16 bytes: 8 bfloat16 elements).  The default, ``scale=8`` on the
CPU, keeps a spec cheap to capture and plan there
(``autostream plan autostream.models.moe_decode:qwen3_moe_decode``); the GPU experiment
passes ``scale=1, device="cuda"``.  ``torch._grouped_mm`` takes bfloat16 only when traced
(its meta function checks), so the layers are bfloat16 only.

>>> model, (x,) = qwen3_moe_decode(tokens=2, scale=16)
>>> model.sizes
MoESizes(hidden=256, inter=96, experts=8, top_k=8, shared_inter=96, routing='softmax', routed_scale=1.0)
>>> model(x).shape, model(x).dtype
(torch.Size([2, 256]), torch.bfloat16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["DEEPSEEK_V3_SHAPE", "QWEN3_SHAPE", "MoEDecodeLayer", "MoEShape", "MoESizes",
           "decode_inputs", "deepseek_v3_decode", "qwen3_moe_decode", "sizes_of"]

#: every size is a multiple of this (16-byte rows of bfloat16 with room to spare)
ALIGN = 16
#: DeepSeek-V3's ``routed_scaling_factor`` (its config.json)
DEEPSEEK_ROUTED_SCALE = 2.5
ROUTINGS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEShape:
    """A model's MoE sizes at full scale (the fields of ``autostream.models.experts.Config``)."""

    name: str
    hidden: int
    moe_inter: int
    experts: int
    topk: int
    shared_inter: int


#: Qwen3-235B-A22B's MoE with a Qwen2-MoE-style shared expert of the routed experts' width
QWEN3_SHAPE = MoEShape("qwen3_moe", 4096, 1536, 128, 8, 1536)
#: DeepSeek-V3 (and R1): 256 routed experts, top-8, one shared expert
DEEPSEEK_V3_SHAPE = MoEShape("deepseek_v3", 7168, 2048, 256, 8, 2048)


@dataclass(frozen=True)
class MoESizes:
    """The sizes of one MoE decode layer."""

    hidden: int
    inter: int
    experts: int
    top_k: int
    shared_inter: int
    routing: str
    routed_scale: float = 1.0


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _aligned(n: int, scale: int) -> int:
    return max(ALIGN, math.ceil(n / scale / ALIGN) * ALIGN)


def sizes_of(config: MoEShape, routing: str, scale: int = 1, routed_scale: float = 1.0) -> MoESizes:
    """``config``'s MoE sizes divided by ``scale`` (aligned, at least ``top_k`` experts).

    >>> sizes_of(DEEPSEEK_V3_SHAPE, "sigmoid", scale=8)
    MoESizes(hidden=896, inter=256, experts=32, top_k=8, shared_inter=256, routing='sigmoid', routed_scale=1.0)
    """
    _check_positive_int("scale", scale)
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r} is unknown; expected one of {', '.join(ROUTINGS)}")
    return MoESizes(hidden=_aligned(config.hidden, scale), inter=_aligned(config.moe_inter, scale),
                    experts=max(config.topk, config.experts // scale), top_k=config.topk,
                    shared_inter=_aligned(config.shared_inter, scale), routing=routing,
                    routed_scale=routed_scale)


def _uniform(shape: tuple[int, ...], fan_in: int, gen: torch.Generator, device: torch.device,
             dtype: torch.dtype) -> nn.Parameter:
    bound = 1.0 / math.sqrt(fan_in)
    w = torch.empty(shape, device=device, dtype=dtype)
    w.uniform_(-bound, bound, generator=gen)
    return nn.Parameter(w, requires_grad=False)


class MoEDecodeLayer(nn.Module):
    """Router, routed experts through ``torch._grouped_mm`` and a shared expert (module docstring)."""

    def __init__(self, sizes: MoESizes, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> None:
        super().__init__()
        if dtype != torch.bfloat16:
            raise ValueError(f"dtype {dtype} is not supported: torch._grouped_mm takes bfloat16 "
                             "only when traced; pass dtype=torch.bfloat16")
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)
        h, i, e, s = sizes.hidden, sizes.inter, sizes.experts, sizes.shared_inter
        self.sizes = sizes
        self.gate = _uniform((e, h), h, gen, device, dtype)
        #: gate and up projections of every expert, side by side: ``[E, H, 2I]``
        self.w13 = _uniform((e, h, 2 * i), h, gen, device, dtype)
        self.w2 = _uniform((e, i, h), i, gen, device, dtype)
        self.shared_gate_up = _uniform((2 * s, h), h, gen, device, dtype)
        self.shared_down = _uniform((h, s), s, gen, device, dtype)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [T, k] in x's dtype, expert ids [T, k])`` of each token."""
        scores = F.linear(x, self.gate).float()
        scores = scores.softmax(-1) if self.sizes.routing == "softmax" else scores.sigmoid()
        weights, ids = scores.topk(self.sizes.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True) * self.sizes.routed_scale
        return weights.to(x.dtype), ids

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum for each token (module docstring)."""
        tokens, k = ids.shape
        slots = tokens * k
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.sizes.experts, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        x_sorted = x.index_select(0, order // k)
        gate_up = torch._grouped_mm(x_sorted, self.w13, offs=offs)
        inter = self.sizes.inter
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y_sorted = torch._grouped_mm(h, self.w2, offs=offs)
        inverse = torch.empty_like(order).scatter_(
            0, order, torch.arange(slots, device=x.device, dtype=order.dtype))
        y = y_sorted.index_select(0, inverse).view(tokens, k, -1)
        return (y * weights.unsqueeze(-1)).sum(1)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert: a SwiGLU MLP every token goes through."""
        gate, up = F.linear(x, self.shared_gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.shared_down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        return self.routed(x, weights, ids) + self.shared(x)


def decode_inputs(model: MoEDecodeLayer, tokens: int, seed: int = 0) -> tuple[torch.Tensor]:
    """``tokens`` random hidden states for ``model``, on its device and in its dtype: one
    layer serves several token counts (DeepSeek's experts need not be built three times).

    >>> model, _ = qwen3_moe_decode(tokens=1, scale=16)
    >>> decode_inputs(model, 64)[0].shape
    torch.Size([64, 256])
    """
    _check_positive_int("tokens", tokens)
    w = model.gate
    gen = torch.Generator(device=w.device).manual_seed(seed + 1)
    x = torch.empty(tokens, model.sizes.hidden, device=w.device, dtype=w.dtype)
    return (x.normal_(generator=gen),)


def _spec(config: MoEShape, routing: str, routed_scale: float, tokens: int, scale: int,
          device: str | torch.device, dtype: torch.dtype, seed: int
          ) -> tuple[MoEDecodeLayer, tuple[torch.Tensor]]:
    _check_positive_int("tokens", tokens)  # before the weights are built, not after
    sizes = sizes_of(config, routing, scale, routed_scale)
    model = MoEDecodeLayer(sizes, device, dtype, seed).eval()
    return model, decode_inputs(model, tokens, seed)


def qwen3_moe_decode(tokens: int = 8, scale: int = 8, device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.bfloat16, seed: int = 0
                     ) -> tuple[MoEDecodeLayer, tuple[torch.Tensor]]:
    """A Qwen3-MoE-shaped decode layer (softmax routing) and ``tokens`` random tokens.

    >>> model, (x,) = qwen3_moe_decode(tokens=1, scale=16)
    >>> x.shape
    torch.Size([1, 256])
    """
    return _spec(QWEN3_SHAPE, "softmax", 1.0, tokens, scale, device, dtype, seed)


def deepseek_v3_decode(tokens: int = 8, scale: int = 8, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.bfloat16, seed: int = 0
                       ) -> tuple[MoEDecodeLayer, tuple[torch.Tensor]]:
    """A DeepSeek-V3-shaped decode layer (sigmoid routing, simplified: module docstring).

    >>> model, _ = deepseek_v3_decode(tokens=1, scale=16)
    >>> model.sizes.experts, model.sizes.routed_scale
    (16, 2.5)
    """
    return _spec(DEEPSEEK_V3_SHAPE, "sigmoid", DEEPSEEK_ROUTED_SCALE, tokens, scale, device, dtype, seed)
