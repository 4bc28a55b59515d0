"""Graph inputs a compiled graph writes, and who reads their old value.

TorchAir compiles inference graphs with ``keep_inference_input_mutations=True``
(``npu_fx_compiler.py:1120-1156``): a graph that updates an input (a KV cache, running
statistics, a module's buffer) ends with ``copy_(input, new)``.  What happens to that copy
after the pass depends on the mode:

- **GE** (``max-autotune``) turns it into an ``Assign``, then binds the producer of
  ``new`` to the input's memory (``optimize_reference_op_redundant_copy``,
  ``_mapping_assign_op_to_graph_output``: ``fx2ge_converter.py:159-233``, called at
  ``:1255-1261``).  That producer writes the input in place, so every op that reads the
  input's old value must run before it, in GE's order (stream order and control edges).
- **ACL graph** (``reduce-overhead``, ``npugraph_ex``) may let the producer of ``new``
  write the input (``_reinplace_input_mutated_ops``, ``graph_pass.py:517``; off with
  ``debug.aclgraph.disable_reinplace_input_mutated_ops_pass``) when no use follows it in
  the order it is given; ``torchair_modes.acl_reinplace_hazards`` keeps that decision the
  same in any launch order.

:func:`ge_output_ref_edges` gives the GE order edges, which the planner adds to the
dependence graph every solver sees; :func:`output_ref_problems` checks a rewritten graph
for them from the graph alone.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import networkx as nx
import torch


@dataclasses.dataclass(frozen=True)
class InputMutation:
    """``copy_(input, value)``: the graph writes ``value`` into ``input`` (a placeholder, or
    a view of one).  ``writers``: the ops a compiler may let write the input in place
    (``value``, and through views and ``getitem`` the op computing it); ``readers``: every other op
    that reads the input's memory, through any view."""

    copy: str
    input: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]


def is_input_copy(node: Any) -> bool:
    """``copy_`` into a graph input's memory (through any view): TorchAir GE turns it into an
    ``Assign`` and then removes it, binding the value to the input instead, so it emits no
    task that a wait or a record could hold.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda buf, x: buf.copy_(x.exp()))(torch.ones(3), torch.ones(3))
    >>> [n.name for n in gm.graph.nodes if is_input_copy(n)]
    ['copy_']
    """
    from autostream.fx.graph import is_view_op

    if not isinstance(node, torch.fx.Node) or node.op != "call_function" \
            or getattr(getattr(node.target, "overloadpacket", None), "__name__", "") != "copy_" \
            or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    base = node.args[0]
    while base.op == "call_function" and is_view_op(base) and base.all_input_nodes:
        base = base.all_input_nodes[0]
    return base.op == "placeholder"


def emits_task(node: Any) -> bool:
    """Whether GE emits a task for ``node`` that a join's wait can land on: not an input
    ``copy_`` (removed), nor a ``getitem``, a view or a size op (no device work).

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda b, x: b.copy_(x.exp().t()))(torch.ones(2, 2), torch.ones(2, 2))
    >>> [n.name for n in gm.graph.nodes if emits_task(n)]
    ['exp']
    """
    from autostream.fx.graph import is_meta_only

    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and not is_input_copy(node) and not is_meta_only(node)


def input_mutations(gm: torch.fx.GraphModule) -> list[InputMutation]:
    """The input writes of ``gm`` (``copy_`` into a placeholder's memory), in program order.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(buf, x):
    ...     y = buf * 2; buf.copy_(x.exp()); return y
    >>> gm = make_fx(f)(torch.ones(3), torch.ones(3))
    >>> [(m.input, m.writers, m.readers) for m in input_mutations(gm)]
    [('buf_1', ('exp',), ('mul',))]
    """
    from autostream.fx.graph import is_meta_only, is_view_op

    roots: dict[torch.fx.Node, torch.fx.Node] = {}
    readers: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    copies: list[torch.fx.Node] = []

    def root(node: torch.fx.Node) -> torch.fx.Node:
        return roots.get(node, node)

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if inputs and (is_view_op(node) or (node.target is operator.getitem
                                           and inputs[0] in roots)):
            roots[node] = root(inputs[0])
            continue
        if is_meta_only(node):
            continue
        for src in inputs:
            readers.setdefault(root(src), []).append(node)
        packet = getattr(node.target, "overloadpacket", None)
        if getattr(packet, "__name__", "") == "copy_" and len(node.args) > 1 \
                and isinstance(node.args[0], torch.fx.Node) \
                and isinstance(node.args[1], torch.fx.Node) \
                and root(node.args[0]).op == "placeholder":
            copies.append(node)
    out = []
    for copy in copies:
        base, value = root(copy.args[0]), copy.args[1]
        chain = [value]  # the value, and through views and getitem the op computing it
        while is_meta_only(chain[-1]) and chain[-1].all_input_nodes:
            chain.append(chain[-1].all_input_nodes[0])
        writers = tuple(dict.fromkeys(n.name for n in chain if n.op == "call_function"))
        seen = [r.name for r in readers.get(base, []) if r is not copy and r.name not in writers]
        out.append(InputMutation(copy.name, base.name, writers, tuple(dict.fromkeys(seen))))
    return out


def ge_output_ref_edges(gm: torch.fx.GraphModule, op_graph: nx.DiGraph
                        ) -> list[tuple[str, str]]:
    """Order edges for GE's output refs: every reader of a written input's old value runs
    before the op GE lets write it.  A reader that depends on the writer already follows it
    (no edge, which would close a cycle); GE reads the new value there, as it does on one
    stream.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from autostream.fx.graph import build_op_graph
    >>> def f(buf, x):
    ...     y = buf * 2; buf.copy_(x.exp()); return y
    >>> gm = make_fx(f)(torch.ones(3), torch.ones(3))
    >>> ge_output_ref_edges(gm, build_op_graph(gm))
    [('mul', 'exp')]
    """
    edges: list[tuple[str, str]] = []
    graph = nx.DiGraph(op_graph.edges)
    graph.add_nodes_from(op_graph.nodes)
    for mutation in input_mutations(gm):
        for writer in mutation.writers:
            for reader in mutation.readers:
                if reader not in graph or writer not in graph or graph.has_edge(reader, writer):
                    continue
                if nx.has_path(graph, writer, reader):
                    continue
                graph.add_edge(reader, writer)
                edges.append((reader, writer))
    return edges


def output_ref_problems(gm: torch.fx.GraphModule, deps: nx.DiGraph,
                        happens_before: Callable[[str, str], bool | None], mode: str
                        ) -> tuple[int, list[str]]:
    """``(pairs checked, problems)`` of a rewritten graph: every reader of a written input's
    old value happens before the op that may write it in place.  GE (``max-autotune``):
    every reader that does not depend on the writer in ``deps``.  ACL graph: every reader
    before the writer in the graph's order (TorchAir reinplaces only when no use follows).
    ``happens_before(a, b)``: ``None`` when either op did not run."""
    position = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    checked, problems = 0, []
    for mutation in input_mutations(gm):
        for writer in mutation.writers:
            if writer not in deps:
                continue
            later = nx.descendants(deps, writer) if mode == "max-autotune" else set()
            for reader in mutation.readers:
                if reader in later or reader not in deps or (
                        mode != "max-autotune" and position[reader] > position[writer]):
                    continue
                ordered = happens_before(reader, writer)
                if ordered is None:
                    continue
                checked += 1
                if not ordered:
                    problems.append(f"{reader} reads input {mutation.input} that {writer} may "
                                    f"write in place ({mode}), and is not ordered before it")
    return checked, problems


@dataclasses.dataclass(frozen=True)
class SizeReads:
    """The ``sym_size`` nodes :func:`symbolic_inputs_as_sizes` put in place of symbolic
    inputs: ``(new node, symbolic input it replaced, its user)``, to undo."""

    replaced: tuple[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node], ...] = ()

    def undo(self, gm: torch.fx.GraphModule) -> None:
        for size, symbol, user in reversed(self.replaced):
            user.replace_input_with(size, symbol)
            gm.graph.erase_node(size)
        if self.replaced:
            gm.recompile()


def symbolic_inputs_as_sizes(gm: torch.fx.GraphModule) -> SizeReads:
    """Each use of a symbolic input (``s0``) read from a tensor input's size instead, one
    ``sym_size`` per user, as TorchAir GE's ``_optimize_sym_input`` does after the pass
    (``npu_fx_compiler.py:403-460``: one ``sym_size`` at the top of the graph, on the main
    stream, that side streams would read unordered).  Placed by the planner, each runs
    where its user runs.  Equal values: the symbol is the tensor's size by construction.

    >>> reads = symbolic_inputs_as_sizes(gm)  # doctest: +SKIP
    >>> [str(n.target) for n, _, _ in reads.replaced]  # doctest: +SKIP
    ['aten.sym_size.int']

    (``tests/test_torchair_modes.py`` runs it on a graph from ``dynamic=True``.)
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [n for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)]
    replaced = []
    for symbol in placeholders:
        value = symbol.meta.get("val")
        if not isinstance(value, torch.SymInt) or not symbol.users:
            continue
        found = next(((t, i) for t in tensors for i, size in enumerate(t.meta["val"].shape)
                      if str(size) == str(value)), None)
        if found is None:
            continue
        for user in list(symbol.users):
            with gm.graph.inserting_before(user):
                size = gm.graph.call_function(torch.ops.aten.sym_size.int, found)
            size.meta["val"] = value
            user.replace_input_with(symbol, size)
            replaced.append((size, symbol, user))
    if replaced:
        gm.recompile()
    return SizeReads(tuple(replaced))
