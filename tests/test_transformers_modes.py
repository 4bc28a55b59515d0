"""transformers models at tiny configs, compiled with forced multi-stream plans, against eager:
outputs, dtypes, tensor kinds, caches and buffers equal, under no_grad, inference_mode and
autocast, on the threads and the sequential runtime; the plans applied and lifted.

A representative subset: ``experiments/correctness.py`` sweeps every model, solver, runtime
and mode."""

import pytest

from autostream.equivalence import check_against_eager

hf_zoo = pytest.importorskip("autostream.models.hf_zoo")

CASES = [  # model, cache, mode, runtime, solver
    ("llama", "decode", "no_grad", "threads", "cpsat"),  # a StaticCache written in place
    ("llama", "decode", "inference_mode", "sequential", "heft"),
    ("llama", "none", "autocast_bf16", "threads", "heft"),
    ("bert", "none", "autocast_bf16", "sequential", "cpsat"),  # the padding mask's `&`
    ("bert", "none", "inference_mode", "threads", "heft"),
    ("qwen3_moe", "prefill", "no_grad", "sequential", "critical_path"),
    ("olmoe", "none", "inference_mode", "threads", "cpsat"),
    ("granite_moe", "decode", "no_grad", "threads", "heft"),
    ("gpt_oss", "prefill", "autocast_bf16", "threads", "heft"),
]


#: the case the fast subset keeps (the others take more than 2 s each)
FAST = ("bert", "none", "inference_mode", "threads", "heft")


@pytest.mark.parametrize("name,cache,mode,runtime,solver", [
    pytest.param(*c, id="-".join(c), marks=() if c == FAST else pytest.mark.slow) for c in CASES])
def test_compiled_transformers_model_equals_eager(name, cache, mode, runtime, solver):
    if name not in hf_zoo.available():
        pytest.skip(f"the installed transformers has no {name}")
    check = check_against_eager(lambda: hf_zoo.HF_ZOO[name](cache), mode, max_streams=2,
                                cost_table="h200", measure=0, runtime=runtime, solver=solver,
                                time_limit=1.0)
    assert not check.skipped, check.skipped
    assert check.mismatch == ""
    assert check.applied and check.lifted, check.not_lifted
