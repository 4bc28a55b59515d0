"""A synthetic decoder-style ``SchedulingProblem`` for the scale benchmark.

Shaped like a post-AOT ATen graph of an MoE decoder (not fitted to any test
graph): per layer an RMSNorm chain, q/k/v projections with rotary embedding on q
and k, attention (scores, softmax chain, values, output projection), a residual
add, a second RMSNorm, a router (softmax, top-k), ``experts`` routed experts
(select, gate/up/down projections, SiLU, weighting) combined by a chain of adds
(the functional form of ``index_add_``), a shared expert, and the residual add.
Costs are per op kind (us, device share), with optional per-op jitter so that
layers are not identical.  With ``experts=11`` a layer has 158 ops: 32 layers
make a 5,000-op graph.

``parallel=True`` makes it the graph of one rank of a distributed deployment, with
the collectives as the planner sees them (a launch, its transfer on the process
group's link, its wait; every launch chained to the previous one): the attention
output and the MoE output all-reduced over the tensor-parallel group (Megatron),
and the routed experts' tokens dispatched and combined by all-to-alls over the
expert-parallel group, beside the shared expert (the overlap Ascend deployments
tag by hand).  Three more ops per collective: 12 per layer.

>>> p = decoder_problem(layers=2, streams=4)
>>> len(p.graph), p.streams
(322, 4)
>>> q = decoder_problem(layers=2, streams=4, parallel=True)
>>> len(q.graph) - len(p.graph), sorted(set(q.pinned.values()))
(24, [-2, -1])
"""

from __future__ import annotations

import random

import networkx as nx

from autostream.scheduling.problem import SchedulingProblem

#: op kind -> (duration us, device share)
COSTS: dict[str, tuple[float, float]] = {
    "view": (0.0, 0.0),
    "elementwise": (1.5, 0.25),
    "reduce": (2.0, 0.3),
    "q_proj": (14.0, 0.7),
    "kv_proj": (6.0, 0.5),
    "o_proj": (14.0, 0.7),
    "bmm": (8.0, 0.6),
    "router": (2.0, 0.2),
    "topk": (3.0, 0.2),
    "gather": (2.0, 0.3),
    "expert_mm": (5.0, 0.4),
    "shared_mm": (8.0, 0.5),
    "lm_head": (40.0, 0.9),
    "launch": (1.0, 0.0),
    "wait": (0.5, 0.0),
}
#: collective -> (transfer us, device share of the running transfer): a decode step's
#: activations over an NVLink/HCCS-class link, the kernels taking a few compute units
TRANSFERS: dict[str, tuple[float, float]] = {
    "all_reduce": (12.0, 0.1),
    "all_to_all": (18.0, 0.1),
}


class _Builder:
    def __init__(self, jitter: float, seed: int, parallel: bool = False) -> None:
        self.g = nx.DiGraph()
        self.rng = random.Random(seed)
        self.jitter = jitter
        self.parallel = parallel
        self.last_launch: str | None = None
        self.last_transfer: dict[str, str] = {}

    def collective(self, name: str, kind: str, group: str, x: str) -> str:
        """``x`` through a collective on ``group``'s link (``x`` itself when not parallel)."""
        if not self.parallel:
            return x
        launch = self.op(f"{name}.launch", "launch", x)
        d, r = TRANSFERS[kind]
        if self.jitter:
            d *= 1 + self.rng.uniform(-self.jitter, self.jitter)
        link = f"link:{group}"
        transfer = f"{name}.transfer"
        self.g.add_node(transfer, duration=round(d, 3), share=r, order=len(self.g),
                        target=kind, lane=link)
        self.g.add_edge(launch, transfer)
        if self.last_launch is not None:  # one issue order on every rank
            self.g.add_edge(self.last_launch, launch)
        if link in self.last_transfer:  # a link is serial
            self.g.add_edge(self.last_transfer[link], transfer)
        self.last_launch, self.last_transfer[link] = launch, transfer
        return self.op(f"{name}.wait", "wait", launch, transfer)

    def op(self, name: str, kind: str, *inputs: str) -> str:
        d, r = COSTS[kind]
        if self.jitter and d:
            d *= 1 + self.rng.uniform(-self.jitter, self.jitter)
        self.g.add_node(name, duration=round(d, 3), share=r, order=len(self.g), target=kind)
        self.g.add_edges_from((i, name) for i in inputs)
        return name

    def rmsnorm(self, p: str, x: str) -> str:
        sq = self.op(f"{p}.pow", "elementwise", x)
        mean = self.op(f"{p}.mean", "reduce", sq)
        eps = self.op(f"{p}.add_eps", "elementwise", mean)
        rs = self.op(f"{p}.rsqrt", "elementwise", eps)
        y = self.op(f"{p}.mul", "elementwise", x, rs)
        return self.op(f"{p}.mul_w", "elementwise", y)

    def rotary(self, p: str, x: str) -> str:
        a = self.op(f"{p}.slice1", "view", x)
        b = self.op(f"{p}.slice2", "view", x)
        nb = self.op(f"{p}.neg", "elementwise", b)
        rot = self.op(f"{p}.cat", "elementwise", nb, a)
        xc = self.op(f"{p}.mul_cos", "elementwise", x)
        rs = self.op(f"{p}.mul_sin", "elementwise", rot)
        return self.op(f"{p}.add", "elementwise", xc, rs)

    def layer(self, p: str, x: str, experts: int) -> str:
        h = self.rmsnorm(f"{p}.norm1", x)
        q = self.op(f"{p}.q_view", "view", self.op(f"{p}.q_proj", "q_proj", h))
        k = self.op(f"{p}.k_view", "view", self.op(f"{p}.k_proj", "kv_proj", h))
        v = self.op(f"{p}.v_view", "view", self.op(f"{p}.v_proj", "kv_proj", h))
        q, k = self.rotary(f"{p}.rope_q", q), self.rotary(f"{p}.rope_k", k)
        kt = self.op(f"{p}.k_t", "view", k)
        s = self.op(f"{p}.scores", "bmm", q, kt)
        s = self.op(f"{p}.scale", "elementwise", s)
        s = self.op(f"{p}.mask", "elementwise", s)
        mx = self.op(f"{p}.amax", "reduce", s)
        sub = self.op(f"{p}.sub", "elementwise", s, mx)
        ex = self.op(f"{p}.exp", "elementwise", sub)
        sm = self.op(f"{p}.sum", "reduce", ex)
        pr = self.op(f"{p}.div", "elementwise", ex, sm)
        o = self.op(f"{p}.pv", "bmm", pr, v)
        o = self.op(f"{p}.o_view", "view", self.op(f"{p}.o_t", "view", o))
        o = self.op(f"{p}.o_proj", "o_proj", o)
        o = self.collective(f"{p}.attn_ar", "all_reduce", "tp", o)
        x = self.op(f"{p}.resid1", "elementwise", x, o)
        h = self.rmsnorm(f"{p}.norm2", x)
        logits = self.op(f"{p}.router", "router", h)
        probs = self.op(f"{p}.router_softmax", "reduce", logits)
        top = self.op(f"{p}.topk", "topk", probs)
        w = self.op(f"{p}.topk_w", "view", top)
        idx = self.op(f"{p}.topk_i", "view", top)
        w = self.op(f"{p}.norm_w", "elementwise", w)
        tokens = self.collective(f"{p}.dispatch", "all_to_all", "ep", h)
        acc = None
        for e in range(experts):
            q = f"{p}.expert{e}"
            sel = self.op(f"{q}.select", "gather", idx)
            xe = self.op(f"{q}.gather", "gather", tokens, sel)
            gate = self.op(f"{q}.gate", "expert_mm", xe)
            up = self.op(f"{q}.up", "expert_mm", xe)
            act = self.op(f"{q}.silu", "elementwise", gate)
            y = self.op(f"{q}.down", "expert_mm", self.op(f"{q}.mul", "elementwise", act, up))
            y = self.op(f"{q}.weight", "elementwise", y, w, sel)
            acc = y if acc is None else self.op(f"{q}.combine", "elementwise", acc, y)
        if acc is not None:
            acc = self.collective(f"{p}.combine", "all_to_all", "ep", acc)
        gate = self.op(f"{p}.shared.gate", "shared_mm", h)
        up = self.op(f"{p}.shared.up", "shared_mm", h)
        act = self.op(f"{p}.shared.silu", "elementwise", gate)
        sh = self.op(f"{p}.shared.down", "shared_mm", self.op(f"{p}.shared.mul", "elementwise", act, up))
        moe = self.op(f"{p}.moe_add", "elementwise", acc, sh) if acc else sh
        moe = self.collective(f"{p}.mlp_ar", "all_reduce", "tp", moe)
        return self.op(f"{p}.resid2", "elementwise", x, moe)


def decoder_problem(
    layers: int = 32,
    streams: int = 4,
    experts: int = 11,
    jitter: float = 0.0,
    seed: int = 0,
    sync_latency_us: float = 1.5,
    parallel: bool = False,
) -> SchedulingProblem:
    """``layers`` decoder layers plus embedding and LM head; ``jitter`` (0..1) perturbs costs;
    ``parallel``: one rank's graph, with its collectives (the module docstring)."""
    b = _Builder(jitter, seed, parallel)
    x = b.op("embed", "gather")
    for i in range(layers):
        x = b.layer(f"L{i}", x, experts)
    x = b.rmsnorm("final_norm", x)
    b.op("lm_head", "lm_head", x)
    return SchedulingProblem(b.g, streams=streams, sync_latency_us=sync_latency_us)
