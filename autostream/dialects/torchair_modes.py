"""What TorchAir 2.14 does to the graph after the pass, and how a plan stays correct through it.

TorchAir hands the pass its ``CompilerConfig`` (the third argument); ``config.mode`` says
whether the graph goes to GE (``max-autotune``) or to an ACL graph (``reduce-overhead``,
``npugraph_ex``).  GE lowers the stream dialect differently from CUDA events
(``docs/torchair.md``, with file and line in the wheel):

- views (``permute/view/transpose/t/reshape``) on the main stream are deferred and emitted
  at their first consumer *without* a stream label and outside the op list records read;
  view ops go into their side-stream consumer's scope, and records follow what GE emits;
- a ``record`` is the last GE op emitted on its stream: after a view that emits nothing,
  or an op lowered to a ``Const`` alone, it follows an earlier op or no task;
- a ``wait``'s control edges attach to the first GE op of the next node converted on its
  stream (often a ``Const`` for a scalar argument), so waits go before an op whose first
  GE op is a task, and the final join wait must precede a real op on the main stream.

:func:`ge_place` places a plan for all of these; the planner checks every
multi-stream plan as placed (:data:`GE_PLACEMENT`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import networkx as nx
import torch

from autostream.dialects.input_mutations import emits_task, is_input_copy
from autostream.scheduling.placement import Placement
from autostream.scheduling.schedule import Schedule

GE_MODE = "max-autotune"
ACL_MODES = ("reduce-overhead", "npugraph_ex")
#: the views GE defers on the main stream (``_ge_concrete_graph/continguous_utils.py``)
GE_LAZY_VIEWS = frozenset({"aten.permute.default", "aten.view.default",
                           "aten.transpose.int", "aten.t.default", "aten.reshape.default"})


def acl_scope_overhead_us(sync_latency_us: float) -> float:
    """What one stream scope adds in an ACL graph: a tagged-event wait at entry, a record
    at exit and a wait before output (``_acl_concrete_graph/graph_pass.py:646-676``), i.e.
    one and a half record/wait pairs at the table's ``sync_latency_us`` (a pair's cost).

    >>> acl_scope_overhead_us(5.0)
    7.5
    """
    return 1.5 * sync_latency_us


def torchair_mode(config: Any) -> str | None:
    """``config.mode`` of TorchAir's ``CompilerConfig`` (a plain string too), else ``None``.

    >>> class Config: mode = "max-autotune"
    >>> torchair_mode(Config()), torchair_mode(None)
    ('max-autotune', None)
    """
    mode = getattr(config, "mode", None)
    mode = getattr(mode, "value", mode)
    return mode if isinstance(mode, str) else None


def _target(graph: nx.DiGraph, name: str) -> str:
    node = graph.nodes[name].get("fx")
    target = getattr(node, "target", None)
    return str(target) if target is not None else ""


def _forwards_lazy_view(graph: nx.DiGraph, name: str, stream_of: dict[str, int]) -> bool:
    """A main-stream view op (``expand``, ``slice`` ...) with a main-stream lazy view among
    its inputs: converting it materialises that view, and its own converter may emit no GE
    op at all (``expand`` to the same shape, a full ``slice``: ``ge_converter/aten/expand.py:22``,
    ``slice.py:30``), so a record after it would not follow the view's ops."""
    node = graph.nodes[name].get("fx")
    if node is None or _target(graph, name) in GE_LAZY_VIEWS:
        return False
    from autostream.fx.graph import is_view_op

    return is_view_op(node) and any(
        stream_of.get(p, 0) == 0 and _target(graph, p) in GE_LAZY_VIEWS
        for p in graph.predecessors(name))


def _is_input_copy(graph: nx.DiGraph, name: str) -> bool:
    return name in graph and is_input_copy(graph.nodes[name].get("fx"))


def _last_task(order: list[str] | tuple[str, ...], stream_of: dict[str, int],
               deps: nx.DiGraph) -> str | None:
    """The last launched op that emits a GE task, where the join's wait lands
    (:func:`autostream.dialects.input_mutations.emits_task`)."""
    def task(name: str) -> bool:
        node = deps.nodes[name].get("fx") if name in deps else None
        return node is None or emits_task(node)

    return next((n for n in reversed(order) if stream_of[n] >= 0 and task(n)), None)


def symbolic_size_lists(gm: Any) -> list[str]:
    """Ops taking a list that holds a symbolic size (``view(x, [s0, 4])``): GE packs such a
    list into a ``Pack`` op labelled for the main stream wherever the op runs, which a side
    stream's op then reads unordered; GE mode keeps these graphs on one stream.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: x.view(x.shape[0] * 2, -1), tracing_mode="symbolic")(
    ...     torch.ones(4, 6))
    >>> symbolic_size_lists(gm)
    ['view']
    """
    def symbolic(value: Any) -> bool:
        return isinstance(value, torch.fx.Node) and isinstance(
            value.meta.get("val"), (torch.SymInt, torch.SymFloat))

    return [n.name for n in gm.graph.nodes if n.op == "call_function" and any(
        isinstance(a, (list, tuple)) and any(symbolic(v) for v in a) for a in n.args)]


def _is_symbolic(graph: nx.DiGraph, name: str) -> bool:
    """A size op (``sym_size``, SymInt arithmetic): no stream task for the planner, but with
    symbolic shapes GE emits ops for it (``Shape``, ``Gather``) where it is converted, which
    its consumer on another stream would read unordered; it runs on its first consumer's
    stream."""
    node = graph.nodes[name].get("fx")
    val = node.meta.get("val") if node is not None else None
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _is_factory(graph: nx.DiGraph, name: str) -> bool:
    """An op with no tensor input (``scalar_tensor``, ``zeros``, ``full`` ...): GE may lower
    it to a ``Const`` alone, which is no task on a stream, so a record right after it
    follows nothing (the record is the last GE op emitted on its stream,
    ``_ge_concrete_graph/fx2ge_converter.py:2096-2102``)."""
    node = graph.nodes[name].get("fx")
    return node is not None and node.op == "call_function" and not node.all_input_nodes \
        and isinstance(getattr(node, "target", None), torch._ops.OpOverload) \
        and node.target.namespace == "aten" and not node.target._schema.is_mutable


def ge_anchor(name: str, schedule: Schedule, deps: nx.DiGraph) -> str:
    """The op a record for ``name`` must follow in GE: ``name`` itself, or for a main-stream
    lazy view (or a view op materialising one) the first consumer that GE converts into ops
    of its own, where the view's ops are emitted (``continguous_utils.py:170-188``; later
    consumers reuse them, ``continguous.py:168-169``).

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from autostream.fx.graph import build_op_graph
    >>> deps = build_op_graph(make_fx(lambda x: x.exp().t().mm(x).cos())(torch.ones(2, 2)))
    >>> s = Schedule("x", {"exp": 0, "t": 0, "mm": 0, "cos": 1}, tuple(deps), {}, {}, 0, 0)
    >>> ge_anchor("t", s, deps), ge_anchor("exp", s, deps)
    ('mm', 'exp')
    """
    return _anchor(name, schedule.stream_of,
                   {n: i for i, n in enumerate(schedule.order)}, deps)


def _anchor(name: str, stream_of: dict[str, int], position: dict[str, int],
            deps: nx.DiGraph) -> str:
    while stream_of.get(name, 0) == 0 and (_target(deps, name) in GE_LAZY_VIEWS
                                           or _forwards_lazy_view(deps, name, stream_of)):
        fx = deps.nodes[name]["fx"]
        users = sorted((u.name for u in fx.users if u.name in position),
                       key=position.__getitem__)
        if not users or stream_of[users[0]] != 0:
            break
        name = users[0]
    return name


def ge_view_sources(name: str, schedule: Schedule, deps: nx.DiGraph) -> list[str]:
    """The producers a record after view op ``name`` may not cover in GE: ``name`` may emit
    no GE op (``expand`` to the same shape), so its record is the last op emitted before
    it on its stream and carries no wait (``fx2ge_converter.py:2096-2102``); the producers
    of its input, through further view ops, on other streams are synced directly.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from autostream.fx.graph import build_op_graph
    >>> deps = build_op_graph(make_fx(lambda x: x.exp().expand(2, 2).cos())(torch.ones(2, 2)))
    >>> s = Schedule("x", {"exp": 1, "expand": 2, "cos": 0}, tuple(deps), {}, {}, 0, 0)
    >>> ge_view_sources("expand", s, deps), ge_view_sources("exp", s, deps)
    (['exp'], [])
    """
    from autostream.fx.graph import is_view_op

    out: list[str] = []
    todo, seen = [name], {name}
    while todo:
        node = deps.nodes[todo.pop()].get("fx")
        if node is None or not is_view_op(node):
            continue
        for producer in deps.predecessors(node.name):
            if producer in seen:
                continue
            seen.add(producer)
            todo.append(producer)
            if schedule.stream_of.get(producer, -1) >= 0 and \
                    schedule.stream_of[producer] != schedule.stream_of[name]:
                out.append(producer)
    return out


def ge_safe_schedule(schedule: Schedule, deps: nx.DiGraph) -> Schedule:
    """``schedule`` with each view op whose first consumer is on another side stream, and
    each op without tensor inputs (:func:`_is_factory`), size op (:func:`_is_symbolic`) or
    view of a graph input whose first consumer is on another stream, moved onto that
    stream right before it, the last launched task on the main
    stream, and input ``copy_`` ops (which GE removes) launched after it on the main
    stream.  GE defers a main-stream lazy view to its first consumer, unlabelled; an
    ``expand`` to the same shape or a full ``slice`` emits no GE op
    (``ge_converter/aten/expand.py:22``, ``slice.py:30``), so a record after it follows an
    earlier op; a view op in its consumer's scope needs no record.  A main-stream lazy
    view of a side stream's result runs on that side stream.

    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> s = Schedule("x", {"a": 0, "b": 1, "c": 0}, ("a", "c", "b"), {}, {}, 0.0, 0.0)
    >>> ge_safe_schedule(s, g).stream_of
    {'a': 0, 'b': 0, 'c': 0}
    """
    from autostream.fx.graph import is_view_op

    stream_of = dict(schedule.stream_of)
    order = list(schedule.order)
    # an input copy_ becomes an Assign that GE removes, binding its value to the input and
    # the graph's output: it is no task.  Launched last on the main stream, after the last
    # task (where the join's wait lands), it is ordered after every stream
    copies = [n for n in order if _is_input_copy(deps, n) and deps.out_degree(n) == 0]
    for name in copies:
        order.remove(name)
        order.append(name)
        stream_of[name] = 0
    for name in order:
        # a main-stream lazy view of a side stream's result: GE would emit it while its
        # consumer's arguments are prepared, before the op the consumer's wait lands on
        node = deps.nodes[name].get("fx") if name in deps else None
        if node is None or stream_of[name] != 0 or _target(deps, name) not in GE_LAZY_VIEWS:
            continue
        sides = [stream_of[p.name] for p in node.all_input_nodes
                 if stream_of.get(p.name, 0) > 0]
        if sides:
            stream_of[name] = sides[0]
    for name in reversed(list(schedule.order)):
        users = sorted(deps.successors(name), key=order.index)
        if not users or stream_of[name] < 0:
            continue
        stream = stream_of[users[0]]
        node = deps.nodes[name].get("fx")
        view = node is not None and is_view_op(node)
        if stream == 0 and view and stream_of[name] == 0:
            # first consumed on the main stream: a record after the op GE emits it at
            # (``ge_anchor``) serves its side users, unless that op comes after one of them
            position = {n: i for i, n in enumerate(order)}
            side = [u for u in users if stream_of[u] > 0]
            if not side or position[_anchor(name, stream_of, position, deps)] \
                    < position[side[0]]:
                continue
            stream = stream_of[side[0]]
        elif stream < 0 or stream == stream_of[name] \
                or not (_is_factory(deps, name) or _is_symbolic(deps, name)
                        or (view and stream > 0) or (view and deps.in_degree(name) == 0)):
            # a view of an input (a weight) has no producer: it follows its first consumer
            continue
        # in a side scope GE converts a view where it stands (labelled, a real op that a
        # record can follow); its other users, if any, then wait for it
        order.remove(name)
        order.insert(order.index(users[0]), name)
        stream_of[name] = stream
    last = _last_task(order, stream_of, deps)
    if last is not None:
        stream_of[last] = 0
        # what is launched after it (views, getitems) and does not depend on it goes before
        # it: the join's wait, right before it, must follow every side stream's record
        after = nx.descendants(deps, last)
        tail = order[order.index(last) + 1:]
        early = [n for n in tail if n not in after and n not in copies]
        if early:
            order = [n for n in order if n not in early]
            at = order.index(last)
            order[at:at] = early
        for name in order[order.index(last) + 1:]:  # views and getitems of it: no tasks
            stream_of[name] = 0
    return dataclasses.replace(schedule, stream_of=stream_of, order=tuple(order))


#: keyword arguments a GE converter turns into attributes or a cast, never into a ``Const``
_NO_CONST_KWARGS = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format",
                              "non_blocking"})


#: defaulted scalar arguments a converter emits no ``Const`` for when left at the default
#: (``ge_converter/aten/add.py:20-23``, ``sub.py:18-22``: ``alpha == 1`` is skipped)
_DEFAULTS_WITHOUT_CONST = {"aten.add.Tensor": frozenset({"alpha"}),
                           "aten.sub.Tensor": frozenset({"alpha"})}


def _task_first(graph: nx.DiGraph, name: str) -> bool:
    """Whether the first GE op emitted for ``name`` is a task that a wait can hold: an ATen
    op, not a view (which GE may defer or skip) nor a factory, whose every argument is a
    tensor.  A scalar or list argument (``0.25``, a ``dim``, ``addmm``'s ``alpha``) makes
    converters emit a ``Const`` first, and a wait's control edges go onto ``ops[0]``
    (``_ge_concrete_graph/fx2ge_converter.py:2118-2131``)."""
    from autostream.fx.graph import is_view_op

    node = graph.nodes[name].get("fx") if name in graph else None
    if node is None or node.op != "call_function" or _is_factory(graph, name) \
            or _is_input_copy(graph, name) \
            or not isinstance(node.target, torch._ops.OpOverload) \
            or node.target.namespace != "aten" or is_view_op(node):
        return False
    schema_args = node.target._schema.arguments
    tensor = torch._C.OptionalType(torch._C.TensorType.get())
    skipped = _DEFAULTS_WITHOUT_CONST.get(str(node.target), frozenset()) - set(node.kwargs)
    if any(not a.type.isSubtypeOf(tensor) and a.name not in _NO_CONST_KWARGS | skipped
           for a in schema_args[len(node.args):]):
        return False  # a defaulted scalar argument (alpha, beta ...)

    def tensors(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return all(v is None or isinstance(v, torch.fx.Node) for v in value)
        return isinstance(value, torch.fx.Node)

    return all(tensors(a) for a in node.args) and set(node.kwargs) <= _NO_CONST_KWARGS


#: ops whose GE converter emits a ``Const`` for a scalar argument first and then, before the
#: op that reads that ``Const``, ops reading these tensor arguments: a wait landing on the
#: node (its control edges go onto the ``Const``) leaves those reads unordered.  Read from
#: TorchAir 2.14's converters and checked against them (``tests/test_torchair_conformance``):
#: ``addmm`` promotes ``alpha`` and ``beta`` to ``Const`` s, then runs ``MatMulV2(mat1,
#: mat2)``, then ``Mul(mm, alpha)`` (``ge_converter/aten/addmm.py:57-80``); ``index_add``
#: promotes ``alpha``, then reads ``index``, ``self`` and ``source`` (``index_add.py:17-61``).
#: ``baddbmm`` and ``addmv`` emit their matmul first; ``add``/``sub`` with ``alpha``,
#: ``clamp``, ``lerp``, ``addcmul``, ``addcdiv``, ``mean``, ``mul`` by a scalar feed their
#: ``Const`` to the op reading their tensors (the wait orders it).
GE_CONST_BEFORE_READS = {"aten.addmm.default": ("mat1", "mat2"),
                         "aten.index_add.default": ("self", "index", "source")}


@dataclasses.dataclass(frozen=True)
class WaitLanding:
    """What a wait orders in GE when it lands on an FX node (``ge_wait_landing``)."""

    #: the node's inputs whose reads the wait does not order
    unordered_inputs: tuple[Any, ...] = ()
    #: the ``Const`` taking the wait feeds none of the node's ops: nothing later on the
    #: stream is ordered by it either
    lost: bool = False


def _bias_in_matmul(node: Any) -> bool:
    """``addmm`` whose converter folds ``self`` into ``MatMulV2`` as its bias (f16/bf16, a
    1-D ``self`` or a ``1 x n`` one matching ``mat2``: ``addmm.py:5-17``): with ``alpha`` and
    ``beta`` 1 the ``Const`` s it makes for them feed nothing."""
    bias, mat2 = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                  for a in (node.args[0], node.args[2]))
    if not isinstance(bias, torch.Tensor) or bias.dtype not in (torch.float16, torch.bfloat16):
        return False
    if bias.dim() == 1:
        return True
    return bias.dim() == 2 and isinstance(mat2, torch.Tensor) and mat2.dim() == 2 \
        and bias.shape[0] == 1 and bias.shape[1] == mat2.shape[1]


def ge_wait_landing(node: Any) -> WaitLanding:
    """What a wait right before ``node`` on its stream orders in GE: its control edges go
    onto the first GE op ``node`` 's converter emits (``fx2ge_converter.py:2118-2131``),
    which for the ops of :data:`GE_CONST_BEFORE_READS` is a ``Const`` that the ops reading
    some tensor arguments come before.  The ops emitted after the one that reads the
    ``Const``, and the later ops on the stream, are ordered.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda b, x, w: torch.addmm(b, x.exp(), w))(*[torch.ones(2, 2)] * 3)
    >>> [n.name for n in ge_wait_landing(list(gm.graph.nodes)[-2]).unordered_inputs]
    ['exp', 'w_1']
    """
    target = str(getattr(node, "target", ""))
    names = GE_CONST_BEFORE_READS.get(target)
    if names is None:
        return WaitLanding()
    schema = node.target._schema.arguments
    given = dict(zip((a.name for a in schema), node.args)) | dict(node.kwargs)
    if target == "aten.addmm.default":
        scalars = [given.get(k, 1) for k in ("alpha", "beta")]
        if _bias_in_matmul(node) and all(not isinstance(v, torch.fx.Node) and float(v) == 1.0
                                         for v in scalars):
            return WaitLanding(tuple(node.all_input_nodes), lost=True)
    inputs = [given[k] for k in names if isinstance(given.get(k), torch.fx.Node)]
    return WaitLanding(tuple(dict.fromkeys(inputs)))


def ge_wait_targets(syncs: Any, schedule: Schedule, deps: nx.DiGraph) -> list[Any]:
    """``syncs`` with each wait moved, on its consumer's stream, to the nearest op at or
    before the consumer whose first GE op is a task (:func:`_task_first`), so that the
    wait's control edges never land on a ``Const`` only some later op reads.  A wait
    moved earlier orders more, never less; without such an op after the record the wait
    stays.
    """
    from autostream.scheduling.schedule import JOIN, Sync

    position = {n: i for i, n in enumerate(schedule.order)}
    out: list[Any] = []
    for sync in syncs:
        target = sync.consumer
        if target != JOIN:
            stream = schedule.stream_of[target]
            for name in reversed(schedule.order[position[sync.producer] + 1:
                                                 position[target] + 1]):
                if schedule.stream_of[name] == stream and _task_first(deps, name):
                    target = name
                    break
        moved = Sync(sync.producer, target)
        if moved not in out:
            out.append(moved)
    return out


def ge_place(schedule: Schedule, deps: nx.DiGraph) -> tuple[Schedule, tuple[Any, ...]]:
    """``schedule`` (on several streams) as GE mode needs it, and its syncs: views and
    factories moved by :func:`ge_safe_schedule`, then each consumer whose wait finds no
    task to land on moved by :func:`_stuck_wait`, with GE's syncs (:func:`_ge_syncs`).
    ``deps``: the dependences, a plan's memory-ordering edges included.  The schedule's
    times are not recomputed (the planner replays it, ``planning.evaluate.evaluate``).

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from autostream.fx.graph import build_op_graph
    >>> deps = build_op_graph(make_fx(lambda x: x.exp().mul(2).cos())(torch.ones(2)))
    >>> s = Schedule("x", {"exp": 1, "mul": 0, "cos": 0}, tuple(deps), {}, {}, 0, 0)
    >>> placed, syncs = ge_place(s, deps)  # mul's first GE op is a Const: no wait lands on it
    >>> placed.stream_of, syncs
    ({'exp': 1, 'mul': 1, 'cos': 0}, (Sync(producer='mul', consumer='cos'),))
    """
    schedule = ge_safe_schedule(schedule, deps)
    moved: set[str] = set()
    for _ in range(len(schedule.order)):
        syncs = _ge_syncs(schedule, deps)
        stuck = _stuck_wait(syncs, schedule, deps, moved)
        if stuck is None:
            return schedule, syncs
        names, stream = stuck
        moved.update(names)
        stream_of = dict(schedule.stream_of)
        stream_of.update(dict.fromkeys(names, stream))
        schedule = ge_safe_schedule(dataclasses.replace(schedule, stream_of=stream_of), deps)
    return schedule, _ge_syncs(schedule, deps)


#: GE mode's placement, for the planner (``plan_graph(place=...)``)
GE_PLACEMENT = Placement(f"placed for TorchAir GE ({GE_MODE})", ge_place)


def _with_view_sources(name: str, schedule: Schedule, deps: nx.DiGraph) -> list[str]:
    """``name`` and, while it is a view op, the producer on its stream it views: a view
    moved without its source would be moved back (a main-stream lazy view of a side
    stream's result runs on that side stream, :func:`ge_safe_schedule`)."""
    from autostream.fx.graph import is_view_op

    out = [name]
    while is_view_op(deps.nodes[name]["fx"]):
        sources = [p for p in deps.predecessors(name)
                   if schedule.stream_of.get(p, -1) == schedule.stream_of[name]]
        if len(sources) != 1:
            break
        name = sources[0]
        out.append(name)
    return out


def _stuck_wait(syncs: Any, schedule: Schedule, deps: nx.DiGraph,
                moved: set[str] = frozenset()) -> tuple[list[str], int] | None:
    """Ops to move onto one stream so that a wait finding no op to land on
    (:func:`ge_wait_targets`) is no longer needed, with that stream: the consumer, when its
    producers all run on one other stream.  For the last launched op (which stays on the
    main stream), a consumer already moved whose wait misses what it reads
    (:func:`ge_wait_landing`), or one whose producers run on several streams, the producer
    of the wait instead (with the op a view producer views, :func:`_with_view_sources`),
    onto the consumer's stream: the wait then lands on an op that lowers to the consumer
    itself, or is moved in turn.  ``None`` when there is none; ops in ``moved`` are not
    moved again.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from autostream.fx.graph import build_op_graph
    >>> from autostream.scheduling.schedule import Sync
    >>> deps = build_op_graph(make_fx(lambda x: x.exp().mul(2).cos())(torch.ones(2)))
    >>> s = Schedule("x", {"exp": 1, "mul": 0, "cos": 0}, tuple(deps), {}, {}, 0, 0)
    >>> _stuck_wait([Sync("exp", "mul")], s, deps)
    (['mul'], 1)
    >>> _stuck_wait([Sync("exp", "mul")], s, deps, {"mul"})  # moved, its wait orders it
    """
    from autostream.fx.graph import is_view_op
    from autostream.scheduling.schedule import JOIN

    last = _last_task(schedule.order, schedule.stream_of, deps)

    def pull(sync: Any) -> tuple[list[str], int] | None:
        if sync.producer == JOIN:
            return None
        names = _with_view_sources(sync.producer, schedule, deps)
        if moved.intersection(names):
            return None
        return names, schedule.stream_of[sync.consumer]

    for sync in syncs:
        name = sync.consumer
        if name == JOIN or _task_first(deps, name) \
                or _is_factory(deps, name) or is_view_op(deps.nodes[name]["fx"]):
            continue
        if name in moved and not ge_wait_landing(deps.nodes[name]["fx"]).unordered_inputs:
            continue  # moved already, and its wait orders what it reads
        if name == last or name in moved:
            found = pull(sync)
            if found is not None:
                return found
            continue
        # a view of a weight (no producer of its own) follows its consumer's stream
        streams = {schedule.stream_of[p] for p in deps.predecessors(name)
                   if schedule.stream_of[p] >= 0 and not (
                       deps.in_degree(p) == 0 and is_view_op(deps.nodes[p]["fx"]))}
        if len(streams) == 1 and schedule.stream_of[name] not in streams:
            return [name], streams.pop()
        # producers on several streams: this producer joins the consumer's stream instead
        found = pull(sync)
        if found is not None:
            return found
    return None


def _ge_syncs(schedule: Schedule, deps: nx.DiGraph) -> tuple[Any, ...]:
    """The syncs of ``schedule`` for GE: anchored records (:func:`ge_anchor`), the producers
    behind view ops (:func:`ge_view_sources`) and waits on tasks (:func:`ge_wait_targets`)."""
    from autostream.scheduling.schedule import JOIN, Sync
    from autostream.scheduling.sync import compute_syncs

    position = {n: i for i, n in enumerate(schedule.order)}
    position[JOIN] = len(position)
    syncs = []
    for sync in compute_syncs(deps, schedule):
        for producer in [sync.producer, *ge_view_sources(sync.producer, schedule, deps)]:
            if schedule.stream_of[producer] == schedule.stream_of.get(sync.consumer, 0):
                continue
            anchor = ge_anchor(producer, schedule, deps)
            if position[anchor] > position[sync.consumer]:
                anchor = producer
            moved = Sync(anchor, sync.consumer)
            if moved not in syncs:
                syncs.append(moved)
    return tuple(ge_wait_targets(syncs, schedule, deps))


def acl_reinplace_hazards(gm: Any, op_graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Order edges for what the ACL graph's reinplace passes may write after the pass.

    ``_reinplace_inplaceable_ops_pass`` turns an out-of-place op with an in-place variant
    (``mul`` -> ``mul_``) into a write of its first input's storage, and
    ``_reinplace_input_mutated_ops`` lets the op feeding ``copy_(input, value)`` write the
    input directly.  Their stream check misses readers through views and ``copy_``
    (``_acl_concrete_graph/utils.py:351-383``), so every earlier reader of that storage
    (through any view) is ordered before the op that may write it.  TorchAir decides on
    the order it is given (``graph_pass.py:239-267``: a use after the op forbids it), and
    the launch order is not the program's: every later reader is ordered after the op,
    so the decision is the same in any launch order.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from autostream.fx.graph import build_op_graph
    >>> def f(x):
    ...     y = x.exp(); v = y.view(-1); return v.sum(), y.mul(2)
    >>> gm = make_fx(f)(torch.ones(2, 2))
    >>> acl_reinplace_hazards(gm, build_op_graph(gm))
    [('sum_1', 'mul')]
    """
    import operator

    import torch

    from autostream.fx.graph import is_meta_only, is_view_op

    roots: dict[Any, Any] = {}
    readers: dict[Any, list[Any]] = {}
    edges: list[tuple[str, str]] = []
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    position = {n: i for i, n in enumerate(nodes)}

    def root(node: Any) -> Any:
        return roots.get(node, node)

    ops = []
    for node in nodes:
        inputs = node.all_input_nodes
        if inputs and (is_view_op(node) or (node.target is operator.getitem
                                           and inputs[0] in roots)):
            roots[node] = root(inputs[0])
        elif not is_meta_only(node):
            ops.append(node)
            for src in inputs:
                readers.setdefault(root(src), []).append(node)

    def pin(reader: Any, writer: Any) -> None:
        # the launch order may differ from the program's: a reader keeps its side of the
        # writer, so TorchAir sees the same later uses (and reinplaces the same ops) in it
        if reader is writer or reader.name not in op_graph or writer.name not in op_graph:
            return
        before = position[reader] < position[writer]
        edges.append((reader.name, writer.name) if before else (writer.name, reader.name))

    for node in ops:
        first = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        packet = getattr(node.target, "overloadpacket", None)
        if first is None or packet is None:
            continue
        base = root(first)
        if packet.__name__ == "copy_" and base.op == "placeholder" and len(node.args) > 1 \
                and isinstance(node.args[1], torch.fx.Node) and node.args[1] in position:
            for reader in readers.get(base, []):
                if reader is not node:
                    pin(reader, node.args[1])
        elif base.op not in ("placeholder", "get_attr") \
                and hasattr(torch.ops.aten, packet.__name__ + "_"):
            for reader in readers.get(base, []):
                pin(reader, node)
    return sorted(set(edges), key=edges.index)
