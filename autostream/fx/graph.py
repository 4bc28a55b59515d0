"""FX ``GraphModule`` -> ``OpGraph``: a networkx DAG of schedulable ops and real dependences.

Edges come from three sources:

1. **data**: every op depends on the ops that produce its inputs (including
   ``operator.getitem`` of multi-output ops and views);
2. **memory**: ops that write a storage (in-place ``aten.*_`` ops, ``copy_``,
   ``index_put_``, out-variants, ``auto_functionalized``) are ordered after every
   earlier reader and writer of the same storage, and later readers after them.
   Storages are tracked through views: a view's storage is its base's;
3. **effects**: ops registered with ``has_side_effect``, impure ops and RNG ops
   keep their relative program order (one chain), so no rewrite reorders them;
4. **communication**: collective launches and blocking communication ops
   (``autostream.comm``) keep their relative program order (a second chain, edge
   kind ``"comm"``): ranks match collectives by issue order.  A ``wait_tensor``
   writes nothing; it depends on its collective through data flow.  On a group whose
   backend runs collectives in flight together unsafely (gloo,
   ``autostream.comm.inflight``), each wait also precedes the group's next launch
   when it does in program order (edge kind ``"comm"``).

Placeholders, ``get_attr`` and ``output`` are not scheduled.  Metadata-only ops
(views, ``getitem``, symbolic-size arithmetic) are scheduled with zero cost.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
import torch.fx

from autostream.comm import comm_op
from autostream.comm.inflight import one_at_a_time as gloo_one_at_a_time
from autostream.comm.ops import launch_of_wait

#: ``OpGraph`` is a plain ``networkx.DiGraph``; nodes are FX node names with the
#: attributes ``fx`` (the ``torch.fx.Node``), ``target`` (str), ``order`` (program
#: position) and ``meta_only`` (bool).  Edges carry ``kind`` in
#: {"data", "memory", "effect", "comm"}.
OpGraph = nx.DiGraph

_UNSCHEDULED = {"placeholder", "get_attr", "output"}


@dataclass(frozen=True)
class OpEffects:
    """What an op does besides computing its outputs."""

    writes: tuple[torch.fx.Node, ...]  # inputs whose storage it mutates
    ordered: bool  # side effect or RNG: keep program order among such ops
    #: a collective launch or blocking communication: keeps program order among those
    communicates: bool = False


def target_name(node: torch.fx.Node) -> str:
    """A stable printable name of a node's target (``aten.mm.default``, ``operator.getitem``).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> target_name(g.call_function(torch.ops.aten.relu.default, (x,)))
    'aten.relu.default'
    """
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::', 1)[-1]}.{t._overloadname}"
    if isinstance(t, torch._ops.HigherOrderOperator):
        return f"higher_order.{t.name()}"
    if isinstance(t, str):
        return t
    module = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", repr(t))
    return f"{module.replace('_operator', 'operator')}.{name}" if module else name


def _schema(node: torch.fx.Node):
    t = node.target
    return t._schema if isinstance(t, torch._ops.OpOverload) else None


def is_view_op(node: torch.fx.Node) -> bool:
    """True when every output of the op aliases an input without writing it (a view)."""
    schema = _schema(node)
    if schema is None or not schema.returns:
        return False
    return all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def is_meta_only(node: torch.fx.Node, view: bool | None = None) -> bool:
    """Views, ``getitem`` and symbolic-size ops carry no device work (``view``:
    ``is_view_op(node)``, when the caller knows it)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem or (is_view_op(node) if view is None else view):
        return True
    if getattr(node.target, "__module__", "") in {"_operator", "operator", "math"}:
        return True
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


_INPLACE_OPERATORS = frozenset({
    operator.setitem, operator.delitem, operator.iadd, operator.isub, operator.imul,
    operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul,
    operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
})


def writes_inputs_by_name(node: torch.fx.Node) -> bool:
    """Whether a Python-level call (a Dynamo graph's node) may mutate one of its inputs.

    Judged conservatively from what the call looks like, where no ATen schema says:
    in-place operators, ``inplace=True``, ``out=`` and torch's trailing-underscore names.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [writes_inputs_by_name(g.call_method(m, (x, 1))) for m in ("add_", "add", "__add__")]
    [True, False, False]
    >>> writes_inputs_by_name(g.call_function(operator.and_, (x, x)))
    False
    """
    if node.target in _INPLACE_OPERATORS:
        return True
    if node.kwargs.get("inplace") is True or "out" in node.kwargs:
        return True
    if getattr(node.target, "__module__", None) in ("_operator", "operator"):
        return False  # and_, or_, xor_, not_: a keyword's name, not an in-place op
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    # torch's in-place convention: add_, relu_, copy_, index_put_ (not __dunder__ names)
    return name.endswith("_") and not name.endswith("__")


def _is_rng(node: torch.fx.Node) -> bool:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return draws_random_numbers(t, node.args, node.kwargs)
    return False


def draws_random_numbers(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether a call of ``op`` with these arguments draws from the random generator.

    torch tags every op that *may* draw (``nondeterministic_seeded``); the attention
    kernels draw only for dropout, so one called with ``dropout_p=0`` does not.

    >>> sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    >>> draws_random_numbers(sdpa, (None, None, None, 0.0), {})
    False
    >>> draws_random_numbers(sdpa, (None, None, None, 0.1), {})
    True
    """
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dropout_p":
            value = args[i] if i < len(args) else kwargs.get("dropout_p", arg.default_value)
            return not (isinstance(value, (int, float)) and value == 0)
    return True


def op_effects(node: torch.fx.Node,
               impure: Callable[[torch.fx.Node], bool] | None = None) -> OpEffects:
    """Inputs an op writes, and whether it must keep program order (side effect / RNG,
    communication).  ``impure``: ``_impure``, or a memo of it (``_TargetFacts``)."""
    comm = comm_op(node)
    if comm is not None:
        return _comm_effects(node, comm.orders, comm.qualname)
    writes = _schema_writes(node)
    is_hop = isinstance(node.target, torch._ops.HigherOrderOperator)
    if is_hop:
        # auto_functionalized and friends: conservatively treat every tensor input as written.
        writes.extend(n for n in node.all_input_nodes if n not in writes)
    side_effect = node.target in torch.fx.node._side_effectful_functions
    ordered = side_effect or (impure or _impure)(node) or _is_rng(node) or is_hop
    if ordered and not writes and (side_effect or is_hop):
        writes.extend(node.all_input_nodes)
    return OpEffects(tuple(writes), ordered)


def communicates(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a collective launch or blocking communication, which keeps program
    order among those (``op_effects(node).communicates``, without the rest of its effects).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> communicates(g.call_function(torch.ops.aten.relu.default, (x,)))
    False
    """
    comm = comm_op(node)
    return comm is not None and comm.orders


def _impure(node: torch.fx.Node) -> bool:
    """torch's purity check (mutable schema, RNG state, registered effects); a node it
    cannot judge is impure."""
    try:
        return node.is_impure()
    except Exception:
        return True


class _TargetFacts:
    """What holds for every call of one op overload (name, view, purity), found once per
    graph: a graph of thousands of nodes calls a few dozen overloads."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, torch._ops.OpOverload], object] = {}

    def _of(self, what: str, fn: Callable[[torch.fx.Node], Any], node: torch.fx.Node) -> Any:
        if not isinstance(node.target, torch._ops.OpOverload):
            return fn(node)
        key = (what, node.target)
        if key not in self._memo:
            self._memo[key] = fn(node)
        return self._memo[key]

    def name(self, node: torch.fx.Node) -> str:
        return self._of("name", target_name, node)

    def view(self, node: torch.fx.Node) -> bool:
        return self._of("view", is_view_op, node)

    def impure(self, node: torch.fx.Node) -> bool:
        return self._of("impure", _impure, node)


def _comm_effects(node: torch.fx.Node, orders: bool, qualname: str) -> OpEffects:
    """A wait writes nothing; a collective writes what its schema says, and a blocking op
    named in-place (``c10d::allreduce_``) its tensor inputs."""
    if not orders:
        return OpEffects((), False)
    writes = _schema_writes(node)
    if qualname.endswith("_") and not writes:
        writes = [n for n in node.all_input_nodes if n.op != "get_attr"]
    return OpEffects(tuple(writes), False, communicates=True)


def _schema_writes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The arguments the op's schema marks as written (``Tensor(a!)``)."""
    schema = _schema(node)
    writes: list[torch.fx.Node] = []
    if schema is None:
        return writes
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, torch.fx.Node):
                writes.append(v)
    return writes


def _storage_root(node: torch.fx.Node, roots: dict[torch.fx.Node, torch.fx.Node]) -> torch.fx.Node:
    return roots.get(node, node)


def view_base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` shares through views and ``getitem``.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> view_base(g.call_function(torch.ops.aten.t.default, (x,))).name
    'x'
    """
    while (node.target is operator.getitem or is_view_op(node)) and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def dependence_storage(u: torch.fx.Node, v: torch.fx.Node) -> str:
    """The storage the dependence ``u -> v`` is about: one written by either op and touched
    by the other, else what ``u`` produces.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mm = g.call_function(torch.ops.aten.mm.default, (x, x))
    >>> dependence_storage(mm, g.call_function(torch.ops.aten.mul_.Tensor, (x, 2.0)))
    'x'
    """
    def touched(n: torch.fx.Node) -> set[torch.fx.Node]:
        return {view_base(n)} | {view_base(a) for a in n.all_input_nodes}

    written = {view_base(w) for w in (*op_effects(u).writes, *op_effects(v).writes)}
    common = touched(u) & touched(v) & written
    return min(common, key=lambda n: n.name).name if common else view_base(u).name


def memory_hazard(u: torch.fx.Node, v: torch.fx.Node, storage: str) -> str:
    """Which hazard a memory dependence ``u -> v`` on ``storage`` guards: ``"write-after-read"``,
    ``"write-after-write"``, ``"read-after-write"`` (``""`` when no schema says who writes).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mm = g.call_function(torch.ops.aten.mm.default, (x, x))
    >>> memory_hazard(mm, g.call_function(torch.ops.aten.mul_.Tensor, (x, 2.0)), "x")
    'write-after-read'
    """
    def writes(n: torch.fx.Node) -> bool:
        return any(view_base(w).name == storage for w in op_effects(n).writes)

    first, second = writes(u), writes(v)
    if second:
        return "write-after-write" if first else "write-after-read"
    return "read-after-write" if first else ""


def build_op_graph(gm: torch.fx.GraphModule,
                   one_at_a_time: Callable[[str | None], bool] | None = None) -> OpGraph:
    """Build the dependence DAG of ``gm``'s schedulable ops.

    ``one_at_a_time(group)``: whether the collectives of a process group must not be in
    flight together beyond the program's (default: its backend is gloo,
    ``autostream.comm.inflight``).

    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.relu(x) + torch.sigmoid(x)
    >>> gm = torch.fx.symbolic_trace(M())
    >>> sorted(build_op_graph(gm).edges)
    [('relu', 'add'), ('sigmoid', 'add')]
    """
    g: OpGraph = nx.DiGraph()
    roots: dict[torch.fx.Node, torch.fx.Node] = {}
    last_write: dict[torch.fx.Node, str] = {}
    reads_since: dict[torch.fx.Node, list[str]] = {}
    last_ordered: str | None = None
    last_comm: str | None = None
    serial = _SerialGroups(one_at_a_time or gloo_one_at_a_time)
    facts = _TargetFacts()

    def add_edge(u: str, v: str, kind: str) -> None:
        if u != v and not g.has_edge(u, v):
            g.add_edge(u, v, kind=kind)

    for order, node in enumerate(gm.graph.nodes):
        if node.op in _UNSCHEDULED:
            continue
        name = node.name
        view = facts.view(node)
        g.add_node(name, fx=node, target=facts.name(node), order=order,
                   meta_only=is_meta_only(node, view))
        inputs = node.all_input_nodes
        for src in inputs:
            if src.op not in _UNSCHEDULED:
                add_edge(src.name, name, "data")
        # Views (and getitem of views) share their base's storage.
        if view and inputs:
            roots[node] = _storage_root(inputs[0], roots)
        elif node.target is operator.getitem and inputs and inputs[0] in roots:
            roots[node] = roots[inputs[0]]

        effects = op_effects(node, facts.impure)
        written = {_storage_root(w, roots) for w in effects.writes}
        for src in inputs:
            root = _storage_root(src, roots)
            if root in written:
                continue
            if root in last_write:
                add_edge(last_write[root], name, "memory")
            reads_since.setdefault(root, []).append(name)
        for root in sorted(written, key=lambda n: n.name):
            for reader in reads_since.pop(root, []):
                add_edge(reader, name, "memory")
            if root in last_write:
                add_edge(last_write[root], name, "memory")
            last_write[root] = name
            # An in-place op's result aliases what it wrote.
            roots.setdefault(node, root)
        if effects.ordered:
            if last_ordered is not None:
                add_edge(last_ordered, name, "effect")
            last_ordered = name
        if effects.communicates:
            if last_comm is not None:
                add_edge(last_comm, name, "comm")
            last_comm = name
        for wait in serial.before(node):
            add_edge(wait, name, "comm")
    return g


class _SerialGroups:
    """The waits each launch of a one-at-a-time group follows: those of the group's
    collectives met since its previous launch (``autostream.comm.inflight``)."""

    def __init__(self, one_at_a_time: Callable[[str | None], bool]) -> None:
        self._one_at_a_time = one_at_a_time
        self._serial: dict[str | None, bool] = {}
        self._group_of: dict[str, str | None] = {}  # launch -> its one-at-a-time group
        self._waits: dict[str | None, list[str]] = {}  # group -> waits since its last launch

    def before(self, node: torch.fx.Node) -> list[str]:
        comm = comm_op(node)
        if comm is None:
            return []
        if comm.role == "wait":
            launch = launch_of_wait(node)
            if launch is not None and launch.name in self._group_of:
                self._waits.setdefault(self._group_of[launch.name], []).append(node.name)
            return []
        if not comm.orders:
            return []
        if comm.group not in self._serial:
            self._serial[comm.group] = self._one_at_a_time(comm.group)
        if not self._serial[comm.group]:
            return []
        self._group_of[node.name] = comm.group
        return self._waits.pop(comm.group, [])
