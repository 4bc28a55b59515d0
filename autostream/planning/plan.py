"""From an FX graph to a plan: OpGraph -> costs -> SchedulingProblem -> Schedule -> Syncs."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import networkx as nx
import torch.fx

from autostream.comm import has_communication
from autostream.cost import OpCost, TableCostModel, source_breakdown
from autostream.cost.defaults import default_table
from autostream.cost.runtime_target import RuntimeCosts, for_runtime, runtime_label
from autostream.fx.capture import capture_graphs
from autostream.fx.graph import OpGraph, build_op_graph
from autostream.memory.budget import DEFAULT_MAX_MEMORY_INCREASE, MemoryBudget
from autostream.memory.predict import GraphMemory
from autostream.planning.defaults import DEFAULT_MAX_STREAMS, DEFAULT_SOLVER
from autostream.planning.evaluate import Candidate, FitInputs, evaluate
from autostream.planning.fit import FALLBACK_SOLVERS, PlanMemory, fit_plan
from autostream.scheduling.placement import Placement
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import Schedule, Sync
from autostream.scheduling.scope_events import grouped_order, scope_latency_us
from autostream.scheduling.simulate import simulate_plan
from autostream.scheduling.solvers import check_solver_name, get_solver
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.scheduling.sync import compute_syncs
from autostream.scheduling.transfers import Transfer, add_transfers, plan_transfers
from autostream.stages import StageTimes, Stopwatch, collector_paused

if TYPE_CHECKING:
    from autostream.cost import CostModel, OpCost, SourceBreakdown

#: A plan must be predicted at least this much faster than one stream to be used.
MIN_RELATIVE_GAIN = 0.01
#: each re-solve of a plan over its memory budget (once with ordering edges, once per
#: smaller stream count) gets this share of the first solve's time
RESOLVE_SHARE = 0.5


@dataclass(frozen=True)
class PlanOptions:
    """What the user chooses; equal options give equal plans.

    >>> PlanOptions(max_streams=0)
    Traceback (most recent call last):
    ...
    ValueError: max_streams must be an integer >= 1, got 0
    >>> PlanOptions(time_limit="abc")
    Traceback (most recent call last):
    ...
    ValueError: time_limit must be a number of seconds > 0 (or None: the solver's own, by the graph's size), got str 'abc'
    """

    max_streams: int = DEFAULT_MAX_STREAMS
    solver: str = DEFAULT_SOLVER
    cost_table: str | None = None
    #: seconds the solver may search (``None``: the solver's own, by the graph's size)
    time_limit: float | None = None
    #: how far the plan's predicted peak may rise above one stream's: a fraction of the
    #: single-stream peak (``0.1``), a size (``"512MiB"``) or both (``"10%,2MiB"``: the
    #: larger); ``None``: no budget (``autostream.memory.budget``).  Keyed by ``repr``:
    #: ``0.1`` and ``"0.1"`` are other options
    max_memory_increase: float | str | None = field(default=DEFAULT_MAX_MEMORY_INCREASE,
                                                    metadata={"key": repr})
    #: also choose each side stream's core budget (``autostream.scheduling.core_budgets``; cpsat only)
    core_budgets: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_streams, bool) or not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise ValueError(f"max_streams must be an integer >= 1, got {self.max_streams!r}")
        if not isinstance(self.solver, str):
            raise ValueError(f"solver must be a solver's name (a string), got "
                             f"{type(self.solver).__name__} {self.solver!r}")
        check_solver_name(self.solver)
        limit = self.time_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                                  or not limit > 0):
            raise ValueError(f"time_limit must be a number of seconds > 0 (or None: the "
                             f"solver's own, by the graph's size), got "
                             f"{type(limit).__name__} {limit!r}")
        if self.cost_table is not None and not isinstance(self.cost_table, (str, os.PathLike)):
            raise ValueError(f"cost_table must be a shipped table's name or the path of a "
                             f"table file (or None: the default table of the graph's device), "
                             f"got {type(self.cost_table).__name__} {self.cost_table!r}")
        MemoryBudget.parse(self.max_memory_increase)
        if not isinstance(self.core_budgets, bool):
            raise ValueError(f"core_budgets must be True or False, got "
                             f"{type(self.core_budgets).__name__} {self.core_budgets!r}")
        if self.core_budgets and self.solver != "cpsat":
            raise ValueError(f"core_budgets=True needs solver='cpsat' (budgets are chosen in "
                             f"its model; other solvers plan without budgets), got solver="
                             f"{self.solver!r}: use solver='cpsat' or drop core_budgets")

    @property
    def memory_budget(self) -> MemoryBudget | None:
        return MemoryBudget.parse(self.max_memory_increase)

    def key(self, table: str | None = None) -> str:
        """The options as text, for the keys equal options share (compile caches, the
        ranks' agreement): ``table`` stands for ``cost_table`` (the tables' content; ``None``:
        left out); a flag shows by its name when set, so a new flag left off keeps old keys.

        >>> PlanOptions(max_streams=4, core_budgets=True).key("t")
        "4|cpsat|t|None|'10%,2MiB'|core_budgets"
        >>> PlanOptions(max_memory_increase=0.1).key()
        '2|cpsat|None|0.1'
        """
        parts = []
        for f in dataclasses.fields(PlanOptions):
            value = getattr(self, f.name)
            if f.name == "cost_table":
                parts += [] if table is None else [table]
            elif isinstance(value, bool):
                parts += [f.name] if value else []
            else:
                parts.append(f.metadata.get("key", str)(value))
        return "|".join(parts)


@dataclass(frozen=True)
class Plan:
    """Everything the planner decided for one graph, and why."""

    op_graph: OpGraph
    problem: SchedulingProblem
    schedule: Schedule
    syncs: tuple[Sync, ...]
    estimates: Mapping[str, OpCost]
    single_stream_us: float
    plan_seconds: float
    #: the plan's expected makespan: the schedule's, plus the multi-stream runtime's
    #: host cost per node when the plan uses several streams
    predicted_us: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: predicted peak memory against one stream's and the budget
    memory: PlanMemory | None = None
    #: seconds per stage of planning (graph, costs, solve, syncs)
    stages: StageTimes = StageTimes()
    #: collective launch -> its transfer on its process group's link (``comm.links``)
    transfers: Mapping[str, Transfer] = field(default_factory=dict)
    #: what the planner could not identify in the graph's communication (see there)
    comm_notes: tuple[str, ...] = field(default_factory=tuple)
    #: side stream -> its core budget (a fraction of the chip); ``problem`` has the ops on
    #: budgeted streams stretched (``autostream.scheduling.core_budgets``)
    core_budgets: Mapping[int, float] = field(default_factory=dict)
    #: the runtime the predictions are for (``autostream.cost.runtime_target``)
    runtime: str = ""
    #: every plan weighed, timed as it would run; the plan is the fastest eligible one
    weighed: tuple[Weighed, ...] = ()

    @property
    def predicted_speedup(self) -> float:
        return self.single_stream_us / self.predicted_us if self.predicted_us > 0 else 1.0

    @property
    def cost_sources(self) -> SourceBreakdown:
        """What fraction of the predicted time rests on exact, scaled, roofline, free costs
        (transfers on links included)."""

        links = [OpCost(t.cost.duration_us, t.cost.share, t.cost.source)
                 for t in self.transfers.values()]
        return source_breakdown([*self.estimates.values(), *links])

    @property
    def is_single_stream(self) -> bool:
        return self.schedule.streams_used <= 1

    @property
    def reorders(self) -> bool:
        """One stream in another order than the program's: collectives launched early and
        waited for late, so their transfers overlap the compute between."""
        return self.is_single_stream and self.schedule.solver != "single"

    @property
    def changes_graph(self) -> bool:
        """Whether applying the plan changes the graph (several streams, or a reorder)."""
        return not self.is_single_stream or self.reorders

    def summary(self) -> dict[str, Any]:
        """The figures a report or ``--json`` needs."""
        return {
            "solver": self.schedule.solver,
            "nodes": self.op_graph.number_of_nodes(),
            "streams_used": self.schedule.streams_used,
            "makespan_us": self.schedule.makespan,
            "predicted_us": self.predicted_us,
            "lower_bound_us": self.schedule.lower_bound,
            "single_stream_us": self.single_stream_us,
            "predicted_speedup": self.predicted_speedup,
            "num_syncs": len(self.syncs),
            "optimal": self.schedule.optimal,
            "plan_seconds": self.plan_seconds,
            "stage_seconds": self.stages.as_dict(),
            "cost_sources": str(self.cost_sources),
            "runtime": self.runtime,
            **({"core_budgets": {str(k): v for k, v in self.core_budgets.items()}}
               if self.core_budgets else {}),
            **self._memory_summary(),
        }

    def _memory_summary(self) -> dict[str, Any]:
        m = self.memory
        if m is None:
            return {}
        return {"peak_bytes": m.peak_bytes, "peak_bound_bytes": m.bound_bytes,
                "single_stream_peak_bytes": m.single_stream_peak_bytes,
                "memory_limit_bytes": m.limit_bytes, "memory_fit": m.how}


def runtime_suffix(runtime: str) -> str:
    """How a predicted speed-up names its runtime: ``1.42x`` + this.

    >>> runtime_suffix("graph"), runtime_suffix("")
    (' on the graph runtime', '')
    """
    return f" on the {runtime} runtime" if runtime else ""


def load_cost_model(cost_table: str | os.PathLike | CostModel | None) -> CostModel:
    """The default cost model (of CPU graphs, ``cost.defaults``), a shipped table by name, a
    table file by path, or ``cost_table`` itself when it already is a cost model."""

    if cost_table is None:
        return default_table("cpu").model
    if isinstance(cost_table, (str, os.PathLike)):
        return TableCostModel.load(cost_table)
    return cost_table


def build_problem(
    op_graph: OpGraph, estimates: Mapping[str, OpCost], streams: int, sync_latency_us: float,
    split: bool = False, transfers: Mapping[str, Transfer] | None = None,
) -> SchedulingProblem:
    """The solver's view of an ``OpGraph``: durations, shares and program order.

    ``split``: durations as in a multi-stream plan, where each op runs on its
    stream's share of the intra-op threads (``OpCost.split``; 1 on accelerators).
    ``transfers``: collectives' transfers, as tasks on their links (``comm.links``).
    """
    g = nx.DiGraph()
    for n, data in op_graph.nodes(data=True):
        e = estimates[n]
        factor = getattr(e, "split", 1.0) if split else 1.0
        g.add_node(n, duration=e.duration_us * factor, share=e.share, order=data["order"],
                   kind=data["target"])
    g.add_edges_from(op_graph.edges)
    add_transfers(g, op_graph, transfers or {})
    return SchedulingProblem(g, streams=streams, sync_latency_us=sync_latency_us)


def plan_graph(
    gm: torch.fx.GraphModule, options: PlanOptions, cost_model: CostModel | None = None,
    extra_deps: Callable[[torch.fx.GraphModule, OpGraph], Iterable[tuple[str, str]]]
    | None = None, scope_overhead_us: float = 0.0, place: Placement | None = None,
    runtime: str | None = None,
) -> Plan:
    """Plan ``gm`` without changing it.

    The single-stream time uses each op's time alone; the multi-stream candidate is
    solved with the times ops take on one stream's share of the device (``split``)
    and charged the runtime's host cost per node.  Falls back to the single-stream
    plan when the candidate is not predicted at least ``MIN_RELATIVE_GAIN`` faster.
    A candidate whose predicted peak memory is over ``options.max_memory_increase``
    is repaired or replaced (:func:`autostream.planning.fit.fit_plan`), never used.
    ``extra_deps`` adds order edges (each in program order) to the dependences: what the
    compiler will do to the graph after the pass (``dialects.torchair_modes``);
    ``scope_overhead_us`` (an ACL graph's events per scope) is charged on every
    cross-stream dependence in the problem itself, so the solver optimises it, and the
    chosen plan is launched in :func:`autostream.scheduling.scope_events.grouped_order` (a new scope
    only at a wait).  ``place`` is what the compiler does to a multi-stream plan's streams
    and syncs after the pass (``dialects.torchair_modes.GE_PLACEMENT``): every candidate,
    and every memory repair of it, is checked as placed, so the gain bar, the memory
    budget and the plan's figures are those of the plan that runs.  Candidates are
    compared by those figures, after every rule, never by the solver's own timing
    (``Plan.weighed`` lists them): where a rule re-times CP-SAT's pick, the heuristics of
    its portfolio are weighed again beside it.
    """
    with collector_paused():
        return _plan_graph(gm, options, cost_model, extra_deps, scope_overhead_us, place,
                           runtime)


def _plan_graph(gm: torch.fx.GraphModule, options: PlanOptions, cost_model: CostModel | None,
                extra_deps: Callable[[torch.fx.GraphModule, OpGraph],
                                     Iterable[tuple[str, str]]] | None = None,
                scope_overhead_us: float = 0.0, place: Placement | None = None,
                runtime: str | None = None) -> Plan:
    t0 = time.perf_counter()
    watch = Stopwatch()
    cost_model = for_runtime(cost_model or load_cost_model(options.cost_table), runtime)
    watch.lap("costs")
    op_graph = build_op_graph(gm)
    if extra_deps is not None:
        for u, v in extra_deps(gm, op_graph):
            if not op_graph.has_edge(u, v):
                op_graph.add_edge(u, v, kind="compiler")
    watch.lap("graph")
    estimates = {n: cost_model.estimate(data["fx"]) for n, data in op_graph.nodes(data=True)}
    transfers, comm_notes = plan_transfers(op_graph, cost_model)
    latency = scope_latency_us(cost_model.sync_latency_us, scope_overhead_us)
    problem = build_problem(op_graph, estimates, options.max_streams, latency,
                            transfers=transfers)
    split_problem = problem if all(getattr(e, "split", 1.0) == 1.0 for e in estimates.values()) \
        else build_problem(op_graph, estimates, options.max_streams, latency,
                           split=True, transfers=transfers)
    watch.lap("costs")
    single = get_solver("single")(problem)
    watch.lap("solve")
    costs = RuntimeCosts.of(cost_model)
    solver_options: dict[str, Any] = {}
    if options.solver == "cpsat" and options.time_limit is not None:
        solver_options["time_limit"] = options.time_limit
    if options.solver == "cpsat" and has_communication(gm.graph):
        # every rank must reach the same plan: no wall-clock cut (docs/distributed.md)
        solver_options["wall_clock"] = False
    fit = FitInputs(op_graph, split_problem, GraphMemory.from_graph(gm), options.solver,
                    _resolve_options(options.solver, solver_options, len(split_problem.graph)),
                    costs, place)
    single_plan = evaluate(fit, single, problem)
    budget = options.memory_budget
    limit = budget.limit(single_plan.memory.peak_bytes) if budget is not None else None
    notes: list[str] = []
    watch.lap("syncs")
    choice = _Choice(fit, single_plan, limit, scope_overhead_us, notes)
    if options.max_streams > 1 and op_graph.number_of_nodes() > 1:
        solved = get_solver(options.solver)(split_problem, **solver_options)
        watch.lap("solve")
        label = f" {place.label}" if place is not None else ""
        candidate = evaluate(fit, solved, split_problem, how=f"{solved.solver} plan{label}")
        if options.core_budgets:
            budgeted, note = with_core_budgets(fit, candidate, cost_model,
                                                        solver_options)
            notes += [note] if note else []
            candidate = budgeted or candidate
            watch.lap("solve")
        # a rule that re-timed the solver's pick may have re-ranked its candidates
        retimed = candidate.schedule is not solved or scope_overhead_us > 0
        rivals = [evaluate(fit, s, split_problem, how=f"{s.solver} plan{label}")
                  for s in (_portfolio(options.solver, split_problem, solved) if retimed else ())]
        watch.lap("solve")
        choice.weigh_streams(candidate, rivals)
        watch.lap("syncs")
    if transfers:
        overlapped = get_solver("overlap")(problem)
        watch.lap("solve")
        choice.weigh(evaluate(fit, overlapped, problem, how="collectives overlapped on one stream"))
    chosen = choice.best()
    watch.lap("syncs")
    return Plan(
        op_graph=op_graph,
        problem=chosen.problem,
        schedule=chosen.schedule,
        syncs=chosen.syncs,
        estimates=estimates,
        single_stream_us=single_plan.predicted_us,
        plan_seconds=time.perf_counter() - t0,
        predicted_us=chosen.predicted_us,
        notes=tuple(notes),
        weighed=tuple(choice.weighed()),
        memory=PlanMemory(chosen.memory.peak_bytes, single_plan.memory.peak_bytes, limit,
                          chosen.memory.reserved_bytes, chosen.memory, chosen.edges, chosen.how),
        stages=watch.times(),
        transfers=transfers,
        comm_notes=comm_notes,
        # the problem of a budgeted plan (and of its memory repairs) names its budgets
        core_budgets=dict(chosen.problem.graph.graph.get("core_budgets", {})),
        runtime=runtime_label(cost_model),
    )


@dataclass(frozen=True)
class Weighed:
    """One plan the planner weighed, timed as it would run: after every rule a plan goes
    through (collective waits on their launches' streams, the compiler's placement, the
    launch order grouped into scopes, the memory fit)."""

    how: str
    predicted_us: float
    streams_used: int
    #: could ship: within the memory budget and, unless one stream in program order,
    #: predicted at least ``MIN_RELATIVE_GAIN`` faster than it
    eligible: bool


class _Choice:
    """The plans weighed for one graph, and the choice: the fastest eligible one, each
    timed after every rule (ties: fewer streams, then the first weighed; one stream in
    program order last).

    A solver times its plan before the rules: a collective's wait moved back to its
    launch's stream (``scheduling.waits``) or the compiler's placement can make the
    fastest plan by the solver's timing slower than another; so the solver's plan and its
    rivals (:func:`_portfolio`) are compared after the rules, not before.
    """

    def __init__(self, fit: FitInputs, single: Candidate, limit: int | None,
                 scope_overhead_us: float, notes: list[str]) -> None:
        self.fit, self.single, self.limit, self.notes = fit, single, limit, notes
        self.scopes = scope_overhead_us > 0
        self.bar = single.predicted_us * (1 - MIN_RELATIVE_GAIN)
        self.candidates: list[Candidate] = []
        self.own: Candidate | None = None

    def weigh(self, candidate: Candidate) -> None:
        self.candidates.append(candidate)

    def weigh_streams(self, own: Candidate, rivals: Sequence[Candidate]) -> None:
        """The solver's plan and its rivals, launch orders grouped into scopes; the fastest
        of them fitted into the memory budget (:func:`fit_plan`) when over it."""
        grouped = [self._grouped(c) for c in (own, *rivals)]
        multi = [c for c in grouped if c.schedule.streams_used > 1]
        self.own = grouped[0]
        self.candidates += multi
        best = min(multi, key=lambda c: c.predicted_us, default=own)
        if best.schedule.streams_used <= 1 or best.predicted_us >= self.bar:
            self.notes.append(_not_faster_note(self.own, self.single.predicted_us,
                                               self.fit.costs))
            return
        fitted, fit_notes = fit_plan(self.fit, best, self.single, self.limit, MIN_RELATIVE_GAIN)
        self.notes += fit_notes
        if fitted is not best:
            self.candidates.append(self._grouped(fitted))

    def eligible(self, c: Candidate) -> bool:
        if c.schedule.solver == "single":
            return True
        return (c.predicted_us < self.bar
                and (self.limit is None or c.memory.bound_bytes <= self.limit))

    def best(self) -> Candidate:
        chosen = min((c for c in (*self.candidates, self.single) if self.eligible(c)),
                     key=lambda c: (c.predicted_us, c.schedule.streams_used))
        own = self.own
        if (own is not None and chosen is not own and chosen.schedule.streams_used > 1
                and own.schedule.streams_used > 1 and chosen.how != own.how):
            self.notes.append(f"using {chosen.how}: {chosen.predicted_us:.1f} us as it would "
                              f"run, against {own.predicted_us:.1f} us for the {own.how}")
        self.notes[:] = list(dict.fromkeys(self.notes))
        return chosen

    def weighed(self) -> list[Weighed]:
        return [Weighed(c.how, c.predicted_us, c.schedule.streams_used, self.eligible(c))
                for c in (*self.candidates, self.single)]

    def _grouped(self, c: Candidate) -> Candidate:
        if not self.scopes or c.schedule.streams_used <= 1:
            return c
        return _scopes_grouped(self.fit, c, self.limit, self.notes)


def _portfolio(solver: str, problem: SchedulingProblem, solved: Schedule
               ) -> Iterator[Schedule]:
    """The cheap heuristics CP-SAT weighs (by its own timing) beside its search, solved
    again, one at a time, so the planner can weigh each after its rules (when a rule
    re-timed CP-SAT's pick; else its choice stands); none for another solver (the user
    chose it).  Their bound is the solver's when that is tighter (the same problem)."""
    if solver != "cpsat":
        return
    for name in FALLBACK_SOLVERS:
        s = get_solver(name)(problem)
        yield dataclasses.replace(s, lower_bound=max(s.lower_bound, solved.lower_bound))


def with_core_budgets(fit: FitInputs, candidate: Any, cost_model: CostModel,
                      solver_options: Mapping[str, Any]) -> tuple[Any, str]:
    """``(candidate re-planned with side-stream core budgets, a note)``
    (``autostream.scheduling.core_budgets``; its problem's graph names the budgets); ``(None, why)``
    unless the simulator predicts the budgets faster."""
    from autostream.scheduling.core_budgets import (
        BUDGET_MIN_S,
        MAX_OPS,
        budgeted,
        cores_missing,
        plan_budgets,
    )
    from autostream.scheduling.solvers.base import schedule_from_assignment

    missing = cores_missing(cost_model)
    if missing:
        return None, f"planned without core budgets: {missing}"
    cores = cost_model.profile.cores
    problem = candidate.problem
    if len(problem.graph) > MAX_OPS:
        return None, (f"planned without core budgets: {len(problem.graph)} ops, over the "
                      f"{MAX_OPS} one budget model holds (the whole graph, no pieces)")
    # the budget model (optional intervals on two cumulatives) needs more search than the
    # stream model's size-scaled default gives a small graph: at least BUDGET_MIN_S
    time_s = max(BUDGET_MIN_S, CpsatOptions(**{k: v for k, v in solver_options.items()
                                              if k == "time_limit"}).seconds(len(problem.graph)))
    choice = plan_budgets(problem, candidate.schedule, cores, time_s=time_s)
    if not choice.budgets:
        return None, ""
    capped = budgeted(problem, choice.stream_of, choice.budgets)
    schedule = schedule_from_assignment(capped, choice.stream_of, "cpsat", order=choice.order)
    # budgets only lengthen ops: the bound of the plan without them bounds this one too
    schedule = dataclasses.replace(schedule, lower_bound=candidate.schedule.lower_bound)
    if dict(schedule.stream_of) != choice.stream_of:  # renumbered: budgets would move
        return None, ("planned without core budgets: the budgeted plan's streams were "
                      "renumbered")
    how = "cpsat plan with core budgets " + ", ".join(
        f"{s}: {b:g}" for s, b in choice.budgets.items())
    with_budgets = evaluate(fit, schedule, capped, how=how)
    same = schedule_from_assignment(problem, choice.stream_of, "cpsat", order=choice.order)
    same_without = evaluate(fit, same, problem, how="cpsat plan of the core budget model")
    # kept only when faster than the plan it started from and the same plan without them
    if with_budgets.predicted_us < min(candidate.predicted_us, same_without.predicted_us):
        return with_budgets, ""
    return None, ""


def _scopes_grouped(fit: FitInputs, chosen: Any, limit: int | None, notes: list[str]) -> Any:
    """``chosen`` launched in :func:`grouped_order`, evaluated again (same streams and
    syncs; the launch order moves the host's costs and, on an accelerator, the memory);
    ``chosen`` itself if the grouped order would break the memory budget."""
    deps = nx.DiGraph(fit.deps)
    deps.add_edges_from(chosen.edges)
    deps.add_edges_from(chosen.problem.graph.edges)  # a collective's transfer on its link
    order = grouped_order(chosen.schedule, chosen.syncs, deps)
    if order == chosen.schedule.order:
        return chosen
    schedule = dataclasses.replace(chosen.schedule, order=order)
    grouped = evaluate(fit, schedule, chosen.problem, chosen.edges, how=chosen.how)
    if limit is not None and grouped.memory.bound_bytes > limit:
        notes.append("launch order not grouped into fewer scopes: it would break the "
                     "memory budget")
        return chosen
    return grouped


def _resolve_options(solver: str, solver_options: Mapping[str, Any], ops: int) -> dict[str, Any]:
    """The options of a memory repair's re-solves: a share of the first solve's time.

    >>> _resolve_options("cpsat", {"time_limit": 2.0}, 100)["time_limit"]
    1.0
    >>> _resolve_options("heft", {}, 100)
    {}
    """
    if solver != "cpsat":
        return dict(solver_options)
    seconds = CpsatOptions(time_limit=solver_options.get("time_limit")).seconds(ops)
    return {**solver_options, "time_limit": RESOLVE_SHARE * seconds}


def _not_faster_note(candidate, single_us: float, costs: RuntimeCosts) -> str:
    streams = candidate.schedule.streams_used
    overhead = (f", runtime overhead of {costs.call_us:.0f} us per call, "
                f"{costs.segment_us:.0f} us per segment and "
                f"{costs.op_us:.1f} us per node included"
                if (costs.op_us or costs.call_us or costs.segment_us) and streams > 1 else "")
    on = "one stream" if streams <= 1 else f"{streams} streams"
    return (f"{candidate.how} ({candidate.predicted_us:.1f} us on {on}{overhead}) is not "
            f"faster than one stream ({single_us:.1f} us); keeping one stream")


def predicted_speedup_over_eager(single_stream_us: float, predicted_us: float,
                                 compile_call_us: float) -> float:
    """A plan's predicted speed-up, run through ``torch.compile``, over its graph run eagerly.

    Every variant the backend weighs runs inside ``torch.compile``, so the planner
    leaves ``torch.compile``'s own per-call cost (``TableCostModel.compile_call_us``) out;
    against plain eager only the compiled side pays it.  Pass ``predicted_us =
    single_stream_us`` for a graph the planner left on one stream.

    >>> round(predicted_speedup_over_eager(1000.0, 800.0, 50.0), 2)
    1.18
    >>> round(predicted_speedup_over_eager(50.0, 50.0, 70.0), 2)  # tiny model: compiling cannot pay
    0.42
    """
    if predicted_us + compile_call_us <= 0:
        return 1.0
    return single_stream_us / (predicted_us + compile_call_us)


def predicted_makespan(
    problem: SchedulingProblem, schedule: Schedule, deps: OpGraph, runtime_op_us: float,
    runtime_call_us: float = 0.0, runtime_segment_us: float = 0.0,
) -> float:
    """The makespan a multi-stream plan is expected to run in: the schedule replayed with
    its minimal syncs and the runtime's host costs per node and per segment (a run of
    one stream's ops between two of its syncs), plus its cost per call (a
    single-stream plan runs as the compiled graph itself, without any of them).

    >>> import networkx as nx
    >>> from autostream.scheduling.solvers import solve
    >>> g = nx.DiGraph([("a", "b"), ("a", "c")])
    >>> nx.set_node_attributes(g, 10.0, "duration")
    >>> p = SchedulingProblem(g, streams=2)
    >>> plan = solve(p, "critical_path")
    >>> plan.streams_used, plan.makespan
    (2, 20.0)
    >>> predicted_makespan(p, plan, g, runtime_op_us=1.0, runtime_call_us=50.0)
    71.0
    >>> predicted_makespan(p, plan, g, 0.0, runtime_call_us=50.0, runtime_segment_us=5.0)
    80.0
    """
    if schedule.streams_used <= 1:
        return schedule.makespan
    if runtime_op_us <= 0 and runtime_segment_us <= 0:
        return schedule.makespan + runtime_call_us

    syncs = compute_syncs(deps, schedule)
    timeline = simulate_plan(problem, schedule, syncs, launch_overhead_us=runtime_op_us,
                             segment_overhead_us=runtime_segment_us)
    return timeline.makespan + runtime_call_us


def plan_model(
    model: torch.nn.Module,
    example_inputs: Any,
    max_streams: int = 2,
    solver: str = "cpsat",
    cost_table: str | CostModel | None = None,
    time_limit: float | None = None,
    max_memory_increase: float | str | None = DEFAULT_MAX_MEMORY_INCREASE,
) -> Plan:
    """Capture ``model``'s post-AOT graph and plan it (the largest graph if Dynamo splits it).

    >>> from autostream.models.zoo import article_model
    >>> plan = plan_model(*article_model(), max_streams=2)
    >>> plan.op_graph.number_of_nodes()
    4
    """

    options = PlanOptions(max_streams, solver, None if not isinstance(cost_table, str) else cost_table,
                          time_limit, max_memory_increase)
    cost_model = load_cost_model(cost_table)
    return plan_graph(largest_graph(model_graphs(model, example_inputs)), options, cost_model)


def model_graphs(model: torch.nn.Module, example_inputs: Any) -> list[torch.fx.GraphModule]:
    """``model``'s post-AOT graphs, as ``torch.compile`` captures them (several where Dynamo
    breaks the graph); ``ValueError`` when there is none."""
    graphs = capture_graphs(model, tuple(example_inputs))
    if not graphs:
        raise ValueError("torch.compile captured no graph for this model; nothing to plan")
    return graphs


def largest_graph(graphs: list[torch.fx.GraphModule]) -> torch.fx.GraphModule:
    """The graph with the most nodes (the first of equals)."""
    return max(graphs, key=lambda g: len(g.graph.nodes))
