"""Model specs: written before the models moved into ``autostream.models``, or naming a
function the module lacks."""

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


def test_an_unknown_function_lists_the_ones_a_spec_may_name(tmp_path):
    with pytest.raises(ValueError) as err:
        resolve_model_spec("autostream.models.zoo:nosuch")
    listed = str(err.value).split("its functions that take no arguments: ")[1].split(", ")
    assert {"moe_model", "article_model", "two_branch_gemv"} <= set(listed)
    assert "MoELayer" not in listed and "_seeded" not in listed  # classes, private helpers
    spec = tmp_path / "mine.py"
    spec.write_text("import torch\n\ndef build(n=2):\n    return torch.nn.Linear(n, n), "
                    "(torch.ones(1, n),)\n\ndef sized(n):\n    return build(n)\n")
    with pytest.raises(ValueError, match=r"has no callable 'buld'; its functions that take no "
                                         r"arguments: build$"):
        resolve_model_spec(f"{spec}:buld")
