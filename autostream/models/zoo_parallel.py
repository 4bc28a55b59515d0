"""Distributed models: tensor-, expert- and fully-sharded-parallel blocks with real collectives.

Build them on every rank after ``torch.distributed.init_process_group``; each
function returns ``(model, make_inputs)`` where ``make_inputs(step)`` gives the
rank's inputs of one call (seeded by step and rank, so every rank and every run
sees the same data).  The collectives are ``torch.distributed._functional_collectives``
(traced by Dynamo into ``_c10d_functional`` ops), on the default group.

- :func:`tensor_parallel_mlp`: a parallel-residual block, ``x + AR(mlp_a(x)) +
  AR(mlp_b(x))``, each MLP column-parallel up and row-parallel down (Megatron):
  two independent all-reduces, the hazard of issue 14.
- :func:`expert_parallel_moe`: one expert per rank; tokens dispatched and combined
  with ``all_to_all_single`` (equal splits, router-weighted), beside a
  tensor-parallel shared expert ending in an all-reduce.
- :func:`fsdp_block`: layers whose weights are sharded across ranks, gathered with
  ``all_gather`` before use (the next layer's gather is independent of this layer's
  compute), and the output reduce-scattered.
- :func:`overlap_probe`: one all-reduce beside an independent chain of matmuls of
  about the same time (``experiments/distributed.py`` sizes the chain in the run): the
  case where overlap pays most.
- :func:`two_allreduces`: issue 14's report, two independent all-reduces and
  independent compute.

Each model carries three hand-written overlaps, the ceilings the experiment compares
autostream with: ``overlapped`` launches the collectives with ``torch.distributed``'s
``async_op=True`` (in place, the usual hand-written idiom in eager code);
``overlapped_graph`` is the same overlap as written for graph mode, where Dynamo keeps
the order of explicit ops: ``_c10d_functional`` launches (an all-reduce in place on a
value nothing else reads) and their ``wait_tensor`` placed by hand as late as the
computation allows, in the order of ``overlapped``; ``overlapped_functional`` reorders
the forward's own functional collectives: each launched where the forward launches it,
its result first used as late as the computation allows (the tensor returned waits on
first use), the same ops a compiled graph runs, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as ft_c
from torch import nn

Inputs = Callable[[int], tuple[torch.Tensor, ...]]
#: the ``*_single`` collectives of newer torch, else their older ``*_tensor`` names
_all_gather = getattr(ft_c, "all_gather_single", None) or ft_c.all_gather_tensor
_reduce_scatter = getattr(ft_c, "reduce_scatter_single", None) or ft_c.reduce_scatter_tensor


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _input_gen(step: int, rank: int, k: int = 0) -> torch.Generator:
    """The generator of input ``k`` of ``rank`` at ``step``: distinct for every triple
    (up to 1,024 ranks and 16 inputs)."""
    return _gen((step * 1024 + rank) * 16 + k)


def _param(*shape: int, gen: torch.Generator, scale: float | None = None) -> nn.Parameter:
    scale = shape[0] ** -0.5 if scale is None else scale
    return nn.Parameter(torch.randn(*shape, generator=gen) * scale, requires_grad=False)


def _group():
    return dist.group.WORLD


_ops = torch.ops._c10d_functional


def _launch_all_reduce(value: torch.Tensor) -> torch.Tensor:
    """Sum ``value`` across the default group in place (it must be a value nothing else
    reads before the wait); the result is ready after :func:`_wait`."""
    return _ops.all_reduce_(value, "sum", _group().group_name)


def _wait(value: torch.Tensor) -> torch.Tensor:
    """``value`` once its collective is done (a launch's result is not before)."""
    return _ops.wait_tensor(value)


class ShardedMLP(nn.Module):
    """Column-parallel up, GELU, row-parallel down: the rank's partial sum of an MLP."""

    def __init__(self, hidden: int, inner: int, gen: torch.Generator) -> None:
        super().__init__()
        self.up = _param(hidden, inner, gen=gen)
        self.down = _param(inner, hidden, gen=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ self.up) @ self.down


class TensorParallelBlock(nn.Module):
    """``x + AR(mlp_a(x)) + AR(mlp_b(x))`` (parallel residual), ``layers`` times; ``mlp_b``
    is narrower (an attention-sized branch beside the MLP), so its all-reduce is ready
    first although it comes second in program order."""

    def __init__(self, hidden: int, inner: int, layers: int, gen: torch.Generator) -> None:
        super().__init__()
        self.pairs = nn.ModuleList(
            nn.ModuleList([ShardedMLP(hidden, inner, gen), ShardedMLP(hidden, inner // 8, gen)])
            for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for a, b in self.pairs:
            ra = ft_c.all_reduce(a(x), "sum", _group())
            rb = ft_c.all_reduce(b(x), "sum", _group())
            x = x + ra + rb
        return x

    def overlapped(self, x: torch.Tensor) -> torch.Tensor:
        for a, b in self.pairs:
            pa = a(x)
            wa = dist.all_reduce(pa, async_op=True)
            pb = b(x)  # hides pa's all-reduce
            wb = dist.all_reduce(pb, async_op=True)
            wa.wait()
            wb.wait()
            x = x + pa + pb
        return x

    def overlapped_graph(self, x: torch.Tensor) -> torch.Tensor:
        for a, b in self.pairs:
            ra = _launch_all_reduce(a(x))
            rb = _launch_all_reduce(b(x))  # b's compute hides a's all-reduce
            x = x + _wait(ra) + _wait(rb)
        return x

    def overlapped_functional(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)  # each all-reduce is used only after both are launched


def tensor_parallel_mlp(rank: int, world: int, tokens: int = 8, hidden: int = 64,
                        inner: int = 512, layers: int = 1) -> tuple[nn.Module, Inputs]:
    """Megatron-style block on ``world`` ranks: each holds ``inner / world`` of both MLPs."""
    model = TensorParallelBlock(hidden, inner // world, layers, _gen(1000 + rank)).eval()
    return model, lambda step: (torch.randn(tokens, hidden, generator=_gen(step)),)


class ExpertParallelMoE(nn.Module):
    """One expert per rank; a tensor-parallel shared expert beside the routed ones."""

    def __init__(self, hidden: int, inner: int, world: int, gen: torch.Generator,
                 router_gen: torch.Generator) -> None:
        super().__init__()
        self.world = world
        self.router = _param(hidden, world, gen=router_gen)  # the same on every rank
        self.expert = ShardedMLP(hidden, inner, gen)
        self.shared = ShardedMLP(hidden, inner // world, gen)

    def _dispatch_buffer(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(x @ self.router, dim=-1)  # [T, world]
        return (probs.t().unsqueeze(-1) * x.unsqueeze(0)).reshape(-1, x.shape[-1])

    def _combine(self, back: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return back.reshape(self.world, *x.shape).sum(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sent = ft_c.all_to_all_single(self._dispatch_buffer(x), None, None, _group())
        back = ft_c.all_to_all_single(self.expert(sent), None, None, _group())
        shared = ft_c.all_reduce(self.shared(x), "sum", _group())
        return x + self._combine(back, x) + shared

    def overlapped(self, x: torch.Tensor) -> torch.Tensor:
        buf = self._dispatch_buffer(x)
        sent = torch.empty_like(buf)
        w1 = dist.all_to_all_single(sent, buf, async_op=True)
        shared = self.shared(x)  # hides the dispatch
        w2 = dist.all_reduce(shared, async_op=True)
        w1.wait()
        out = self.expert(sent)
        back = torch.empty_like(out)
        w3 = dist.all_to_all_single(back, out, async_op=True)
        w2.wait()
        w3.wait()
        return x + self._combine(back, x) + shared

    def overlapped_graph(self, x: torch.Tensor) -> torch.Tensor:
        buf = self._dispatch_buffer(x)
        splits = [buf.shape[0] // self.world] * self.world
        name = _group().group_name
        sent = _ops.all_to_all_single(buf, splits, splits, name)
        shared = _launch_all_reduce(self.shared(x))  # the shared expert hides the dispatch
        out = self.expert(_wait(sent))
        back = _ops.all_to_all_single(out, splits, splits, name)
        return x + self._combine(_wait(back), x) + _wait(shared)

    def overlapped_functional(self, x: torch.Tensor) -> torch.Tensor:
        sent = ft_c.all_to_all_single(self._dispatch_buffer(x), None, None, _group())
        partial = self.shared(x)  # hides the dispatch
        back = ft_c.all_to_all_single(self.expert(sent), None, None, _group())
        shared = ft_c.all_reduce(partial, "sum", _group())
        return x + self._combine(back, x) + shared


def expert_parallel_moe(rank: int, world: int, tokens: int = 8, hidden: int = 64,
                        inner: int = 128) -> tuple[nn.Module, Inputs]:
    """Expert parallelism with a shared expert (the overlap Ascend deployments hand-tag)."""
    model = ExpertParallelMoE(hidden, inner, world, _gen(2000 + rank), _gen(7)).eval()
    return model, lambda step: (torch.randn(tokens, hidden, generator=_input_gen(step, rank)),)


class FSDPBlock(nn.Module):
    """Layers with row-sharded weights: all-gather, matmul, tanh; reduce-scatter at the end."""

    def __init__(self, hidden: int, layers: int, world: int, gen: torch.Generator) -> None:
        super().__init__()
        self.world = world
        self.shards = nn.ParameterList(_param(hidden // world, hidden, gen=gen, scale=hidden ** -0.5)
                                       for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for shard in self.shards:
            weight = _all_gather(shard, 0, _group())
            x = torch.tanh(x @ weight)
        return _reduce_scatter(x, "sum", 0, _group())

    def overlapped(self, x: torch.Tensor) -> torch.Tensor:
        def gather(shard: torch.Tensor):
            full = shard.new_empty(shard.shape[0] * self.world, *shard.shape[1:])
            return full, dist.all_gather_into_tensor(full, shard, async_op=True)

        pending = gather(self.shards[0])
        for i in range(len(self.shards)):
            weight, work = pending
            if i + 1 < len(self.shards):  # prefetch: hides behind this layer's matmul
                pending = gather(self.shards[i + 1])
            work.wait()
            x = torch.tanh(x @ weight)
        out = x.new_empty(x.shape[0] // self.world, *x.shape[1:])
        dist.reduce_scatter_tensor(out, x)
        return out

    def overlapped_graph(self, x: torch.Tensor) -> torch.Tensor:
        name = _group().group_name
        weights = [_ops.all_gather_into_tensor(self.shards[0], self.world, name)]
        for i in range(len(self.shards)):
            if i + 1 < len(self.shards):  # prefetch: hides behind this layer's matmul
                weights.append(_ops.all_gather_into_tensor(self.shards[i + 1], self.world, name))
            x = torch.tanh(x @ _wait(weights[i]))
        return _wait(_ops.reduce_scatter_tensor(x, "sum", self.world, name))

    def overlapped_functional(self, x: torch.Tensor) -> torch.Tensor:
        weights = [_all_gather(self.shards[0], 0, _group())]
        for i in range(len(self.shards)):
            if i + 1 < len(self.shards):  # prefetch: hides behind this layer's matmul
                weights.append(_all_gather(self.shards[i + 1], 0, _group()))
            x = torch.tanh(x @ weights[i])
        return _reduce_scatter(x, "sum", 0, _group())


def fsdp_block(rank: int, world: int, tokens: int = 8, hidden: int = 64,
               layers: int = 3) -> tuple[nn.Module, Inputs]:
    """FSDP-style: the next layer's gather is independent of this layer's compute."""
    model = FSDPBlock(hidden, layers, world, _gen(3000 + rank)).eval()
    return model, lambda step: (torch.randn(tokens, hidden, generator=_input_gen(step, rank)),)


class OverlapProbe(nn.Module):
    """``(all_reduce(a), chain(b))``: a transfer and an independent compute chain."""

    def __init__(self, width: int, depth: int, gen: torch.Generator) -> None:
        super().__init__()
        self.weights = nn.ParameterList(_param(width, width, gen=gen) for _ in range(depth))

    def _chain(self, b: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            b = torch.tanh(b @ w)
        return b

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        reduced = ft_c.all_reduce(a, "sum", _group())
        return reduced * 0.5, self._chain(b)

    def overlapped(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = a.clone()
        work = dist.all_reduce(a, async_op=True)
        out = self._chain(b)
        work.wait()
        return a * 0.5, out

    def overlapped_graph(self, a: torch.Tensor, b: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        reduced = _launch_all_reduce(a.clone())
        out = self._chain(b)
        return _wait(reduced) * 0.5, out

    def overlapped_functional(self, a: torch.Tensor, b: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        reduced = ft_c.all_reduce(a, "sum", _group())
        out = self._chain(b)
        return reduced * 0.5, out


def overlap_probe(rank: int, world: int, elements: int = 1 << 20, rows: int = 64,
                  width: int = 512, depth: int = 2) -> tuple[nn.Module, Inputs]:
    """An all-reduce of ``elements`` floats beside ``depth`` matmuls ``rows x width x width``."""
    model = OverlapProbe(width, depth, _gen(4000)).eval()
    return model, lambda step: (torch.randn(elements, generator=_input_gen(step, rank)),
                                torch.randn(rows, width, generator=_input_gen(step, rank, 1)))


class TwoAllReduces(nn.Module):
    """Issue 14's report: two independent all-reduces (the first behind a matmul chain, the
    second of a cheap op) and independent compute."""

    def __init__(self, width: int, gen: torch.Generator) -> None:
        super().__init__()
        self.w = _param(width, width, gen=gen)

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        h = a
        for _ in range(3):
            h = torch.tanh(h @ self.w)
        x = ft_c.all_reduce(h, "sum", _group())
        y = ft_c.all_reduce(torch.sigmoid(b), "sum", _group())
        z = c
        for _ in range(4):
            z = torch.tanh(z @ self.w)
        return x + 1, y * 3, z

    def overlapped(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        h = a
        for _ in range(3):
            h = torch.tanh(h @ self.w)
        wx = dist.all_reduce(h, async_op=True)
        y = torch.sigmoid(b)
        wy = dist.all_reduce(y, async_op=True)
        z = c
        for _ in range(4):
            z = torch.tanh(z @ self.w)
        wx.wait()
        wy.wait()
        return h + 1, y * 3, z

    def overlapped_graph(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        h = a
        for _ in range(3):
            h = torch.tanh(h @ self.w)
        x = _launch_all_reduce(h)
        y = _launch_all_reduce(torch.sigmoid(b))
        z = c
        for _ in range(4):
            z = torch.tanh(z @ self.w)
        return _wait(x) + 1, _wait(y) * 3, z

    def overlapped_functional(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        return self.forward(a, b, c)  # both all-reduces are used only after the compute


def two_allreduces(rank: int, world: int, rows: int = 32, width: int = 64
                   ) -> tuple[nn.Module, Inputs]:
    """Two independent all-reduces beside independent compute (the reported race)."""
    model = TwoAllReduces(width, _gen(5000)).eval()
    return model, lambda step: tuple(torch.randn(rows, width, generator=_input_gen(step, rank, k))
                                     for k in range(3))


class GraphModeOverlap(nn.Module):
    """``model``'s hand-written graph-mode overlap (``model.overlapped_graph``) as a module,
    to compile the way the model itself is compiled: ``torch.compile(GraphModeOverlap(
    model), backend=...)`` computes what ``model`` does, on every rank that calls it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor):
        return self.model.overlapped_graph(*inputs)


#: name -> builder ``(rank, world, **sizes) -> (model, make_inputs)``
PARALLEL_ZOO: dict[str, Callable[..., tuple[nn.Module, Inputs]]] = {
    "tp_mlp": tensor_parallel_mlp,
    "ep_moe": expert_parallel_moe,
    "fsdp": fsdp_block,
    "probe": overlap_probe,
    "two_allreduces": two_allreduces,
}
