"""What ``autostream.backend`` did to one graph Dynamo compiled: the pass's reports, where
the plan runs, and what was measured and kept.

The report is live: while the backend measures, ``summary()`` says so; once the choice is
made it gives the measured times and the variant kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autostream.summaries import outcome_text, plan_lines

if TYPE_CHECKING:
    from autostream.passes import Outcome, PassReport
    from autostream.planning.lift import LiftedPlan, LiftError
    from autostream.planning.plan import Plan
    from autostream.runtime.choice import MeasuredChoice


#: a cost table whose single-stream prediction is this many times off the measured eager
#: graph is told to be far from this machine (a warning)
FAR = 3.0


@dataclass(eq=False, repr=False)
class BackendReport:
    """One Dynamo graph: its pass reports (one per AOT graph: the forward, and the
    backward when compiled for training), the lift, and the measured choice.

    ``summary()`` tells it in a few lines; ``plan``, ``applied``, ``outcome`` and ``reason``
    are those of the pass report that counts (the last applied one, else the last).
    """

    graph_nodes: int
    device: str
    training: bool
    passes: list[PassReport] = field(default_factory=list)
    lift: LiftedPlan | LiftError | None = None
    choice: MeasuredChoice | None = None
    #: what runs when nothing is measured, and why nothing is (``choice`` is then ``None``)
    kept: str = ""
    not_measured: str = ""

    @property
    def pass_report(self) -> PassReport | None:
        applied = [r for r in self.passes if r.applied]
        return (applied or self.passes or [None])[-1]

    @property
    def plan(self) -> Plan | None:
        r = self.pass_report
        return None if r is None else r.plan

    @property
    def applied(self) -> bool:
        r = self.pass_report
        return r is not None and r.applied

    @property
    def outcome(self) -> Outcome | None:
        r = self.pass_report
        return None if r is None else r.outcome

    @property
    def reason(self) -> str:
        r = self.pass_report
        return "" if r is None else r.reason

    @property
    def log_level(self) -> int:
        return max((r.outcome.log_level for r in self.passes), default=logging.INFO)

    def summary(self) -> str:
        """What was done to which graph, the streams, predicted and measured times, the
        variant kept and why, and the cost table, in a few lines."""
        mode = "training" if self.training else "inference"
        head = (f"autostream backend, Dynamo graph of {self.graph_nodes} nodes "
                f"({self.device}, {mode})")
        main = self.pass_report
        if main is None:
            return f"{head}: no graph reached the pass"
        lines = [f"{head}: {outcome_text(main)}"]
        if len(self.passes) > 1:
            names = ("forward", "backward")
            lines += [f"  {names[i] if i < 2 else f'graph {i}'} ({r.graph_nodes} nodes): "
                      f"{outcome_text(r)}" for i, r in enumerate(self.passes)]
        lines += [f"  {line}" for line in plan_lines(main)]
        if self.lift is not None:
            where = (self.lift.describe() if hasattr(self.lift, "describe")
                     else f"plan kept on the ATen graph: {self.lift}")
            lines.append(f"  {where}")
        lines.append(f"  {self.measured_line()}")
        return "\n".join(lines)

    def measured_line(self) -> str:
        """The measured choice in words (or why nothing was measured, and what runs)."""
        if self.choice is not None:
            gap = self.prediction_check()
            return self.choice.describe() + (f"; {gap[0]}" if gap else "")
        return f"not measured: {self.not_measured}; runs {self.kept}"

    def prediction_check(self) -> tuple[str, bool] | None:
        """The cost table's single-stream prediction against the measured eager graph, in
        words, and whether they are more than ``FAR`` times apart (``None`` until measured).
        """
        timings = self.choice.timings if self.choice is not None else {}
        plan = self.lift if hasattr(self.lift, "single_stream_us") else self.plan
        if "eager" not in timings or plan is None or plan.single_stream_us <= 0:
            return None
        predicted, measured = plan.single_stream_us, timings["eager"].median * 1e6
        factor = max(predicted / measured, measured / predicted)
        text = (f"one stream predicted {predicted:.0f} us, measured {measured:.0f} us "
                f"({predicted / measured:.2f}x)")
        return text, factor > FAR

    def __repr__(self) -> str:
        return f"<BackendReport {self.summary()}>"

    def figures(self) -> dict[str, Any]:
        """The pass report's figures, with the measured choice's."""
        main = self.pass_report
        out = main.figures() if main is not None else {}
        if self.choice is not None:
            out["measured_us"] = {n: round(t.median * 1e6, 1)
                                  for n, t in self.choice.timings.items()}
            out["kept"] = self.choice.choice
            out["calls_to_decision"] = self.choice.calls_to_decision
        else:
            out["kept"] = self.kept
        return out
