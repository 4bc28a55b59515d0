"""Check a rewritten graph, independently of how its syncs were computed.

The checker reads only the rewritten FX graph and the dependence graph.  It replays
the linear node order the way TorchAir and the runtimes interpret it: scope
enter/exit select the current stream, ``record`` snapshots what has happened on
the current stream so far, ``wait`` makes the next op of the current stream happen
after those snapshots.  Happens-before is tracked with vector clocks.

Communication: ranks match collectives by issue order, so every two collective
launches (and blocking communication ops) must be ordered by happens-before, in
their program order; a rewrite that lets two streams race to issue them is
rejected, whatever the dependence graph says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import torch.fx

from autostream.dialects.input_mutations import is_input_copy, output_ref_problems
from autostream.dialects.torchair import air_kind, scope_label, stream_index
from autostream.dialects.torchair_modes import GE_LAZY_VIEWS, GE_MODE, ge_wait_landing
from autostream.fx.graph import communicates


@dataclass
class VerifyResult:
    """``ok`` when ``problems`` is empty; each problem names the nodes involved."""

    problems: list[str] = field(default_factory=list)
    #: how much was checked: ``dependences``, ``output_refs`` (reader -> in-place writer
    #: pairs of a compiler mode), ``joins`` (side streams)
    checked: dict[str, int] = field(default_factory=dict)
    #: the dependences ``(u, v)`` left unordered (each also one of ``problems``)
    unordered: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> None:
        if self.problems:
            raise VerificationError("; ".join(self.problems[:10]))


class VerificationError(RuntimeError):
    """A rewritten graph breaks a dependence, a scope or a join."""


def check_scopes(graph: torch.fx.Graph) -> list[str]:
    """The balance check TorchAir's ``_valid_graph`` performs: enters and exits as a stack."""
    depth = 0
    problems = []
    for node in graph.nodes:
        kind = air_kind(node)
        if kind == "scope_enter":
            depth += 1
        elif kind == "scope_exit":
            if depth == 0:
                problems.append(f"scope_exit {node.name} has no matching scope_enter")
            else:
                depth -= 1
    if depth:
        problems.append(f"{depth} scope_enter node(s) are never exited")
    return problems


def verify_rewrite(gm: torch.fx.GraphModule, deps: nx.DiGraph, mode: str | None = None
                   ) -> VerifyResult:
    """Check every dependence is ordered, scopes balance, each op runs once, streams join.

    ``deps`` is the dependence graph of the ops (an ``OpGraph`` or any DiGraph whose
    nodes are FX node names).  ``mode="max-autotune"`` checks the graph as TorchAir's GE
    lowers it (``dialects.torchair_modes``): a main-stream lazy view runs on the main
    stream where its first consumer is converted, and a wait with no op after it on its
    stream (a join right before ``output``) orders nothing, and a wait landing on an op whose
    converter puts it on a ``Const`` made for a scalar argument orders only what that op
    emits after reading the ``Const`` (``torchair_modes.ge_wait_landing``: ``addmm``'s
    ``mat1`` and ``mat2`` are read before).  Elsewhere a record covers
    what its stream ran before it, and a wait orders the stream's next op.  With a TorchAir
    ``mode``, the readers of an input the graph writes are checked, from the graph alone,
    to run before the op that mode lets write it in place
    (:func:`autostream.dialects.input_mutations.output_ref_problems`).
    """
    ge = mode == GE_MODE
    result = VerifyResult(check_scopes(gm.graph))
    stack: list[int] = [0]
    where: dict[str, tuple[int, int]] = {}  # op -> (stream, position on stream)
    seen_count: dict[str, int] = {}
    clock_of_stream: dict[int, dict[int, int]] = {0: {}}
    clock_of_op: dict[str, dict[int, int]] = {}
    token_clock: dict[str, dict[int, int]] = {}
    pending: dict[int, list[dict[int, int]]] = {}
    count: dict[int, int] = {}

    def merge(a: dict[int, int], b: dict[int, int]) -> None:
        for s, p in b.items():
            if p > a.get(s, -1):
                a[s] = p

    deferred: set[torch.fx.Node] = set()  # GE: main-stream lazy views not yet emitted

    # GE: op -> (its inputs a wait landing on it leaves unordered, its clock without it)
    missed: dict[str, tuple[set[str], dict[int, int]]] = {}

    def run_op(node: torch.fx.Node, stream: int, holds_wait: bool = True) -> None:
        clock = clock_of_stream.setdefault(stream, {})
        pos = count.get(stream, 0)
        # GE removes an input copy_ (its Assign) and emits a lazy view unlabelled before its
        # consumer's ops: neither holds a wait
        waits = pending.pop(stream, []) if holds_wait and not (ge and is_input_copy(node)) \
            else []
        landing = ge_wait_landing(node) if ge and waits else None
        if landing is not None and landing.unordered_inputs:
            before = dict(clock)
            before[stream] = pos
            missed[node.name] = (_producers(landing.unordered_inputs, deps), before)
        if landing is not None and landing.lost:
            waits = []
        for c in waits:
            merge(clock, c)
        count[stream] = pos + 1
        clock[stream] = pos
        where[node.name] = (stream, pos)
        clock_of_op[node.name] = dict(clock)
        seen_count[node.name] = seen_count.get(node.name, 0) + 1

    def emit_views(node: torch.fx.Node) -> None:
        for arg in node.all_input_nodes:
            if arg in deferred:
                emit_views(arg)
                deferred.discard(arg)
                run_op(arg, 0, holds_wait=False)

    output_node = None
    for node in gm.graph.nodes:
        kind = air_kind(node)
        stream = stack[-1]
        if kind == "scope_enter":
            label = scope_label(node)
            try:
                stack.append(stream_index(label) if label is not None else stream)
            except ValueError as exc:
                result.problems.append(f"{node.name}: {exc}")
                stack.append(stream)
            continue
        if kind == "scope_exit":
            if len(stack) > 1:
                stack.pop()
            continue
        clock = clock_of_stream.setdefault(stream, {})
        if kind == "record":
            token_clock[node.name] = dict(clock)
            continue
        if kind == "wait":
            tokens = node.args[0]
            for t in tokens:
                if not isinstance(t, torch.fx.Node) or t.name not in token_clock:
                    result.problems.append(f"{node.name} waits on {t}, which is not recorded before it")
                    continue
                pending.setdefault(stream, []).append(token_clock[t.name])
            continue
        if node.op == "output":
            output_node = node
            if ge:
                emit_views(node)
            else:
                for c in pending.pop(0, []):
                    merge(clock_of_stream[0], c)
            continue
        if node.op in ("placeholder", "get_attr"):
            continue
        if ge:
            emit_views(node)
            if stream == 0 and str(node.target) in GE_LAZY_VIEWS:
                deferred.add(node)
                continue
        run_op(node, stream)

    for n in deps.nodes:
        if seen_count.get(n, 0) != 1:
            result.problems.append(f"op {n} is scheduled {seen_count.get(n, 0)} times, expected once")
    extra = sorted(set(seen_count) - set(deps.nodes))
    if extra:
        result.problems.append(f"ops not in the dependence graph appear in the rewrite: {extra[:5]}")
    for u, v in deps.edges:
        if u not in where or v not in where or (ge and is_input_copy(deps.nodes[v].get("fx"))):
            continue  # GE: what an input copy_ reads goes to NetOutput, which the join orders
        su, pu = where[u]
        on_const = v in missed and u in missed[v][0]
        clock = missed[v][1] if on_const else clock_of_op[v]
        if clock.get(su, -1) < pu:
            result.unordered.append((u, v))
            why = (f"; GE puts the wait before {v} on the Const its converter makes for a "
                   f"scalar argument, and {v} reads {u} before using that Const"
                   ) if on_const else ""
            result.problems.append(
                f"dependence {u} -> {v} is not ordered (stream {su} -> stream {where[v][0]})"
                + why)
    result.problems += check_collective_order(gm.graph, where, clock_of_op, deps)
    refs = 0
    if mode is not None:
        def happens_before(a: str, b: str) -> bool | None:
            if a not in where or b not in where:
                return None
            return clock_of_op[b].get(where[a][0], -1) >= where[a][1]

        refs, ref_problems = output_ref_problems(gm, deps, happens_before, mode)
        result.problems += ref_problems
    result.checked = {"dependences": deps.number_of_edges(), "output_refs": refs,
                      "joins": sum(s != 0 for s in count)}
    main_clock = clock_of_stream.get(0, {})
    for s, n in count.items():
        if s != 0 and main_clock.get(s, -1) < n - 1:
            result.problems.append(f"side stream {s} is not joined to the main stream before output")
    if output_node is None:
        result.problems.append("the graph has no output node")
    return result


def _producers(inputs: tuple[torch.fx.Node, ...], deps: nx.DiGraph) -> set[str]:
    """The ops of ``deps`` behind ``inputs`` (through nodes it does not hold, a ``getitem``)."""
    out: set[str] = set()
    todo = list(inputs)
    while todo:
        node = todo.pop()
        if node.name in deps:
            out.add(node.name)
        else:
            todo += node.all_input_nodes
    return out


def check_collective_order(
    graph: torch.fx.Graph, where: dict[str, tuple[int, int]],
    clock_of_op: dict[str, dict[int, int]], deps: nx.DiGraph,
) -> list[str]:
    """Every collective launch happens before the next one (linear order), and the linear
    order is their program order (``deps``' ``order`` attribute, where it has one)."""
    launches = [n.name for n in graph.nodes
                if n.name in where and n.op == "call_function" and communicates(n)]
    problems = []
    for a, b in zip(launches, launches[1:]):
        sa, pa = where[a]
        if clock_of_op[b].get(sa, -1) < pa:
            problems.append(
                f"collectives {a} (stream {sa}) and {b} (stream {where[b][0]}) are not ordered: "
                f"ranks could issue them in different orders (wrong results or a hang)")
    order = {n: deps.nodes[n].get("order") for n in launches if n in deps}
    known = [n for n in launches if order.get(n) is not None]
    if known != sorted(known, key=order.__getitem__):
        problems.append(f"collectives issued as {known[:6]}, not in their program order")
    return problems
