"""The model zoo: real PyTorch modules with the shapes of graphs users parallelise.

Each function returns ``(model, example_inputs)``, the ``MODEL_SPEC`` contract of the
command line (``autostream plan autostream.models.zoo:moe_model``).  Sizes default to
small, GEMV-shaped work (few tokens, wide layers: decode-style inference), where
independent branches can overlap even on a CPU.

>>> model, inputs = article_model()
>>> [t.shape for t in model(*inputs)]
[torch.Size([64, 64]), torch.Size([64, 64])]
"""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.nn import functional as F

from autostream.models.seeding import own_rng

__all__ = [
    "ZOO",
    "article_model",
    "moe_model",
    "decoder_layer",
    "inception_block",
    "inception_head",
    "multihead_block",
    "parallel_block",
    "two_branch_gemv",
    "random_dag_model",
    "running_stats_model",
]


def _seeded(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


class ArticleModel(nn.Module):
    """The seed article's example: ``mm = x @ x; add = |mm| + 1; sub = x - mm``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mm = torch.mm(x, x)
        abs_ = torch.abs(mm)
        add = abs_ + 1
        sub = x - mm
        return add, sub


@own_rng
def article_model(n: int = 64) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The article's worked example with an ``n x n`` input."""
    _seeded(0)
    return ArticleModel().eval(), (torch.randn(n, n),)


class Expert(nn.Module):
    """A SwiGLU feed-forward expert."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, inner, bias=False)
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class MoELayer(nn.Module):
    """Top-k routed experts beside an always-on shared expert (DeepSeek / Qwen-MoE style).

    Routing is dense-masked (every expert sees every token, weighted by its gate),
    so shapes stay static, as in captured decode graphs.
    """

    def __init__(self, hidden: int, inner: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, inner) for _ in range(experts))
        self.shared = Expert(hidden, inner * 2)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        weights, chosen = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, chosen, weights)
        routed = sum(gates[:, i : i + 1] * e(x) for i, e in enumerate(self.experts))
        return self.shared(x) + routed


@own_rng
def moe_model(
    tokens: int = 8, hidden: int = 256, inner: int = 256, experts: int = 4, top_k: int = 2
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """An MoE layer with a shared expert beside ``experts`` routed experts."""
    _seeded(1)
    return MoELayer(hidden, inner, experts, top_k).eval(), (torch.randn(tokens, hidden),)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class DecoderLayer(nn.Module):
    """A pre-norm transformer decoder layer: causal multi-head attention + SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, inner: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp = Expert(hidden, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        y = self.norm1(x)

        def split(z: torch.Tensor) -> torch.Tensor:
            return z.view(b, t, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.q(y)), split(self.k(y)), split(self.v(y))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


@own_rng
def decoder_layer(
    batch: int = 1, tokens: int = 16, hidden: int = 256, heads: int = 4, inner: int = 512
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One decoder layer on a ``batch x tokens x hidden`` input."""
    _seeded(2)
    return DecoderLayer(hidden, heads, inner).eval(), (torch.randn(batch, tokens, hidden),)


class InceptionBlock(nn.Module):
    """GoogLeNet's Inception module: 1x1, 3x3, 5x5 and pooled branches, concatenated."""

    def __init__(self, cin: int, c1: int, c3: int, c5: int, cp: int) -> None:
        super().__init__()
        self.b1 = nn.Conv2d(cin, c1, 1)
        self.b3 = nn.Sequential(nn.Conv2d(cin, c3 // 2, 1), nn.ReLU(), nn.Conv2d(c3 // 2, c3, 3, padding=1))
        self.b5 = nn.Sequential(nn.Conv2d(cin, c5 // 2, 1), nn.ReLU(), nn.Conv2d(c5 // 2, c5, 5, padding=2))
        self.bp = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(cin, cp, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = [self.b1(x), self.b3(x), self.b5(x), self.bp(x)]
        return torch.relu(torch.cat(branches, dim=1))


@own_rng
def inception_block(
    batch: int = 1, channels: int = 64, size: int = 14
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """An Inception-style multi-branch block on a ``batch x channels x size x size`` input."""
    _seeded(3)
    model = InceptionBlock(channels, 32, 48, 16, 16).eval()
    return model, (torch.randn(batch, channels, size, size),)


class InceptionHead(nn.Module):
    """GoogLeNet's last stage: an Inception block, then its classifier (average pool,
    ``flatten``, ``Linear``)."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.block = InceptionBlock(channels, 32, 48, 16, 16)
        self.fc = nn.Linear(32 + 48 + 16 + 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.block(x), (1, 1))
        return self.fc(torch.flatten(x, 1))


@own_rng
def inception_head(
    batch: int = 1, channels: int = 64, size: int = 14, classes: int = 10
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GoogLeNet's classifier head on a ``batch x channels x size x size`` input (not in
    ``ZOO``): its ``Linear`` reads the pooled, flattened block through ``addmm``, whose
    ``alpha`` TorchAir's GE makes a ``Const`` first (``dialects.torchair_modes``)."""
    _seeded(3)
    return InceptionHead(channels, classes).eval(), (torch.randn(batch, channels, size, size),)


class MultiHeadBlock(nn.Module):
    """Independent prediction heads on one input (multi-task / Medusa-style heads)."""

    def __init__(self, hidden: int, out: int, heads: int, depth: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(hidden, hidden), nn.SiLU())],
                          nn.Linear(hidden, out))
            for _ in range(heads)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(head(x) for head in self.heads)


@own_rng
def multihead_block(
    tokens: int = 4, hidden: int = 512, out: int = 128, heads: int = 4, depth: int = 2
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``heads`` independent MLP heads over a shared input."""
    _seeded(4)
    return MultiHeadBlock(hidden, out, heads, depth).eval(), (torch.randn(tokens, hidden),)


class AttentionHead(nn.Module):
    """One causal attention head that materialises its ``tokens x tokens`` scores."""

    def __init__(self, hidden: int, dim: int, tokens: int) -> None:
        super().__init__()
        self.q = nn.Linear(hidden, dim, bias=False)
        self.k = nn.Linear(hidden, dim, bias=False)
        self.v = nn.Linear(hidden, dim, bias=False)
        self.register_buffer("future", torch.ones(tokens, tokens, dtype=torch.bool).triu(1))
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-2, -1) * self.scale
        scores = scores.masked_fill(self.future, float("-inf"))
        return torch.softmax(scores, dim=-1) @ self.v(x)


class ParallelBlock(nn.Module):
    """A parallel transformer block (GPT-J, PaLM): ``x + attention(y) + mlp(y)`` with
    ``y = norm(x)``, one module per attention head (as in minimal GPT implementations),
    so the heads fan out beside the MLP."""

    def __init__(self, hidden: int, heads: int, inner: int, tokens: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.heads = nn.ModuleList(AttentionHead(hidden, hidden // heads, tokens)
                                   for _ in range(heads))
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp = Expert(hidden, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        attention = self.o(torch.cat([h(y) for h in self.heads], dim=-1))
        return x + attention + self.mlp(y)


@own_rng
def parallel_block(
    tokens: int = 384, hidden: int = 256, heads: int = 4, inner: int = 512
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A parallel attention + MLP block on a ``tokens x hidden`` prompt (prefill-shaped:
    the heads' scores dominate the activations)."""
    _seeded(7)
    return ParallelBlock(hidden, heads, inner, tokens).eval(), (torch.randn(tokens, hidden),)


class TwoBranchGemv(nn.Module):
    """Two independent chains of GEMV-shaped matmuls (``rows x width @ width x width``)."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.a = nn.ParameterList(nn.Parameter(torch.randn(width, width) / width**0.5) for _ in range(depth))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(width, width) / width**0.5) for _ in range(depth))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for w in self.a:
            x = torch.mm(x, w)
        for w in self.b:
            y = torch.mm(y, w)
        return x, y


@own_rng
def two_branch_gemv(
    rows: int = 16, width: int = 1024, depth: int = 4
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two independent GEMV-shaped matmul chains: the CPU speed-up probe of issue 5."""
    _seeded(5)
    return TwoBranchGemv(width, depth).eval(), (torch.randn(rows, width), torch.randn(rows, width))


class RandomDag(nn.Module):
    """A random DAG of tensor ops over ``width``-wide activations; the structure comes from ``seed``."""

    def __init__(self, seed: int, ops: int, width: int) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.plan: list[tuple[str, tuple[int, ...]]] = []
        weights = []
        for i in range(ops):
            kind = rng.choice(["linear", "linear", "relu", "add", "tanh", "mul"])
            arity = 2 if kind in ("add", "mul") else 1
            # Inputs are earlier values: 0 is the model input, j >= 1 the j-th op's output.
            args = tuple(rng.randrange(0, i + 1) for _ in range(arity))
            if kind == "linear":
                weights.append(nn.Parameter(torch.randn(width, width) / width**0.5))
                args = (*args, len(weights) - 1)
            self.plan.append((kind, args))
        self.weights = nn.ParameterList(weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = [x]
        used: set[int] = set()
        for kind, args in self.plan:
            if kind == "linear":
                out = values[args[0]] @ self.weights[args[1]]
                used.add(args[0])
            elif kind == "relu":
                out = torch.relu(values[args[0]])
            elif kind == "tanh":
                out = torch.tanh(values[args[0]])
            elif kind == "add":
                out = values[args[0]] + values[args[1]]
            else:
                out = values[args[0]] * values[args[1]]
            used.update(args[:2] if kind in ("add", "mul") else args[:1])
            values.append(out)
        sinks = [v for i, v in enumerate(values) if i not in used and i > 0]
        return torch.stack(sinks).sum(0) if sinks else values[-1]


@own_rng
def random_dag_model(
    seed: int = 0, ops: int = 12, width: int = 64, rows: int = 8
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A random DAG-shaped model (for property tests and solver comparisons)."""
    _seeded(6 + seed)
    return RandomDag(seed, ops, width).eval(), (torch.randn(rows, width),)


class RunningStats(nn.Module):
    """Branches reading buffers that a functional batch norm updates in place.

    ``F.batch_norm(..., training=True)`` writes its running mean and variance, and no
    name in the call says so: the branch reading the mean before it and the one reading
    it after must stay on either side of the write.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.register_buffer("mean", torch.randn(width))
        self.register_buffer("var", torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        before = self.mean * 2 + self.a(x).sum(0)
        h = torch.tanh(self.b(x))
        normed = F.batch_norm(h, self.mean, self.var, training=True, momentum=0.5)
        after = self.mean + 1
        return before, normed, after


@own_rng
def running_stats_model(rows: int = 16, width: int = 512) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two branches around a functional batch norm writing buffers they read (not in ``ZOO``:
    each call changes the model)."""
    _seeded(7)
    return RunningStats(width).eval(), (torch.randn(rows, width),)


#: name -> factory of the zoo's named models (random DAGs are parameterised by seed).
ZOO = {
    "article": article_model,
    "moe": moe_model,
    "decoder": decoder_layer,
    "inception": inception_block,
    "multihead": multihead_block,
    "parallel": parallel_block,
    "two_branch_gemv": two_branch_gemv,
}
