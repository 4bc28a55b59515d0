"""Models whose graphs write their own state, and a small MLP for training steps.

Compiled for inference with input mutations kept (TorchAir's default,
``keep_inference_input_mutations=True``), each graph ends with ``copy_(buffer, new)``, and
other ops read the buffer's old value: the order a compiler that writes ``new`` straight
into the buffer (TorchAir GE's output refs, the ACL graph's input reinplacing) must keep.
Not in ``ZOO``: each call changes the model.

>>> model, (x,) = buffer_update_model()
>>> before = model.total.clone(); _ = model(x)
>>> bool((model.total - before).abs().sum() > 0)
True
"""

from __future__ import annotations

import torch
from torch import nn

from autostream.models.seeding import own_rng


class BatchNormTrain(nn.Module):
    """A batch norm in train mode (it updates its running statistics) beside a branch that
    reads the running mean."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.side = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        centred = self.side(x) - self.norm.running_mean
        return self.norm(torch.relu(self.up(x))), torch.tanh(centred)


class BufferUpdate(nn.Module):
    """Reads its own buffer in two branches and updates it with ``add_``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.register_buffer("total", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = self.a(x) * self.total
        shifted = torch.sigmoid(self.b(x)) + self.total
        self.total.add_(x.mean(0))
        return scaled, shifted


class MLP(nn.Module):
    """Two parallel MLP towers summed: independent work in forward and backward."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        self.right = nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


@own_rng
def batchnorm_train_model(rows: int = 32, width: int = 256
                          ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A train-mode batch norm whose running mean a branch reads."""
    torch.manual_seed(11)
    return BatchNormTrain(width).train(), (torch.randn(rows, width),)


@own_rng
def buffer_update_model(rows: int = 32, width: int = 256
                        ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A module reading and updating its own buffer."""
    torch.manual_seed(12)
    model = BufferUpdate(width)
    model.total.normal_()
    return model, (torch.randn(rows, width),)


@own_rng
def mlp_model(rows: int = 64, width: int = 256, hidden: int = 512
              ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two MLP towers, for a training step (forward and backward graphs)."""
    torch.manual_seed(13)
    return MLP(width, hidden), (torch.randn(rows, width),)


class SliceKVCache(nn.Module):
    """Attention over a KV cache written by slice assignment (``cache[:n] = k``): with a
    symbolic ``n`` the write is a ``slice_scatter`` copied back into the buffer."""

    def __init__(self, width: int, max_len: int) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.register_buffer("k_cache", torch.zeros(max_len, width))
        self.register_buffer("v_cache", torch.zeros(max_len, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        old = self.k_cache.sum(0) + self.v_cache.sum(0)
        self.k_cache[:n] = self.k(x)
        self.v_cache[:n] = self.v(x)
        scores = torch.softmax(self.q(x) @ self.k_cache[:n].t(), dim=-1)
        return scores @ self.v_cache[:n] + old


class StaticCacheDecode(nn.Module):
    """One decode step into a static KV cache at a position (``index_copy_``), as
    transformers' ``StaticCache`` writes it."""

    def __init__(self, width: int, max_len: int) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.register_buffer("k_cache", torch.zeros(max_len, width))
        self.register_buffer("v_cache", torch.zeros(max_len, width))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.k_cache.index_copy_(0, position, self.k(x))
        self.v_cache.index_copy_(0, position, self.v(x))
        scores = torch.softmax(self.q(x) @ self.k_cache.t(), dim=-1)
        return self.out(scores @ self.v_cache)


class TokenDispatchMoE(nn.Module):
    """Top-1 routed experts that gather their tokens (``index_select``) and scatter the
    results back (``index_add_``), beside an always-on shared expert."""

    def __init__(self, width: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))
        self.shared = nn.Sequential(nn.Linear(width, 2 * width), nn.SiLU(),
                                    nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.router(x).argmax(-1)
        order = torch.argsort(chosen)
        tokens = x.index_select(0, order)
        picked = chosen.index_select(0, order)
        routed = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            mask = (picked == i).unsqueeze(-1).to(x.dtype)
            routed.index_add_(0, order, expert(tokens) * mask)
        return self.shared(x) + routed


@own_rng
def slice_kv_cache_model(tokens: int = 16, width: int = 128, max_len: int = 64
                         ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Attention over a KV cache written by slice assignment (``tokens`` rows)."""
    torch.manual_seed(14)
    return SliceKVCache(width, max_len), (torch.randn(tokens, width),)


@own_rng
def static_cache_decode_model(tokens: int = 4, width: int = 128, max_len: int = 64
                              ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``tokens`` new tokens written into a static KV cache at positions 8, 9, ..."""
    torch.manual_seed(15)
    return StaticCacheDecode(width, max_len), (torch.randn(tokens, width),
                                               torch.arange(8, 8 + tokens))


@own_rng
def token_dispatch_moe_model(tokens: int = 32, width: int = 128, experts: int = 4
                             ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A token-dispatch MoE (``index_select`` / ``index_add_``) with a shared expert."""
    torch.manual_seed(16)
    return TokenDispatchMoE(width, experts), (torch.randn(tokens, width),)
