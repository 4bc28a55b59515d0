"""More ``transformers`` architectures at tiny configs, random weights: forward passes only.

Mixture-of-experts decoders (JetMoe, DBRX, PhiMoE, DeepSeek-V2, Qwen3-Next, Qwen3.5-MoE),
state-space and hybrid models (Mamba2, Jamba), encoder-decoders (T5, SwitchTransformers,
NLLB-MoE, Whisper), older decoders (Falcon, BLOOM, Gemma3) and vision models (ViT,
DETR with its ResNet backbone built by ``transformers``, no ``timm``): the graphs the
planner met in issue 43.  Unlike :mod:`autostream.models.hf_zoo` they hold no KV
cache: each factory takes ``layers`` (each stack's depth; 2 for tests) and ``seed`` and
returns ``(model, example_inputs)``, a ``MODEL_SPEC`` of the command line
(``autostream plan autostream.models.hf_archs:detr``).  Hidden sizes are 32 to 64.

>>> sorted(HF_ARCHS)[:3]
['bloom', 'dbrx', 'deepseek_v2']
>>> HF_ARCHS["vit"](layers=0)
Traceback (most recent call last):
...
ValueError: layers must be an integer >= 1, got 0
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from autostream.models.hf_zoo import _transformers
from autostream.models.seeding import own_rng

__all__ = ["HF_ARCHS", "available", "bloom", "dbrx", "deepseek_v2", "detr", "falcon", "gemma3",
           "jamba", "jetmoe", "mamba2", "nllb_moe", "phimoe", "qwen3_5_moe", "qwen3_next",
           "switch_transformers", "t5", "vit", "whisper"]

Model = tuple[nn.Module, tuple[torch.Tensor, ...]]
_VOCAB = 128
_TOKENS = 8
#: the tiny decoder shape (hidden 64, 4 heads of 16, 2 KV heads)
_DECODER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=_VOCAB, max_position_embeddings=64,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)


class _Logits(nn.Module):
    """``inputs -> logits`` (or ``out_field``) of a model called with the cache off."""

    def __init__(self, model: nn.Module, out_field: str = "logits", **fixed: Any) -> None:
        super().__init__()
        self.model = model
        self.out_field = out_field
        self.fixed = fixed

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(*inputs, **self.fixed), self.out_field)


class _Seq2Seq(nn.Module):
    """``(encoder inputs, decoder_input_ids) -> logits`` of an encoder-decoder."""

    def __init__(self, model: nn.Module, encoder_input: str = "input_ids") -> None:
        super().__init__()
        self.model = model
        self.encoder_input = encoder_input

    def forward(self, source: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.encoder_input: source}, decoder_input_ids=decoder_input_ids,
                          use_cache=False).logits


class _Detection(nn.Module):
    """``pixel_values -> (class logits, boxes)`` of a detector."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(pixel_values=pixel_values)
        return out.logits, out.pred_boxes


@own_rng
def _build(config_name: str, model_name: str, layers: int, seed: int,
           attention: str | None = "sdpa", **config: Any) -> nn.Module:
    """``model_name(config_name(**config))`` in eval mode, seeded; ``attention``: the
    attention implementation (``None``: the model's default)."""
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be an integer >= 1, got {layers!r}")
    tf = _transformers()
    torch.manual_seed(seed)
    cfg = getattr(tf, config_name)(**config)
    if attention is not None:
        cfg._attn_implementation = attention
    return getattr(tf, model_name)(cfg).eval()


def _ids(seed: int, rows: int = 1, tokens: int = _TOKENS) -> torch.Tensor:
    return torch.randint(3, _VOCAB, (rows, tokens), generator=torch.Generator().manual_seed(seed))


def _causal(config_name: str, model_name: str, layers: int, seed: int,
            attention: str | None = "sdpa", **config: Any) -> Model:
    model = _build(config_name, model_name, layers, seed, attention,
                   **{**_DECODER, "num_hidden_layers": layers, **config})
    return _Logits(model, use_cache=False).eval(), (_ids(seed),)


def jetmoe(layers: int = 2, seed: int = 0) -> Model:
    """A JetMoe decoder: mixture-of-experts attention and MLP, 4 experts, top-2."""
    return _causal("JetMoeConfig", "JetMoeForCausalLM", layers, seed, attention="eager",
                   num_key_value_heads=2, kv_channels=16, num_local_experts=4,
                   num_experts_per_tok=2)


def dbrx(layers: int = 2, seed: int = 0) -> Model:
    """A DBRX decoder: 4 experts, top-2, grouped-query attention."""
    # clip_qkv set: transformers 5.25 clamps with both bounds None without it (and raises)
    model = _build("DbrxConfig", "DbrxForCausalLM", layers, seed, d_model=64, n_heads=4,
                   n_layers=layers, max_seq_len=64, vocab_size=_VOCAB,
                   attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                   ffn_config={"hidden_size": 64, "ffn_hidden_size": 128, "moe_num_experts": 4,
                               "moe_top_k": 2})
    return _Logits(model, use_cache=False).eval(), (_ids(seed),)


def phimoe(layers: int = 2, seed: int = 0) -> Model:
    """A PhiMoE decoder: 4 experts, top-2."""
    return _causal("PhimoeConfig", "PhimoeForCausalLM", layers, seed, num_local_experts=4,
                   num_experts_per_tok=2)


def deepseek_v2(layers: int = 2, seed: int = 0) -> Model:
    """A DeepSeek-V2 decoder: multi-head latent attention, 4 routed experts (top-2) and a
    shared one."""
    return _causal("DeepseekV2Config", "DeepseekV2ForCausalLM", layers, seed,
                   num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
                   num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0,
                   kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                   v_head_dim=16, n_group=1, topk_group=1)


def _linear_and_full_attention(config_name: str, model_name: str, layers: int,
                               seed: int) -> Model:
    """A decoder alternating gated delta-net linear attention and full attention layers,
    with 4 experts (top-2) and a shared expert (Qwen3-Next's design)."""
    kinds = ["linear_attention", "full_attention"]
    return _causal(config_name, model_name, layers, seed, head_dim=16,
                   layer_types=[kinds[i % 2] for i in range(layers)], num_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=32, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)


def qwen3_next(layers: int = 2, seed: int = 0) -> Model:
    """A Qwen3-Next decoder: gated delta-net linear attention beside full attention,
    4 experts (top-2) and a shared expert."""
    return _linear_and_full_attention("Qwen3NextConfig", "Qwen3NextForCausalLM", layers, seed)


def qwen3_5_moe(layers: int = 2, seed: int = 0) -> Model:
    """A Qwen3.5-MoE text decoder: linear and full attention layers, 4 experts (top-2)
    and a shared expert."""
    return _linear_and_full_attention("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                                      layers, seed)


def mamba2(layers: int = 2, seed: int = 0) -> Model:
    """A Mamba2 state-space model (the PyTorch scan: no CUDA kernels)."""
    model = _build("Mamba2Config", "Mamba2ForCausalLM", layers, seed, attention=None,
                   hidden_size=64, num_hidden_layers=layers, num_heads=8, head_dim=16,
                   state_size=16, n_groups=1, expand=2, chunk_size=8, vocab_size=_VOCAB)
    return _Logits(model, use_cache=False).eval(), (_ids(seed),)


def jamba(layers: int = 2, seed: int = 0) -> Model:
    """A Jamba hybrid: Mamba and attention layers, 4 experts (top-2) every other layer."""
    return _causal("JambaConfig", "JambaForCausalLM", layers, seed, num_experts=4,
                   num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
                   expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8,
                   mamba_d_conv=4, mamba_expand=2)


def falcon(layers: int = 2, seed: int = 0) -> Model:
    """A Falcon decoder: parallel attention and MLP, multi-query attention."""
    model = _build("FalconConfig", "FalconForCausalLM", layers, seed, hidden_size=64,
                   num_hidden_layers=layers, num_attention_heads=4, vocab_size=_VOCAB)
    return _Logits(model, use_cache=False).eval(), (_ids(seed),)


def bloom(layers: int = 2, seed: int = 0) -> Model:
    """A BLOOM decoder: ALiBi attention."""
    model = _build("BloomConfig", "BloomForCausalLM", layers, seed, attention="eager",
                   hidden_size=64, n_layer=layers, n_head=4, vocab_size=_VOCAB)
    return _Logits(model, use_cache=False).eval(), (_ids(seed),)


def gemma3(layers: int = 2, seed: int = 0) -> Model:
    """A Gemma3 text decoder: sliding-window and global attention layers."""
    return _causal("Gemma3TextConfig", "Gemma3ForCausalLM", layers, seed, head_dim=16,
                   sliding_window=4, layer_types=["sliding_attention"] * (layers - 1)
                   + ["full_attention"])


def _seq2seq(config_name: str, model_name: str, layers: int, seed: int,
             attention: str | None = "sdpa", **config: Any) -> Model:
    model = _build(config_name, model_name, layers, seed, attention, **config)
    return _Seq2Seq(model).eval(), (_ids(seed), _ids(seed + 1, tokens=4))


def t5(layers: int = 2, seed: int = 0) -> Model:
    """A T5 encoder-decoder: relative position buckets."""
    return _seq2seq("T5Config", "T5ForConditionalGeneration", layers, seed, attention=None,
                    d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=layers,
                    num_decoder_layers=layers, vocab_size=_VOCAB, decoder_start_token_id=0)


def switch_transformers(layers: int = 2, seed: int = 0) -> Model:
    """A SwitchTransformers encoder-decoder: 4 experts, top-1, every other layer sparse."""
    return _seq2seq("SwitchTransformersConfig", "SwitchTransformersForConditionalGeneration",
                    layers, seed, attention=None, d_model=64, d_ff=128, d_kv=16, num_heads=4,
                    num_layers=layers, num_decoder_layers=layers, num_experts=4,
                    expert_capacity=8, encoder_sparse_step=2, decoder_sparse_step=2,
                    vocab_size=_VOCAB, decoder_start_token_id=0)


def nllb_moe(layers: int = 2, seed: int = 0) -> Model:
    """An NLLB-MoE encoder-decoder: 4 experts, top-2, every other layer sparse."""
    return _seq2seq("NllbMoeConfig", "NllbMoeForConditionalGeneration", layers, seed,
                    attention="eager", d_model=64, encoder_layers=layers, decoder_layers=layers,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, num_experts=4, expert_capacity=8,
                    encoder_sparse_step=2, decoder_sparse_step=2, vocab_size=_VOCAB,
                    max_position_embeddings=64, decoder_start_token_id=2)


def whisper(layers: int = 2, seed: int = 0) -> Model:
    """A Whisper speech encoder-decoder on 16 mel bins of 64 frames."""
    model = _build("WhisperConfig", "WhisperForConditionalGeneration", layers, seed,
                   d_model=64, encoder_layers=layers, decoder_layers=layers,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                   decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32,
                   max_target_positions=32, vocab_size=_VOCAB, decoder_start_token_id=1,
                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    features = torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(seed))
    return _Seq2Seq(model, "input_features").eval(), (features, _ids(seed + 1, tokens=4))


def vit(layers: int = 2, seed: int = 0) -> Model:
    """A ViT encoder on one 32x32 image in 8x8 patches: its last hidden state."""
    model = _build("ViTConfig", "ViTModel", layers, seed, hidden_size=64,
                   num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128,
                   image_size=32, patch_size=8)
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return _Logits(model, "last_hidden_state").eval(), (pixels,)


def detr(layers: int = 2, seed: int = 0) -> Model:
    """A DETR detector on one 64x64 image: a two-stage ResNet backbone built by
    ``transformers`` (no ``timm``, no pretrained weights), ``layers`` encoder and decoder
    layers of width 32, 8 object queries."""
    tf = _transformers()
    backbone = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                               out_features=["stage1", "stage2"])
    model = _build("DetrConfig", "DetrForObjectDetection", layers, seed, attention=None,
                   use_timm_backbone=False, use_pretrained_backbone=False,
                   backbone_config=backbone, d_model=32, encoder_layers=layers,
                   decoder_layers=layers, encoder_attention_heads=2,
                   decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   num_queries=8, num_labels=4)
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    return _Detection(model).eval(), (pixels,)


#: name -> factory(layers=2, seed=0)
HF_ARCHS: dict[str, Callable[..., Model]] = {
    "jetmoe": jetmoe, "dbrx": dbrx, "phimoe": phimoe, "deepseek_v2": deepseek_v2,
    "qwen3_next": qwen3_next, "qwen3_5_moe": qwen3_5_moe, "mamba2": mamba2, "jamba": jamba,
    "falcon": falcon, "bloom": bloom, "gemma3": gemma3, "t5": t5,
    "switch_transformers": switch_transformers, "nllb_moe": nllb_moe, "whisper": whisper,
    "vit": vit, "detr": detr,
}

#: name -> the ``transformers`` class its factory builds
CLASSES = {
    "jetmoe": "JetMoeForCausalLM", "dbrx": "DbrxForCausalLM", "phimoe": "PhimoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForCausalLM", "mamba2": "Mamba2ForCausalLM",
    "jamba": "JambaForCausalLM", "falcon": "FalconForCausalLM", "bloom": "BloomForCausalLM",
    "gemma3": "Gemma3ForCausalLM", "t5": "T5ForConditionalGeneration",
    "switch_transformers": "SwitchTransformersForConditionalGeneration",
    "nllb_moe": "NllbMoeForConditionalGeneration",
    "whisper": "WhisperForConditionalGeneration", "vit": "ViTModel",
    "detr": "DetrForObjectDetection",
}


def available(names: Iterable[str] | None = None) -> list[str]:
    """The architectures (of ``names``, default all) the installed ``transformers``
    provides (``[]`` without it)."""
    if importlib.util.find_spec("transformers") is None:
        return []
    tf = _transformers()
    wanted = set(HF_ARCHS if names is None else names)
    return [name for name in HF_ARCHS if name in wanted and hasattr(tf, CLASSES[name])]
