"""The models' builders seed their weights on a fork of torch's generator: the caller's
random stream is where it was, and two builds are the same model."""

from __future__ import annotations

import pytest
import torch

from autostream.models import hf_zoo, zoo, zoo_state

BUILDERS = {**{name: getattr(zoo, name) for name in zoo.__all__ if name.endswith(
    ("_model", "_block", "_layer", "_gemv", "_head"))},
    "mlp_model": zoo_state.mlp_model, "buffer_update_model": zoo_state.buffer_update_model}


def test_every_builder_is_listed():
    assert len(BUILDERS) >= 10


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_builder_leaves_the_callers_random_stream(name):
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    model, inputs = BUILDERS[name]()
    assert torch.equal(torch.rand(4), expected)
    again, inputs_again = BUILDERS[name]()
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(inputs, inputs_again, strict=True):
        assert not isinstance(a, torch.Tensor) or torch.equal(a, b)


def test_a_transformers_builder_too():
    pytest.importorskip("transformers")
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    hf_zoo.llama()
    assert torch.equal(torch.rand(3), expected)
