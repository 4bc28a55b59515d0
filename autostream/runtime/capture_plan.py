"""What a captured multi-stream graph does, in order: a pure function of the program.

Capturing a plan into one device graph (``torch.cuda.CUDAGraph``, ``torch.npu.NPUGraph``)
follows PyTorch's rules for several streams (``docs/cuda.md``):

1. ``begin``: capture starts on the capture stream (stream 0 of the plan);
2. ``fork k``: each side stream waits for the capture stream *after* capture began,
   so it joins the capture (a side stream that never forks is outside it);
3. the program's steps in launch order: ``op``, ``record``, ``wait``, and ``release``
   where the program drops values (:mod:`autostream.memory.lifetimes`: a storage another
   stream reads is dropped only once its allocating stream has waited for every read);
4. ``join k``: the capture stream waits for every side stream before
5. ``end``: capture ends (a side stream with unjoined work makes it fail).

:func:`capture_steps` builds that sequence; :func:`check_capture` checks any sequence
independently of how it was built, with vector clocks over the streams, and counts
what it checked.

>>> import torch
>>> from autostream.runtime.builder import fork_join
>>> from autostream.runtime.program import parse_program
>>> program = parse_program(fork_join(streams=2)[0])
>>> steps = capture_steps(program)
>>> [s.verb for s in steps][:3], [s.verb for s in steps][-2:]
(['begin', 'fork', 'op'], ['join', 'end'])
>>> check_capture(steps, program).summary()
'capture sequence: 2 streams, 2 cross-stream reads, 0 cross-stream releases, 1 join, 1 output checked; no problem'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch.fx

from autostream.memory.lifetimes import alias_groups
from autostream.runtime.program import Step, StreamProgram

__all__ = ["CaptureCheck", "CaptureStep", "capture_steps", "check_capture"]

Verb = Literal["begin", "fork", "op", "record", "wait", "release", "join", "end"]


@dataclass(frozen=True)
class CaptureStep:
    """One action of a capture.  ``stream``: the stream that acts (``fork``: the side
    stream that waits for the capture stream; ``join``: the side stream waited for).
    ``step``: the program's step (``op``, ``record``, ``wait``); ``values``: what a
    ``release`` drops."""

    verb: Verb
    stream: int = 0
    step: Step | None = None
    values: tuple[torch.fx.Node, ...] = ()

    def __str__(self) -> str:
        what = (self.step.node.name if self.step is not None
                else ",".join(v.name for v in self.values))
        return f"{self.verb}[{self.stream}]{' ' + what if what else ''}"


def capture_steps(program: StreamProgram) -> tuple[CaptureStep, ...]:
    """The capture of ``program``: begin, fork every side stream, the program's steps
    with its releases, join every side stream, end."""
    out = [CaptureStep("begin")]
    out += [CaptureStep("fork", k) for k in program.side_streams]
    for step in program.steps:
        out.append(CaptureStep(step.kind, step.stream, step))
        if step.release:
            out.append(CaptureStep("release", step.stream, values=step.release))
    out += [CaptureStep("join", k) for k in program.side_streams]
    out.append(CaptureStep("end"))
    return tuple(out)


@dataclass
class CaptureCheck:
    """What :func:`check_capture` found, and how much it looked at."""

    streams: int = 0
    cross_reads: int = 0
    cross_releases: int = 0
    joins: int = 0
    outputs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        def n(count: int, what: str) -> str:
            return f"{count} {what}{'s' * (count != 1)}"

        head = (f"capture sequence: {n(self.streams, 'stream')}, "
                f"{n(self.cross_reads, 'cross-stream read')}, "
                f"{n(self.cross_releases, 'cross-stream release')}, {n(self.joins, 'join')}, "
                f"{n(self.outputs, 'output')} checked")
        if self.ok:
            return f"{head}; no problem"
        return f"{head}; {n(len(self.problems), 'problem')}: " + "; ".join(self.problems)


class _Clocks:
    """Vector clocks of the streams: ``clock[s][t]`` = ops of stream ``t`` that stream ``s``
    is ordered after (its own included)."""

    def __init__(self) -> None:
        self.clock: dict[int, dict[int, int]] = {}
        self.stamp: dict[torch.fx.Node, tuple[int, int]] = {}
        self.tokens: dict[str, dict[int, int]] = {}

    def of(self, stream: int) -> dict[int, int]:
        return self.clock.setdefault(stream, {})

    def covers(self, stream: int, node: torch.fx.Node) -> bool:
        """Whether ``stream`` is ordered after ``node``'s launch (launched at all)."""
        if node not in self.stamp:
            return False
        s, c = self.stamp[node]
        return self.of(stream).get(s, 0) >= c

    def merge(self, into: int, other: dict[int, int]) -> None:
        mine = self.of(into)
        for s, c in other.items():
            mine[s] = max(mine.get(s, 0), c)

    def launch(self, stream: int, node: torch.fx.Node) -> None:
        mine = self.of(stream)
        mine[stream] = mine.get(stream, 0) + 1
        self.stamp[node] = (stream, mine[stream])


def check_capture(steps: Sequence[CaptureStep], program: StreamProgram) -> CaptureCheck:
    """Check a capture sequence of ``program``: side streams fork after ``begin``; every
    value read on another stream than its producer's is ordered by a wait; a storage
    read on another stream is released only once its allocating stream is ordered after
    every read of it (else the allocator could hand its block to a later kernel of that
    stream that no graph edge orders after the read); every side stream is joined after
    its last step and before ``end``; the outputs are ordered before ``end``.

    >>> import torch
    >>> from autostream.runtime.builder import fork_join
    >>> from autostream.runtime.program import parse_program
    >>> program = parse_program(fork_join(streams=2)[0])
    >>> dropped = [s for s in capture_steps(program) if s.verb != "join"]
    >>> check_capture(dropped, program).problems[0]
    'stream 1 is not joined before the capture ends'
    """
    result = CaptureCheck(streams=len(program.streams))
    clocks = _Clocks()
    groups = _Groups(program)
    capturing = ended = False
    forked: set[int] = set()
    last_action: dict[int, int] = {}
    joined_at: dict[int, int] = {}
    for i, s in enumerate(steps):
        if s.verb == "begin":
            if capturing or ended:
                result.problems.append(f"step {i}: capture begins twice")
            capturing = True
            continue
        if s.verb == "end":
            ended = True
            _check_end(result, clocks, program, last_action, joined_at)
            capturing = False
            continue
        if not capturing:
            result.problems.append(f"step {i} ({s}) runs outside the capture")
        if s.verb == "fork":
            forked.add(s.stream)
            clocks.merge(s.stream, dict(clocks.of(0)))
            continue
        if s.verb == "join":
            joined_at[s.stream] = i
            result.joins += 1
            clocks.merge(0, dict(clocks.of(s.stream)))
            continue
        if s.stream != 0 and s.stream not in forked:
            result.problems.append(f"{s} on stream {s.stream} before the stream forks from "
                                   f"the capture stream")
            forked.add(s.stream)  # once per stream
        last_action[s.stream] = i
        if s.verb == "op":
            _check_reads(result, clocks, s)
            clocks.launch(s.stream, s.step.node)
        elif s.verb == "record":
            clocks.tokens[s.step.node.name] = dict(clocks.of(s.stream))
        elif s.verb == "wait":
            for t in s.step.tokens:
                if t not in clocks.tokens:
                    result.problems.append(f"{s} waits on {t!r}, not recorded before it")
                else:
                    clocks.merge(s.stream, clocks.tokens[t])
        elif s.verb == "release":
            for freed in groups.release(s.values):
                result.cross_releases += groups.crosses(freed)
                _check_release(result, clocks, groups, freed, s)
    if not ended:
        result.problems.append("the capture never ends")
    return result


def _check_reads(result: CaptureCheck, clocks: _Clocks, s: CaptureStep) -> None:
    for arg in s.step.node.all_input_nodes:
        producer = clocks.stamp.get(arg)
        if producer is None or producer[0] == s.stream:
            continue
        result.cross_reads += 1
        if not clocks.covers(s.stream, arg):
            result.problems.append(f"{s.step.node.name!r} on stream {s.stream} reads "
                                   f"{arg.name!r} from stream {producer[0]} with no wait "
                                   f"ordering it after the write")


def _check_release(result: CaptureCheck, clocks: _Clocks, groups: _Groups, group: str,
                   s: CaptureStep) -> None:
    home = groups.stream_of_group(group, clocks)
    if home is None:
        return
    for reader in groups.readers(group):
        if reader not in clocks.stamp:
            result.problems.append(f"{s}: storage of {group!r} released before its reader "
                                   f"{reader.name!r} is launched")
        elif not clocks.covers(home, reader):
            result.problems.append(
                f"{s}: storage of {group!r} (allocated on stream {home}) released before "
                f"stream {home} waits for its reader {reader.name!r} on stream "
                f"{clocks.stamp[reader][0]}: a later kernel of stream {home} could reuse "
                f"the block while the read runs")


def _check_end(result: CaptureCheck, clocks: _Clocks, program: StreamProgram,
               last_action: dict[int, int], joined_at: dict[int, int]) -> None:
    for k in program.side_streams:
        if k not in joined_at:
            result.problems.append(f"stream {k} is not joined before the capture ends")
        elif last_action.get(k, -1) > joined_at[k]:
            result.problems.append(f"stream {k} runs steps after its join")
    for out in program.output.all_input_nodes:
        if out in clocks.stamp:
            result.outputs += 1
            if not clocks.covers(0, out):
                result.problems.append(f"output {out.name!r} (stream "
                                       f"{clocks.stamp[out][0]}) is not ordered before the "
                                       f"capture ends")


class _Groups:
    """Alias groups of the program's values: a storage is freed when its group's last
    live member is released (each value its own group when aliasing is unknown)."""

    def __init__(self, program: StreamProgram):
        nodes = [*program.placeholders, *program.constants,
                 *(s.node for s in program.steps if s.kind == "op")]
        found = alias_groups(nodes)
        self.group_of = found if found is not None else {n.name: n.name for n in nodes}
        self.by_name = {n.name: n for n in nodes}
        self.external = {self.group_of[n.name] for n in (*program.placeholders,
                                                         *program.constants)}
        self.returned = {self.group_of.get(n.name) for n in program.output.all_input_nodes}
        self.live: dict[str, set[str]] = {}
        for n in nodes:
            self.live.setdefault(self.group_of[n.name], set()).add(n.name)
        self.members = {g: set(m) for g, m in self.live.items()}
        self.program = program

    def release(self, values: Sequence[torch.fx.Node]) -> list[str]:
        """The groups whose storage these releases free."""
        freed = []
        for v in values:
            g = self.group_of.get(v.name)
            if g is None or g in self.external or g in self.returned:
                continue  # held by the caller or returned: never freed here
            live = self.live[g]
            live.discard(v.name)
            if not live:
                freed.append(g)
        return freed

    def readers(self, group: str) -> list[torch.fx.Node]:
        return [u for m in self.members[group] for u in self.by_name[m].users
                if u.op != "output"]

    def stream_of_group(self, group: str, clocks: _Clocks) -> int | None:
        root = self.by_name[group]
        stamp = clocks.stamp.get(root)
        return None if stamp is None else stamp[0]

    def crosses(self, group: str) -> int:
        stream_of = self.program.stream_of
        streams = {stream_of.get(self.by_name[m]) for m in self.members[group]}
        streams |= {stream_of.get(u) for u in self.readers(group)}
        return int(len(streams - {None}) > 1)
