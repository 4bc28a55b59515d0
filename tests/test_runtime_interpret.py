"""The interpreter loop the runtimes share: which hook it calls, in which order, and when it stops."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from autostream.runtime import (
    SequentialRunner,
    Step,
    StreamsRunner,
    ThreadsRunner,
    parse_program,
)
from autostream.runtime.builder import DialectBuilder
from autostream.runtime.interpret import EnvHooks, interpret
from autostream.runtime.segments import Segment, split_segments
from tests.helpers import as_tuple
from tests.test_runtime_streams import RecordingAPI


class RecordingHooks:
    """Hooks that run nothing and log each call as ``(hook, names)``."""

    def __init__(self, fail_at: str | None = None):
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.fail_at = fail_at

    def _log(self, hook: str, *names: str) -> None:
        self.calls.append((hook, names))
        if names and names[0] == self.fail_at:
            raise ValueError(f"{hook} {names[0]} failed")

    def op(self, step: Step) -> None:
        self._log("op", step.node.name)

    def record(self, step: Step) -> None:
        self._log("record", step.node.name)

    def wait(self, step: Step) -> None:
        self._log("wait", *step.tokens)

    def segment(self, segment: Segment) -> None:
        self._log("segment", *segment.names)

    def release(self, values) -> None:
        self._log("release", *(v.name for v in values))


def _fork_and_join():
    """Stream 1: ``a = neg(x)``, ``b = neg(a)``, record; stream 0: ``c = relu(x)``, wait, ``a + c``."""
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        a = b.call(torch.ops.aten.neg.default, x)
        a2 = b.call(torch.ops.aten.neg.default, a)
        done = b.record()
    c = b.call(torch.ops.aten.relu.default, x)
    b.wait(done)
    return b.finish(b.call(torch.ops.aten.add.Tensor, a2, c))


@dataclass
class _Node:
    name: str


def test_hooks_run_in_step_order_and_release_follows_its_step():
    n = {name: _Node(name) for name in ("x", "y", "t", "w", "w2", "z")}
    steps = [
        Step("op", n["y"], 0, release=(n["x"],)),
        Step("record", n["t"], 0),
        Step("wait", n["w"], 0, tokens=("t",), release=(n["y"], n["x"])),
        Step("wait", n["w2"], 0, tokens=("t", "u")),
        Step("op", n["z"], 0),
    ]
    hooks = RecordingHooks()
    interpret(steps, hooks)
    assert hooks.calls == [
        ("op", ("y",)), ("release", ("x",)),
        ("record", ("t",)),
        ("wait", ("t",)), ("release", ("y", "x")),
        ("wait", ("t", "u")),  # nothing to release: no release call
        ("op", ("z",)),
    ]


def test_segments_go_to_their_hook_and_release_after_them():
    program = parse_program(_fork_and_join())
    items = split_segments(program, 1)
    assert [item.kind for item in items] == ["segment", "record"]
    hooks = RecordingHooks()
    interpret(items, hooks)
    assert hooks.calls == [
        ("segment", ("neg_default", "neg_default_1")),
        ("release", ("neg_default",)),  # read inside the segment only
        ("record", ("record_default",)),
    ]


def test_a_failing_hook_stops_the_loop_before_its_release():
    program = parse_program(_fork_and_join())
    first = program.steps[0].node.name
    hooks = RecordingHooks(fail_at=first)
    with pytest.raises(ValueError, match=f"op {first} failed"):
        interpret(program.steps, hooks)
    assert hooks.calls == [("op", (first,))]


def test_a_parsed_program_calls_one_hook_per_step_then_its_release():
    gm = _fork_and_join()
    program = parse_program(gm)
    hooks = RecordingHooks()
    interpret(program.steps, hooks)
    expected = []
    for step in program.steps:
        expected.append((step.kind, (step.node.name,) if step.kind != "wait" else step.tokens))
        if step.release:
            expected.append(("release", tuple(v.name for v in step.release)))
    assert hooks.calls == expected
    assert any(hook == "release" for hook, _ in hooks.calls)  # the program does free values


def test_env_hooks_compute_the_graph_and_free_released_values():
    gm = _fork_and_join()
    program = parse_program(gm)
    x = torch.tensor([-1.0, 2.0])
    env = {program.placeholders[0]: x}
    interpret(program.steps, EnvHooks(gm, env))
    released = {v for s in program.steps for v in s.release}
    assert released and not released & set(env)
    out = env[program.output.args[0][0]]
    torch.testing.assert_close(out, gm(x)[0], rtol=0, atol=0)


def test_every_runtime_raises_the_ops_own_error_naming_op_and_stream():
    b = DialectBuilder()
    x = b.input("x")
    with b.stream(1):
        bad = b.call(torch.ops.aten.mm.default, x, x)  # a vector: mm refuses it
        done = b.record()
    b.wait(done)
    gm = b.finish(bad)
    runners = [SequentialRunner(gm), ThreadsRunner(gm, segments=False),
               StreamsRunner(gm, api=RecordingAPI)]
    for runner in runners:
        with pytest.raises(RuntimeError) as info:
            runner(torch.ones(3))
        assert type(info.value) is RuntimeError  # mm's own error, not a wrapper
        assert info.value.__notes__ == ["autostream: raised by op 'mm_default' (mm.default) "
                                        "on the stream_1"]
        runner.close()


def test_runtimes_agree_through_the_shared_loop():
    gm = _fork_and_join()
    x = torch.tensor([-1.0, 2.0, 3.0])
    expected = as_tuple(gm(x))
    with ThreadsRunner(gm, deterministic=True) as threads:  # bit for bit: eager's threads
        for runner in (SequentialRunner(gm), threads,
                       StreamsRunner(gm, api=RecordingAPI)):
            for _ in range(3):  # the threads runtime traces its segments on the first call
                torch.testing.assert_close(as_tuple(runner(x)), expected, rtol=0, atol=0)
