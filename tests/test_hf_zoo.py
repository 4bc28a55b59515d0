"""The transformers model zoo: tiny configs build, run, and their decode step writes its cache."""

from __future__ import annotations

import copy

import pytest
import torch

from autostream.models import hf_zoo

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", hf_zoo.available())
def test_every_architecture_builds_and_is_deterministic(name):
    model, inputs = hf_zoo.HF_ZOO[name]()
    again, inputs_again = hf_zoo.HF_ZOO[name]()
    with torch.no_grad():
        out, out_again = model(*inputs), again(*inputs_again)
    assert torch.equal(out, out_again), "same seed, same weights and inputs"
    assert out.dim() == 3 and out.shape[1] == inputs[0].shape[1]


@pytest.mark.parametrize("name", [n for n in hf_zoo.available() if n != "bert"])
def test_prefill_returns_logits_and_two_cache_tensors_per_layer(name):
    model, inputs = hf_zoo.HF_ZOO[name]("prefill", layers=2)
    with torch.no_grad():
        logits, *cache = model(*inputs)
    # sliding-window layers (gpt_oss) keep fewer positions than the prompt
    assert len(cache) == 4 and all(0 < t.shape[-2] <= inputs[0].shape[1] for t in cache)


def test_decode_step_writes_the_static_cache_in_place():
    model, (ids, position) = hf_zoo.llama("decode")
    keys = model.cache.layers[0].keys
    before = keys.clone()
    with torch.no_grad():
        model(ids, position)
    changed = (keys != before).flatten(0, 1).any(-1).any(0)  # per cache position
    assert changed.nonzero().flatten().tolist() == [position.item()]


def test_decode_steps_from_copies_agree():
    model, (ids, position) = hf_zoo.qwen3_moe("decode")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        assert torch.equal(model(ids, position), twin(ids, position))


def test_bad_cache_mode_and_encoder_cache_are_refused():
    with pytest.raises(ValueError, match="cache must be one of"):
        hf_zoo.llama("sideways")
    with pytest.raises(ValueError, match="encoder"):
        hf_zoo.bert("decode")


def test_a_further_architecture_builds_tiny_and_deterministic():
    from autostream.models import hf_archs

    if "vit" not in hf_archs.available(["vit"]):
        pytest.skip("the installed transformers has no ViTModel")
    (model, inputs), (again, inputs_again) = hf_archs.vit(), hf_archs.vit()
    with torch.no_grad():
        out, out_again = model(*inputs), again(*inputs_again)
    assert torch.equal(out, out_again)
    assert out.shape == (1, 1 + (32 // 8) ** 2, 64)  # the class token and 16 patches


def test_an_architecture_the_installed_transformers_lacks_is_not_available(monkeypatch):
    from autostream.models import hf_archs

    monkeypatch.setitem(hf_archs.CLASSES, "vit", "NoSuchModelAnywhere")
    have = hf_archs.available(["vit", "bloom"])
    assert "vit" not in have and have == [n for n in ["bloom"] if n in hf_archs.available()]
