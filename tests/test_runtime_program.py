"""Parsing rewritten graphs into StreamPrograms, and the errors for bad input."""

from __future__ import annotations

import pytest
import torch

from autostream.dialects.torchair import STREAM_LABEL_KEY
from autostream.runtime import ProgramError, make_runner, parse_program, unordered_dependences
from autostream.runtime.builder import DialectBuilder, fork_join, two_chains

relu = torch.ops.aten.relu.default
neg = torch.ops.aten.neg.default


def test_fork_join_streams_and_steps():
    gm, _ = fork_join(streams=3, depth=1)
    p = parse_program(gm)
    assert sorted(p.streams) == [0, 1, 2]
    assert p.side_streams == (1, 2)
    # each side stream: wait (fork), mm, tanh, record (join)
    for k in (1, 2):
        assert [s.kind for s in p.streams[k]] == ["wait", "op", "op", "record"]
    kinds0 = [s.kind for s in p.streams[0]]
    assert kinds0.count("record") == 1 and kinds0.count("wait") == 1
    # the join wait names both side records
    join = next(s for s in p.streams[0] if s.kind == "wait")
    assert set(join.tokens) == {p.streams[1][-1].node.name, p.streams[2][-1].node.name}
    assert [s.node for s in p.steps if s.kind == "op"] == [
        n for n in gm.graph.nodes if n.op == "call_function" and s_is_op(n)]


def s_is_op(node):
    return not str(node.target).startswith("air.")


def test_held_values_are_exactly_the_cross_stream_ones():
    gm, _ = fork_join(streams=2, depth=1)
    p = parse_program(gm)
    names = {n.name for n in p.held}
    side_last = p.ops(1)[-1]
    assert side_last in names  # produced on stream 1, read on stream 0
    assert "relu_default" in names  # produced on 0, read on 1
    # nothing used on a single stream is held, and held values are never released early
    released = {v.name for s in p.steps for v in s.release}
    assert not names & released


def test_release_lists_free_single_stream_values_after_last_use():
    gm, _ = two_chains(depth=3, rows=2, width=4, streams=1)
    p = parse_program(gm)
    released = [v.name for s in p.steps for v in s.release]
    # intermediate chain values are dropped; the output value is not
    assert "mm_default" in released
    out_values = {n.name for n in p.output.all_input_nodes}
    assert not out_values & set(released)


def _graph_with(build):
    b = DialectBuilder()
    x = b.input("x")
    result = build(b, x)
    return b.finish(result)


def test_scope_exit_without_enter():
    def build(b, x):
        b.graph.call_function(b.ops.scope_exit, ())
        return b.call(relu, x)
    with pytest.raises(ProgramError, match="scope_exit .* no matching scope_enter"):
        parse_program(_graph_with(build))


def test_scope_not_exited_before_output():
    def build(b, x):
        b.graph.call_function(b.ops.scope_enter, ([STREAM_LABEL_KEY], ["stream_1"]))
        return b.call(relu, x)
    with pytest.raises(ProgramError, match="'stream_1' .* not exited before the graph's output"):
        parse_program(_graph_with(build))


def test_nested_scopes_rejected():
    def build(b, x):
        with b.stream(1):
            b.graph.call_function(b.ops.scope_enter, ([STREAM_LABEL_KEY], ["stream_2"]))
            y = b.call(relu, x)
            b.graph.call_function(b.ops.scope_exit, ())
        return y
    with pytest.raises(ProgramError, match="nested scopes"):
        parse_program(_graph_with(build))


@pytest.mark.parametrize("label", ["stream_0", "streamX", "side_1", "stream_-1"])
def test_unknown_stream_label(label):
    def build(b, x):
        b.graph.call_function(b.ops.scope_enter, ([STREAM_LABEL_KEY], [label]))
        y = b.call(relu, x)
        b.graph.call_function(b.ops.scope_exit, ())
        return y
    with pytest.raises(ProgramError, match="stream label"):
        parse_program(_graph_with(build))


def test_scope_without_stream_label_is_outside_dialect():
    def build(b, x):
        b.graph.call_function(b.ops.scope_enter, (["_super_kernel_scope"], ["sk"]))
        y = b.call(relu, x)
        b.graph.call_function(b.ops.scope_exit, ())
        return y
    with pytest.raises(ProgramError, match="no '_user_stream_label'"):
        parse_program(_graph_with(build))


def test_wait_on_token_recorded_later():
    b = DialectBuilder()
    x = b.input("x")
    y = b.call(relu, x)
    token = b.record()
    z = b.call(neg, y)
    wait = b.wait(token)
    gm = b.finish(z)
    # Move the wait before the record: the token is then recorded after its wait.
    # (FX itself would reject the use-before-def, so bypass its order with prepend.)
    y.prepend(wait)
    with pytest.raises(ProgramError, match="not recorded before it"):
        parse_program(gm.graph)


def test_wait_on_non_token_and_empty_wait():
    b = DialectBuilder()
    x = b.input("x")
    y = b.call(relu, x)
    b.graph.call_function(b.ops.wait, ([y],))
    with pytest.raises(ProgramError, match="not an air.record token"):
        parse_program(b.finish(y))
    b = DialectBuilder()
    x = b.input("x")
    b.graph.call_function(b.ops.wait, ([],))
    with pytest.raises(ProgramError, match="non-empty list"):
        parse_program(b.finish(x))


def test_air_op_outside_dialect():
    lib = torch.library.Library("air", "FRAGMENT")
    if not hasattr(torch.ops.air, "autostream_test_unknown"):
        lib.define("autostream_test_unknown(Tensor x) -> Tensor")
        lib.impl("autostream_test_unknown", lambda x: x, "CompositeExplicitAutograd")
    b = DialectBuilder()
    x = b.input("x")
    y = b.call(torch.ops.air.autostream_test_unknown.default, x)
    with pytest.raises(ProgramError, match="outside the autostream dialect"):
        parse_program(b.finish(y))


def test_errors_come_before_any_op_runs():
    calls = []

    def spy(x):
        calls.append(x)
        return x

    def build(b, x):
        y = b.call(spy, x)
        b.graph.call_function(b.ops.scope_exit, ())
        return y
    gm = _graph_with(build)
    for kind in ("sequential", "threads", "streams", "auto"):
        with pytest.raises(ProgramError):
            make_runner(gm, kind)
    assert calls == []


def test_unordered_dependences_finds_each_removed_wait():
    gm, _ = fork_join(streams=3, depth=1)
    assert unordered_dependences(parse_program(gm)) == []
    waits = [n for n in gm.graph.nodes if n.name.startswith("wait")]
    assert len(waits) == 3
    for wait in waits:
        gm2, _ = fork_join(streams=3, depth=1)
        victim = next(n for n in gm2.graph.nodes if n.name == wait.name)
        gm2.graph.erase_node(victim)
        missing = unordered_dependences(parse_program(gm2))
        assert missing, f"removing {wait.name} should leave an unordered dependence"
