"""All-reduces rewritten in place only where no other value can see the buffer."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autostream.dialects.reinplace import reinplace_all_reduces
from autostream.memory.predict import GraphMemory

f = torch.ops._c10d_functional


def _reduce(t: torch.Tensor) -> torch.Tensor:
    return f.wait_tensor(f.all_reduce(t, "sum", "0"))


def _private(x):
    return _reduce(torch.relu(x)) * 2


def _read_again(x):
    y = torch.relu(x)
    return _reduce(y) + y


def _of_input(x):
    return _reduce(x) + 1


def _a_view(x):
    y = torch.relu(x)
    return _reduce(y[:2]) + y.sum()


def _transposed(x):
    return _reduce(torch.relu(x.t()))  # a fresh buffer with the input's strides


def _graph(fn):
    return make_fx(fn, tracing_mode="fake")(torch.randn(4, 3))


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if "all_reduce" in str(n.target)]


def test_a_private_buffer_is_reduced_in_place_and_shares_its_storage():
    gm = _graph(_private)
    [name] = reinplace_all_reduces(gm)
    assert _targets(gm) == ["_c10d_functional.all_reduce_.default"]
    node = next(n for n in gm.graph.nodes if n.name == name)
    memory = GraphMemory.from_graph(gm)
    # the result, and its wait's, are the relu's storage: no new allocation
    relu = node.args[0].name
    wait = next(iter(node.users)).name
    assert memory.storages_of[node.name] == memory.storages_of[relu] == memory.storages_of[wait]


@pytest.mark.parametrize("fn", [_read_again, _of_input, _a_view, _transposed],
                         ids=["read again", "graph input", "a view", "not contiguous"])
def test_a_buffer_others_can_see_is_left_functional(fn):
    gm = _graph(fn)
    if fn is _transposed:
        [relu] = [n for n in gm.graph.nodes if n.name.startswith("relu")]
        assert not relu.meta["val"].is_contiguous() and len(relu.users) == 1
    assert reinplace_all_reduces(gm) == ()
    assert _targets(gm) == ["_c10d_functional.all_reduce.default"]


def test_without_fake_values_nothing_is_rewritten():
    gm = _graph(_private)
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    assert reinplace_all_reduces(gm) == ()


def test_the_rewritten_graph_computes_the_same_on_one_rank(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        name = dist.group.WORLD.group_name

        def fn(x):
            y = torch.relu(x)
            return f.wait_tensor(f.all_reduce(y, "sum", name)) * 2

        x = torch.randn(4, 3)
        gm = make_fx(fn, tracing_mode="fake")(x)
        expected = gm(x)
        assert reinplace_all_reduces(gm)
        torch.testing.assert_close(gm(x), expected)
    finally:
        dist.destroy_process_group()
