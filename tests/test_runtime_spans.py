"""Measured timelines: the threads runtime records each op's span for traces."""

from autostream.runtime import ThreadsRunner, parse_program
from autostream.runtime.builder import fork_join
from autostream.scheduling.timeline import Timeline


def test_spans_cover_every_op_once_on_its_stream_in_stream_order():
    gm, inputs = fork_join(streams=3, size=16, depth=2)
    program = parse_program(gm)
    with ThreadsRunner(gm, record_spans=True) as runner:
        runner(*inputs)
        spans = runner.last_spans
    ops = {s.node.name: k for k, steps in program.streams.items() for s in steps if s.kind == "op"}
    assert {n: s for n, (s, _, _) in spans.items()} == ops
    assert min(a for _, a, _ in spans.values()) == 0.0
    for steps in program.streams.values():
        names = [s.node.name for s in steps if s.kind == "op"]
        for a, b in zip(names, names[1:]):
            assert spans[a][1] <= spans[a][2] <= spans[b][1], (a, b)
    timeline = Timeline.from_spans(spans)
    assert timeline.makespan == max(e for _, _, e in spans.values())


def test_spans_are_off_by_default():
    gm, inputs = fork_join(streams=2, size=8, depth=1)
    with ThreadsRunner(gm) as runner:
        runner(*inputs)
        assert runner.last_spans == {}
