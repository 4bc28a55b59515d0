"""The graphs ``experiments/overlap.py`` measures compute what they claim."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from autostream.fx.capture import capture
from autostream.models.zoo import ZOO
from autostream.runtime import ThreadsRunner, parse_program
from experiments import overlap


@pytest.mark.parametrize("name", ["moe", "inception"])
def test_two_copies_on_two_streams_compute_the_graph_twice(name):
    model, inputs = ZOO[name]()
    with torch.no_grad():
        [c] = capture(model, inputs)
        other = tuple(a.clone() + 1 if isinstance(a, torch.Tensor) and a.is_floating_point()
                      and a is c.dynamo_args[0] else a for a in c.dynamo_args)
        expected = [*pytree.tree_leaves(c.dynamo(*c.dynamo_args)),
                    *pytree.tree_leaves(c.dynamo(*other))]
        one = overlap.copies_on_streams(c.dynamo, 1)
        two = overlap.copies_on_streams(c.dynamo, 2)
        assert parse_program(one).side_streams == ()
        assert parse_program(two).side_streams == (1,)
        args = (*c.dynamo_args, *other)
        with ThreadsRunner(two) as runner:
            for _ in range(2):
                torch.testing.assert_close(pytree.tree_leaves(runner(*args)), expected)
        torch.testing.assert_close(pytree.tree_leaves(one(*args)), expected)


def test_small_op_chains_plan_equals_its_one_stream_graph():
    from autostream.runtime.builder import two_chains

    one, inputs = two_chains(depth=4, rows=4, width=16, streams=1, softmax=True)
    two, _ = two_chains(depth=4, rows=4, width=16, streams=2, softmax=True)
    assert sum(n.target is torch.ops.aten._softmax.default for n in two.graph.nodes) == 8
    assert parse_program(two).side_streams == (1,)
    with ThreadsRunner(two) as runner:
        runner(*inputs)
        torch.testing.assert_close(runner(*inputs), one(*inputs), rtol=0, atol=0)
