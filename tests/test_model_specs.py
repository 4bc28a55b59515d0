"""Model specs written before the models moved into ``autostream.models``."""

import pytest

from autostream.models.modelspec import load_model_spec, resolve_model_spec


def test_a_spec_from_before_the_models_moved_names_the_new_one():
    with pytest.raises(ValueError, match=r"the models moved: write 'autostream\.models\.zoo:moe_model'"):
        load_model_spec("autostream.zoo:moe_model")


def test_a_missing_module_outside_the_models_gets_no_hint():
    for spec in ("autostream.nowhere:f", "autostream.no.where:f", "nowhere:f"):
        with pytest.raises(ValueError, match="cannot import module") as e:
            resolve_model_spec(spec)
        assert "moved" not in str(e.value)
