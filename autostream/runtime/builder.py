"""Writing rewritten graphs by hand (tests, experiments): FX plus the air stream ops.

>>> import torch
>>> b = DialectBuilder()
>>> x = b.input("x")
>>> with b.stream(1):
...     y = b.call(torch.ops.aten.neg.default, x)
...     t = b.record()
>>> _ = b.wait(t)
>>> gm = b.finish(y)
>>> gm(torch.tensor([1.0]))[0]
tensor([-1.])
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx

from autostream.dialects.torchair import STREAM_LABEL_KEY, air_ops, stream_label


class DialectBuilder:
    """Appends nodes in launch order; ``with b.stream(k):`` wraps them in a stream scope."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.ops = air_ops()
        self.current = 0

    def input(self, name: str) -> torch.fx.Node:
        return self.graph.placeholder(name)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self.graph.call_function(fn, args, kwargs)

    @contextlib.contextmanager
    def stream(self, k: int) -> Iterator[None]:
        if k == 0:
            yield
            return
        self.graph.call_function(self.ops.scope_enter, ([STREAM_LABEL_KEY], [stream_label(k)]))
        self.current = k
        try:
            yield
        finally:
            self.graph.call_function(self.ops.scope_exit, ())
            self.current = 0

    def record(self) -> torch.fx.Node:
        return self.graph.call_function(self.ops.record, ())

    def wait(self, *tokens: torch.fx.Node) -> torch.fx.Node:
        return self.graph.call_function(self.ops.wait, (list(tokens),))

    def finish(self, *outputs: torch.fx.Node) -> torch.fx.GraphModule:
        self.graph.output(tuple(outputs))
        return torch.fx.GraphModule(torch.nn.Module(), self.graph)


def two_chains(depth: int = 8, rows: int = 16, width: int = 1024, streams: int = 2,
               seed: int = 0, softmax: bool = False
               ) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """Two independent chains of ``depth`` matmuls ``(rows x width) @ (width x width)``, summed.

    ``softmax``: each matmul is followed by a softmax over its rows (chains of small
    ops, where the threads runtime's GIL hand-overs matter most).

    Chain ``b`` runs on stream 1 when ``streams == 2`` (joined before the sum),
    everything on stream 0 when ``streams == 1``.  Each chain has its own weights,
    as two branches of a model do (chains sharing weights would read them from a
    shared cache and overstate the overlap).  Returns the graph and its inputs
    ``(x, y, a_0 ... a_{depth-1}, b_0 ... b_{depth-1})``.

    >>> gm, inputs = two_chains(depth=2, rows=2, width=4)
    >>> gm(*inputs)[0].shape, len(inputs)
    (torch.Size([2, 4]), 6)
    """
    if streams not in (1, 2):
        raise ValueError("two_chains supports streams=1 or streams=2")
    gen = torch.Generator().manual_seed(seed)
    b = DialectBuilder()
    x, y = b.input("x"), b.input("y")
    wa = [b.input(f"a{i}") for i in range(depth)]
    wb = [b.input(f"b{i}") for i in range(depth)]
    def step(v: torch.fx.Node, w: torch.fx.Node) -> torch.fx.Node:
        v = b.call(torch.ops.aten.mm.default, v, w)
        return b.call(torch.ops.aten._softmax.default, v, -1, False) if softmax else v

    with b.stream(1 if streams == 2 else 0):
        v = y
        for w in wb:
            v = step(v, w)
        token = b.record() if streams == 2 else None
    u = x
    for w in wa:
        u = step(u, w)
    if token is not None:
        b.wait(token)
    out = b.call(torch.ops.aten.add.Tensor, u, v)
    scale = width ** -0.5
    inputs = (torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen),
              *(torch.randn(width, width, generator=gen) * scale for _ in range(2 * depth)))
    return b.finish(out), inputs


def fork_join(streams: int = 3, size: int = 32, depth: int = 2,
              seed: int = 0) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """``h = relu(x @ w0)`` on the main stream, forked to ``streams - 1`` side branches and joined.

    Every stream runs ``depth`` steps of ``tanh(v @ w_k)`` on ``h``; the main stream
    waits for every side branch and sums all branches.  Syncs: one fork record
    waited on by each side stream, one join record per side stream.

    >>> gm, inputs = fork_join(streams=2, size=4)
    >>> gm(*inputs)[0].shape
    torch.Size([4, 4])
    """
    if streams < 1:
        raise ValueError("streams must be >= 1")
    gen = torch.Generator().manual_seed(seed)
    mm, tanh = torch.ops.aten.mm.default, torch.ops.aten.tanh.default
    b = DialectBuilder()
    x = b.input("x")
    ws = [b.input(f"w{k}") for k in range(streams + 1)]
    h = b.call(torch.ops.aten.relu.default, b.call(mm, x, ws[-1]))
    fork = b.record() if streams > 1 else None
    joins, branches = [], []
    for k in range(1, streams):
        with b.stream(k):
            b.wait(fork)
            v = h
            for _ in range(depth):
                v = b.call(tanh, b.call(mm, v, ws[k]))
            branches.append(v)
            joins.append(b.record())
    v = h
    for _ in range(depth):
        v = b.call(tanh, b.call(mm, v, ws[0]))
    if joins:
        b.wait(*joins)
    out = v
    for branch in branches:
        out = b.call(torch.ops.aten.add.Tensor, out, branch)
    inputs = (torch.randn(size, size, generator=gen),
              *(torch.randn(size, size, generator=gen) / size ** 0.5 for _ in range(streams + 1)))
    return b.finish(out), inputs


def striped_chains(depth: int = 16, segments: int = 4, size: int = 2, seed: int = 0
                   ) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """Two chains of ``depth`` ``tanh`` ops, one per stream, each cut into ``segments`` runs.

    A record after every ``depth // segments`` ops cuts each chain (no stream waits
    for them but the last: the main stream joins the side stream and adds the two
    chains).  The runtimes' cost per segment is calibrated on these graphs.

    >>> gm, inputs = striped_chains(depth=4, segments=2)
    >>> gm(*inputs)[0].shape
    torch.Size([2, 2])
    """
    if segments < 1 or depth < segments:
        raise ValueError("striped_chains needs 1 <= segments <= depth")
    gen = torch.Generator().manual_seed(seed)
    tanh = torch.ops.aten.tanh.default
    every = depth // segments
    b = DialectBuilder()
    x, y = b.input("x"), b.input("y")
    chains: list[torch.fx.Node] = []
    join = None
    for stream in (1, 0):
        with b.stream(stream):
            v = y if stream else x
            for i in range(1, depth + 1):
                v = b.call(tanh, v)
                if i % every == 0 and stream == 1:
                    join = b.record()
                elif i % every == 0 and i < depth:
                    b.record()
            chains.append(v)
    b.wait(join)
    out = b.call(torch.ops.aten.add.Tensor, chains[1], chains[0])
    return b.finish(out), (torch.randn(size, size, generator=gen),
                           torch.randn(size, size, generator=gen))
