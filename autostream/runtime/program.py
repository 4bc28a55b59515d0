"""Parse a rewritten FX graph into a :class:`StreamProgram`: what each stream runs, in order.

The rewritten-graph dialect (linear FX node order = launch order): ops of side stream
``k`` sit between ``air.scope_enter(["_user_stream_label"], ["stream_k"])`` and
``air.scope_exit()``; everything outside a scope is on stream 0.  ``t = air.record()``
marks "everything launched so far on this stream", ``air.wait([t, ...])`` makes the
current stream wait for those marks.

Every structural error is reported here, before any op runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch.fx

from autostream.dialects.torchair import (
    STREAM_LABEL_KEY,
    air_kind,
    scope_label,
    stream_index,
    stream_label,
)
from autostream.memory.lifetimes import LaunchStep, alias_groups, release_points

StepKind = Literal["op", "record", "wait"]


class ProgramError(ValueError):
    """A rewritten graph that no runtime can execute (raised before any op runs)."""


@dataclass(frozen=True)
class Step:
    """One action of one stream.

    ``kind == "op"``: run ``node``; ``"record"``: publish token ``node.name``;
    ``"wait"``: block until every token in ``tokens`` is published.  ``release``
    lists values the runtime drops after the step: after an op, values last read
    there; after a wait, storages other streams read, once every read
    happens-before it (:mod:`autostream.memory.lifetimes`).
    """

    kind: StepKind
    node: torch.fx.Node
    stream: int
    tokens: tuple[str, ...] = ()
    release: tuple[torch.fx.Node, ...] = ()


@dataclass(frozen=True)
class StreamProgram:
    """What each stream runs, parsed from a rewritten graph.

    ``steps`` is the linear (launch) order of all steps; ``streams[k]`` the steps of
    stream ``k`` in order (stream 0 always present).  ``held`` are the values
    produced on one stream and used on another: a runtime keeps them alive until
    their stream has waited for every read (:mod:`autostream.memory.lifetimes`), at the
    latest until every side stream has been joined back.
    """

    placeholders: tuple[torch.fx.Node, ...]
    constants: tuple[torch.fx.Node, ...]
    steps: tuple[Step, ...]
    streams: dict[int, tuple[Step, ...]]
    output: torch.fx.Node
    stream_of: dict[torch.fx.Node, int]
    held: frozenset[torch.fx.Node]

    @property
    def side_streams(self) -> tuple[int, ...]:
        """Side stream numbers (every stream but 0), ascending."""
        return tuple(k for k in sorted(self.streams) if k != 0)

    def ops(self, stream: int) -> list[str]:
        """Names of the ops (not records/waits) of ``stream``, in launch order."""
        return [s.node.name for s in self.streams.get(stream, ()) if s.kind == "op"]


def _is_air_node(node: torch.fx.Node) -> bool:
    name = getattr(node.target, "name", None)
    return node.op == "call_function" and callable(name) and str(name()).startswith("air::")


def _scope_stream(node: torch.fx.Node) -> int:
    label = scope_label(node)
    if label is None:
        raise ProgramError(
            f"scope_enter node {node.name!r} has keys {list(node.args[0])} but no "
            f"{STREAM_LABEL_KEY!r}: only stream scopes are part of the autostream dialect; "
            f"emit scope_enter([{STREAM_LABEL_KEY!r}], ['stream_<k>'])"
        )
    try:
        return stream_index(label)
    except ValueError as exc:
        raise ProgramError(
            f"scope_enter node {node.name!r}: {exc} (stream 0 is the main stream: put its "
            f"ops outside any scope)"
        ) from None


def _check_wait(node: torch.fx.Node, position: dict[torch.fx.Node, int],
                records: set[torch.fx.Node]) -> tuple[str, ...]:
    tokens = node.args[0] if node.args else node.kwargs.get("x", ())
    if not isinstance(tokens, (list, tuple)) or not tokens:
        raise ProgramError(
            f"wait node {node.name!r} waits on {tokens!r}: expected a non-empty list of "
            f"record tokens"
        )
    for t in tokens:
        if not isinstance(t, torch.fx.Node) or air_kind(t) != "record":
            raise ProgramError(
                f"wait node {node.name!r} waits on {t!r}, which is not an air.record token"
            )
        if t not in records or position[t] > position[node]:
            raise ProgramError(
                f"wait node {node.name!r} waits on token {t.name!r}, which is not recorded "
                f"before it in the graph: the wait could never be satisfied; record the "
                f"token right after its producer, before the wait"
            )
    return tuple(t.name for t in tokens)


def parse_program(graph: torch.fx.Graph | torch.fx.GraphModule) -> StreamProgram:
    """Parse a rewritten graph (or GraphModule) into a :class:`StreamProgram`.

    Raises :class:`ProgramError` for unbalanced or nested scopes, waits on tokens
    never recorded before them, unknown stream labels and air ops outside the dialect.

    >>> import torch, torch.fx
    >>> from autostream.dialects.torchair import air_ops
    >>> ops = air_ops()
    >>> g = torch.fx.Graph()
    >>> x = g.placeholder("x")
    >>> _ = g.call_function(ops.scope_enter, (["_user_stream_label"], ["stream_1"]))
    >>> y = g.call_function(torch.ops.aten.relu.default, (x,))
    >>> t = g.call_function(ops.record, ())
    >>> _ = g.call_function(ops.scope_exit, ())
    >>> _ = g.call_function(ops.wait, ([t],))
    >>> _ = g.output((y,))
    >>> p = parse_program(g)
    >>> p.ops(1), [s.kind for s in p.streams[0]]
    (['relu_default'], ['wait'])
    """
    graph = graph.graph if isinstance(graph, torch.fx.GraphModule) else graph
    scan = _Scan({n: i for i, n in enumerate(graph.nodes)})
    for node in graph.nodes:
        if node.op == "output":
            return scan.program(node)
        scan.add(node)
    raise ProgramError("graph has no output node")


class _Scan:
    """The graph's nodes read in order: inputs, the stream scope open now, the steps so far."""

    def __init__(self, position: dict[torch.fx.Node, int]):
        self.position = position
        self.placeholders: list[torch.fx.Node] = []
        self.constants: list[torch.fx.Node] = []
        self.raw: list[tuple[StepKind, torch.fx.Node, int, tuple[str, ...]]] = []
        self.stream_of: dict[torch.fx.Node, int] = {}
        self.records: set[torch.fx.Node] = set()
        self.current, self.opened_by = 0, None

    def add(self, node: torch.fx.Node) -> None:
        if node.op in ("placeholder", "get_attr"):
            (self.placeholders if node.op == "placeholder" else self.constants).append(node)
            self.stream_of[node] = 0
            return
        kind = air_kind(node)
        if kind is None and _is_air_node(node):
            raise ProgramError(
                f"node {node.name!r} calls {node.target.name()}, an air op outside the "
                f"autostream dialect (scope_enter, scope_exit, record, wait)"
            )
        if kind == "scope_enter":
            self.enter(node)
        elif kind == "scope_exit":
            self.exit(node)
        else:
            self.step(kind, node)

    def enter(self, node: torch.fx.Node) -> None:
        stream = _scope_stream(node)
        if self.current != 0:
            raise ProgramError(
                f"scope_enter {node.name!r} opens {stream_label(stream)!r} inside scope "
                f"{stream_label(self.current)!r} opened at {self.opened_by.name!r}: nested "
                f"scopes are not allowed; exit the first scope before entering another"
            )
        self.current, self.opened_by = stream, node

    def exit(self, node: torch.fx.Node) -> None:
        if self.current == 0:
            raise ProgramError(f"scope_exit {node.name!r} has no matching scope_enter before it")
        self.current, self.opened_by = 0, None

    def step(self, kind: str | None, node: torch.fx.Node) -> None:
        self.stream_of[node] = self.current
        if kind == "record":
            self.records.add(node)
            self.raw.append(("record", node, self.current, (node.name,)))
        elif kind == "wait":
            tokens = _check_wait(node, self.position, self.records)
            self.raw.append(("wait", node, self.current, tokens))
        else:
            self.raw.append(("op", node, self.current, ()))

    def program(self, output: torch.fx.Node) -> StreamProgram:
        if self.current != 0:
            raise ProgramError(
                f"scope {stream_label(self.current)!r} entered at {self.opened_by.name!r} is "
                f"not exited before the graph's output: add scope_exit() after its last op"
            )
        held, release = _lifetimes(self.raw, self.placeholders + self.constants, output,
                                   self.stream_of)
        steps = tuple(Step(kind, node, stream, tokens, tuple(release.get(i, ())))
                      for i, (kind, node, stream, tokens) in enumerate(self.raw))
        streams: dict[int, list[Step]] = {0: []}
        for step in steps:
            streams.setdefault(step.stream, []).append(step)
        return StreamProgram(
            placeholders=tuple(self.placeholders),
            constants=tuple(self.constants),
            steps=steps,
            streams={k: tuple(v) for k, v in sorted(streams.items())},
            output=output,
            stream_of=self.stream_of,
            held=frozenset(held),
        )


def _lifetimes(raw, inputs: Iterable[torch.fx.Node], output: torch.fx.Node,
               stream_of: dict[torch.fx.Node, int]):
    """Values used across streams (``held``) and, per step, what it may release
    (:func:`autostream.memory.lifetimes.release_points`)."""
    inputs = list(inputs)
    ops = [n for kind, n, _, _ in raw if kind == "op"]
    returned = set(output.all_input_nodes)
    held = {v for v in inputs + ops if v not in returned
            and len({stream_of[v]} | {stream_of[u] for u in v.users if u in stream_of}) > 1}
    steps = [_launch_step(kind, node, stream, tokens) for kind, node, stream, tokens in raw]
    by_name = {n.name: n for n in inputs + ops}
    points = release_points(steps, [n.name for n in inputs],
                            {n.name for n in output.all_input_nodes}, alias_groups(inputs + ops))
    release: dict[int, list[torch.fx.Node]] = {}
    for name, index in points.items():
        if index is not None:
            release.setdefault(index, []).append(by_name[name])
    return held, release


def _launch_step(kind: StepKind, node: torch.fx.Node, stream: int, tokens: tuple[str, ...]
                 ) -> LaunchStep:
    reads = tuple(n.name for n in node.all_input_nodes) if kind == "op" else ()
    return LaunchStep(kind, node.name, stream, reads, tokens)


def unordered_dependences(program: StreamProgram) -> list[tuple[str, str]]:
    """``(producer, consumer)`` pairs on different streams not ordered by any record/wait.

    A static happens-before check with vector clocks: a consumer may read a value
    only if the producer's stream position is covered by the consumer stream's
    clock (through waits on records).  The graph's output counts as a consumer on
    stream 0.

    >>> import torch, torch.fx
    >>> from autostream.dialects.torchair import air_ops
    >>> ops = air_ops()
    >>> g = torch.fx.Graph()
    >>> x = g.placeholder("x")
    >>> _ = g.call_function(ops.scope_enter, (["_user_stream_label"], ["stream_1"]))
    >>> y = g.call_function(torch.ops.aten.relu.default, (x,))
    >>> _ = g.call_function(ops.scope_exit, ())
    >>> _ = g.output((y,))
    >>> unordered_dependences(parse_program(g))
    [('relu_default', 'output')]
    """
    clock: dict[int, dict[int, int]] = {k: {} for k in program.streams}
    stamp: dict[torch.fx.Node, tuple[int, int]] = {}
    token_clock: dict[str, dict[int, int]] = {}
    missing: list[tuple[str, str]] = []

    def check(consumer: torch.fx.Node, stream: int) -> None:
        for arg in consumer.all_input_nodes:
            if arg not in stamp:
                continue
            s, c = stamp[arg]
            if s != stream and clock[stream].get(s, 0) < c:
                missing.append((arg.name, consumer.name))

    for step in program.steps:
        k, vc = step.stream, clock[step.stream]
        if step.kind == "op":
            check(step.node, k)
            vc[k] = vc.get(k, 0) + 1
            stamp[step.node] = (k, vc[k])
        elif step.kind == "record":
            token_clock[step.node.name] = dict(vc)
        else:
            for t in step.tokens:
                for s, c in token_clock[t].items():
                    vc[s] = max(vc.get(s, 0), c)
    check(program.output, 0)
    return missing
