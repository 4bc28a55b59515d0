"""The experts' own layers: MoE and MLA layers with the streams their engineers placed by hand.

Each layer is written op by op at the granularity of the real one (router gate, top-k,
dispatch, grouped matmul 1, SwiGLU, grouped matmul 2, combine; MLA's projections, norms,
rope and cache write), and each placement with the ops a user writes for it: TorchAir
scopes as ``npu_stream_switch(label)`` emits them, ``air.record``/``air.wait`` and
``air.wait_tensor`` (``npu_wait_tensor``).  Every op carries the source line it is
written on (``meta["stack_trace"]``).  Recipes (docs/experts.md, read from vLLM-Ascend,
vLLM and SGLang; none of their code):

- ``coarse`` (a): the side stream forks at MoE entry and runs the whole shared MLP; main
  runs gate, dispatch, experts, combine and waits; the shared all-reduce stays on main;
- ``fine_bf16`` (b): the side waits for "before dispatch" and runs shared gate_up and
  the activation, waits for "before combine" and runs shared down; main joins at the end;
- ``fine_w8a8`` (c): dynamic quant beside the router gate; shared gate_up after the router
  logits; dequant-SwiGLU after the dispatch output; shared down after grouped matmul 2;
- ``mla_decode`` (d): after ``q_a_proj`` the side runs the KV projection, kv-norm, rope and
  the cache write (ordering by ``npu_wait_tensor``); main runs ``q_a_layernorm`` and
  ``q_proj`` and waits;
- ``dual_stream`` (e): SGLang's: the routed path on the alternate stream, shared experts
  on main, then join, add, all-reduce;
- ``v4_prolog`` (f): three fork/join pairs, each a matmul on one stream beside vector work;
- ``fine_bf16_race`` (b with vLLM #28942's bug): combine writes ``hidden_states`` in
  place while the shared expert on the side stream still reads it.

``build(recipe, config, tokens)`` returns an :class:`ExpertLayer`: the ``GraphModule``
with ``meta["val"]`` at the real sizes (fake tensors: nothing is allocated) and, for a
run, ``inputs(scale)`` real tensors at the sizes divided by ``scale``.  Dispatch, combine
and the all-reduce are registered communication ops (``autostream.comm``) whose CPU
kernels compute one rank's part.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from autostream.comm.registry import DEFAULT_REGISTRY, CommSpec
from autostream.dialects.torchair import STREAM_LABEL_KEY, air_ops, wait_tensor_op

aten = torch.ops.aten
BF16 = torch.bfloat16

RECIPES = ("coarse", "fine_bf16", "fine_w8a8", "mla_decode", "dual_stream", "v4_prolog",
           "fine_bf16_race")
#: recipes of a MoE layer (the others are attention's)
MOE_RECIPES = ("coarse", "fine_bf16", "fine_w8a8", "dual_stream", "fine_bf16_race")


@dataclass(frozen=True)
class Config:
    """A model's sizes on one rank (expert parallel over ``ep`` ranks)."""

    name: str
    hidden: int
    moe_inter: int
    experts: int
    topk: int
    ep: int
    shared_inter: int
    #: MLA (DeepSeek only): heads, q/kv LoRA ranks, nope/rope/v head dims
    heads: int = 0
    q_lora: int = 0
    kv_lora: int = 0
    nope: int = 0
    rope: int = 0
    v_dim: int = 0

    @property
    def local_experts(self) -> int:
        return max(1, self.experts // self.ep)


#: DeepSeek-V3 (and R1): 256 routed experts, top-8, one shared expert, MLA; EP over 32 ranks
DEEPSEEK_V3 = Config("deepseek_v3", 7168, 2048, 256, 8, 32, 2048, heads=128, q_lora=1536,
                     kv_lora=512, nope=128, rope=64, v_dim=128)
#: Qwen3-235B-A22B's MoE (128 experts, top-8) with a Qwen2-MoE-style shared expert of the
#: routed experts' width (Qwen3-MoE itself has none); EP over 16 ranks
QWEN3_MOE = Config("qwen3_moe", 4096, 1536, 128, 8, 16, 1536)
CONFIGS = {c.name: c for c in (DEEPSEEK_V3, QWEN3_MOE)}
#: the tensor-parallel group of the shared expert's all-reduce (and of SGLang's MoE)
TP = 8


# -- the ops a real layer calls that ATen has no single op for --------------------------

_LIB: list[torch.library.Library] = []


def _define_ops() -> None:
    """``experts::`` ops with CPU kernels (one rank's part) and fake kernels."""
    if hasattr(torch.ops, "experts") and hasattr(torch.ops.experts, "dispatch"):
        return
    lib = torch.library.Library("experts", "DEF")
    _LIB.append(lib)

    def define(schema: str, cpu: Callable, fake: Callable) -> None:
        name = schema.split("(", 1)[0]
        lib.define(schema)
        lib.impl(name, cpu, "CPU")
        lib.impl(name, fake, "Meta")

    def slots(t: int, k: int, e: int) -> int:
        return math.ceil(t * k / e)

    def dispatch(x, ids, local, group, group_size=1):
        t, h = x.shape
        rows = x.index_select(0, torch.arange(ids.numel()) // ids.shape[1])
        c = slots(t, ids.shape[1], local)
        out = x.new_zeros(local * c, h)
        out[: rows.shape[0]] = rows
        return out.view(local, c, h)

    define("dispatch(Tensor x, Tensor topk_ids, int local_experts, str group, "
           "int group_size=1) -> Tensor",
           dispatch, lambda x, ids, local, group, group_size=1: x.new_empty(
               local, slots(x.shape[0], ids.shape[1], local), x.shape[1]))

    def combine(y, weights, group, group_size=1):
        t, k = weights.shape
        rows = y.reshape(-1, y.shape[-1])[: t * k].view(t, k, -1)
        return (rows * weights.unsqueeze(-1).to(rows.dtype)).sum(1)

    define("combine(Tensor y, Tensor topk_weights, str group, int group_size=1) -> Tensor",
           combine, lambda y, w, group, group_size=1: y.new_empty(w.shape[0], y.shape[-1]))
    # the same on one rank (tensor-parallel MoE: tokens sorted by expert, no all-to-all)
    define("permute(Tensor x, Tensor topk_ids, int local_experts, str group) -> Tensor",
           dispatch, lambda x, ids, local, group: x.new_empty(
               local, slots(x.shape[0], ids.shape[1], local), x.shape[1]))
    define("unpermute(Tensor y, Tensor topk_weights, str group) -> Tensor", combine,
           lambda y, w, group: y.new_empty(w.shape[0], y.shape[-1]))

    def combine_(out, y, weights, group, group_size=1):
        return out.copy_(combine(y, weights, group))

    define("combine_(Tensor(a!) out, Tensor y, Tensor topk_weights, str group, "
           "int group_size=1) -> Tensor(a!)",
           combine_, lambda out, y, w, group, group_size=1: out)
    define("all_reduce(Tensor x, str group, int group_size=1) -> Tensor",
           lambda x, group, group_size=1: x.clone(),
           lambda x, group, group_size=1: torch.empty_like(x))

    def quant(x):
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-6) / 127
        return (x / scale).round().to(torch.int8), scale.float()

    define("dynamic_quant(Tensor x) -> (Tensor, Tensor)", quant,
           lambda x: (x.new_empty(x.shape, dtype=torch.int8),
                      x.new_empty(*x.shape[:-1], 1, dtype=torch.float32)))

    def gmm_w8a8(x, w, scale):
        return (x.float() @ w.float() * scale.unsqueeze(-1) if x.dim() == 3
                else x.float() @ w.float() * scale).to(BF16)

    def gmm_w8a8_fake(x, w, scale):
        return x.new_empty(*x.shape[:-1], w.shape[-1], dtype=BF16)

    define("gmm_w8a8(Tensor x, Tensor w, Tensor scale) -> Tensor", gmm_w8a8, gmm_w8a8_fake)

    def dequant_swiglu(y):
        a, b = y.float().chunk(2, -1)
        return (torch.nn.functional.silu(a) * b).to(torch.int8)

    define("dequant_swiglu(Tensor y) -> Tensor", dequant_swiglu,
           lambda y: y.new_empty(*y.shape[:-1], y.shape[-1] // 2, dtype=torch.int8))

    def rms_norm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)

    define("rms_norm(Tensor x, Tensor w) -> Tensor", rms_norm,
           lambda x, w: torch.empty_like(x))

    def rope(x, cos):
        return x * cos[: x.shape[0]].view(x.shape[0], *([1] * (x.dim() - 2)), -1)

    define("rope(Tensor x, Tensor cos) -> Tensor", rope, lambda x, cos: torch.empty_like(x))

    def kv_cache(kv, w, cos, cache, kv_lora):
        normed = rms_norm(kv[:, :kv_lora], w)
        pe = rope(kv[:, kv_lora:], cos)
        cache[: kv.shape[0]] = torch.cat([normed, pe], -1)
        return normed, pe

    define("kv_norm_rope_cache(Tensor kv, Tensor w, Tensor cos, Tensor(a!) cache, "
           "int kv_lora) -> (Tensor, Tensor)", kv_cache,
           lambda kv, w, cos, cache, kv_lora: (kv.new_empty(kv.shape[0], kv_lora),
                                               kv.new_empty(kv.shape[0],
                                                            kv.shape[1] - kv_lora)))

    def mla_attention(q_lat, q_pe, cache):
        latent = cache[:, : q_lat.shape[-1]].to(q_lat.dtype)
        scores = (q_lat @ latent.T).float().softmax(-1).to(q_lat.dtype)
        return scores @ latent + q_pe.sum()

    define("mla_attention(Tensor q_nope, Tensor q_pe, Tensor cache) -> Tensor",
           mla_attention, lambda q_nope, q_pe, cache: torch.empty_like(q_nope))
    for name, kind in (("dispatch", "all_to_all"), ("combine", "all_to_all"),
                       ("combine_", "all_to_all"), ("all_reduce", "all_reduce")):
        DEFAULT_REGISTRY.register(CommSpec(f"experts::{name}", "blocking", kind, "group"))


# -- writing a layer op by op ----------------------------------------------------------

class _Writer:
    """Appends ATen and air nodes; each op gets its caller's source line as stack trace."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.air = air_ops()
        self.specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}

    def input(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = BF16
              ) -> torch.fx.Node:
        self.specs[name] = (tuple(int(s) for s in shape), dtype)
        return self.graph.placeholder(name)

    def __call__(self, op, *args, **kwargs) -> torch.fx.Node:
        node = self.graph.call_function(op, args, kwargs)
        frame = sys._getframe(1)
        code = _line(frame.f_code.co_filename, frame.f_lineno)
        node.meta["stack_trace"] = (f'  File "{frame.f_code.co_filename}", line '
                                    f'{frame.f_lineno}, in {frame.f_code.co_name}\n    {code}\n')
        return node

    def item(self, node: torch.fx.Node, i: int) -> torch.fx.Node:
        import operator

        return self.graph.call_function(operator.getitem, (node, i))

    @contextlib.contextmanager
    def stream(self, label: str) -> Iterator[None]:
        """``with npu_stream_switch(label):`` as TorchAir emits it."""
        self.graph.call_function(self.air.scope_enter, (
            [STREAM_LABEL_KEY, "_user_stream_priority", "_enable_inner_parallel"],
            [label, "0", "True"]))
        try:
            yield
        finally:
            self.graph.call_function(self.air.scope_exit, ())

    def record(self) -> torch.fx.Node:
        return self.graph.call_function(self.air.record, ())

    def wait(self, *tokens: torch.fx.Node) -> None:
        self.graph.call_function(self.air.wait, (list(tokens),))

    def wait_tensor(self, x: torch.fx.Node, dependency: torch.fx.Node) -> torch.fx.Node:
        return self.graph.call_function(wait_tensor_op(), (x, dependency))


def _line(path: str, number: int) -> str:
    import linecache

    return linecache.getline(path, number).strip()


@dataclass(frozen=True)
class ExpertLayer:
    """One layer with one placement, at one size."""

    recipe: str
    config: Config
    tokens: int
    gm: torch.fx.GraphModule
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(repr=False)

    def inputs(self, scale: int = 64, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Real inputs with every size above 16 divided by ``scale`` (``build(...,
        scale=scale)`` builds the graph for them)."""
        gen = torch.Generator().manual_seed(seed)
        out = []
        for shape, dtype in self.specs.values():
            if dtype == torch.int64:
                out.append(torch.randint(0, 4, shape, generator=gen))
            elif dtype == torch.int8:
                out.append(torch.randint(-8, 8, shape, generator=gen, dtype=torch.int8))
            else:
                out.append((torch.randn(shape, generator=gen) * 0.1).to(dtype))
        return tuple(out)


def _scaled(n: int, scale: int) -> int:
    return n if n <= 16 or scale == 1 else max(16, n // scale)


def build(recipe: str, config: Config | str = DEEPSEEK_V3, tokens: int = 32, scale: int = 1
          ) -> ExpertLayer:
    """The layer of ``recipe`` (``RECIPES``) at ``config``'s sizes (divided by ``scale``,
    sizes of 16 or less kept) for ``tokens`` tokens per rank, with fake values.

    >>> layer = build("coarse", "qwen3_moe", tokens=8)
    >>> layer.gm.graph.find_nodes(op="placeholder")[0].meta["val"].shape
    torch.Size([8, 4096])
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    cfg = CONFIGS[config] if isinstance(config, str) else config
    if recipe in ("mla_decode", "v4_prolog") and not cfg.heads:
        raise ValueError(f"recipe {recipe!r} is an MLA layer; {cfg.name} has no MLA sizes")
    _define_ops()
    s = {f: _scaled(getattr(cfg, f), scale) for f in
         ("hidden", "moe_inter", "shared_inter", "q_lora", "kv_lora", "nope", "rope", "v_dim")}
    heads = _scaled(cfg.heads, scale) if cfg.heads else 0
    w = _Writer()
    out = _BUILDERS[recipe](w, cfg, s, heads, tokens)
    w.graph.output(tuple(out) if isinstance(out, tuple) else (out,))  # as AOT graphs return
    gm = torch.fx.GraphModule(torch.nn.Module(), w.graph)
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        fakes = [torch.empty(shape, dtype=dtype) for shape, dtype in w.specs.values()]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return ExpertLayer(recipe, cfg, tokens, gm, dict(w.specs))


# -- the layers ---------------------------------------------------------------------------

def _moe_inputs(w: _Writer, cfg: Config, s: dict[str, int], t: int, w8a8: bool = False):
    h, local = s["hidden"], cfg.local_experts
    wdt = torch.int8 if w8a8 else BF16
    x = w.input("hidden_states", (t, h))
    gate = w.input("w_gate", (h, cfg.experts))
    w1 = w.input("w13", (local, h, 2 * s["moe_inter"]), wdt)
    w2 = w.input("w2", (local, s["moe_inter"], h), wdt)
    sw1 = w.input("shared_w13", (h, 2 * s["shared_inter"]), wdt)
    sw2 = w.input("shared_w2", (s["shared_inter"], h), wdt)
    return x, gate, w1, w2, sw1, sw2


def _router(w: _Writer, cfg: Config, x, gate):
    logits = w(aten.mm.default, x, gate)
    probs = w(aten.sigmoid.default, logits)
    top = w(aten.topk.default, probs, cfg.topk)
    return logits, w.item(top, 0), w.item(top, 1)


def _swiglu(w: _Writer, y):
    a = w(aten.slice.Tensor, y, -1, 0, None, 2)
    b = w(aten.slice.Tensor, y, -1, 1, None, 2)
    return w(aten.mul.Tensor, w(aten.silu.default, a), b)


def _routed(w: _Writer, cfg: Config, x, ids, weights, w1, w2, dispatch=None):
    if dispatch is None:
        sent = w(torch.ops.experts.dispatch.default, x, ids, cfg.local_experts, "ep",
                 group_size=cfg.ep)
    else:
        sent = w(dispatch.default, x, ids, cfg.local_experts, "ep")
    up = w(aten.bmm.default, sent, w1)
    act = _swiglu(w, up)
    down = w(aten.bmm.default, act, w2)
    return sent, down


def _coarse(w, cfg, s, heads, t):
    x, gate, w1, w2, sw1, sw2 = _moe_inputs(w, cfg, s, t)
    entry = w.record()
    with w.stream("moe_secondary"):
        w.wait(entry)
        shared = w(aten.mm.default, _swiglu(w, w(aten.mm.default, x, sw1)), sw2)
        shared_done = w.record()
    _, ids, weights = _router(w, cfg, x, gate)
    _, down = _routed(w, cfg, x, ids, weights, w1, w2)
    routed = w(torch.ops.experts.combine.default, down, weights, "ep", group_size=cfg.ep)
    w.wait(shared_done)
    reduced = w(torch.ops.experts.all_reduce.default, shared, "tp", group_size=TP)
    return w(aten.add.Tensor, routed, reduced)


def _fine(w, cfg, s, heads, t, race: bool = False):
    x, gate, w1, w2, sw1, sw2 = _moe_inputs(w, cfg, s, t)
    _, ids, weights = _router(w, cfg, x, gate)
    before_dispatch = w.record()
    sent = w(torch.ops.experts.dispatch.default, x, ids, cfg.local_experts, "ep",
             group_size=cfg.ep)
    with w.stream("moe_secondary"):
        w.wait(before_dispatch)
        shared_act = _swiglu(w, w(aten.mm.default, x, sw1))
    up = w(aten.bmm.default, sent, w1)
    down = w(aten.bmm.default, _swiglu(w, up), w2)
    before_combine = w.record()
    with w.stream("moe_secondary"):
        w.wait(before_combine)
        shared = w(aten.mm.default, shared_act, sw2)
        shared_done = w.record()
    if race:  # vLLM #28942: the routed result written into hidden_states in place
        routed = w(torch.ops.experts.combine_.default, x, down, weights, "ep",
                   group_size=cfg.ep)
    else:
        routed = w(torch.ops.experts.combine.default, down, weights, "ep", group_size=cfg.ep)
    w.wait(shared_done)
    reduced = w(torch.ops.experts.all_reduce.default, shared, "tp", group_size=TP)
    return w(aten.add.Tensor, routed, reduced)


def _fine_w8a8(w, cfg, s, heads, t):
    x, gate, w1, w2, sw1, sw2 = _moe_inputs(w, cfg, s, t, w8a8=True)
    scale_w = w.input("w_scale", (1,), torch.float32)
    with w.stream("moe_secondary"):
        quant = w(torch.ops.experts.dynamic_quant.default, x)
        xq, xs = w.item(quant, 0), w.item(quant, 1)
        quant_done = w.record()
    logits, ids, weights = _router(w, cfg, x, gate)
    after_logits = w.record()
    w.wait(quant_done)
    sent = w(torch.ops.experts.dispatch.default, xq, ids, cfg.local_experts, "ep",
             group_size=cfg.ep)
    after_dispatch = w.record()
    with w.stream("moe_secondary"):
        w.wait(after_logits)
        shared_up = w(torch.ops.experts.gmm_w8a8.default, xq, sw1, xs)
        w.wait(after_dispatch)
        shared_act = w(torch.ops.experts.dequant_swiglu.default, shared_up)
    up = w(torch.ops.experts.gmm_w8a8.default, sent, w1, scale_w)
    act = w(torch.ops.experts.dequant_swiglu.default, up)
    down = w(torch.ops.experts.gmm_w8a8.default, act, w2, scale_w)
    after_gmm2 = w.record()
    with w.stream("moe_secondary"):
        w.wait(after_gmm2)
        shared = w(torch.ops.experts.gmm_w8a8.default, shared_act, sw2, scale_w)
        shared_done = w.record()
    routed = w(torch.ops.experts.combine.default, down, weights, "ep", group_size=cfg.ep)
    w.wait(shared_done)
    reduced = w(torch.ops.experts.all_reduce.default, shared, "tp", group_size=TP)
    return w(aten.add.Tensor, routed, reduced)


def _dual_stream(w, cfg, s, heads, t):
    x, gate, w1, w2, sw1, sw2 = _moe_inputs(w, cfg, s, t)
    entry = w.record()
    with w.stream("alt_stream"):
        w.wait(entry)
        _, ids, weights = _router(w, cfg, x, gate)  # tensor parallel: no all-to-all
        sent, down = _routed(w, cfg, x, ids, weights, w1, w2, torch.ops.experts.permute)
        routed = w(torch.ops.experts.unpermute.default, down, weights, "tp")
        routed_done = w.record()
    shared = w(aten.mm.default, _swiglu(w, w(aten.mm.default, x, sw1)), sw2)
    w.wait(routed_done)
    both = w(aten.add.Tensor, routed, shared)
    return w(torch.ops.experts.all_reduce.default, both, "tp", group_size=TP)


def _mla_inputs(w, cfg, s, heads, t):
    h = s["hidden"]
    qk = s["nope"] + s["rope"]
    return (w.input("hidden_states", (t, h)),
            w.input("w_q_a", (h, s["q_lora"])),
            w.input("q_a_norm", (s["q_lora"],)),
            w.input("w_q_b", (s["q_lora"], heads * qk)),
            w.input("w_kv_a", (h, s["kv_lora"] + s["rope"])),
            w.input("kv_norm", (s["kv_lora"],)),
            w.input("cos", (max(t, 16), s["rope"])),
            w.input("kv_cache", (max(4 * t, 64), s["kv_lora"] + s["rope"])),
            w.input("w_uk", (heads, s["nope"], s["kv_lora"])))


def _mla_decode(w, cfg, s, heads, t):
    x, wqa, qan, wqb, wkva, kvn, cos, cache, wuk = _mla_inputs(w, cfg, s, heads, t)
    q_c = w(aten.mm.default, x, wqa)
    with w.stream("mla_secondary"):
        x_side = w.wait_tensor(x, q_c)
        kv = w(aten.mm.default, x_side, wkva)
        kv_out = w(torch.ops.experts.kv_norm_rope_cache.default, kv, kvn, cos, cache,
                   s["kv_lora"])
        k_pe = w.item(kv_out, 1)
    q = w(aten.mm.default, w(torch.ops.experts.rms_norm.default, q_c, qan), wqb)
    q3 = w(aten.view.default, q, [t, heads, s["nope"] + s["rope"]])
    q_nope = w(aten.slice.Tensor, q3, 2, 0, s["nope"])
    q_pe = w(aten.slice.Tensor, q3, 2, s["nope"], None)
    with w.stream("mla_secondary"):
        q_pe_ready = w.wait_tensor(q_pe, k_pe)
        q_pe_rot = w(torch.ops.experts.rope.default, q_pe_ready, cos)
    q_lat = w(aten.bmm.default, w(aten.transpose.int, q_nope, 0, 1), wuk)
    q_lat = w.wait_tensor(q_lat, q_pe_rot)
    q_lat = w.wait_tensor(q_lat, w.item(kv_out, 0))
    return w(torch.ops.experts.mla_attention.default, q_lat, q_pe_rot, cache)


def _v4_prolog(w, cfg, s, heads, t):
    x, wqa, qan, wqb, wkva, kvn, cos, cache, wuk = _mla_inputs(w, cfg, s, heads, t)
    start = w.record()
    with w.stream("prolog_vector"):  # pair 1: q_a matmul | the hidden states' quant
        w.wait(start)
        quant = w(torch.ops.experts.dynamic_quant.default, x)
        kv = w(aten.mm.default, x, wkva)
        pair1 = w.record()
    q_c = w(aten.mm.default, x, wqa)
    w.wait(pair1)
    fork2 = w.record()
    with w.stream("prolog_vector"):  # pair 2: q_b matmul | kv norm, rope, cache scatter
        w.wait(fork2)
        kv_out = w(torch.ops.experts.kv_norm_rope_cache.default, kv, kvn, cos, cache,
                   s["kv_lora"])
        pair2 = w.record()
    q = w(aten.mm.default, w(torch.ops.experts.rms_norm.default, q_c, qan), wqb)
    q3 = w(aten.view.default, q, [t, heads, s["nope"] + s["rope"]])
    q_nope = w(aten.slice.Tensor, q3, 2, 0, s["nope"])
    q_pe = w(aten.slice.Tensor, q3, 2, s["nope"], None)
    fork3 = w.record()
    w.wait(pair2)
    with w.stream("prolog_vector"):  # pair 3: q absorb matmul | q rope
        w.wait(fork3)
        q_pe_rot = w(torch.ops.experts.rope.default, q_pe, cos)
        pair3 = w.record()
    q_lat = w(aten.bmm.default, w(aten.transpose.int, q_nope, 0, 1), wuk)
    w.wait(pair3)
    del kv_out
    attn = w(torch.ops.experts.mla_attention.default, q_lat, q_pe_rot, cache)
    return attn, w.item(quant, 0)


_BUILDERS: dict[str, Callable] = {
    "coarse": _coarse,
    "fine_bf16": _fine,
    "fine_w8a8": _fine_w8a8,
    "mla_decode": _mla_decode,
    "dual_stream": _dual_stream,
    "v4_prolog": _v4_prolog,
    "fine_bf16_race": lambda w, cfg, s, heads, t: _fine(w, cfg, s, heads, t, race=True),
}


def spec(recipe: str, config: str = "deepseek_v3", tokens: int = 32
         ) -> tuple[torch.fx.GraphModule, tuple[()]]:
    """``(graph, ())`` for ``autostream check``: the layer at its real sizes (fake values).

    >>> gm, _ = spec("coarse", "qwen3_moe", 8); len(gm.graph.find_nodes(op="placeholder"))
    6
    """
    return build(recipe, config, tokens).gm, ()


# one ``autostream check`` SPEC per recipe (``autostream.models.experts:<recipe>``;
# ``autostream check --list`` prints them with their first docstring line)

def coarse() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """MoE, recipe (a): the whole shared expert on a side stream (DeepSeek-V3, 32 tokens)."""
    return spec("coarse")


def fine_bf16() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """MoE, recipe (b): shared expert split around dispatch and combine (DeepSeek-V3, 32 tokens)."""
    return spec("fine_bf16")


def fine_w8a8() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """MoE, recipe (c): W8A8, quant and dequant beside the routed path (DeepSeek-V3, 32 tokens)."""
    return spec("fine_w8a8")


def mla_decode() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """MLA decode, recipe (d): KV path on a side stream, npu_wait_tensor (DeepSeek-V3, 32 tokens)."""
    return spec("mla_decode")


def dual_stream() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """MoE, recipe (e): SGLang's routed path on the alternate stream (DeepSeek-V3, 32 tokens)."""
    return spec("dual_stream")


def v4_prolog() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """Attention prolog, recipe (f): three fork/join pairs (DeepSeek-V3, 32 tokens)."""
    return spec("v4_prolog")


def fine_bf16_race() -> tuple[torch.fx.GraphModule, tuple[()]]:
    """MoE, recipe (b) with vLLM #28942's race: combine writes what the side stream reads."""
    return spec("fine_bf16_race")
