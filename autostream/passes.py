"""The user-facing FX pass: ``config.post_grad_custom_pre_pass = autostream.AutoStreamPass()``."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from autostream.budget import DEFAULT_MAX_MEMORY_INCREASE, format_bytes
from autostream.comm import has_communication
from autostream.comm.agree import outcome_digest, rank_disagreement
from autostream.dialects.torchair import is_stream_op
from autostream.graph import target_name
from autostream.planning import Plan, PlanOptions, plan_graph
from autostream.rewrite import restore, rewrite_graph, snapshot
from autostream.stages import StageTimes, Stopwatch
from autostream.verify import verify_rewrite

log = logging.getLogger("autostream")

_VERSION = "autostream-pass-1"


@dataclass(frozen=True)
class PassReport:
    """What one call of the pass did to one graph."""

    graph_nodes: int
    applied: bool
    reason: str
    plan: Plan | None = None
    #: seconds per stage: the plan's, then rewriting and verifying the graph (``None``:
    #: the graph was not rewritten, the plan's own stages are all there is)
    stages: StageTimes | None = None
    #: for a graph that communicates: the digest every rank compared (``comm.agree``)
    rank_digest: str | None = None

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"applied": self.applied, "reason": self.reason, "graph_nodes": self.graph_nodes}
        if self.plan is not None:
            out.update(self.plan.summary())
        stages = self.stages or (self.plan.stages if self.plan is not None else None)
        if stages is not None:
            out["stage_seconds"] = stages.as_dict()
            out["pass_seconds"] = round(stages.total, 4)
        return out


def _memory_note(plan: Plan) -> str:
    m = plan.memory
    if m is None:
        return ""
    return (f", predicted peak {format_bytes(m.peak_bytes)} ({100 * m.increase:+.1f}% over "
            "one stream)")


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


@dataclass(frozen=True)
class AutoStreamPass:
    """Plan streams for a post-AOT ATen graph and rewrite it in TorchAir's stream dialect.

    Call signature is TorchAir's ``(gm, example_inputs, config)``; the graph is edited
    in place.  A graph the pass cannot handle is left unchanged, with the reason
    logged and kept in ``reports``.

    >>> p = AutoStreamPass(max_streams=2)
    >>> p == AutoStreamPass(max_streams=2) and hash(p) == hash(AutoStreamPass(max_streams=2))
    True
    >>> AutoStreamPass(solver="magic")
    Traceback (most recent call last):
    ...
    ValueError: unknown solver 'magic'; allowed: cpsat, critical_path, heft, nimble, opara, round_robin, single, tf_greedy
    """

    max_streams: int = 2
    solver: str = "cpsat"
    cost_table: str | None = None
    time_limit: float | None = None
    #: a fraction of the single-stream peak (``0.1``), a size (``"512MiB"``) or both
    #: (``"10%,2MiB"``: the larger); ``None``: no budget (``autostream.budget``)
    max_memory_increase: float | str | None = DEFAULT_MAX_MEMORY_INCREASE
    reports: list[PassReport] = field(default_factory=list, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        self.options()  # validate eagerly: bad options fail where they are written

    def options(self) -> PlanOptions:
        return PlanOptions(self.max_streams, self.solver, self.cost_table, self.time_limit,
                           self.max_memory_increase)

    def digest(self) -> str:
        """A stable digest of the options (TorchAir hashes passes into its cache key)."""
        text = (f"{_VERSION}|{self.max_streams}|{self.solver}|{self.cost_table}|{self.time_limit}"
                f"|{self.max_memory_increase!r}")
        return hashlib.sha256(text.encode()).hexdigest()

    def uuid(self) -> str:
        """Inductor's ``CustomGraphPass`` identity."""
        return self.digest()

    @property
    def last_report(self) -> PassReport | None:
        return self.reports[-1] if self.reports else None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any = None, config: Any = None) -> None:
        report = self.apply(gm)
        self.reports.append(report)
        hand_tagged_graph = "hand-tagged" in report.reason
        log.log(logging.WARNING if hand_tagged_graph else logging.INFO, "autostream pass on %d-node graph: %s", report.graph_nodes, report.reason)

    def apply(self, gm: torch.fx.GraphModule) -> PassReport:
        """Plan and rewrite ``gm``; never raises for a graph it cannot handle.

        A graph that communicates is rewritten only if every rank decided the same
        (``comm.agree``); else every rank leaves it unchanged.
        """
        if not has_communication(gm.graph):
            return self._plan_and_rewrite(gm)
        snap = snapshot(gm.graph)
        report = self._plan_and_rewrite(gm)
        plan = report.plan if report.applied else None
        digest = outcome_digest((f"{n.name}:{target_name(n)}" for n in snap.order),
                                plan.schedule if plan else None, plan.syncs if plan else ())
        why = rank_disagreement(digest)
        if why is None:
            return dataclasses.replace(report, rank_digest=digest)
        log.warning("autostream: %s", why)
        if report.applied:
            restore(gm.graph, snap)
            gm.recompile()
        return PassReport(report.graph_nodes, False, f"left unchanged: {why}", report.plan,
                          rank_digest=digest)

    def _plan_and_rewrite(self, gm: torch.fx.GraphModule) -> PassReport:
        nodes = len(gm.graph.nodes)
        tagged = hand_tagged(gm.graph)
        if tagged:
            return PassReport(nodes, False, f"left unchanged: {tagged} (hand-tagged graphs are respected)")
        snap = snapshot(gm.graph)
        try:
            plan = plan_graph(gm, self.options())
        except Exception as exc:  # the pass must never break compilation
            log.debug("planning failed", exc_info=True)
            return PassReport(nodes, False, f"left unchanged: planning failed: {type(exc).__name__}: {exc}")
        if plan.op_graph.number_of_nodes() == 0:
            return PassReport(nodes, False, "left unchanged: the graph has no ops to schedule", plan)
        if plan.is_single_stream:
            why = plan.notes[0] if plan.notes else "no parallelism worth a second stream"
            return PassReport(nodes, False, f"left unchanged: {why}", plan)
        watch = Stopwatch()
        try:
            rewrite_graph(gm, plan.schedule, plan.syncs)
            watch.lap("rewrite")
            verify_rewrite(gm, plan.op_graph).raise_if_failed()
            watch.lap("verify")
        except Exception as exc:
            restore(gm.graph, snap)
            gm.recompile()
            log.debug("rewrite failed", exc_info=True)
            return PassReport(nodes, False, f"left unchanged: rewrite rejected: {type(exc).__name__}: {exc}", plan)
        stages = plan.stages.plus(**dataclasses.asdict(watch.times()))
        return PassReport(
            nodes,
            True,
            f"{plan.schedule.streams_used} streams, {len(plan.syncs)} syncs, predicted "
            f"{plan.predicted_us:.1f} us vs {plan.single_stream_us:.1f} us on one stream "
            f"({plan.predicted_speedup:.2f}x)" + _memory_note(plan),
            plan,
            stages,
        )
