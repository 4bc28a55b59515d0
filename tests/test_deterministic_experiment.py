"""``experiments/deterministic.py``: deterministic plans equal eager bit for bit; the table and
headlines say so."""

from __future__ import annotations

import pytest
import torch

from experiments import deterministic, headline


def test_headlines_count_bitwise_models_against_dynamos_own_graph():
    rows = [deterministic.Row("a", 2, 1.0, 1.0, 1.5, {"dynamo": True, "default": False,
                                                       "deterministic": True}),
            deterministic.Row("b", 2, 1.0, 2.0, 2.0, {"dynamo": False, "default": False,
                                                       "deterministic": False}),
            deterministic.Row("c", 1, 1.0, 1.0, 9.0, {"dynamo": True, "default": True,
                                                       "deterministic": True})]
    cost, exact = deterministic.headlines(rows)
    assert cost.measured == "1.25x (1.50x, a)"  # over the multi-stream plans a and b only
    # b differs from eager under Dynamo already: not counted against deterministic
    assert (exact.measured, exact.target, exact.met) == ("1 / 2", "deterministic: 2", True)


@pytest.mark.slow
def test_a_deterministic_plan_equals_eager_bit_for_bit(capsys, tmp_path):
    old = torch.get_num_threads()
    torch.set_num_threads(2)  # the default then splits the threads: the case that matters
    try:
        assert deterministic.main(["--models", "two_branch_gemv_d8", "--runs", "1",
                                   "--warmup", "0", "--settle-ms", "0"]) == 0
    finally:
        torch.set_num_threads(old)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| two_branch_gemv_d8 "))
    assert row.split("|")[2].strip() == "2"  # the plan ran on two streams
    dynamo, _, exact = row.split("|")[-2].strip().split(" / ")
    assert (dynamo, exact) == ("yes", "yes"), row
    cost, exact = headline.load(tmp_path / "headlines" / "deterministic.json")
    assert exact.met is True, exact
