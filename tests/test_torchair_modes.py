"""The pass plans for what TorchAir does after it, by ``config.mode`` (issue 27)."""

from __future__ import annotations

import pytest

from autostream import AutoStreamPass, zoo
from autostream.capture import capture_graphs
from autostream.dialects.torchair import air_kind, scope_label
from autostream.dialects.torchair_modes import GE_LAZY_VIEWS


class Config:  # what the pass reads of TorchAir's CompilerConfig
    def __init__(self, mode: str) -> None:
        self.mode = mode


def rewritten(factory, mode: str | None, streams: int = 2, table: str = "ascend910b"):
    model, inputs = factory()
    [gm] = capture_graphs(model, inputs)
    autostream_pass = AutoStreamPass(max_streams=streams, cost_table=table)
    autostream_pass(gm, inputs, Config(mode) if mode else None)
    assert autostream_pass.last_report.applied, autostream_pass.last_report.reason
    return gm


def streams_of(gm):
    stack, out = ["main"], {}
    for node in gm.graph.nodes:
        kind = air_kind(node)
        if kind == "scope_enter":
            stack.append(scope_label(node))
        elif kind == "scope_exit":
            stack.pop()
        else:
            out[node] = stack[-1]
    return out


def test_ge_join_wait_precedes_a_main_stream_op_not_output():
    """GE attaches a wait to the next GE op on its stream: nothing follows a wait right
    before ``output``."""
    gm = rewritten(zoo.inception_block, "max-autotune")
    nodes = list(gm.graph.nodes)
    assert air_kind(nodes[-2]) is None and nodes[-2].op == "call_function"
    assert streams_of(gm)[nodes[-2]] == "main"
    waits = [n for n in nodes if air_kind(n) == "wait"]
    assert waits and nodes[nodes.index(waits[-1]) + 1] is nodes[-2]


def lazy_views_feeding_side_streams(gm):
    where = streams_of(gm)
    return [n.name for n, stream in where.items()
            if n.op == "call_function" and str(n.target) in GE_LAZY_VIEWS and stream == "main"
            and any(where[u] != "main" for u in n.users)]


@pytest.mark.slow
def test_ge_main_stream_lazy_views_never_feed_a_side_stream():
    """GE defers ``view/reshape/transpose/...`` on the main stream to their first consumer,
    unlabelled: such a view feeding a side stream moves into the side stream.  Without the
    mode (CUDA events) the same Llama plan has three."""
    from autostream import hf_zoo

    assert lazy_views_feeding_side_streams(rewritten(hf_zoo.llama, None, 4, "h200"))
    assert lazy_views_feeding_side_streams(
        rewritten(hf_zoo.llama, "max-autotune", 4, "h200")) == []


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_other_modes_keep_the_join_right_before_output(mode):
    gm = rewritten(zoo.inception_block, mode)
    assert air_kind(list(gm.graph.nodes)[-2]) == "wait"
