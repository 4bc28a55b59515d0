"""Carry a plan made on the post-AOT ATen graph back to the Dynamo graph it came from.

The planner works on ATen ops (their costs are what the cost table knows), but on
CPU the ATen graph itself runs slower than the graph Dynamo captured: AOTAutograd's
decompositions (``linear`` -> ``t`` + ``addmm``, ``max_pool2d`` ->
``max_pool2d_with_indices``...) and per-call wrappers cost time eager mode does not
pay (``docs/design.md``).  ``lift_plan`` gives every Dynamo node the stream of its ATen ops (found through ``meta["from_node"]``, the
provenance FX keeps), orders the Dynamo nodes by where the plan launched their
ATen ops, recomputes the minimal syncs on the Dynamo graph's own dependences and
rewrites a copy of it.  The rewritten Dynamo graph runs the very calls eager mode
runs, on the plan's streams.

The Dynamo graph's dependences are its data flow plus what its calls really do
(:mod:`autostream.fx.call_effects`, from the ATen ops each call dispatches on fake
tensors): every write of a storage stays ordered against every read and write of it
(``F.batch_norm`` writing its running statistics, a ``StaticCache``'s
``index_copy_``), and calls that draw random numbers or have side effects keep their
program order.  Every input AOTAutograd found mutated must have a call seen writing
it.  Lifting is refused (:class:`LiftError`, the plan then stays on the ATen graph)
where that truth cannot be established (a module call, a call the fake run refuses,
mutations AOTAutograd reports but no call was seen making) and for calls that change
the thread's state (``_set_grad_enabled``, autocast regions): the ops after them
depend on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import networkx as nx
import torch
import torch.fx

from autostream.cost.runtime_target import RuntimeCosts
from autostream.dialects.rewrite import rewrite_graph
from autostream.dialects.verify import verify_rewrite
from autostream.fx.call_effects import (
    EFFECTS_KEY,
    EffectsUnknown,
    GraphEffects,
    trace_call_effects,
)
from autostream.fx.graph import OpGraph, build_op_graph, target_name
from autostream.memory.budget import format_bytes
from autostream.memory.predict import (
    GraphMemory,
    allocation_timeline,
    launch_timeline,
    predict_memory,
)
from autostream.planning.plan import Plan, runtime_suffix
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule, Sync
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.sync import compute_syncs
from autostream.scheduling.transfers import add_transfers

#: ``lift_plan``'s default: a runtime without host costs
NO_COSTS = RuntimeCosts()


class LiftError(ValueError):
    """The plan cannot be carried to the Dynamo graph; the message says why."""


@dataclass(frozen=True)
class LiftedPlan:
    """A plan on the Dynamo graph: a rewritten copy of it, and what it is predicted to take.

    ``moved`` are the ATen ops whose Dynamo node runs on another stream than the plan
    gave them (a Dynamo node runs whole, on the stream of its most expensive ATen op).
    """

    gm: torch.fx.GraphModule
    op_graph: OpGraph
    schedule: Schedule
    syncs: tuple[Sync, ...]
    problem: SchedulingProblem
    single_stream_us: float
    predicted_us: float
    moved: tuple[str, ...] = ()
    #: the runtime the predictions are for (the ATen plan's)
    runtime: str = ""

    @property
    def predicted_speedup(self) -> float:
        return self.single_stream_us / self.predicted_us if self.predicted_us > 0 else 1.0

    @property
    def streams_used(self) -> int:
        return self.schedule.streams_used

    def describe(self) -> str:
        return (f"lifted to the Dynamo graph: {self.streams_used} streams, {len(self.syncs)} "
                f"syncs, predicted {self.predicted_us:.1f} us vs {self.single_stream_us:.1f} us "
                f"on one stream ({self.predicted_speedup:.2f}x{runtime_suffix(self.runtime)})")


def dynamo_effects(dynamo: torch.fx.GraphModule, mutated_inputs: frozenset[str] | None = None
                   ) -> GraphEffects:
    """What every call of ``dynamo`` does, checked against AOTAutograd's mutated inputs.

    Raises :class:`LiftError` where lifting cannot trust it (see the module docstring).
    """
    try:
        effects = trace_call_effects(dynamo)
    except EffectsUnknown as exc:
        raise LiftError(f"what the Dynamo graph's calls do is unknown: {exc}") from None
    for name, call in effects.calls.items():
        if call.state_change:
            node = next(n for n in dynamo.graph.nodes if n.name == name)
            raise LiftError(f"Dynamo node {name!r} ({target_name(node)}) changes the thread's "
                            f"state ({call.state_change}); the calls after it depend on it")
    unseen = (mutated_inputs or frozenset()) - effects.written_inputs()
    if unseen:
        raise LiftError(f"AOTAutograd found inputs {sorted(unseen)} mutated, but no call of the "
                        f"Dynamo graph was seen writing them")
    return effects


def _sources(node: torch.fx.Node) -> Iterable[tuple[str, int]]:
    """``(name, graph_id)`` of every node ``node`` was made from, nearest first."""
    pending = list(node.meta.get("from_node") or ())
    while pending:
        src = pending.pop(0)
        if isinstance(src, tuple):  # older torch: (name, target) pairs
            yield str(src[0]), -1
            continue
        yield src.name, src.graph_id
        pending.extend(getattr(src, "from_node", ()) or ())


def dynamo_source(node: torch.fx.Node, graph: torch.fx.Graph, names: Mapping[str, torch.fx.Node]
                  ) -> str | None:
    """The name of the node of ``graph`` that ``node`` (an ATen op) was made from, if known.

    >>> g = torch.fx.Graph(); x = g.placeholder("x"); y = g.call_function(torch.relu, (x,))
    >>> a = torch.fx.Graph(); ax = a.placeholder("x")
    >>> r = a.call_function(torch.ops.aten.relu.default, (ax,))
    >>> r.meta["from_node"] = [torch.fx.traceback.NodeSource(y)]
    >>> dynamo_source(r, g, {n.name: n for n in g.nodes})
    'relu'
    """
    fallback = None
    for name, graph_id in _sources(node):
        if name in names:
            if graph_id == id(graph):
                return name
            fallback = fallback or name
    return fallback


def _copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    copied = torch.fx.GraphModule(gm, graph)
    missing = {n.name for n in gm.graph.nodes} - {n.name for n in copied.graph.nodes}
    if missing:
        raise LiftError(f"copying the Dynamo graph renamed nodes {sorted(missing)[:3]}")
    return copied


def _aten_groups(plan: Plan, dynamo: torch.fx.GraphModule) -> dict[str, list[str]]:
    """Dynamo node name -> the plan's ATen ops made from it."""
    names = {n.name: n for n in dynamo.graph.nodes if n.op in ("call_function", "call_method",
                                                               "call_module")}
    groups: dict[str, list[str]] = {}
    for aten, data in plan.op_graph.nodes(data=True):
        source = dynamo_source(data["fx"], dynamo.graph, names)
        if source is not None:
            groups.setdefault(source, []).append(aten)
    return groups


def lift_plan(dynamo: torch.fx.GraphModule, plan: Plan, costs: RuntimeCosts = NO_COSTS,
              mutated_inputs: frozenset[str] | None = None) -> LiftedPlan:
    """Carry ``plan`` (made on the ATen graph AOTAutograd traced from ``dynamo``) to ``dynamo``.

    Returns a rewritten copy of ``dynamo`` (``dynamo`` itself is not changed), or
    raises :class:`LiftError`.  Costs of a Dynamo node are the sums of its ATen ops'
    (single-stream and split); ``costs`` are the runtime's host costs
    (:class:`autostream.cost.runtime_target.RuntimeCosts`: per node, per call and per
    segment, ``autostream.scheduling.simulate.segment_leaders``, and what every variant
    pays per op issued from one host thread and per call).  ``mutated_inputs``: the
    placeholders AOTAutograd found mutated (``call_effects.aot_mutated_inputs``), each
    of which some call must be seen writing.

    >>> from autostream.fx.capture import capture
    >>> from autostream.planning.plan import PlanOptions, plan_graph
    >>> from autostream.models.zoo import two_branch_gemv
    >>> [graph] = capture(*two_branch_gemv(depth=2))
    >>> lifted = lift_plan(graph.dynamo, plan_graph(graph.gm, PlanOptions(max_streams=2)))
    >>> lifted.streams_used, sorted(set(lifted.schedule.stream_of.values()))
    (2, [0, 1])
    """
    if not plan.changes_graph:
        raise LiftError("the plan keeps the program order on one stream: nothing to lift")
    effects = dynamo_effects(dynamo, mutated_inputs)
    groups = _aten_groups(plan, dynamo)
    ops = [n for n in dynamo.graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    aten_position = {n: i for i, n in enumerate(plan.schedule.order)}
    aten_stream = plan.schedule.stream_of
    single_us = {n: e.duration_us for n, e in plan.estimates.items()}
    split = plan.problem.graph.nodes
    op_graph = effects.add_to(build_op_graph(dynamo))
    stream_of: dict[str, int] = {}
    key: dict[str, float] = {}
    moved: list[str] = []
    for node in ops:
        members = groups.get(node.name)
        if members:
            heaviest = max(members, key=lambda a: (split[a]["duration"], -aten_position[a]))
            stream_of[node.name] = aten_stream[heaviest]
            key[node.name] = aten_position[heaviest]
            moved += [a for a in members if aten_stream[a] != stream_of[node.name]]
        else:  # getitem or a view with no ATen op: follow its first producer
            producer = next((p.name for p in node.all_input_nodes if p.name in stream_of), None)
            stream_of[node.name] = stream_of[producer] if producer else 0
            key[node.name] = key[producer] + 0.5 if producer else -1.0
    if len(set(stream_of.values())) < 2 and not plan.reorders:
        raise LiftError("every Dynamo node lands on one stream")
    deps = _with_memory_edges(op_graph, plan, groups)
    order = tuple(nx.lexicographical_topological_sort(deps, key=lambda n: (key[n], n)))
    problem = _lifted_problem(deps, groups, plan)
    stream_of, order = problem.place_lanes(stream_of, order)
    schedule = Schedule(f"{plan.schedule.solver}+lifted", stream_of, order, {}, {}, 0.0, 0.0)
    syncs = tuple(compute_syncs(deps, schedule))
    timeline = simulate_plan(problem, schedule, syncs,
                             launch_overhead_us=costs.issue_us + costs.op_us,
                             segment_overhead_us=costs.segment_us)
    schedule = Schedule(schedule.solver, stream_of, order, timeline.start, timeline.end,
                        timeline.makespan, plan.schedule.lower_bound)
    _check_memory(dynamo, deps, plan, schedule, syncs, timeline)
    predicted_us = timeline.makespan + costs.call_us + costs.fixed_us
    gm = _copy_module(dynamo)
    for node in gm.graph.nodes:
        if node.name in effects.calls:
            node.meta[EFFECTS_KEY] = effects.calls[node.name]
    rewrite_graph(gm, schedule, syncs)
    verify_rewrite(gm, op_graph).raise_if_failed()
    # with collectives, one stream also waits for the transfers: the ATen plan's baseline
    single = (plan.single_stream_us if plan.transfers or costs.issue_us > 0
              else sum(single_us[a] for m in groups.values() for a in m) + costs.fixed_us)
    return LiftedPlan(gm=gm, op_graph=op_graph, schedule=schedule, syncs=syncs, problem=problem,
                      single_stream_us=single,
                      predicted_us=predicted_us,
                      moved=tuple(moved), runtime=plan.runtime)


def _with_memory_edges(op_graph: OpGraph, plan: Plan, groups: Mapping[str, list[str]]
                       ) -> OpGraph:
    """``op_graph`` with the plan's memory ordering edges between the Dynamo nodes of
    their ATen ends (an edge that would close a cycle there is left out)."""
    edges = plan.memory.edges if plan.memory is not None else ()
    if not edges:
        return op_graph
    source = {a: d for d, members in groups.items() for a in members}
    deps = op_graph.copy()
    for u, v in edges:
        a, b = source.get(u), source.get(v)
        if a is not None and b is not None and a != b and not nx.has_path(deps, b, a):
            deps.add_edge(a, b, kind="memory_order")
    return deps


def _check_memory(dynamo: torch.fx.GraphModule, deps: OpGraph, plan: Plan, schedule: Schedule,
                  syncs: tuple[Sync, ...], timeline) -> None:
    """Refuse a lifted plan that could peak (in any interleaving of its streams,
    ``MemoryProfile.bound_bytes``) above the Dynamo graph's own single-stream peak by
    more than the plan's budget allowed."""
    budget = plan.memory
    if budget is None or budget.limit_bytes is None:
        return
    memory = GraphMemory.from_graph(dynamo)
    program_order = tuple(nx.lexicographical_topological_sort(
        deps, key=lambda n: (deps.nodes[n]["order"], n)))
    single = Schedule("single", dict.fromkeys(program_order, 0), program_order, {}, {}, 0.0, 0.0)
    single_peak = predict_memory(memory, single, (), launch_timeline(single)).peak_bytes
    timeline = allocation_timeline(memory, schedule, timeline)
    peak = predict_memory(memory, schedule, syncs, timeline).bound_bytes
    limit = single_peak + budget.limit_bytes - budget.single_stream_peak_bytes
    if peak > limit:
        raise LiftError(f"the lifted plan may peak at {format_bytes(peak)}, over its "
                        f"memory budget {format_bytes(limit)} (one stream: "
                        f"{format_bytes(single_peak)})")


def _lifted_problem(op_graph: OpGraph, groups: Mapping[str, list[str]], plan: Plan
                    ) -> SchedulingProblem:
    """Dynamo ops with the summed durations (and duration-weighted shares) of their ATen ops."""
    aten = plan.problem.graph.nodes
    g = nx.DiGraph()
    for n, data in op_graph.nodes(data=True):
        members = groups.get(n, [])
        durations = [aten[a]["duration"] for a in members]
        total = sum(durations)
        share = (sum(d * aten[a]["share"] for d, a in zip(durations, members, strict=True)) / total
                 if total > 0 else 0.0)
        g.add_node(n, duration=total, share=min(1.0, share), order=data["order"],
                   kind=data["target"])
    g.add_edges_from(op_graph.edges)
    # a blocking op's transfer is already in its ATen op's duration
    transfers = {n: dataclasses.replace(plan.transfers[a], launch=n)
                 for n, members in groups.items() for a in members
                 if a in plan.transfers and not plan.transfers[a].blocking}
    add_transfers(g, op_graph, transfers)
    return SchedulingProblem(g, streams=plan.problem.streams,
                             sync_latency_us=plan.problem.sync_latency_us,
                             capacity=plan.problem.capacity)
