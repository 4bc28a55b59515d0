"""Where a comparison's ``SchedulingProblem`` comes from: a model, a model spec or an STG file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autostream.cost.runtime_target import RuntimeCosts
from autostream.memory.predict import GraphMemory
from autostream.models.modelspec import load_model_spec
from autostream.models.stg import read_stg, resolve_stg
from autostream.planning.plan import (
    PlanOptions,
    build_problem,
    largest_graph,
    load_cost_model,
    model_graphs,
    plan_graph,
)
from autostream.scheduling.problem import SchedulingProblem


@dataclass(frozen=True)
class Source:
    """A problem to compare solvers on, its display title and how it was obtained."""

    problem: SchedulingProblem
    title: str
    notes: tuple[str, ...] = ()
    #: tensor sizes, for the predicted peak memory of each plan (``None`` for STG graphs)
    memory: GraphMemory | None = None
    #: the problem multi-stream plans are solved on, as ``autostream plan`` does: each op
    #: on its stream's share of the intra-op threads (``None``: ``problem``'s durations)
    split_problem: SchedulingProblem | None = None
    #: the multi-stream runtime's host costs, which ``autostream plan`` adds to a
    #: multi-stream plan's makespan (``None``: an STG graph, none)
    runtime: RuntimeCosts | None = None
    #: the cost table, in words (``cost.label.table_label``)
    table: str = "none: the .stg file's task times"
    #: the runtime the costs are for (``cost.runtime_target``; "" for an STG graph)
    runtime_name: str = ""


def problem_from_model(
    model: Any,
    example_inputs: tuple[Any, ...],
    streams: int,
    *,
    cost_table: str | None = None,
    time_limit: float | None = None,
    title: str = "model",
    runtime: str | None = None,
) -> Source:
    """Capture ``model``'s post-AOT graph (the largest, if Dynamo splits it), estimate
    op costs, and return the problem, with the split problem and runtime costs
    ``autostream plan`` uses for multi-stream plans.  ``runtime``: the runtime the costs
    are for (``None``: the default of the table's device, ``cost.runtime_target``)."""
    from autostream.cost.label import table_label
    from autostream.cost.runtime_target import default_runtime, for_runtime, runtime_label

    table = load_cost_model(cost_table)
    kind = getattr(getattr(table, "profile", None), "kind", "")
    costs = for_runtime(table, runtime or (default_runtime(kind) if kind else None))
    graphs = model_graphs(model, example_inputs)
    largest = largest_graph(graphs)
    plan = plan_graph(largest, PlanOptions(max_streams=streams, solver="single",
                                           time_limit=time_limit), costs)
    gm = next(iter(plan.op_graph.nodes.values()))["fx"].graph if len(plan.op_graph) else None
    split = plan.problem
    if any(getattr(e, "split", 1.0) != 1.0 for e in plan.estimates.values()):
        split = build_problem(plan.op_graph, plan.estimates, streams,
                              plan.problem.sync_latency_us, split=True,
                              transfers=plan.transfers)
    return Source(plan.problem, title, split_notes(graphs, largest),
                  GraphMemory.from_graph(gm) if gm is not None else None,
                  split, RuntimeCosts.of(costs), table_label(table, cost_table, kind),
                  runtime_label(costs))


def split_notes(graphs: list[Any], largest: Any) -> tuple[str, ...]:
    """What a comparison of the largest graph leaves out when Dynamo split the model."""
    if len(graphs) <= 1:
        return ()
    sizes = ", ".join(f"{len(g.graph.nodes)}" + (" (compared)" if g is largest else "")
                      for g in graphs)
    return (f"Dynamo split the model at graph breaks into {len(graphs)} graphs of {sizes} "
            f"nodes; this compares the largest; `autostream plan SPEC` plans every one, "
            f"as torch.compile does",)


def problem_from_spec(
    spec: str,
    streams: int,
    *,
    cost_table: str | None = None,
    time_limit: float | None = None,
    sync_latency_us: float | None = None,
) -> Source:
    """``file.stg``, ``module:function`` or ``file.py:function`` -> the problem to compare.

    >>> problem_from_spec("nowhere.stg", 2)
    Traceback (most recent call last):
    ...
    FileNotFoundError: STG file nowhere.stg does not exist (nor is it a file shipped with autostream); try the sample graph autostream/models/sample.stg
    """
    if spec.endswith(".stg"):
        problem = read_stg(resolve_stg(spec), streams=streams)
        if sync_latency_us is not None:
            problem = SchedulingProblem(problem.graph, problem.streams, sync_latency_us,
                                        problem.capacity)
        return Source(problem, Path(spec).name)

    model, inputs = load_model_spec(spec)
    return problem_from_model(model, inputs, streams, cost_table=cost_table,
                              time_limit=time_limit, title=spec)
