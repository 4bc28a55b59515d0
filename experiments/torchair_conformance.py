"""Is a rewritten graph still correct after TorchAir's own lowering?  Run it and check.

TorchAir 2.14's real Python lowering (``experiments.torchair_real``) turns the graph the
pass rewrote into the program each mode runs; this module models only how that program
executes and checks every dependence of it:

- **ACL graph** (``reduce-overhead``): the final FX graph, which TorchAir's codegen prints
  line for line.  ``scope_enter``/``scope_exit`` select the stream; ``air.record`` /
  ``air.wait`` are ``torch.npu.Event`` record/wait (CUDA semantics: a record covers all
  earlier work on its stream, waits included); ``tagged_event_record`` /
  ``tagged_event_wait`` the same by tag.
- **GE** (``max-autotune``): happens-before is the emission order of the GE ops that are
  stream tasks with the same ``_user_stream_label`` plus control edges; a ``Const`` is no
  task: it passes its control inputs on to the ops it feeds, nothing else; a cross-stream
  data edge orders nothing (no Python code in TorchAir orders one).

Checked: every data edge, and read/write order on the same storage (views and in-place
ops followed through their schemas) in program order; each side stream joined before
output; for GE also ops emitted for a side-stream FX node without its label, and
output-ref writes (an output written into an input's memory) after every reader of that
input, and waits whose ``Const`` feeds no compute op of its FX node.

Run ``python -m experiments.torchair_conformance`` for the table in RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

MAIN = "main"
ACL_EVENT_OPS = ("record", "wait", "tagged_event_record", "tagged_event_wait")


@dataclass
class Findings:
    """What one lowered program got wrong; every list holds one line per problem."""

    mode: str
    uncovered: list[str] = field(default_factory=list)
    unlabelled_views: list[str] = field(default_factory=list)
    dropped_joins: list[str] = field(default_factory=list)
    uncovered_output_refs: list[str] = field(default_factory=list)
    #: GE: a wait's control edges on a ``Const`` (made for a scalar argument) rather than on
    #: a compute op; the ``Const`` is no stream task, it orders only its data consumers
    waits_on_const: list[str] = field(default_factory=list)
    #: the core limits the program applies: GE ops carrying ``limit_core_num``'s attributes,
    #: ACL ``torch.npu.set_stream_limit`` calls
    core_limits: list[str] = field(default_factory=list)
    #: GE: of those, the waits whose ``Const`` feeds no compute op of the FX node it was
    #: made for: they do not reach the consumer's compute op
    waits_off_compute: list[str] = field(default_factory=list)
    scopes: int = 0
    syncs: int = 0
    #: how much was checked: (reader, writer) pairs on input memory an output ref or a
    #: reinplaced op writes, side streams checked for their join, view ops followed
    checked_output_refs: int = 0
    checked_joins: int = 0
    checked_views: int = 0

    @property
    def ok(self) -> bool:
        return not (self.uncovered or self.unlabelled_views or self.dropped_joins
                    or self.uncovered_output_refs or self.waits_off_compute)

    def checked(self) -> dict[str, int]:
        return {"refs_checked": self.checked_output_refs, "joins_checked": self.checked_joins,
                "views_checked": self.checked_views}

    def counts(self) -> dict[str, int]:
        return {"uncovered": len(self.uncovered), "unlabelled": len(self.unlabelled_views),
                "dropped_joins": len(self.dropped_joins),
                "output_refs": len(self.uncovered_output_refs),
                "waits_on_const": len(self.waits_on_const),
                "waits_off_compute": len(self.waits_off_compute)}


def _air(node: torch.fx.Node) -> str | None:
    target = node.target
    if node.op == "call_function" and getattr(target, "namespace", None) == "air":
        return target._overloadpacket.__name__
    return None


def _label(node: torch.fx.Node, enclosing: str = MAIN) -> str:
    """The stream a ``scope_enter`` selects: its label, else the enclosing scope's (a scope
    of other keys, such as ``limit_core_num``'s, nested in a stream scope)."""
    keys, values = node.args[0], node.args[1]
    return dict(zip(keys, values)).get("_user_stream_label", enclosing)


CORE_KEYS = ("_op_aicore_num", "_op_vectorcore_num")


# ---- storage: which FX values share memory -------------------------------------------------

def _storages(graph: torch.fx.Graph) -> dict[Any, Any]:
    """value -> storage key; views and in-place results share their base's key."""
    key: dict[Any, Any] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            key[node] = node
        elif node.op == "call_function" and node.target is operator.getitem:
            parent, index = node.args[0], node.args[1]
            # an output of a multi-output op is a storage of its own, unless the op returns
            # views of a base (``split``: its key is the base's)
            own = key.get(parent, parent) is parent and isinstance(parent.target,
                                                                     torch._ops.OpOverload)
            key[node] = key.get((parent, index),
                                (parent, index) if own else key.get(parent, (parent, index)))
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            key[node] = node
            schema = node.target._schema
            out_alias = [r.alias_info for r in schema.returns]
            for i, ret in enumerate(out_alias):
                if ret is None:
                    continue
                for arg, value in zip(schema.arguments, node.args):
                    info = arg.alias_info
                    if info is not None and isinstance(value, torch.fx.Node) \
                            and set(info.before_set) & set(ret.before_set):
                        base = key.get(value, value)
                        if len(out_alias) == 1:
                            key[node] = base
                        key[(node, i)] = base
    return key


def _is_view(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    return bool(schema.returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns) \
        and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _accesses(node: torch.fx.Node, storage: dict[Any, Any]) -> tuple[set, set]:
    """(read, written) storages of one op; a view reads and writes nothing."""
    reads, writes = set(), set()
    if node.op == "output":
        for value in node.all_input_nodes:
            reads.add(storage.get(value, value))
        return reads, writes
    if not isinstance(node.target, torch._ops.OpOverload):
        return reads, writes
    schema = node.target._schema
    returns_alias = any(r.alias_info is not None and not r.alias_info.is_write
                        for r in schema.returns)
    if returns_alias and not any(a.alias_info is not None and a.alias_info.is_write
                                 for a in schema.arguments):
        return reads, writes  # a view
    written_args = set()
    for arg, value in zip(schema.arguments, node.args):
        if arg.alias_info is not None and arg.alias_info.is_write:
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(v, torch.fx.Node):
                    written_args.add(v)
    for arg_name, value in node.kwargs.items():
        match = [a for a in schema.arguments if a.name == arg_name]
        if match and match[0].alias_info is not None and match[0].alias_info.is_write \
                and isinstance(value, torch.fx.Node):
            written_args.add(value)
    for value in node.all_input_nodes:
        s = storage.get(value, value)
        (writes if value in written_args else reads).add(s)
    if not returns_alias:
        writes.add(storage.get(node, node))
    return reads, writes


# ---- ACL graph ------------------------------------------------------------------------

def acl_findings(gm: torch.fx.GraphModule) -> Findings:
    """Replay TorchAir's final ACL-graph FX program and check its dependences."""
    found = Findings("reduce-overhead")
    graph = gm.graph
    storage = _storages(graph)
    stack = [MAIN]
    clock: dict[str, dict[str, int]] = {MAIN: {}}
    count: dict[str, int] = {}
    events: dict[Any, dict[str, int]] = {}
    where: dict[torch.fx.Node, tuple[str, int, dict[str, int]]] = {}
    order: list[torch.fx.Node] = []

    def merge(into: dict[str, int], other: dict[str, int]) -> None:
        for s, p in other.items():
            into[s] = max(into.get(s, -1), p)

    for node in graph.nodes:
        kind = _air(node)
        stream = stack[-1]
        current = clock.setdefault(stream, {})
        if kind == "scope_enter":
            found.scopes += 1
            stack.append(_label(node, stream))
            continue
        if node.op == "call_function" and "set_stream_limit" in str(node.target):
            found.core_limits.append(f"{stream}: set_stream_limit{tuple(map(str, node.args[1:]))}")
            continue
        if kind == "scope_exit":
            stack.pop() if len(stack) > 1 else None
            continue
        if kind in ("record", "tagged_event_record"):
            events[node if kind == "record" else ("tag", node.args[0])] = dict(current)
            found.syncs += kind == "record"
            continue
        if kind in ("wait", "tagged_event_wait"):
            sources = node.args[0] if kind == "wait" else [("tag", node.args[0])]
            for token in sources:
                merge(current, events.get(token, {}))
            continue
        if kind is not None or node.op in ("placeholder", "get_attr"):
            continue
        if node.op == "call_function" and node.target is operator.getitem:
            continue
        position = count.get(stream, 0)
        count[stream] = position + 1
        current[stream] = position
        where[node] = (stream, position, dict(current))
        order.append(node)

    def before(a: torch.fx.Node, b: torch.fx.Node) -> bool:
        sa, pa, _ = where[a]
        return where[b][2].get(sa, -1) >= pa

    inputs = {n for n in graph.nodes if n.op == "placeholder"}
    last_access: dict[Any, list[tuple[torch.fx.Node, bool]]] = {}
    for node in order:
        reads, writes = _accesses(node, storage)
        found.checked_views += node.op == "call_function" and not reads and not writes \
            and isinstance(node.target, torch._ops.OpOverload)
        for s in reads | writes:
            for earlier, wrote in last_access.get(s, []):
                found.checked_output_refs += s in inputs and (wrote or s in writes)
                if (wrote or s in writes) and not before(earlier, node):
                    what = "write" if s in writes else "read"
                    found.uncovered.append(
                        f"{earlier.name} ({where[earlier][0]}, {'write' if wrote else 'read'}) "
                        f"-> {node.name} ({where[node][0]}, {what}) on {getattr(s, 'name', s)}")
        for s in reads:
            last_access.setdefault(s, []).append((node, False))
        for s in writes:
            last_access[s] = [(node, True)]
    output = next(n for n in graph.nodes if n.op == "output")
    out_clock = where[output][2] if output in where else {}
    for stream, n in count.items():
        found.checked_joins += stream != MAIN
        if stream != MAIN and out_clock.get(stream, -1) < n - 1:
            found.dropped_joins.append(f"{stream} is not joined before output")
    return found


# ---- GE -------------------------------------------------------------------------------

def _ge_label(op: Any) -> str:
    return op.attr["_user_stream_label"].s.decode() if "_user_stream_label" in op.attr else MAIN


def _ge_inputs(op: Any) -> tuple[list[str], list[str]]:
    """(data producers, control producers) of a GE op."""
    data, control = [], []
    for name in op.input:
        if not name:
            continue
        producer, _, index = name.rpartition(":")
        (control if index == "-1" else data).append(producer)
    return data, control


def _fx_streams(fx: torch.fx.GraphModule) -> dict[str, str]:
    """FX node name -> the stream label of its scope."""
    stack, out = [MAIN], {}
    for node in fx.graph.nodes:
        kind = _air(node)
        if kind == "scope_enter":
            stack.append(_label(node, stack[-1]))
        elif kind == "scope_exit":
            stack.pop() if len(stack) > 1 else None
        else:
            out[node.name] = stack[-1]
    return out


#: GE ops whose output may share their first input's memory: readers through them read it
GE_ALIASING = ("Reshape", "Squeeze", "Unsqueeze", "ExpandDims", "Flatten", "Identity")

#: GE ops that are no task on a stream: they order nothing by their place in it
NON_TASK = ("Data", "RefData", "Const")


def ge_findings(ops: list, origin: dict[str, str], fx: torch.fx.GraphModule,
                output_ref: dict[int, int]) -> Findings:
    """Check TorchAir's final GE graph: stream order of its tasks plus control edges must
    cover it.  A ``Const`` is no task: it is ordered after its control inputs and passes
    that order on to the ops it feeds, nothing else."""
    found = Findings("max-autotune")
    fx_stream = _fx_streams(fx)
    found.scopes = sum(_air(n) == "scope_enter" for n in fx.graph.nodes)
    found.syncs = sum(_air(n) == "record" for n in fx.graph.nodes)
    index = {op.name: i for i, op in enumerate(ops)}
    ancestors: list[int] = []
    last_on: dict[str, int] = {}
    feeds: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        label = _ge_label(op)
        mask = 0
        data, control = _ge_inputs(op)
        preds = [index[p] for p in control if p in index]
        preds += [index[p] for p in data if p in index and ops[index[p]].type == "Const"]
        for p in data:
            if p in index:
                feeds.setdefault(index[p], []).append(i)
        if label in last_on and op.type not in NON_TASK:
            preds.append(last_on[label])
        for p in preds:
            mask |= ancestors[p] | (1 << p)
        ancestors.append(mask)
        if op.type not in NON_TASK:
            last_on[label] = i
        if all(k in op.attr for k in CORE_KEYS):
            found.core_limits.append(f"{label}: {op.name} ({op.type}) " + ", ".join(
                f"{k}={op.attr[k].s.decode()}" for k in CORE_KEYS))
    for i, op in enumerate(ops):
        control = _ge_inputs(op)[1]
        if op.type not in NON_TASK or not control:
            continue
        line = f"{op.name} ({_ge_label(op)}) for {origin.get(op.name, '?')} carries {control}"
        found.waits_on_const.append(line)
        if not any(ops[u].type not in NON_TASK and origin.get(ops[u].name) == origin.get(op.name)
                   for u in feeds.get(i, [])):
            found.waits_off_compute.append(line)

    def before(a: int, b: int) -> bool:
        return bool(ancestors[b] >> a & 1)

    free = NON_TASK
    fx_views = {n.name for n in fx.graph.nodes if _is_view(n)}
    for i, op in enumerate(ops):
        for producer in _ge_inputs(op)[0]:
            p = index.get(producer)
            if p is None or ops[p].type in free or before(p, i):
                continue
            line = (f"{producer} ({_ge_label(ops[p])}) -> {op.name} ({_ge_label(op)}) "
                    f"[fx {origin.get(producer, '?')} -> {origin.get(op.name, '?')}]")
            if op.type == "NetOutput":
                found.dropped_joins.append(line)
            else:
                found.uncovered.append(line)
        fx_node = origin.get(op.name)
        found.checked_views += fx_node in fx_views and op.type not in free
        if fx_node is not None and op.type not in free and \
                fx_stream.get(fx_node, MAIN) != _ge_label(op):
            found.unlabelled_views.append(
                f"{op.name} ({op.type}) emitted for {fx_node} on {fx_stream[fx_node]} "
                f"but labelled {_ge_label(op)}")
    output = next((i for i, op in enumerate(ops) if op.type == "NetOutput"), None)
    if output is not None:
        for label, last in last_on.items():
            found.checked_joins += label != MAIN
            if label != MAIN and not before(last, output):
                found.dropped_joins.append(f"{label} (last op {ops[last].name}) is not "
                                           f"joined before NetOutput")
        data_ops = {op.attr["index"].i: i for i, op in enumerate(ops) if op.type == "Data"}
        out_inputs = _ge_inputs(ops[output])[0]
        for out_i, in_i in output_ref.items():
            if out_i >= len(out_inputs) or in_i not in data_ops:
                continue
            writer = index.get(out_inputs[out_i])
            if writer is None:
                continue
            sources = {ops[data_ops[in_i]].name}  # the input, and GE views sharing its memory
            for op in ops:
                if op.type in GE_ALIASING and _ge_inputs(op)[0][:1] and \
                        _ge_inputs(op)[0][0] in sources:
                    sources.add(op.name)
            for r, op in enumerate(ops):
                if r == writer or not sources & set(_ge_inputs(op)[0]) \
                        or op.type == "NetOutput":
                    continue
                found.checked_output_refs += 1
                if not before(r, writer):
                    found.uncovered_output_refs.append(
                        f"{op.name} ({_ge_label(op)}) reads input {in_i} that "
                        f"{ops[writer].name} ({_ge_label(ops[writer])}) overwrites")
    return found


def findings(lowered: Any) -> Findings:
    """The :class:`Findings` of a ``torchair_real.Lowered`` program in its mode."""
    if lowered.mode == "max-autotune":
        return ge_findings(lowered.ge_ops, lowered.ge_origin, lowered.fx, lowered.output_ref)
    return acl_findings(lowered.acl_gm)


# ---- the table ------------------------------------------------------------------------

#: ``npugraph_ex``: torch-npu's backend of that name, the pass given in ``options=``
MODES = ("reduce-overhead", "max-autotune", "npugraph_ex")
DYNAMIC_MODES = ("reduce-overhead", "max-autotune")
TABLES = ("ascend910b", "h200")
STREAMS = (2, 4)


@dataclass(frozen=True)
class DropOneSync:
    """A pass that runs ``inner`` and then deletes its first ``air.wait``: the negative control."""

    inner: Any

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any = None,
                 config: Any = None) -> None:
        self.inner(gm, example_inputs, config)
        wait = next((n for n in gm.graph.nodes if _air(n) == "wait"), None)
        if wait is not None:
            gm.graph.erase_node(wait)
            gm.recompile()


@dataclass(frozen=True)
class WithoutMode:
    """A pass that runs ``inner`` without TorchAir's config: the plan made for CUDA events."""

    inner: Any

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any = None,
                 config: Any = None) -> None:
        self.inner(gm, example_inputs, None)


@dataclass(frozen=True)
class _Mode:
    """What the pass reads of TorchAir's ``CompilerConfig``."""

    mode: str | None


@dataclass(frozen=True)
class WithoutRefEdges:
    """A pass that runs ``inner`` without the order edges for GE's output refs, and without
    ``verify_rewrite``'s check of them: the negative control of the output-ref check."""

    inner: Any

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any = None,
                 config: Any = None) -> None:
        from unittest import mock

        with mock.patch("autostream.passes.ge_output_ref_edges", lambda gm, graph: []), \
                mock.patch("autostream.dialects.verify.output_ref_problems",
                           lambda *args: (0, [])):
            self.inner(gm, example_inputs, config)


@dataclass(frozen=True)
class Case:
    """A model of the table: ``factory() -> (model, inputs)``; ``train``: a training step
    (forward and backward graphs), else inference under ``torch.no_grad()``; ``calls``:
    compiled with ``dynamic=True`` and run on ``calls()``, the inputs at several lengths."""

    factory: Any
    train: bool = False
    calls: Any = None


def _at_lengths(factory: Any, lengths: tuple[int, ...]) -> Any:
    """``calls`` for a zoo factory taking ``tokens``: its inputs at each length."""
    return lambda: [factory(tokens=n)[1] for n in lengths]


def _at_batches(factory: Any, batches: tuple[int, ...]) -> Any:
    """``calls`` for a zoo factory taking ``batch``: its inputs at each batch size."""
    return lambda: [factory(batch=n)[1] for n in batches]


def _ids_at_lengths(lengths: tuple[int, ...]) -> Any:
    """``calls`` for a transformers decoder without cache: prompts of each length."""
    def calls() -> list[tuple]:
        generator = torch.Generator().manual_seed(0)
        return [(torch.randint(3, 64, (1, n), generator=generator),) for n in lengths]
    return calls


def dynamic_models(names: Iterable[str] | None = None) -> dict[str, Case]:
    """The ``dynamic=True`` cases: GoogLeNet's classifier head at 3 batch sizes,
    static-KV-cache decode, a KV cache written by slice assignment, a token-dispatch MoE and
    a transformers MoE decoder, each run at 3 lengths (2+ tokens: Dynamo specialises sizes 0
    and 1)."""
    import functools

    from autostream.models import hf_zoo, zoo, zoo_state

    wanted = None if names is None else set(names)
    out = {"inception_head_batches": Case(zoo.inception_head, calls=_at_batches(
               zoo.inception_head, (2, 3, 5))),
           "static_cache_decode": Case(zoo_state.static_cache_decode_model, calls=_at_lengths(
               zoo_state.static_cache_decode_model, (2, 3, 5))),
           "slice_kv_cache": Case(zoo_state.slice_kv_cache_model, calls=_at_lengths(
               zoo_state.slice_kv_cache_model, (16, 24, 40))),
           "token_dispatch_moe": Case(zoo_state.token_dispatch_moe_model, calls=_at_lengths(
               zoo_state.token_dispatch_moe_model, (16, 24, 40)))}
    if (wanted is None or "qwen3_moe_prompt" in wanted) and hf_zoo.available(["qwen3_moe"]):
        out["qwen3_moe_prompt"] = Case(functools.partial(hf_zoo.qwen3_moe, cache="none"),
                                       calls=_ids_at_lengths((8, 12, 20)))
    return {n: c for n, c in out.items() if wanted is None or n in wanted}


#: transformers cases: name -> (architecture, cache mode, training step)
HF_CASES = {"llama": ("llama", "none", False), "granite_moe": ("granite_moe", "none", False),
            "qwen3_moe": ("qwen3_moe", "none", False), "gpt_oss": ("gpt_oss", "none", False),
            "llama_decode": ("llama", "decode", False),
            "qwen3_moe_decode": ("qwen3_moe", "decode", False),
            "gpt_oss_decode": ("gpt_oss", "decode", False),
            "llama_train": ("llama", "none", True)}


def models(names: Iterable[str] | None = None) -> dict[str, Case]:
    """name -> :class:`Case`: zoo models, models writing their own state, training steps
    and transformers decoders (static-KV-cache decode steps among them); only ``names``
    when given (only the transformers architectures asked for are looked up: each one
    imports its module)."""
    import functools

    from autostream.models import hf_zoo, zoo, zoo_state

    wanted = None if names is None else set(names)
    out = {"inception": Case(zoo.inception_block), "inception_head": Case(zoo.inception_head),
           "moe": Case(zoo.moe_model),
           "multihead": Case(zoo.multihead_block), "parallel": Case(zoo.parallel_block),
           "running_stats": Case(zoo.running_stats_model),
           "batchnorm_train": Case(zoo_state.batchnorm_train_model),
           "buffer_update": Case(zoo_state.buffer_update_model),
           "mlp_train": Case(zoo_state.mlp_model, train=True)}
    hf = [n for n in HF_CASES if wanted is None or n in wanted]
    have = set(hf_zoo.available({HF_CASES[n][0] for n in hf})) if hf else set()
    for name in hf:
        arch, cache, train = HF_CASES[name]
        if arch in have:
            out[name] = Case(functools.partial(getattr(hf_zoo, arch), cache=cache), train)
    return {n: c for n, c in out.items() if wanted is None or n in wanted}


def case_model(name: str) -> Case:
    """The model ``--case`` runs: one of the table's, or the core budget demo."""
    from experiments.core_budget_demo import demo_model

    found = {"core_budget_demo": Case(demo_model)} if name == "core_budget_demo" \
        else {**models([name]), **dynamic_models([name])}
    if name not in found:
        raise SystemExit(f"unknown or unavailable model {name!r}: one of "
                         f"{', '.join([*models(), 'core_budget_demo'])}")
    return found[name]


def entry_of(mode: str) -> str:
    """The front door a mode is compiled through: ``npugraph_ex``'s own backend (the pass
    in ``options=``) for ``npugraph_ex``, TorchAir's ``get_npu_backend`` otherwise."""
    return "npugraph_ex" if mode == "npugraph_ex" else "get_npu_backend"


@dataclass
class CaseResult:
    """One case through TorchAir's front door: per compiled graph its phase, findings and
    the pass's report; and the run's results against the same model compiled without the
    pass (bit for bit)."""

    graphs: list[tuple[str, Findings, Any]]
    results_compared: int
    results_differing: list[str]
    run: Any = None


def run_case(case: Case, streams: int, table: str, mode: str, drop_sync: bool = False,
             without_mode: bool = False, core_budgets: bool = False,
             drop_ref_edges: bool = False, baseline: Any = None) -> CaseResult:
    """Compile the model through TorchAir's front door with the pass, run it once; the
    findings of every graph TorchAir compiled and the results against ``baseline`` (the
    same compiled without the pass; compiled here when not given)."""
    from autostream.passes import AutoStreamPass
    from experiments import torchair_frontdoor as front_door

    model, inputs = case.factory()
    calls = case.calls() if case.calls is not None else inputs
    dynamic = True if case.calls is not None else None
    autostream_pass = AutoStreamPass(max_streams=streams, cost_table=table,
                                     core_budgets=core_budgets)
    custom = WithoutMode(autostream_pass) if without_mode else autostream_pass
    custom = WithoutRefEdges(custom) if drop_ref_edges else custom
    custom = DropOneSync(custom) if drop_sync else custom
    run = front_door.compile_and_run(model, calls, mode, custom, entry_of(mode), case.train,
                                     dynamic)
    if baseline is None:
        baseline = front_door.compile_and_run(model, calls, mode, None, entry_of(mode),
                                              case.train, dynamic)
    compared, differing = front_door.same_results(baseline, run)
    return CaseResult([(g.phase, findings(g.lowered), g.report) for g in run.graphs],
                      compared, differing, run)


def _offline_speedup(run: Any, streams: int, table: str, mode: str | None,
                     without_ref_edges: bool = False) -> float:
    """The predicted speed-up of the plan for ``mode`` (``None``: CUDA events), on the
    graphs TorchAir handed the pass; ``without_ref_edges``: planned without the order
    edges of GE's output refs (the plan before they were modelled)."""
    import copy

    from autostream.passes import AutoStreamPass

    speedups = []
    for graph in run.graphs:
        autostream_pass = AutoStreamPass(max_streams=streams, cost_table=table)
        planner = WithoutRefEdges(autostream_pass) if without_ref_edges else autostream_pass
        planner(copy.deepcopy(graph.before_pass), None, _Mode(mode))
        report = autostream_pass.last_report
        speedups.append(report.plan.predicted_speedup if report.applied else 1.0)
    return round(min(speedups), 2)


def _speedup(reports: list[Any]) -> float:
    speedups = [r.plan.predicted_speedup if r.applied else 1.0 for r in reports]
    return round(min(speedups), 2) if speedups else 1.0


def case_rows(name: str, case: Case) -> list[dict[str, Any]]:
    """The rows of one model: every stream count, table and mode (``npugraph_ex`` at the
    largest stream count)."""
    from experiments import torchair_frontdoor as front_door

    out = []
    model, inputs = case.factory()
    calls = case.calls() if case.calls is not None else inputs
    dynamic = True if case.calls is not None else None
    modes = MODES if case.calls is None else DYNAMIC_MODES
    baselines = {mode: front_door.compile_and_run(model, calls, mode, None, entry_of(mode),
                                                  case.train, dynamic) for mode in modes}
    static = Case(case.factory, case.train)
    for streams in STREAMS:
        for table in TABLES:
            cuda = None
            for mode in modes:
                if mode == "npugraph_ex" and streams != max(STREAMS):
                    continue
                result = run_case(case, streams, table, mode, baseline=baselines[mode])
                if cuda is None:
                    cuda = _offline_speedup(result.run, streams, table, None)
                before = _offline_speedup(result.run, streams, table, mode, True) \
                    if mode == "max-autotune" else _speedup(
                        [r for _, _, r in result.graphs if r is not None])
                founds = [f for _, f, _ in result.graphs]
                reports = [r for _, _, r in result.graphs if r is not None]
                counts = {k: sum(f.counts()[k] for f in founds) for k in founds[0].counts()}
                checked = {k: sum(f.checked()[k] for f in founds) for k in founds[0].checked()}
                out.append({
                    "model": name, "streams": streams, "table": table, "mode": mode,
                    "graphs": "+".join(p[0] for p, _, _ in result.graphs),
                    "applied": sum(r.applied for r in reports),
                    "scopes": sum(f.scopes for f in founds),
                    "syncs": sum(f.syncs for f in founds), **counts, **checked,
                    "results": f"{result.results_compared - len(result.results_differing)}"
                               f"/{result.results_compared}",
                    "results_differing": len(result.results_differing),
                    "rejected": sum(r.outcome.name == "REWRITE_REJECTED" for r in reports),
                    "speedup": _speedup(reports), "before_refs": before,
                    "cuda_speedup": cuda})
                if case.calls is not None:  # its static twin: one length, static shapes
                    twin = run_case(static, streams, table, mode)
                    out[-1]["static_speedup"] = _speedup(
                        [r for _, _, r in twin.graphs if r is not None])
    return out


def rows(names: list[str] | None = None, dynamic: bool = False) -> list[dict[str, Any]]:
    """One row per model, stream count, table and mode (``dynamic``: the ``dynamic=True``
    cases)."""
    cases = dynamic_models(names or None) if dynamic else models(names or None)
    return [row for name, case in cases.items() for row in case_rows(name, case)]


HEAD = ["model", "streams", "table", "mode", "graphs", "applied", "scopes", "syncs",
        "uncovered", "unlabelled", "dropped_joins", "output_refs", "waits_off_compute",
        "waits_on_const", "rejected", "refs_checked", "joins_checked", "views_checked",
        "results", "speedup", "before_refs", "cuda_speedup"]
#: the problems a row counts (each must be 0), and what it checked
PROBLEMS = ("uncovered", "unlabelled", "dropped_joins", "output_refs", "waits_off_compute",
            "rejected", "results_differing")
CHECKED = ("refs_checked", "joins_checked", "views_checked")


def markdown(table_rows: list[dict[str, Any]]) -> str:
    """The table, then per mode the totals, what was checked and the mean predicted
    speed-up: with the output refs ordered, before they were, and the CUDA plan's."""
    head = HEAD + ["static_speedup"] * any("static_speedup" in r for r in table_rows)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in table_rows]
    totals = ("applied", *PROBLEMS, "waits_on_const", *CHECKED)
    lines += ["", "| mode | cases | " + " | ".join(totals) + " | mean speedup | "
              "mean before_refs | mean cuda_speedup |", "|---" * (len(totals) + 5) + "|"]
    for mode in MODES:
        rs = [r for r in table_rows if r["mode"] == mode]
        if not rs:
            continue
        total = [str(sum(r[k] for r in rs)) for k in totals]
        means = [f"{sum(r[k] for r in rs) / len(rs):.2f}"
                 for k in ("speedup", "before_refs", "cuda_speedup")]
        lines.append(f"| {mode} | {len(rs)} | " + " | ".join(total + means) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from experiments.torchair_real import torchair_or_reason

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="only these models")
    parser.add_argument("--dynamic", action="store_true",
                        help="the dynamic=True cases, each run at 3 lengths, beside the "
                             "predicted speed-up of its static twin")
    parser.add_argument("--case", nargs=4, metavar=("MODEL", "STREAMS", "TABLE", "MODE"),
                        help="one case, printed as JSON (what the tests run, in a process "
                             "of its own: importing TorchAir changes torch.ops.air)")
    parser.add_argument("--drop-sync", action="store_true",
                        help="with --case: delete the first wait after the pass")
    parser.add_argument("--without-mode", action="store_true",
                        help="with --case: the pass does not see TorchAir's config")
    parser.add_argument("--drop-ref-edges", action="store_true",
                        help="with --case: plan without the order edges of GE's output "
                             "refs and skip their check in verify_rewrite (negative control)")
    parser.add_argument("--core-budgets", action="store_true",
                        help="with --case: the pass chooses core budgets (TABLE: a table "
                             "with core counts, e.g. from experiments.core_budget_demo)")
    args = parser.parse_args(argv)
    torchair, why = torchair_or_reason()
    if torchair is None:
        raise SystemExit(f"TorchAir unavailable: {why}")
    if args.case:
        import json

        name, streams, table, mode = args.case
        result = run_case(case_model(name), int(streams), table, mode, args.drop_sync,
                          args.without_mode, args.core_budgets, args.drop_ref_edges)
        print(json.dumps({
            "results_compared": result.results_compared,
            "results_differing": result.results_differing,
            "graphs": [{**dataclasses.asdict(f), "phase": phase,
                        "applied": bool(r and r.applied), "mode_seen": getattr(r, "mode", None),
                        "outcome": r.outcome.name if r is not None else None,
                        "core_budgets": {str(k): v for k, v in r.plan.core_budgets.items()}
                        if r is not None and r.plan is not None else {}}
                       for phase, f, r in result.graphs]}))
        return
    release = "" if torch.__version__.startswith("2.14") else \
        " (torch-npu 2.14.0 pins torch 2.14: run this under torch 2.14 for figures to trust)"
    print(f"TorchAir from the torch-npu 2.14.0 wheel beside torch {torch.__version__}"
          f"{release}; graphs compiled through TorchAir's own backends.\n")
    static_rows = [] if args.dynamic else rows(args.models)
    dynamic_rows = rows(args.models, dynamic=True) if args.dynamic or not args.models else []
    control = None
    if static_rows:
        print(markdown(static_rows))
        control = negative_control()
        print(f"\nNegative control ({control['case']}, planned without the order edges of "
              f"GE's output refs and without verify_rewrite's check of them): "
              f"{control['caught']} output-ref races found.")
    if dynamic_rows:
        print("\nWith `dynamic=True`: each case compiled once and run at 3 lengths, beside the "
              "predicted speed-up of its static twin (one length, static shapes).\n")
        print(markdown(dynamic_rows))
    record_headlines(static_rows, dynamic_rows, control)


def negative_control() -> dict[str, Any]:
    """The buffer-updating module in GE at 2 streams on ``h200``, planned without the order
    edges of GE's output refs: the harness must find the race they prevent."""
    name = "buffer_update"
    result = run_case(models([name])[name], 2, "h200", "max-autotune", drop_ref_edges=True)
    caught = sum(len(f.uncovered_output_refs) for _, f, _ in result.graphs)
    return {"case": f"{name}, 2 streams, h200, max-autotune", "caught": caught}


def record_headlines(table_rows: list[dict[str, Any]],
                     dynamic_rows: list[dict[str, Any]] = (),
                     control: dict[str, Any] | None = None) -> None:
    from experiments.headline import Headline, record

    out = []
    if control is not None:
        out.append(Headline(f"TorchAir negative control: output-ref races found without their "
                            f"order edges ({control['case']})", str(control["caught"]), ">= 1",
                            control["caught"] > 0))
    for mode in MODES:
        rs = [r for r in table_rows if r["mode"] == mode]
        if not rs:
            continue
        holes = sum(r[k] for r in rs for k in PROBLEMS)
        refs = sum(r["refs_checked"] for r in rs)
        out.append(Headline(f"TorchAir {mode} (front door): dependences, output refs, joins "
                            f"and results wrong ({len(rs)} cases, "
                            f"{sum(r['applied'] for r in rs)} graphs rewritten, {refs} output "
                            f"refs checked)", str(holes), "0", holes == 0 and refs > 0))
        mean, before, cuda = (sum(r[k] for r in rs) / len(rs)
                              for k in ("speedup", "before_refs", "cuda_speedup"))
        out.append(Headline(f"TorchAir {mode}: mean predicted speed-up, without the output-ref "
                            f"order, and the plan for CUDA events",
                            f"{mean:.2f}x vs {before:.2f}x vs {cuda:.2f}x", "-", None))
    if dynamic_rows:
        table = dynamic_rows
        for mode in DYNAMIC_MODES:
            rs = [r for r in table if r["mode"] == mode]
            holes = sum(r[k] for r in rs for k in PROBLEMS)
            views = sum(r["views_checked"] for r in rs)
            mean, static = (sum(r[k] for r in rs) / len(rs)
                            for k in ("speedup", "static_speedup"))
            out.append(Headline(f"TorchAir {mode}, dynamic=True at 3 lengths: dependences, "
                                f"joins, rejected rewrites and results wrong ({len(rs)} "
                                f"cases, {views} views checked)", str(holes), "0",
                                holes == 0 and views > 0))
            out.append(Headline(f"TorchAir {mode}, dynamic=True: mean predicted speed-up "
                                f"against the static twins'", f"{mean:.2f}x vs {static:.2f}x",
                                "-", None))
    record(__file__, out)


if __name__ == "__main__":
    main()
