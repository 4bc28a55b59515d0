"""The user-facing FX pass: ``config.post_grad_custom_pre_pass = autostream.AutoStreamPass()``.

TorchAir calls it with a ``GraphModule`` and gets the graph rewritten in its stream
dialect.  Inductor calls it with a ``torch.fx.Graph`` (a ``CustomGraphPass``): with
``inductor_streams=True`` (as ``post_grad_custom_post_pass``, on CUDA) the plan becomes
Inductor's own stream annotations and ``wait_stream`` syncs (``dialects.inductor``);
otherwise the graph is left unchanged with a warning saying so.  Every call ends in a :class:`PassReport` whose :class:`Outcome`
says what happened; the last ``history`` reports are kept.

``AUTOSTREAM_STRICT=1`` in the environment turns planning and rewrite failures (bugs,
not bad input) into exceptions instead of a warning and an unchanged graph; the test
suite runs with it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
import os
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

import cost_models
from autostream.comm import has_communication
from autostream.cost import TableCostModel
from autostream.cost.defaults import DEFAULT_TABLES, DefaultTable, default_table
from autostream.cost.fused import FusedCosts, split_fusions
from autostream.cost.label import table_label
from autostream.dialects.hand import strip_stream_ops
from autostream.dialects.input_mutations import ge_output_ref_edges, symbolic_inputs_as_sizes
from autostream.dialects.rewrite import restore, rewrite_graph, snapshot
from autostream.dialects.torchair import is_stream_op
from autostream.dialects.torchair_modes import (
    ACL_MODES,
    GE_MODE,
    GE_PLACEMENT,
    acl_reinplace_hazards,
    acl_scope_overhead_us,
    symbolic_size_lists,
    torchair_mode,
)
from autostream.dialects.verify import verify_rewrite
from autostream.fx.device import graph_device
from autostream.fx.graph import target_name
from autostream.memory.budget import format_bytes
from autostream.planning.agree import check_through_store, graph_key, outcome_digest
from autostream.planning.anytime import BackgroundPlan, copy_module, fast_solve, load_cpsat
from autostream.planning.check import HandCheck, check_placement
from autostream.planning.plan import (
    MIN_RELATIVE_GAIN,
    Plan,
    PlanOptions,
    plan_graph,
    runtime_suffix,
)
from autostream.report.latest import announce
from autostream.report.summary import pass_summary
from autostream.scheduling.core_budgets import cores_missing, scope_keys
from autostream.scheduling.solvers.cpsat.cancel import (
    Cancelled,
    CancelScope,
    cancellable,
)
from autostream.scheduling.solvers.cpsat.options import CpsatOptions
from autostream.stages import StageTimes, Stopwatch, collector_paused
from autostream.version import __version__

try:  # Inductor's interface for post-grad passes (its cache keys on ``uuid()``)
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover - torch without it
    CustomGraphPass = object  # type: ignore[assignment,misc]

log = logging.getLogger("autostream")

_VERSION = "autostream-pass-2"
TORCHAIR_TARGET = "torchair"
INDUCTOR_TARGET = "inductor"
STRICT_ENV = "AUTOSTREAM_STRICT"
#: reports (and the backend's measured choices and lifts) kept by default
DEFAULT_HISTORY = 16


def strict() -> bool:
    """Whether ``AUTOSTREAM_STRICT`` asks for planning and rewrite failures to raise."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


class Outcome(enum.Enum):
    """What the pass did to one graph."""

    APPLIED = "applied"
    NO_OPS = "no ops to schedule"
    NO_PARALLELISM = "no parallelism worth a second stream"
    ONE_STREAM_TARGET = "the target runs this graph on one stream"
    HAND_TAGGED = "hand-tagged"
    UNSUPPORTED_COMPILER = "the compiler cannot run stream ops"
    PLANNING_FAILED = "planning failed"
    REWRITE_REJECTED = "rewrite rejected"

    @property
    def log_level(self) -> int:
        """INFO for the expected outcomes, WARNING for those the user should hear about.

        >>> logging.getLevelName(Outcome.PLANNING_FAILED.log_level)
        'WARNING'
        """
        quiet = (Outcome.APPLIED, Outcome.NO_OPS, Outcome.NO_PARALLELISM)
        return logging.INFO if self in quiet else logging.WARNING


@dataclass(frozen=True, repr=False)
class PassReport:
    """What one call of the pass did to one graph: the outcome, in words, and the plan.

    ``summary()`` tells it in a few lines (the repr too); ``figures()`` gives the numbers.
    """

    graph_nodes: int
    outcome: Outcome
    reason: str
    plan: Plan | None = None
    #: seconds per stage: the plan's, then rewriting and verifying the graph (``None``:
    #: the graph was not rewritten, the plan's own stages are all there is)
    stages: StageTimes | None = None
    #: for a graph that communicates: this rank's plan digest, set in the process
    #: group's store (``planning.agree``)
    rank_digest: str | None = None
    #: the ranks whose digests differ from this one's, in words (``None``: none seen)
    rank_mismatch: str | None = None
    #: the compiler mode the graph was planned for (TorchAir's ``config.mode``; ``None``:
    #: CUDA events)
    mode: str | None = None
    #: a hand-tagged graph's placement, checked (``planning.check.HandCheck``)
    check: HandCheck | None = None
    #: the dialect the graph was rewritten in: ``"torchair"``, ``"inductor"`` (Inductor's
    #: own streams) or ``None`` (unchanged; ``reason`` says why)
    target: str | None = None
    #: the device type of the graph's tensors ("" when unknown)
    device: str = ""
    #: the cost table that planned the graph, in words (``cost.label.table_label``)
    cost_table: str = ""
    #: the synchronous plan of the graph, made in a thread, when this report's plan is the
    #: fast one a compile returns with (``planning.anytime``; ``None``: this is that plan)
    background: BackgroundPlan | None = field(default=None, compare=False)
    #: the CP-SAT searches' time limit, in words ("" unless CP-SAT planned the graph)
    time_limit: str = ""

    @property
    def applied(self) -> bool:
        return self.outcome is Outcome.APPLIED

    def summary(self) -> str:
        """What was done to which graph, the plan's streams, syncs and predicted times, the
        cost table and where its costs came from, in a few lines."""
        return pass_summary(self)

    def __repr__(self) -> str:
        return f"<PassReport {self.summary()}>"

    def figures(self) -> dict[str, Any]:
        """The figures a ``--json`` output needs (the plan's, the outcome, stage seconds)."""
        out: dict[str, Any] = {"applied": self.applied, "outcome": self.outcome.value,
                               "reason": self.reason, "graph_nodes": self.graph_nodes,
                               "target": self.target, "device": self.device,
                               "cost_table": self.cost_table}
        if self.plan is not None:
            out.update(self.plan.summary())
        if self.check is not None:
            out["hand_check"] = self.check.figures()
        stages = self.stages or (self.plan.stages if self.plan is not None else None)
        if stages is not None:
            out["stage_seconds"] = stages.as_dict()
            out["pass_seconds"] = round(stages.total, 4)
        return out


def _memory_note(plan: Plan) -> str:
    m = plan.memory
    if m is None:
        return ""
    bound = (f", at most {format_bytes(m.bound_bytes)} in any interleaving"
             if m.bound_bytes > m.peak_bytes else "")
    return (f", predicted peak {format_bytes(m.peak_bytes)} ({100 * m.increase:+.1f}% over "
            f"one stream{bound})")


def hand_tagged(graph: torch.fx.Graph) -> str | None:
    """Why the graph already carries stream decisions, or ``None``."""
    for node in graph.nodes:
        if is_stream_op(node):
            return f"it already contains stream op {node.name} ({node.target})"
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and "stream" in custom:
            return f"node {node.name} is already assigned a stream in meta['custom']"
        if getattr(node.target, "namespace", None) == "streams":
            return f"it already contains native stream op {node.name}"
    return None


def load_table(cost_table: str | os.PathLike) -> TableCostModel:
    """The cost model of a shipped table name or a table file; a ``ValueError`` naming the
    table, the problem and the fix when it cannot be found, read or validated.

    >>> load_table("h2OO")
    Traceback (most recent call last):
    ...
    ValueError: cost_table='h2OO': no shipped cost table named 'h2OO'; known: ascend910b, cpu, h200 (or pass a path to a .json table). Fix: pass a shipped table's name (ascend910b, cpu, h200), the path of a table `autostream calibrate` wrote, or no cost_table for the default table of the graph's device.
    """
    try:
        return TableCostModel.load(cost_table)
    except (OSError, ValueError) as exc:
        problem = str(exc) if isinstance(exc, ValueError) else f"cannot be read: {exc}"
        raise ValueError(
            f"cost_table={os.fspath(cost_table)!r}: {problem}. Fix: pass a shipped table's "
            f"name ({', '.join(cost_models.available())}), the path of a table `autostream "
            f"calibrate` wrote, or no cost_table for the default table of the graph's "
            f"device.") from None


@dataclass(frozen=True)
class AutoStreamPass(PlanOptions, CustomGraphPass):
    """Plan streams for a post-AOT ATen graph and rewrite it in TorchAir's stream dialect.

    Call signature is TorchAir's ``(gm, example_inputs, config)``; the graph is edited
    in place.  A graph the pass cannot handle is left unchanged, with the reason
    logged and kept in ``reports`` (the last ``history`` of them).  The options are
    :class:`PlanOptions`'s, validated the same way.  ``cost_table`` (a shipped table's
    name or a table file) is loaded here: a bad one fails now; without it each graph is
    planned with the default table of its device (``autostream.cost.defaults``).

    >>> p = AutoStreamPass(max_streams=2)
    >>> p == AutoStreamPass(max_streams=2) and hash(p) == hash(AutoStreamPass(max_streams=2))
    True
    >>> AutoStreamPass(solver="magic")
    Traceback (most recent call last):
    ...
    ValueError: unknown solver 'magic'; allowed: cpsat, critical_path, heft, nimble, opara, overlap, round_robin, single, tf_greedy
    """

    # PlanOptions's fields come first (``AutoStreamPass(2, "cpsat")`` as ever); with
    # ``core_budgets`` each side stream's budget is emitted as ``limit_core_num``'s scope keys
    history: int = DEFAULT_HISTORY
    #: a hand-tagged graph gets autostream's plan instead of its own placement when that
    #: is predicted faster (else it is left unchanged, its placement checked)
    replace_hand_tags: bool = False
    #: as Inductor's ``post_grad_custom_post_pass``: plan CUDA forward/inference graphs
    #: into Inductor's own streams (``dialects.inductor``); Inductor's caches are bypassed
    #: (``uuid()`` is ``None``: a cache hit would skip the streams' registration)
    inductor_streams: bool = False
    reports: deque[PassReport] = field(init=False, compare=False, hash=False, repr=False)
    _table: TableCostModel | None = field(init=False, compare=False, hash=False, repr=False)
    _defaults: dict[str, DefaultTable] = field(init=False, compare=False, hash=False, repr=False)
    _digest: list[str] = field(init=False, compare=False, hash=False, repr=False)
    #: the digest as a code object's constant: TorchAir keys its compile cache on
    #: ``md5(dis.dis(pass))``, which shows an instance's code-valued attributes only
    _cache_key: types.CodeType = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()  # validate eagerly: bad options fail where they are written
        if not isinstance(self.inductor_streams, bool):
            raise ValueError(f"inductor_streams must be True or False, got "
                             f"{self.inductor_streams!r}; True plans CUDA graphs into "
                             f"Inductor's own streams (register the pass as Inductor's "
                             f"post_grad_custom_post_pass)")
        if isinstance(self.history, bool) or not isinstance(self.history, int) \
                or self.history < 1:
            raise ValueError(f"history must be an integer >= 1 (reports kept), got "
                             f"{self.history!r}")
        table = None if self.cost_table is None else load_table(self.cost_table)
        missing = cores_missing(table) if self.core_budgets and table is not None else None
        if missing:
            raise ValueError(f"cost_table={os.fspath(self.cost_table)!r}: {missing}")
        if not isinstance(self.replace_hand_tags, bool):
            raise ValueError(f"replace_hand_tags must be True or False, got "
                             f"{self.replace_hand_tags!r}")
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "_defaults", {})
        object.__setattr__(self, "_digest", [])
        object.__setattr__(self, "reports", deque(maxlen=self.history))
        object.__setattr__(self, "_cache_key", digest_code(self.digest()))

    def __deepcopy__(self, memo: dict) -> AutoStreamPass:
        # torch.compile deep-copies Inductor's config, pass included: the options are
        # frozen, and the reports (plans holding the graphs' fake tensors) are a log
        return self

    def options(self) -> PlanOptions:
        """The pass's :class:`PlanOptions` alone.

        >>> AutoStreamPass(max_streams=3, history=4).options()
        PlanOptions(max_streams=3, solver='cpsat', cost_table=None, time_limit=None, max_memory_increase='10%,2MiB', core_budgets=False)
        """
        return PlanOptions(**{f.name: getattr(self, f.name)
                              for f in dataclasses.fields(PlanOptions)})

    def cost_model_for(self, device_type: str, communicates: bool = False) -> TableCostModel:
        """The user's table, else the default of ``device_type`` (warning once if unmeasured);
        a graph that ``communicates`` gets the shipped default as it is, never one fitted to
        this machine, so every rank plans it from the same table."""
        if self._table is not None:
            return self._table
        key = f"{device_type}, shipped" if communicates else device_type
        if key not in self._defaults:
            self._defaults[key] = choice = default_table(device_type, fitted=not communicates)
            if choice.warning:
                log.warning("autostream: %s", choice.warning)
            missing = cores_missing(choice.model) if self.core_budgets else None
            if missing:
                log.warning("autostream: core_budgets=True, but %s graphs are planned with "
                            "the default table %r, which cannot hold them, so without core "
                            "budgets: %s", device_type, choice.name, missing)
        return self._defaults[key].model

    def digest(self) -> str:
        """A digest of the options, the cost tables' content and the package version
        (TorchAir and Inductor key their compile caches on it)."""
        if not self._digest:
            self._digest.append(self._compute_digest())
        return self._digest[0]

    def _compute_digest(self) -> str:
        if self._table is not None:
            tables = self._table.table.digest()
        else:
            tables = ",".join(f"{device}={TableCostModel.load(name).table.digest()}"
                              for device, name in sorted(DEFAULT_TABLES.items()))
        flags = ("|replace_hand_tags" if self.replace_hand_tags else "") + (
            "|inductor_streams" if self.inductor_streams else "")
        text = f"{_VERSION}|{__version__}|{self.key(tables)}{flags}"
        return hashlib.sha256(text.encode()).hexdigest()

    def uuid(self) -> str | None:
        """Inductor's ``CustomGraphPass`` identity; ``None`` with ``inductor_streams``, which
        makes Inductor's FX and AOTAutograd caches bypass the graph
        (``torch/_inductor/codecache.py:1073-1078``): on a hit the pass would not run and
        its streams would not be registered for the frame."""
        return None if self.inductor_streams else self.digest()

    @property
    def last_report(self) -> PassReport | None:
        return self.reports[-1] if self.reports else None

    def __call__(self, gm: torch.fx.GraphModule | torch.fx.Graph, example_inputs: Any = None,
                 config: Any = None) -> None:
        self.run(gm, example_inputs, torchair_mode(config))

    def run(self, gm: torch.fx.GraphModule | torch.fx.Graph, example_inputs: Any = None,
            mode: str | None = None, runtime: str | None = None) -> PassReport:
        """Apply the pass, keep and log the report, and return it.  ``mode``: TorchAir's
        ``config.mode`` (what TorchAir will do after the pass depends on it); ``runtime``:
        the runtime the costs are for (:meth:`apply`)."""
        report = dataclasses.replace(self.apply(gm, example_inputs, mode, runtime), mode=mode)
        self.reports.append(report)
        announce(report, report.outcome.log_level)
        return report

    def apply(self, gm: torch.fx.GraphModule | torch.fx.Graph, example_inputs: Any = None,
              mode: str | None = None, runtime: str | None = None,
              anytime: bool = False) -> PassReport:
        """Plan and rewrite ``gm``; never raises for a graph it cannot handle (unless strict).

        ``runtime``: the runtime the graph will run on (the backend's ``graph``, ``streams``,
        ``threads``...), which the costs are for (``cost.runtime_target``); ``None``: the
        table's own figures (TorchAir's GE and ACL graphs).

        ``anytime`` (the backend's): a graph CP-SAT would plan by its default budget gets
        the plan cache's plan if it has one, else a fast plan (``planning.anytime``) and the
        synchronous plan to make in the background (``PassReport.background``, not started).
        Graphs that communicate, TorchAir's modes, ``time_limit``, ``core_budgets`` and
        other solvers plan synchronously.

        For a graph that communicates, the plan's digest is compared with those other
        ranks have set in the process group's store, without waiting and without a
        collective (``planning.agree``); a mismatch is logged and kept in the report.
        """
        if not isinstance(gm, torch.fx.GraphModule):
            if self.inductor_streams and isinstance(gm, torch.fx.Graph) \
                    and isinstance(gm.owning_module, torch.fx.GraphModule):
                with collector_paused():
                    return self._plan_for_inductor(gm, example_inputs)
            return _unsupported(gm)
        if not has_communication(gm.graph):
            return self._plan_and_rewrite(gm, example_inputs, mode, runtime,
                                          anytime and self._plans_in_background(mode))
        # the options in the key: one process may plan a graph with several passes;
        # the table is not, so that another table on one rank shows as a mismatch
        key = graph_key(gm.graph, f"{self.key()}|{mode}")
        names = [f"{n.name}:{target_name(n)}" for n in gm.graph.nodes]
        report = self._plan_and_rewrite(gm, example_inputs, mode, runtime)
        plan = report.plan if report.applied else None
        digest = outcome_digest(names, plan.schedule if plan else None,
                                plan.syncs if plan else ())
        mismatch = check_through_store(key, digest)
        if mismatch is not None:
            log.warning("autostream: %s", mismatch)
        return dataclasses.replace(report, rank_digest=digest, rank_mismatch=mismatch)

    def _plans_in_background(self, mode: str | None) -> bool:
        """Whether a graph may get a fast plan first: CP-SAT by its default budget (an
        explicit ``time_limit`` is a budget the compile pays), CUDA events (TorchAir's GE
        compiles what the pass returns), several streams, no core budgets."""
        return (mode is None and self.solver == "cpsat" and self.time_limit is None
                and self.max_streams > 1 and not self.core_budgets)

    def _plan_and_rewrite(self, gm: torch.fx.GraphModule, example_inputs: Any = None,
                          mode: str | None = None, runtime: str | None = None,
                          anytime: bool = False) -> PassReport:
        with collector_paused():
            if anytime:
                report = self._plan_anytime(gm, example_inputs, runtime)
            else:
                report = self._plan_and_rewrite_graph(gm, example_inputs, mode, runtime)
        return self._described(report, gm, example_inputs)

    def _described(self, report: PassReport, gm: torch.fx.GraphModule,
                   example_inputs: Any) -> PassReport:
        """``report`` with the graph's device, its cost table and CP-SAT's time limit."""
        device = graph_device(gm.graph, example_inputs)
        return dataclasses.replace(report, device=device, cost_table=self.table_label(device),
                                   time_limit=self._time_limit_text(report.plan))

    def _time_limit_text(self, plan: Plan | None) -> str:
        """The time limit CP-SAT planned ``plan`` under (``CpsatOptions.seconds``), in words."""
        if plan is None or plan.schedule.solver != "cpsat":
            return ""
        if self.time_limit is not None:
            return f"{self.time_limit:g} s (time_limit)"
        seconds = CpsatOptions().seconds(len(plan.problem.graph))
        return f"{seconds:.2f} s (by the graph's size: no time_limit)"

    def table_label(self, device_type: str) -> str:
        """The cost table of graphs on ``device_type``, in words (``cost.label.table_label``)."""
        try:
            model = self.cost_model_for(device_type)
        except Exception:  # a default table that cannot load: the report says so
            return "(none could be loaded)"
        return table_label(model, self.cost_table, device_type)

    def _plan_anytime(self, gm: torch.fx.GraphModule, example_inputs: Any,
                      runtime: str | None) -> PassReport:
        """The plan with every CP-SAT solve answered by the plan cache, else by the fast
        solver; when one was, the synchronous plan of a copy of the graph (taken before the
        rewrite), to make in the background."""
        pristine = copy_module(gm)
        scope = CancelScope(fallback=fast_solve)
        with cancellable(scope):
            report = self._plan_and_rewrite_once(gm, example_inputs, None, runtime)
        if not scope.missed:
            return report  # the synchronous plan, from the cache
        job = BackgroundPlan(functools.partial(self._plan_in_thread, pristine, example_inputs,
                                               runtime), pristine, load_cpsat)
        return dataclasses.replace(report, background=job)

    def _plan_in_thread(self, gm: torch.fx.GraphModule, example_inputs: Any,
                        runtime: str | None) -> PassReport:
        """What a synchronous compile gives ``gm``: the background plan."""
        report = self._plan_and_rewrite_once(gm, example_inputs, None, runtime)
        return self._described(report, gm, example_inputs)

    def _plan_and_rewrite_graph(self, gm: torch.fx.GraphModule, example_inputs: Any,
                                mode: str | None = None, runtime: str | None = None
                                ) -> PassReport:
        if mode != GE_MODE:
            return self._plan_and_rewrite_once(gm, example_inputs, mode, runtime)
        packed = symbolic_size_lists(gm)
        if packed and not hand_tagged(gm.graph):
            return PassReport(len(gm.graph.nodes), Outcome.ONE_STREAM_TARGET,
                              f"left unchanged: GE packs the symbolic size lists of "
                              f"{', '.join(packed[:3])}{' ...' * (len(packed) > 3)} on the "
                              f"main stream wherever they run (docs/torchair.md); "
                              f"mark fewer sizes dynamic or use the ACL graph")
        # GE reads symbolic inputs through sym_size ops it adds after the pass on the main
        # stream: added here instead, one per user, they are planned like any op
        reads = symbolic_inputs_as_sizes(gm)
        report = self._plan_and_rewrite_once(gm, example_inputs, mode, runtime)
        if not report.applied:
            reads.undo(gm)
        return report

    def _plan_and_rewrite_once(self, gm: torch.fx.GraphModule, example_inputs: Any,
                               mode: str | None = None, runtime: str | None = None
                               ) -> PassReport:
        nodes = len(gm.graph.nodes)
        tagged = hand_tagged(gm.graph)
        if tagged:
            return self._hand_tagged(gm, example_inputs, mode, tagged)
        try:
            costs = self.cost_model_for(graph_device(gm.graph, example_inputs),
                                        has_communication(gm.graph))
            acl = mode in ACL_MODES
            plan = plan_graph(gm, self.options(), costs,
                              acl_reinplace_hazards if acl else
                              ge_output_ref_edges if mode == GE_MODE else None,
                              acl_scope_overhead_us(costs.sync_latency_us) if acl else 0.0,
                              GE_PLACEMENT if mode == GE_MODE else None, runtime)
        except Cancelled:  # a background plan dropped: not a failure
            raise
        except Exception as exc:  # the pass must never break compilation
            return _failed(nodes, Outcome.PLANNING_FAILED, exc)
        if plan.op_graph.number_of_nodes() == 0:
            return PassReport(nodes, Outcome.NO_OPS,
                              "left unchanged: the graph has no ops to schedule", plan)
        if not plan.changes_graph:
            why = plan.notes[0] if plan.notes else Outcome.NO_PARALLELISM.value
            return PassReport(nodes, Outcome.NO_PARALLELISM, f"left unchanged: {why}", plan)
        snap = snapshot(gm.graph)
        watch = Stopwatch()
        try:
            rewrite_graph(gm, plan.schedule, plan.syncs,
                          join_before_last=mode == GE_MODE and not plan.is_single_stream,
                          core_scopes={s: scope_keys(b, costs.profile.cores)
                                       for s, b in plan.core_budgets.items()})
            watch.lap("rewrite")
            verify_rewrite(gm, plan.op_graph, mode).raise_if_failed()
            watch.lap("verify")
        except Exception as exc:
            restore(gm.graph, snap)
            gm.recompile()
            return _failed(nodes, Outcome.REWRITE_REJECTED, exc, plan)
        stages = plan.stages.plus(**dataclasses.asdict(watch.times()))
        return PassReport(nodes, Outcome.APPLIED, _applied_reason(plan), plan, stages,
                          target=TORCHAIR_TARGET)

    def _plan_for_inductor(self, graph: torch.fx.Graph, example_inputs: Any) -> PassReport:
        from autostream.dialects import inductor

        gm = graph.owning_module
        nodes = len(graph.nodes)
        tagged = hand_tagged(graph)
        if tagged:
            return PassReport(nodes, Outcome.HAND_TAGGED,
                              f"left unchanged: {tagged} (hand-tagged graphs are respected)")
        device = graph_device(graph, example_inputs)
        why = self._inductor_refusal(graph, device)
        if why:
            return PassReport(nodes, Outcome.UNSUPPORTED_COMPILER, f"left unchanged: {why}")
        try:
            costs = FusedCosts(self.cost_model_for(device), graph)
            plan = plan_graph(gm, self.options(), costs)
        except Exception as exc:  # the pass must never break compilation
            return _failed(nodes, Outcome.PLANNING_FAILED, exc)
        if plan.op_graph.number_of_nodes() == 0:
            return PassReport(nodes, Outcome.NO_OPS,
                              "left unchanged: the graph has no ops to schedule", plan)
        if plan.is_single_stream:
            why = plan.notes[0] if plan.notes else Outcome.NO_PARALLELISM.value
            return PassReport(nodes, Outcome.NO_PARALLELISM, f"left unchanged: {why}", plan)
        snap = snapshot(graph)
        watch = Stopwatch()
        try:
            indices = inductor.register_streams(_graph_device_object(graph, device),
                                                plan.schedule.streams_used - 1)
            done = inductor.rewrite_for_inductor(gm, plan.schedule, plan.syncs, indices)
            watch.lap("rewrite")
        except Exception as exc:
            restore(graph, snap)
            gm.recompile()
            return _failed(nodes, Outcome.REWRITE_REJECTED, exc, plan)
        stages = plan.stages.plus(**dataclasses.asdict(watch.times()))
        split = split_fusions(costs.fused, plan.schedule.stream_of)
        fused = (f"{len(costs.fused)} pointwise ops costed as fused into their producers"
                 + (f" ({len(split)} split across streams: unfused)" if split else ""))
        return PassReport(nodes, Outcome.APPLIED, f"Inductor streams: {done.summary()}; "
                          f"{fused}; " + _applied_reason(plan), plan, stages,
                          target=INDUCTOR_TARGET)

    def _inductor_refusal(self, graph: torch.fx.Graph, device: str) -> str | None:
        """Why Inductor cannot run this graph on streams (``dialects.inductor.refusal``)."""
        from autostream.dialects import inductor

        if has_communication(graph):
            return ("graphs with collectives are not planned into Inductor streams; use "
                    "backend='autostream' for them")
        return inductor.refusal(graph, device)

    def _hand_tagged(self, gm: torch.fx.GraphModule, example_inputs: Any, mode: str | None,
                     tagged: str) -> PassReport:
        """A hand-tagged graph: its placement checked (a race is a WARNING naming the ops and
        their source lines); replaced by autostream's plan only with ``replace_hand_tags``
        and when that is predicted faster."""
        nodes = len(gm.graph.nodes)
        reason = f"left unchanged: {tagged} (hand-tagged graphs are respected)"
        target = "ge" if mode == GE_MODE else "acl" if mode in ACL_MODES else "cuda"
        try:
            device = graph_device(gm.graph, example_inputs)
            costs = self.cost_model_for(device)
            checked = check_placement(gm, target, self.options(), costs,
                                      cost_table=self.table_label(device))
        except Exception as exc:  # the check must never break compilation
            if strict():
                raise
            return PassReport(nodes, Outcome.HAND_TAGGED, f"{reason}; the placement could not "
                              f"be checked: {type(exc).__name__}: {exc}")
        for race in checked.races:
            log.warning("autostream: hand placement race: %s", race.describe())
        found = (f"{len(checked.races)} race(s), {len(checked.problems)} other problem(s), "
                 f"{checked.dependences_checked} dependences checked; predicted "
                 f"{checked.hand_us:.1f} us as placed, {checked.autostream_us:.1f} us "
                 f"autostream's plan, {checked.single_stream_us:.1f} us one stream"
                 + "".join(f"; race: {r.describe()}" for r in checked.races[:3]))
        plan = checked.plan
        faster = plan.predicted_us < checked.hand_us * (1 - MIN_RELATIVE_GAIN)
        if not (self.replace_hand_tags and faster):
            return PassReport(nodes, Outcome.HAND_TAGGED, f"{reason}; checked: {found}",
                              check=checked)
        snap = snapshot(gm.graph)
        try:
            strip_stream_ops(gm)
            if plan.changes_graph:
                rewrite_graph(gm, plan.schedule, plan.syncs,
                              join_before_last=mode == GE_MODE and not plan.is_single_stream,
                              core_scopes={s: scope_keys(b, costs.profile.cores)
                                           for s, b in plan.core_budgets.items()})
                verify_rewrite(gm, plan.op_graph, mode).raise_if_failed()
        except Exception as exc:
            restore(gm.graph, snap)
            gm.recompile()
            if strict():
                raise
            return PassReport(nodes, Outcome.HAND_TAGGED, f"{reason}; replacing it failed: "
                              f"{type(exc).__name__}: {exc}", check=checked)
        return PassReport(nodes, Outcome.APPLIED, f"hand placement replaced "
                          f"(replace_hand_tags; it had {found}): " + _applied_reason(plan),
                          plan, check=checked)


def digest_code(digest: str) -> types.CodeType:
    """A code object whose disassembly shows ``digest`` (what ``dis.dis`` of the pass prints).

    >>> import dis, io
    >>> out = io.StringIO(); dis.dis(digest_code("abc123"), file=out)
    >>> "'autostream abc123'" in out.getvalue()
    True
    """
    return compile(repr(f"autostream {digest}"), "<autostream pass digest>", "eval")


def _applied_reason(plan: Plan) -> str:
    n = len(plan.syncs)
    what = ("collectives overlapped on one stream" if plan.reorders else
            f"{plan.schedule.streams_used} streams, {n} sync{'s' * (n != 1)}")
    budgets = "".join(f", stream {s} on {b:g} of the chip" for s, b in plan.core_budgets.items())
    return (f"{what}{budgets}, predicted {plan.predicted_us:.1f} us vs "
            f"{plan.single_stream_us:.1f} us on one stream ({plan.predicted_speedup:.2f}x"
            f"{runtime_suffix(plan.runtime)})"
            + _memory_note(plan))


def _failed(nodes: int, outcome: Outcome, exc: Exception, plan: Plan | None = None
            ) -> PassReport:
    if strict():
        raise exc
    log.debug("autostream: %s", outcome.value, exc_info=True)
    return PassReport(nodes, outcome,
                      f"left unchanged: {outcome.value}: {type(exc).__name__}: {exc}", plan)


def _unsupported(graph: Any) -> PassReport:
    if not isinstance(graph, torch.fx.Graph):
        raise TypeError(f"AutoStreamPass takes a torch.fx.GraphModule (TorchAir) or a "
                        f"torch.fx.Graph (Inductor), not {type(graph).__name__}")
    return PassReport(
        len(graph.nodes), Outcome.UNSUPPORTED_COMPILER,
        "left unchanged: Inductor cannot run autostream's stream ops (TorchAir's "
        "scope/record/wait ops); on CUDA register AutoStreamPass(inductor_streams=True) as "
        "post_grad_custom_post_pass for Inductor's own streams, use torch.compile(model, "
        "backend='autostream') on CPU or CUDA, or register the pass with TorchAir on Ascend")


def _graph_device_object(graph: torch.fx.Graph, device_type: str) -> torch.device:
    """The device (with its index) of the graph's first tensor input."""
    for node in graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device(device_type)
