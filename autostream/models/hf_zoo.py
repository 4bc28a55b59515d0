"""Models nobody here wrote: ``transformers`` model classes at tiny configs, random weights.

Each factory returns ``(model, example_inputs)`` like :mod:`autostream.models.zoo`, so it is a
``MODEL_SPEC`` of the command line (``autostream plan autostream.models.hf_zoo:qwen3_moe``).
``transformers`` is an extra (``pip install -e ".[models]"``), imported on first use;
:func:`available` says which architectures the installed version provides.

Every factory takes ``layers`` (2 for tests, 32 for the scale experiments) and
``cache``:

- ``"none"``: ``forward(input_ids) -> logits`` (or the encoder's hidden states);
- ``"prefill"``: ``forward(input_ids) -> (logits, *keys_and_values)``, the graph that
  builds a fresh KV cache;
- ``"decode"``: one decode step against a ``StaticCache`` held by the module:
  ``forward(input_ids, cache_position) -> logits``, whose graph writes the cache's
  buffers in place (``index_copy_``), a mutation the planner must order.

>>> "llama" in HF_ZOO
True
>>> HF_ZOO["llama"]("sideways")
Traceback (most recent call last):
...
ValueError: cache must be one of none, prefill, decode; got 'sideways'
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from autostream.models.seeding import own_rng

__all__ = ["CACHE_MODES", "HF_ZOO", "available", "bert", "bert_32", "gpt_oss", "gpt_oss_32",
           "granite_moe", "granite_moe_32", "llama", "llama_32", "olmoe", "olmoe_32", "qwen3_moe",
           "qwen3_moe_32"]

CACHE_MODES = ("none", "prefill", "decode")

#: the tiny shape every decoder shares (hidden 64, 4 heads of 16, 2 KV heads)
_DECODER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = dict(num_experts_per_tok=2)
_TOKENS = 8
_CACHE_LEN = 16


def _transformers() -> Any:
    if importlib.util.find_spec("transformers") is None:
        raise ModuleNotFoundError(
            "the transformers model zoo needs the 'transformers' package: "
            "pip install -e \".[models]\" (or pip install transformers)")
    import transformers

    return transformers


class _Logits(nn.Module):
    """``input_ids -> logits``: the model's forward with the cache off."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, use_cache=False).logits


class _Prefill(nn.Module):
    """``input_ids -> (logits, k0, v0, k1, v1, ...)``: a prompt's logits and fresh KV cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, use_cache=True)
        cache = out.cache if "cache" in out else out.past_key_values
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.logits, *tensors)


class _Decode(nn.Module):
    """One decode step against a ``StaticCache`` the module owns (and writes in place)."""

    def __init__(self, model: nn.Module, cache: Any) -> None:
        super().__init__()
        self.model = model
        self.cache = cache

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, cache_position=cache_position, use_cache=True,
                          **_cache_kwarg(self.model, self.cache)).logits


def _cache_kwarg(model: nn.Module, cache: Any) -> dict[str, Any]:
    """``cache=`` in recent ``transformers``, ``past_key_values=`` before."""
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


@own_rng
def _decoder(config_name: str, model_name: str, layers: int, cache: str, seed: int,
             attention: str = "sdpa", **config: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {', '.join(CACHE_MODES)}; got {cache!r}")
    tf = _transformers()
    torch.manual_seed(seed)
    cfg = getattr(tf, config_name)(num_hidden_layers=layers, **{**_DECODER, **config})
    cfg._attn_implementation = attention
    model = getattr(tf, model_name)(cfg).eval()
    ids = torch.randint(3, cfg.vocab_size, (1, _TOKENS))
    if cache == "none":
        return _Logits(model).eval(), (ids,)
    if cache == "prefill":
        return _Prefill(model).eval(), (ids,)
    static = tf.StaticCache(config=cfg, max_cache_len=_CACHE_LEN)
    with torch.no_grad():  # the prompt fills the first _TOKENS positions
        model(ids, cache_position=torch.arange(_TOKENS), use_cache=True,
              **_cache_kwarg(model, static))
    step = torch.randint(3, cfg.vocab_size, (1, 1))
    return _Decode(model, static).eval(), (step, torch.tensor([_TOKENS]))


def llama(cache: str = "none", layers: int = 2, seed: int = 0):
    """A dense Llama decoder (GQA attention, SwiGLU MLP)."""
    return _decoder("LlamaConfig", "LlamaForCausalLM", layers, cache, seed)


def qwen3_moe(cache: str = "none", layers: int = 2, seed: int = 0):
    """A Qwen3-MoE decoder: 8 routed experts, top-2."""
    return _decoder("Qwen3MoeConfig", "Qwen3MoeForCausalLM", layers, cache, seed,
                    num_experts=8, moe_intermediate_size=64, head_dim=16, **_MOE)


def olmoe(cache: str = "none", layers: int = 2, seed: int = 0):
    """An OLMoE decoder: 8 routed experts, top-2, QK-norm."""
    return _decoder("OlmoeConfig", "OlmoeForCausalLM", layers, cache, seed,
                    num_experts=8, **_MOE)


def gpt_oss(cache: str = "none", layers: int = 2, seed: int = 0):
    """A GPT-OSS decoder: 8 local experts, attention sinks, sliding-window layers."""
    return _decoder("GptOssConfig", "GptOssForCausalLM", layers, cache, seed,
                    attention="eager", num_local_experts=8, head_dim=16, sliding_window=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 150000.0}, **_MOE)


def granite_moe(cache: str = "none", layers: int = 2, seed: int = 0):
    """A Granite-MoE decoder: 8 local experts, top-2."""
    return _decoder("GraniteMoeConfig", "GraniteMoeForCausalLM", layers, cache, seed,
                    num_local_experts=8, **_MOE)


class _Encoder(nn.Module):
    """``(input_ids, attention_mask) -> last hidden state`` of a BERT encoder."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@own_rng
def bert(cache: str = "none", layers: int = 2, seed: int = 0):
    """A BERT encoder with a padding mask (its masked attention graph); no cache."""
    if cache != "none":
        raise ValueError(f"bert is an encoder and has no KV cache; use cache='none', not {cache!r}")
    tf = _transformers()
    torch.manual_seed(seed)
    cfg = tf.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                        num_attention_heads=4, vocab_size=128, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    ids = torch.randint(3, cfg.vocab_size, (2, _TOKENS))
    mask = torch.ones(2, _TOKENS, dtype=torch.long)
    mask[1, _TOKENS // 2:] = 0
    return _Encoder(tf.BertModel(cfg, add_pooling_layer=False).eval()).eval(), (ids, mask)


#: name -> factory(cache="none", layers=2, seed=0)
HF_ZOO: dict[str, Callable[..., tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "llama": llama,
    "qwen3_moe": qwen3_moe,
    "olmoe": olmoe,
    "gpt_oss": gpt_oss,
    "granite_moe": granite_moe,
    "bert": bert,
}

# 32-layer models as model specs of the command line (a spec takes no arguments):
# ``autostream plan autostream.models.hf_zoo:qwen3_moe_32``


def llama_32():
    """``llama(layers=32)``."""
    return llama(layers=32)


def qwen3_moe_32():
    """``qwen3_moe(layers=32)``."""
    return qwen3_moe(layers=32)


def olmoe_32():
    """``olmoe(layers=32)``."""
    return olmoe(layers=32)


def gpt_oss_32():
    """``gpt_oss(layers=32)``."""
    return gpt_oss(layers=32)


def granite_moe_32():
    """``granite_moe(layers=32)``."""
    return granite_moe(layers=32)


def bert_32():
    """``bert(layers=32)``."""
    return bert(layers=32)


_CLASSES = {"llama": "LlamaForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "olmoe": "OlmoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
            "granite_moe": "GraniteMoeForCausalLM", "bert": "BertModel"}


def available(names: Iterable[str] | None = None) -> list[str]:
    """The zoo's architectures (of ``names``, default all) that the installed
    ``transformers`` provides (``[]`` without it).  Each one checked imports its model
    module, so ask only for those needed."""
    if importlib.util.find_spec("transformers") is None:
        return []
    tf = _transformers()
    wanted = set(HF_ZOO if names is None else names)
    return [name for name in HF_ZOO if name in wanted and hasattr(tf, _CLASSES[name])]
