"""``torch.compile`` backends: ``backend="autostream"`` and ``autostream.backend(**options)``."""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from autostream.comm import has_communication
from autostream.cost.label import table_mismatch
from autostream.cost.runtime_target import DEVICE_RUNTIMES, RuntimeCosts, for_runtime
from autostream.dialects.reinplace import reinplace_all_reduces
from autostream.fx.call_effects import EffectsUnknown, aot_mutated_inputs
from autostream.passes import AutoStreamPass, Outcome, PassReport, graph_device, strict
from autostream.planning.anytime import BackgroundPlan, anytime_from_environment
from autostream.planning.lift import LiftedPlan, LiftError, lift_plan
from autostream.planning.plan import Plan
from autostream.report.latest import announce, tell
from autostream.report.summary import outcome_text, plan_lines
from autostream.runtime.baseline import baseline_text, eager_candidates, fastest_single
from autostream.runtime.capturable import capture_refusal
from autostream.runtime.choice import MeasuredChoice
from autostream.runtime.graphed import check_output_policy
from autostream.runtime.machine import read as read_machine
from autostream.runtime.sanitizer import SanitizerConfig
from autostream.runtime.select import (
    check_runtime_device,
    check_runtime_name,
    make_runner,
    select_runtime,
)
from autostream.runtime.switch import PlanLog, PlanSwitch, compiling

#: Single-stream alternatives the backend can measure the plan against.
FALLBACKS = ("eager", "inductor")

log = logging.getLogger("autostream")


class _Slot:
    """The runner an AOT graph's compiled function calls; a background plan swaps it."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class _Lazy:
    """A runner built on its first call (a lifted plan usually makes it unused)."""

    def __init__(self, build: Callable[[], Callable[..., Any]]):
        self._build = build
        self._runner: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self._runner is None:
            self._runner = self._build()
        return self._runner(*args)


def backend(runtime: str = "auto", sanitize: bool = False, measure: int = 5,
            fallback: str = "eager", deterministic: bool = False,
            graph_outputs: str = "fresh", **options: Any) -> Callable:
    """A ``torch.compile`` backend that plans streams and runs the rewritten graph.

    ``runtime`` is ``"auto"`` (on CUDA and NPU the plan captured into a device graph
    where the graph can be captured, else device streams; threads on CPU), ``"graph"``,
    ``"threads"``, ``"streams"`` or ``"sequential"``; ``sanitize`` turns on the
    threads runtime's race sanitizer.  On the graph runtime (``runtime.graphed``) the
    single-stream candidate is Dynamo's graph captured the same way (the *one-stream
    graph*): a plan is kept only when it beats that, never merely eager; a graph that
    cannot be captured (host syncs, collectives, autograd: ``runtime.capturable``) runs
    on device streams, and the report says why.  ``graph_outputs``: ``"fresh"`` (new
    tensors each call) or ``"reused"`` (the graph's own, overwritten by the next call).
    ``measure`` (default 5): for an applied plan,
    the first calls time the multi-stream plan and Dynamo's eager graph in ``measure``
    interleaved rounds (a warm-up and a timed call each per round: ``2 * measure``
    calls per candidate), and every later call uses the plan only if it measured at
    least 5% faster than the fallback, the spread of the rounds included; the choice
    is re-checked now and then (``runtime.choice.MeasuredChoice``); 0 trusts the plan
    without measuring.  On the threads runtime eager is also measured at the fewer intra-op
    threads the plan's streams use (``"eager (1 thread)"``...: ``runtime.baseline``; not with
    ``deterministic=True``), and the report names the fastest single stream and the
    machine's load (figures timed while it was busy are marked unreliable).  Graphs compiled for autograd (grad enabled and a parameter or
    input requires grad) keep the plan unmeasured.  A graph that communicates is never measured: it
    keeps the plan when one was applied, else the fallback (ranks would time it
    differently, and agreeing would take a collective of the library's own).
    ``fallback="inductor"`` also compiles the graph with Inductor (``torch.compile``'s
    default compiler; seconds of compilation per graph) and measures it too: the backend then keeps the fastest
    of plan, eager graph and Inductor, and never loses to plain ``torch.compile``
    by more than the measurement noise; on the graph runtime Inductor compiles with CUDA
    graphs (``mode="reduce-overhead"``), and a plan that measured slower than it is never
    kept.  ``deterministic=True``: the threads runtime
    runs every op, on every stream, with the intra-op thread count eager would give
    it (the caller's ``torch.get_num_threads()``), so reductions split their work as
    eager does and the outputs are bit for bit those of Dynamo's graph run on one
    thread (the sequential runtime); by default streams divide the caller's threads,
    and a reduction may then differ in its last bits (``docs/correctness.md``).
    ``options`` are ``AutoStreamPass`` options
    (``max_streams``, ``solver``, ``cost_table``, ``time_limit``,
    ``max_memory_increase``: the memory budget, ``autostream.memory.budget``; ``history``).
    Every option is checked here: a bad value, an unknown option, a cost table that
    cannot be loaded or ``sanitize`` with a runtime it cannot check raise a
    ``ValueError`` naming the option and the fix.  ``runtime="streams"`` with CPU
    inputs fails when the graph compiles.  The pass object, with its reports, is
    ``backend(...).autostream_pass``; ``backend(...).last_report`` tells what the last
    compiled graph got (``BackendReport.summary()``).

    A functional all-reduce whose input no other op can see runs in place, as
    hand-written code does (``autostream.dialects.reinplace``).

    The compile returns with a plan at once (``planning.anytime``): each CP-SAT solve is
    answered by the plan cache, else by the best of HEFT and the cheap baselines; CP-SAT
    then plans the graph in a background thread from a later call, once no graph has
    compiled for a quarter of a second, and its plan (the one a synchronous compile gives,
    stored in the plan cache for the next process) takes over between two calls where it
    is predicted faster than the fast plan, re-measured alone against the one-stream
    candidates (``runtime.switch``; ``BackendReport.anytime`` says which plan ran which
    calls).  Graphs compiled for autograd or that communicate, an explicit ``time_limit``,
    ``core_budgets``, other solvers and ``AUTOSTREAM_ANYTIME=off`` plan synchronously; with
    ``AUTOSTREAM_STRICT=1`` a failed background plan raises at the graph's next call.

    For inference graphs the plan, made on the ATen graph, is lifted to the graph
    Dynamo captured (``autostream.planning.lift``): the streams then run the calls eager mode
    makes, without AOTAutograd's decompositions and wrappers.  Where lifting is
    refused (calls whose effects cannot be established, calls that change the
    thread's state) the ATen graph runs.  One entry per applied plan, a
    ``LiftedPlan`` or the ``LiftError`` saying why not, is kept in
    ``backend(...).lifts``; ``backend(...).measured_choices`` and ``lifts`` keep the
    last ``history`` entries (default 16), like the pass's ``reports``.

    >>> model = torch.nn.Linear(4, 4)
    >>> compiled = torch.compile(model, backend=backend(max_streams=2))
    >>> compiled(torch.randn(2, 4)).shape
    torch.Size([2, 4])
    """
    _check_options(runtime, sanitize, measure, fallback, deterministic, options)
    check_output_policy(graph_outputs, "graph_outputs")
    stream_pass = AutoStreamPass(**options)
    choices: deque[MeasuredChoice] = deque(maxlen=stream_pass.history)
    lifts: deque[LiftedPlan | LiftError] = deque(maxlen=stream_pass.history)
    reports: list[PassReport] = []  # the current compile's, one per AOT graph
    slots: list[_Slot] = []  # the current compile's runners of its AOT graphs
    warned: set[str] = set()  # device types told their table was made for another kind
    # the current compile's report (one graph compiles at a time): its runtime and graph runners
    current: dict[str, BackendReport] = {}

    def runner(gm: torch.fx.GraphModule, kind: str, graphs: list[tuple[str, Any]],
               label: str = "plan") -> Callable[..., Any]:
        """The runner of ``kind``; a graph runner joins ``graphs`` (its compile's report)."""
        if kind != "graph":
            return make_runner(gm, kind, sanitize=sanitize, deterministic=deterministic)
        built = make_runner(gm, "graph", outputs=graph_outputs)
        graphs.append((label, built))
        return built

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        reinplace_all_reduces(gm)
        now = current["report"]  # set by compile_fn, around AOT
        kind, graphs = now.runtime, now.graph_runners
        report = stream_pass.apply(gm, example_inputs, runtime=kind,  # told in the report
                                   anytime=not now.training and anytime_from_environment())
        stream_pass.reports.append(report)
        reports.append(report)
        slots.append(_Slot(aten_runner(gm, report, kind, graphs)))
        return make_boxed_func(slots[-1])

    def aten_runner(gm: torch.fx.GraphModule, report: PassReport, kind: str,
                    graphs: list[tuple[str, Any]], label: str = "plan") -> Callable[..., Any]:
        """What runs the ATen graph ``report`` planned."""
        if not report.applied or report.plan.is_single_stream:
            return gm.forward  # one stream (maybe reordered): runs as is
        return _Lazy(lambda: runner(gm, kind, graphs, label))

    def lifted_runner(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], plan,
                      now: BackendReport, label: str = "plan") -> Callable | None:
        """The plan on Dynamo's graph, or ``None`` (then the ATen graph runs)."""
        try:
            costs = RuntimeCosts.of(for_runtime(
                stream_pass.cost_model_for(graph_device(gm.graph, example_inputs),
                                         has_communication(gm.graph)),
                now.runtime))
            lifted = lift_plan(gm, plan, costs, mutated_inputs=aot_mutated_inputs(gm))
        except (LiftError, EffectsUnknown) as exc:
            why = exc if isinstance(exc, LiftError) else LiftError(str(exc))
            lifts.append(why)  # told in the backend's report
            return None
        except Exception as exc:  # a bug: visible, and never a broken compilation
            if strict():
                raise
            why = LiftError(f"lifting failed ({type(exc).__name__}: {exc})")
            lifts.append(why)
            log.warning("autostream: plan kept on the ATen graph: %s", why)
            return None
        lifts.append(lifted)  # told in the backend's report
        if lifted.streams_used <= 1 and now.runtime != "graph":
            return lifted.gm.forward
        return runner(lifted.gm, now.runtime, now.graph_runners, label)

    aot_compile = aot_autograd(fw_compiler=compiler, bw_compiler=compiler, inference_compiler=compiler)

    def compile_fn(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        device = graph_device(gm.graph, example_inputs)
        check_runtime_device(runtime, device)
        warn_table_device(stream_pass, device, warned)
        reports.clear()
        slots.clear()
        training = _needs_autograd(gm, example_inputs)
        report = BackendReport(len(gm.graph.nodes), device, training)
        report.runtime, report.capture_refused = _runtime_for(runtime, gm, example_inputs,
                                                              device, training)
        current["report"] = report
        with compiling():  # no background plan starts meanwhile
            compiled = aot_compile(gm, example_inputs)
            report.passes = list(reports)
            fn = choose(gm, example_inputs, compiled, report)
            job = report.pass_report.background if report.pass_report is not None else None
            if job is not None:
                fn = switching(gm, example_inputs, compiled, fn, job, report, slots[-1])
        compile_fn.last_report = report
        announce(report, report.log_level)
        return _holding(fn, report)

    def choose(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], compiled: Callable,
               report: BackendReport) -> Callable:
        """What runs the graph: the plan, a single-stream graph, or a measured choice."""
        applied = report.applied
        plan_runs = "the plan (multi-stream)" if applied else "the graph as compiled"
        if report.training:
            report.kept = plan_runs
            report.not_measured = ("compiled for autograd (grad enabled and a parameter or "
                                   "input requires grad); call under torch.no_grad() or "
                                   "torch.inference_mode() to measure")
            return compiled
        # after AOT, whose functionalization refuses in-place collectives: the lifted
        # plan and the eager candidate run this graph
        reinplace_all_reduces(gm)
        if applied:
            lifted = lifted_runner(gm, example_inputs, report.plan, report)
            report.lift = lifts[-1] if lifts else None
            compiled = lifted or compiled
        if not report.passes:
            report.kept, report.not_measured = plan_runs, "no graph reached the pass"
            return compiled
        if applied and measure == 0:
            report.kept, report.not_measured = "the plan", "measure=0 trusts the plan"
            return compiled
        # Dynamo's graph calls the original (eager) ops, which skips AOTAutograd's
        # decompositions and per-call wrappers; Inductor is compiled only when used.
        if has_communication(gm.graph):
            # by prediction: timings differ per rank, and agreeing on them would take a
            # collective of our own (docs/distributed.md)
            report.kept = "the plan" if applied else fallback
            report.not_measured = "the graph communicates: kept by prediction"
            if applied:
                return compiled
            return _inductor(gm, example_inputs) if fallback == "inductor" else gm.forward
        singles: dict[str, Callable] = {}
        default = fallback
        if report.runtime == "graph":  # the strongest single-stream baseline
            graphs = report.graph_runners  # this compile's: the runner is built on first call
            singles["graph1"] = _Lazy(lambda: runner(gm, "graph", graphs, "one-stream graph"))
            default = "graph1"
        singles["eager"] = gm.forward
        if applied:  # eager at the plan's other thread counts (runtime/baseline.py)
            singles.update(eager_candidates(gm.forward, report.runtime, report.streams_used,
                                            deterministic))
        if fallback == "inductor":  # on the graph runtime, Inductor with CUDA graphs too
            singles["inductor"] = _inductor(
                gm, example_inputs, "reduce-overhead" if report.runtime == "graph" else "default",
                report.device, graph_outputs)
        if not applied and (len(singles) == 1 or measure == 0):
            report.kept, report.not_measured = default, "no plan to measure"
            return singles[default]
        report.baselines = tuple(singles)
        plan_name = _plan_name(report)
        candidates = {plan_name: compiled, **singles} if applied else singles
        floors = {plan_name: "inductor"} if applied and fallback == "inductor" else None
        choice = MeasuredChoice(candidates, trials=measure, default=default,
                                on_choice=lambda *_: _chosen(report), read_machine=read_machine,
                                floors=floors)
        report.choice = choice
        choices.append(choice)
        return choice

    def switching(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], compiled: Callable,
                  fn: Callable, job: BackgroundPlan, report: BackendReport, slot: _Slot
                  ) -> PlanSwitch:
        """``fn`` (the fast plan's), until the background plan takes over between calls."""

        def adopt(job: BackgroundPlan) -> tuple[Callable | None, str]:
            new, old = job.result, report.pass_report
            if job.state == "failed" or new.outcome is Outcome.PLANNING_FAILED:
                why = job.error or new.reason
                if strict():
                    raise RuntimeError(f"autostream: the background CP-SAT plan failed: "
                                       f"{why}") from job.error
                log.warning("autostream: the background CP-SAT plan failed (%s); the fast "
                            "plan stays", why)
                return None, f"CP-SAT's plan failed ({why}); the fast plan stays"
            took = f"planned in {job.seconds:.2f} s in the background"
            if _same_plan(old, new):
                return None, f"CP-SAT's plan ({took}) is the fast plan: nothing to switch"
            before = _predicted(old)
            if not _predicted(new) < before:  # a switch costs a measurement (and a capture)
                return None, (f"CP-SAT's plan ({took}) is predicted no faster "
                              f"({_predicted(new):.1f} us, the fast plan {before:.1f} us): "
                              f"the fast plan stays")
            _retire_runners(report.graph_runners)
            stream_pass.reports.append(new)
            report.passes[-1] = new
            slot.fn = aten_runner(job.gm, new, report.runtime, report.graph_runners,
                                  "new plan")
            why = (f"CP-SAT's plan took over ({took}; predicted {_predicted(new):.1f} us, "
                   f"the fast plan {before:.1f} us)")
            tell(f"autostream: {why}")
            choice, plan_name = report.choice, _plan_name(report)
            if choice is not None and new.applied:
                lifted = lifted_runner(gm, example_inputs, new.plan, report, "new plan")
                report.lift = lifts[-1]
                choice.remeasure(plan_name, lifted or compiled)  # the plan alone, again
                return choice, why
            report.lift = report.choice = None
            return choose(gm, example_inputs, compiled, report), why

        def ready() -> bool:  # never in the middle of a measurement
            return report.choice is None or not report.choice.measuring

        fast = report.plan.schedule.solver if report.applied else "one stream"
        switch = PlanSwitch(fn, job, adopt, f"fast plan ({fast})", "CP-SAT's plan", ready)
        report.anytime = switch.log
        return switch

    compile_fn.autostream_pass = stream_pass
    compile_fn.last_report = None
    compile_fn.measured_choices = choices
    compile_fn.lifts = lifts
    return compile_fn


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
    #: the measured single-stream candidates (the one-stream graph, eager at the caller's
    #: and other intra-op thread counts, Inductor), and the caller's count when the graph
    #: compiled
    baselines: tuple[str, ...] = ()
    caller_threads: int = field(default_factory=torch.get_num_threads)
    #: the runtime the graph runs on, why not the graph runtime where it was asked for,
    #: and the graph runners built, labelled (their captures, replays and refusals)
    runtime: str = ""
    capture_refused: str = ""
    graph_runners: list[tuple[str, Any]] = field(default_factory=list)
    #: which plan ran which calls, when the compile returned with a fast plan and CP-SAT
    #: plans in the background (``runtime.switch``; ``None``: planned synchronously)
    anytime: PlanLog | None = None

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
    def streams_used(self) -> int:
        """Streams of what runs the plan: the lifted plan's, else the ATen plan's."""
        if isinstance(self.lift, LiftedPlan):
            return self.lift.streams_used
        return self.plan.schedule.streams_used if self.plan is not None else 1

    @property
    def baseline(self) -> tuple[str, int] | None:
        """The fastest measured single-stream candidate and its intra-op threads."""
        return fastest_single(self.choice, self.baselines, self.caller_threads)

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
        lines += [f"  {line}" for line in self.runtime_lines()]
        if self.anytime is not None:
            lines.append(f"  {self.anytime.describe()}")
        lines.append(f"  {self.measured_line()}")
        if self.baseline is not None:
            lines.append(f"  {baseline_text(self.choice, self.baselines, self.caller_threads)}")
        return "\n".join(lines)

    def runtime_lines(self) -> list[str]:
        """An accelerator's runtime in words: captured graphs and replays, or why nothing is
        captured (none on the CPU: threads)."""
        if self.runtime not in ("graph", "streams"):
            return []
        head = f"runtime: {self.runtime}"
        if self.capture_refused:
            head += f" (not captured: {self.capture_refused})"
        return [head] + [f"  {label}: {r.describe()}" for label, r in self.graph_runners]

    def measured_line(self) -> str:
        """The measured choice in words (or why nothing was measured, and what runs)."""
        if self.choice is not None:
            gap = self.prediction_check()
            load = self.choice.load
            busy = f"unreliable ({load.reason}): " if load is not None and load.busy else ""
            return busy + self.choice.describe() + (f"; {gap[0]}" if gap else "")
        return f"not measured: {self.not_measured}; runs {self.kept}"

    def prediction_check(self) -> tuple[str, bool] | None:
        """The cost table's single-stream prediction against the measured eager graph, in
        words, and whether they are more than ``FAR`` times apart (``None`` until measured).
        """
        timings = self.choice.timings if self.choice is not None else {}
        plan = self.lift if hasattr(self.lift, "single_stream_us") else self.plan
        base = "graph1" if "graph1" in timings else "eager"
        if base not in timings or plan is None or plan.single_stream_us <= 0:
            return None
        predicted, measured = plan.single_stream_us, timings[base].median * 1e6
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
            best = self.baseline
            if best is not None:
                out["baseline"], out["baseline_threads"] = best
            if self.choice.load is not None:
                out["load"] = self.choice.load.figures()
        else:
            out["kept"] = self.kept
        if self.anytime is not None:
            out["plans"] = [{"plan": s.plan, "first_call": s.first, "last_call": s.last}
                            for s in self.anytime.segments]
            out["plan_switch"] = self.anytime.outcome
        if self.runtime:
            out["runtime"] = self.runtime
            out["capture"] = self.capture_refused or {label: r.describe()
                                                      for label, r in self.graph_runners}
        return out


def _check_options(runtime: str, sanitize: bool, measure: int, fallback: str,
                   deterministic: bool, options: dict[str, Any]) -> None:
    """Reject what cannot work before anything compiles, naming the fix."""
    check_runtime_name(runtime)
    if fallback not in FALLBACKS:
        raise ValueError(f"unknown fallback {fallback!r}; choose one of {', '.join(FALLBACKS)}")
    if isinstance(measure, bool) or not isinstance(measure, int) or measure < 0:
        raise ValueError(f"measure must be >= 0 (an integer: calls per candidate), got {measure!r}")
    for name, value in (("sanitize", sanitize), ("deterministic", deterministic)):
        if not isinstance(value, bool) and not (name == "sanitize"
                                                and isinstance(value, SanitizerConfig)):
            raise ValueError(f"{name} must be True or False, got {type(value).__name__} "
                             f"{value!r}")
    if sanitize and runtime in (*DEVICE_RUNTIMES, "sequential"):
        raise ValueError(f"sanitize=True checks the threads runtime, not runtime={runtime!r}; "
                         f"use runtime='threads' (or 'auto' on CPU inputs), or sanitize=False")
    allowed = [f.name for f in fields(AutoStreamPass) if f.init]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}; "
                         f"backend() takes runtime, sanitize, measure, fallback, deterministic, "
                         f"graph_outputs and the pass options {', '.join(allowed)}")


def _runtime_for(runtime: str, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 device: str, training: bool) -> tuple[str, str]:
    """The runtime a Dynamo graph runs on, and why it is not the graph runtime where that
    was asked for (``auto`` on an accelerator that captures graphs, or ``graph``)."""
    kind = select_runtime(runtime, example_inputs)
    if kind != "graph":
        return kind, ""
    why = ("compiled for autograd: a captured graph records no autograd (call under "
           "torch.no_grad() to capture)" if training
           else capture_refusal(gm, device, example_inputs))
    return ("streams", why) if why else ("graph", "")


class _Retired:
    """A graph runner a new plan replaced, as the report tells it (its captured graphs
    are released with the runner)."""

    def __init__(self, text: str):
        self.text = text

    def describe(self) -> str:
        return f"{self.text} (replaced by the new plan)"


def _retire_runners(graphs: list[tuple[str, Any]]) -> None:
    """Keep only the words of the fast plan's graph runners."""
    graphs[:] = [(label, _Retired(r.describe()) if label == "plan" else r)
                 for label, r in graphs]


def _same_plan(old: PassReport | None, new: PassReport) -> bool:
    """Whether ``new`` runs as ``old`` does: both unchanged, or the same streams and order."""
    if old is None or old.applied != new.applied:
        return False
    if not new.applied:
        return True
    a, b = old.plan.schedule, new.plan.schedule
    return dict(a.stream_of) == dict(b.stream_of) and tuple(a.order) == tuple(b.order)


def _predicted(report: PassReport) -> float:
    plan = report.plan
    if plan is None:
        return float("nan")
    return plan.predicted_us if report.applied else plan.single_stream_us


def _plan_name(report: BackendReport) -> str:
    return "graph" if report.runtime == "graph" else "streams"


def _chosen(report: BackendReport) -> None:
    """Tell the measured choice; warn when the cost table is far from the measurement (not
    when the machine was busy: the load, not the table, is then the likelier cause)."""
    tell(f"autostream: {report.measured_line()}")
    check = report.prediction_check()
    main = report.pass_report
    load = report.choice.load if report.choice is not None else None
    if check is not None and check[1] and main is not None and not (load and load.busy):
        log.warning("autostream: the cost table %s is far from this machine: %s; plans rest "
                    "on its figures: measure the model here with `autostream calibrate SPEC "
                    "--device %s --out my.json` and pass cost_table='my.json'",
                    main.cost_table, check[0], report.device)


def warn_table_device(stream_pass: AutoStreamPass, device: str, warned: set[str]) -> None:
    """Warn once per device type when the user's cost table was made for another kind of
    device than the one the graph runs on (its predictions are not this machine's)."""
    if stream_pass.cost_table is None or device in warned:
        return
    mismatch = table_mismatch(stream_pass.cost_model_for(device).profile.kind, device)
    if mismatch:
        warned.add(device)
        log.warning("autostream: cost_table=%r: %s; pass cost_table=None (the default table "
                    "of the graph's device) or a table `autostream calibrate` measured here",
                    os.fspath(stream_pass.cost_table), mismatch)


def _holding(fn: Callable, report: BackendReport) -> Callable:
    """``fn``, holding ``report`` alive as long as Dynamo keeps the compiled graph
    (``autostream.last_report()`` keeps only a weak reference)."""
    try:
        fn.autostream_report = report
        return fn
    except (AttributeError, TypeError):  # a bound method (Dynamo's own graph), a builtin
        def run(*args: Any) -> Any:
            return fn(*args)

        run.autostream_report = report
        return run


def _inductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str = "default",
              device: str = "cpu", outputs: str = "fresh") -> Callable:
    """Inductor's compiled graph.  ``mode="reduce-overhead"`` on a CUDA device compiles it
    as ``torch.compile(mode="reduce-overhead")`` does (CUDA graph trees), the alternative a
    GPU user has to the graph runtime; with ``outputs="fresh"`` its outputs are cloned, as
    the trees overwrite them on the next replay (the graph runtime copies its own too).
    Elsewhere plain Inductor: the CPU has no CUDA graphs."""
    from torch._inductor import list_mode_options  # imported on use: heavy
    from torch._inductor.compile_fx import compile_fx
    from torch.utils._pytree import tree_map_only

    if mode != "reduce-overhead" or device != "cuda":
        return compile_fx(gm, list(example_inputs))
    compiled = compile_fx(gm, list(example_inputs), config_patches=list_mode_options(mode))
    if outputs != "fresh":
        return compiled

    def fresh(*args: Any) -> Any:
        return tree_map_only(torch.Tensor, torch.clone, compiled(*args))

    return fresh


def _needs_autograd(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    if not torch.is_grad_enabled():
        return False
    tensors = [*gm.parameters(), *(x for x in example_inputs if isinstance(x, torch.Tensor))]
    return any(t.requires_grad for t in tensors)


def autostream_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                       options: dict[str, Any] | None = None, mode: str | None = None):
    """The ``"autostream"`` entry point: ``torch.compile(model, backend="autostream",
    options={...})`` compiles with ``backend(**options)``, as Inductor takes its options.

    ``torch.compile`` calls a backend named by a string only when it compiles (at the
    first call), so bad options fail there (wrapped in Dynamo's ``BackendCompilerFailed``);
    ``backend=autostream.backend(...)`` checks them where they are written.  autostream
    has no modes: a ``mode`` other than ``"default"`` fails, naming the fix.

    >>> autostream_backend(None, [], mode="max-autotune")
    Traceback (most recent call last):
    ...
    ValueError: torch.compile(..., backend="autostream", mode='max-autotune'): autostream has no modes (they are Inductor's); leave mode out and pass options={...}, or backend=autostream.backend(...), which checks the options where they are written
    """
    return backend(**_compile_options(options, mode))(gm, example_inputs)


def _compile_options(options: Any, mode: Any) -> dict[str, Any]:
    """``backend``'s keyword arguments from ``torch.compile``'s ``options`` and ``mode``."""
    where = 'torch.compile(..., backend="autostream", '
    if mode not in (None, "default"):
        raise ValueError(f"{where}mode={mode!r}): autostream has no modes (they are "
                         f"Inductor's); leave mode out and pass options={{...}}, or "
                         f"backend=autostream.backend(...), which checks the options where "
                         f"they are written")
    if options is None:
        return {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"{where}options=...) must be a dict of autostream.backend's "
                         f"keyword arguments, got {type(options).__name__} {options!r}")
    return options
