"""CPU runtime: a worker thread per side stream for each call, the calling thread is stream 0.

Workers come from a pool shared by every graph in the process
(:mod:`autostream.runtime.workers`): a call takes one idle worker per side stream and
gives it back as soon as that stream is done; a worker idle for a few seconds exits.

``record`` sets a ``threading.Event`` once everything before it on its stream has run;
``wait`` blocks on those events.  A wait has no deadline by default, as in eager code:
it ends when its token is recorded or when another stream fails (then that stream's
error is raised at once).  A stream inside a collective waits for its peers as long
as the process group lets it (a slow rank saving a checkpoint, say); the group's
timeout, not the runtime's, ends a collective that never completes.  An explicit
``wait_timeout_s`` bounds waits (and joins) on a stream that runs no communication,
counting only time its producer spends outside communication (the error names the
token and the op).
ATen ops release the GIL, so streams really overlap.  Each run of two or more ops
between a stream's syncs runs as one generated Python function
(``autostream.runtime.segments``: less Python between ops, so less time holding the
GIL the other stream waits for; ``segments=False`` runs every op through the
interpreter loop).

Thread-local state: each worker runs a call under the caller's grad, inference and
autocast modes (:class:`~autostream.fx.thread_state.ThreadState`); a state that cannot be
carried to a worker (an active ``TorchDispatchMode``, say) runs the call on the calling
thread in program order instead, with a warning saying why.

Intra-op threads: each stream thread sets its own count (only that thread's: OpenMP's
and MKL's, not torch's process default, which ``torch.set_num_threads`` would also
change for every thread started meanwhile; :mod:`autostream.fx.intra_op`).  For
the whole call every stream gets ``max(1, budget // streams)``, where ``budget`` is the
caller's ``torch.get_num_threads()`` and ``streams`` the number of streams in the plan;
side-stream workers never use more than one thread.  The caller's own count is
restored after each call.  Pass ``intra_op_threads=n`` for a fixed ``n`` per stream
instead.  Where this torch's OpenMP cannot be reached, counts are left as they are
(every stream runs with the caller's).

``deterministic=True`` gives every stream, side streams included, the caller's whole
count: each op then runs with the thread count eager gives it, so a reduction splits
its work into the same chunks and sums them in the same order as eager (bitwise equal),
at the price of more threads than cores while streams overlap.  Otherwise a reduction
run with fewer threads than eager may differ from eager's in its last bits.

Why fixed and not re-divided as streams block and finish: a thread that ran a
parallel region keeps its OpenMP team spinning for a while after it; changing
counts mid-call (or a worker with a team of its own) leaves those idle teams
competing with the running ops, eager ops of the calling thread included.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch
import torch.fx

from autostream.comm import comm_op
from autostream.dialects.torchair import stream_label
from autostream.fx.intra_op import IntraOpThreads, Previous
from autostream.fx.thread_state import ThreadState
from autostream.runtime.execute import Env, bind_inputs, collect_outputs, run_op
from autostream.runtime.interpret import interpret
from autostream.runtime.memory import LiveBytes, MeasuredMemory
from autostream.runtime.orders import cross_stream_orders
from autostream.runtime.program import Step, StreamProgram, parse_program
from autostream.runtime.sanitizer import (
    RaceError,
    SanitizerConfig,
    SanitizerRun,
    sanitize_from_env,
)
from autostream.runtime.segments import Segment, SegmentRunner, split_segments
from autostream.runtime.sequential import SequentialRunner
from autostream.runtime.workers import WORKERS, WorkerPool

log = logging.getLogger("autostream")


class StreamWaitTimeout(RuntimeError):
    """A wait was not satisfied within the runner's ``wait_timeout_s``."""


#: seconds between checks of a bounded wait on whether its producer is communicating
POLL_S = 0.5


class _Aborted(Exception):
    """Another stream failed; this one stops quietly."""


def _state_carried_to_worker(state: ThreadState) -> ThreadState:
    with state.carried():
        return ThreadState.capture()


def _where(stream: int) -> str:
    return "main stream" if stream == 0 else stream_label(stream)


#: intra-op threads of a side-stream worker (see the module docstring)
SIDE_STREAM_THREADS = 1


def _until_first_op(items: list[Step | Segment]
                    ) -> tuple[list[Step | Segment], list[Step | Segment]]:
    """``items`` cut before the first op or segment (the stream sets its threads there)."""
    first = next((i for i, item in enumerate(items) if item.kind in ("op", "segment")),
                 len(items))
    return items[:first], items[first:]


class _Call:
    """One call: environment, events, abort flag, sanitizer; the hooks each stream runs.

    ``op`` and ``release`` are picked once per call: the plain ones do nothing but
    run and drop, the observed ones also feed the sanitizer, spans and memory meter.
    """

    def __init__(self, runner: ThreadsRunner, env: Env, call_index: int, budget: int,
                 state: ThreadState):
        program = runner.program
        self.runner, self.gm, self.env = runner, runner.gm, env
        self.events = {token: threading.Event() for token in runner.waited}
        self.aborted = False
        #: streams inside a communicating op, and the stream each waiting stream waits
        #: for (only kept under a ``wait_timeout_s``: time in communication is not counted)
        self.communicating: dict[int, bool] = {}
        self.left_communication: dict[int, float] = {}  # stream -> when, ``runner.clock``
        self.waiting_on: dict[int, int] = {}
        self.spans: dict[str, tuple[int, float, float]] | None = {} if runner.record_spans else None
        self.meter = LiveBytes() if runner.record_memory else None
        if self.meter is not None:
            self.meter.pin(env.values())
        self.budget = budget
        if runner.deterministic:  # eager's count for every op
            self.main_threads = self.side_threads = budget
        else:
            self.main_threads = runner.intra_op_threads or max(
                1, budget // max(1, len(program.streams)))
            self.side_threads = min(self.main_threads, SIDE_STREAM_THREADS)
        # Grad, inference and autocast modes are thread-local: workers run in the
        # caller's, or a side stream would compute other dtypes or tensor kinds.
        self.state = state
        #: the calling thread's counts before this call set its own (put back after it)
        self.main_previous: Previous | None = None
        config = runner.sanitizer
        self.san = SanitizerRun(config, program, call_index, runner.orders) if config else None
        observed = self.san or self.spans is not None or self.meter is not None
        self.op = self._observed_op if observed else self._op
        self.release = self._pop if self.meter is None else self._pop_metered

    def fail(self) -> None:
        self.aborted = True
        for ev in self.events.values():
            ev.set()

    def run_stream(self, stream: int) -> None:
        if stream == 0:  # the calling thread
            self._run_stream(stream)
            return
        with self.state.carried():
            self._run_stream(stream)

    def _run_stream(self, stream: int) -> None:
        lead, rest = self.runner.parts[stream]
        try:
            if self.san and stream != 0:
                self.san.check_state(stream, self.state, ThreadState.capture())
            if lead:
                interpret(lead, self)
            if rest:
                self._set_intra_op_threads(stream)
                interpret(rest, self)
        except BaseException:
            self.fail()
            raise

    def _set_intra_op_threads(self, stream: int) -> None:
        """Give this stream's thread its count for the call; only this thread's is set,
        not torch's process default (:mod:`autostream.fx.intra_op`)."""
        threads = self.runner.intra_op
        if not threads.available:
            return
        if stream != 0:
            threads.set(self.side_threads)
        elif self.main_threads != self.budget:
            self.main_previous = threads.set(self.main_threads)

    def restore_caller_threads(self) -> None:
        """Put back the calling thread's counts (call on the calling thread)."""
        if self.main_previous is not None:
            self.runner.intra_op.restore(self.main_previous)
            self.main_previous = None

    def _op(self, step: Step) -> None:
        if self.aborted:
            raise _Aborted()
        self.env[step.node] = self._run(step)

    def _run(self, step: Step) -> Any:
        if step.node not in self.runner.communication:
            return run_op(self.gm, step, self.env)
        self.communicating[step.stream] = True
        try:
            return run_op(self.gm, step, self.env)
        finally:
            self.left_communication[step.stream] = self.runner.clock()
            self.communicating[step.stream] = False

    def quiet_since(self, stream: int) -> float | None:
        """``None`` while ``stream``, or a stream it waits for (transitively),
        communicates; else when the last of them left communication (0: never)."""
        seen: set[int] = set()
        latest = 0.0
        following: int | None = stream
        while following is not None and following not in seen:
            if self.communicating.get(following):
                return None
            latest = max(latest, self.left_communication.get(following, 0.0))
            seen.add(following)
            following = self.waiting_on.get(following)
        return latest

    def bounded(self, finished: Callable[[float], bool], producer: int, limit: float) -> bool:
        """Poll ``finished(timeout)`` until it is true (True), or until ``producer`` has
        spent ``limit`` seconds outside communication since the polling began (False)."""
        clock = self.runner.clock
        since = clock()
        while not finished(max(0.0, min(since + limit - clock(), POLL_S))):
            quiet = self.quiet_since(producer)
            now = clock()
            since = now if quiet is None else max(since, quiet)
            if now - since >= limit:
                return False
        return True

    def _observed_op(self, step: Step) -> None:
        if self.aborted:
            raise _Aborted()
        stream, node, san = step.stream, step.node, self.san
        if san:
            san.before_op(stream, node)
        t0 = time.perf_counter()
        value = self._run(step)
        if self.spans is not None:
            self.spans[node.name] = (stream, t0, time.perf_counter())
        if san:
            san.after_op(stream, node)
        self.env[node] = value
        if self.meter is not None:
            self.meter.hold(value, t0)
        if san:
            san.published(stream, node)

    def segment(self, seg: Segment) -> None:
        if self.aborted:
            raise _Aborted()
        self.runner.segments.run(seg, self.env, self.state)

    def record(self, step: Step) -> None:
        # no op reads a token's value: nothing to allocate (an ATen call here would
        # hand the GIL to the other stream once more)
        if self.aborted:
            raise _Aborted()
        if self.san:
            self.san.on_record(step.stream, step.node.name)
        event = self.events.get(step.node.name)
        if event is not None:  # a record no stream waits for needs no event
            event.set()

    def wait(self, step: Step) -> None:
        if self.aborted:
            raise _Aborted()
        for token in step.tokens:
            ev = self.events[token]
            if not ev.is_set():
                self._await(step, token, ev)
            if self.aborted:
                raise _Aborted()
        if self.san:
            self.san.on_wait(step.stream, step.tokens)

    def _await(self, step: Step, token: str, ev: threading.Event) -> None:
        limit = self.runner.wait_timeout_s
        if limit is None:
            ev.wait()
            return
        producer = self.runner.token_stream[token]
        self.waiting_on[step.stream] = producer
        try:
            if not self.bounded(ev.wait, producer, limit):
                raise self.runner.wait_timed_out(step, token)
            # the producer's time in communication counts as this stream's own
            quiet = self.quiet_since(producer)
            self.left_communication[step.stream] = max(
                self.left_communication.get(step.stream, 0.0),
                self.runner.clock() if quiet is None else quiet)
        finally:
            del self.waiting_on[step.stream]

    def _pop(self, values: tuple[torch.fx.Node, ...]) -> None:
        env = self.env
        for v in values:
            env.pop(v, None)

    def _pop_metered(self, values: tuple[torch.fx.Node, ...]) -> None:
        for v in values:
            self.meter.drop(self.env.pop(v, None))


class ThreadsRunner:
    """Run a rewritten GraphModule with real thread concurrency on CPU.

    Calls are serialised (one call at a time per runner); side streams run on workers
    of ``workers``, by default the process-wide pool shared by every runner
    (:mod:`autostream.runtime.workers`), whose idle workers exit on their own.

    >>> import torch, torch.fx
    >>> gm = torch.fx.symbolic_trace(lambda x: x * 2)
    >>> r = ThreadsRunner(gm)
    >>> r(torch.tensor([1.0]))
    tensor([2.])
    >>> r.close()
    """

    kind = "threads"

    def __init__(self, gm: torch.fx.GraphModule, program: StreamProgram | None = None, *,
                 sanitize: bool | SanitizerConfig = False, seed: int = 0,
                 wait_timeout_s: float | None = None, intra_op_threads: int | None = None,
                 record_spans: bool = False, segments: bool = True,
                 record_memory: bool = False, deterministic: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 workers: WorkerPool | None = None):
        if wait_timeout_s is not None and not wait_timeout_s > 0:
            raise ValueError(f"wait_timeout_s must be > 0 seconds (or None: no deadline), "
                             f"got {wait_timeout_s!r}")
        if intra_op_threads is not None and intra_op_threads < 1:
            raise ValueError("intra_op_threads must be >= 1 (or None to divide the cores)")
        if deterministic and intra_op_threads is not None:
            raise ValueError("deterministic=True gives every op eager's intra-op thread "
                             "count: leave intra_op_threads out (None)")
        self.deterministic = deterministic
        self.gm = gm
        self.program = program if program is not None else parse_program(gm)
        self.sanitizer = sanitize_from_env(sanitize, seed)
        #: what each op needs before it from other streams (sanitizer only: the checks)
        self.orders = cross_stream_orders(gm, self.program) if self.sanitizer else {}
        #: ``None``: waits have no deadline (see the module docstring)
        self.wait_timeout_s = wait_timeout_s
        #: what ``wait_timeout_s`` is counted on (seconds; tests inject their own)
        self.clock = clock
        self.intra_op_threads = intra_op_threads
        #: with ``record_spans``: op -> (stream, start_us, end_us) of the last call,
        #: relative to its start (a measured timeline for traces)
        self.record_spans = record_spans
        self.last_spans: dict[str, tuple[int, float, float]] = {}
        #: with ``record_memory``: the bytes the last call held (``runtime.memory.LiveBytes``)
        self.record_memory = record_memory
        self.last_memory: MeasuredMemory | None = None
        self.token_origin, self.next_op = self._describe_syncs()
        self.token_stream = {s.node.name: s.stream for s in self.program.steps
                             if s.kind == "record"}
        #: ops that communicate (a bounded wait does not count time spent in them)
        self.communication = frozenset(
            s.node for s in self.program.steps
            if s.kind == "op" and wait_timeout_s is not None and comm_op(s.node) is not None)
        self.waited = frozenset(t for s in self.program.steps if s.kind == "wait" for t in s.tokens)
        #: what each stream runs: steps, and ``Segment``s run as generated functions
        #: (off under the sanitizer, ``record_spans`` and ``record_memory``, which need
        #: every op)
        self.segments = SegmentRunner(gm)
        self.plan_of = self._plan(segments and not (self.sanitizer or record_spans
                                                    or record_memory))
        #: ``plan_of`` cut where each stream sets its intra-op threads
        self.parts = {k: _until_first_op(items) for k, items in self.plan_of.items()}
        #: sets one thread's intra-op threads, leaving torch's process default alone
        self.intra_op = IntraOpThreads.find()
        if not self.intra_op.available and not deterministic:
            log.debug("autostream: intra-op threads not divided: %s", self.intra_op.why_not)
        #: where side streams run (shared: nothing here is stopped when the runner goes)
        self.workers = WORKERS if workers is None else workers
        self._lock = threading.Lock()
        self._calls = 0
        self._broken: str | None = None
        #: caller states the workers cannot be given -> why (``None``: they can)
        self._refusals: dict[ThreadState, str | None] = {}
        self._warned: set[str] = set()
        self._sequential: SequentialRunner | None = None

    def _plan(self, segments: bool) -> dict[int, list[Step | Segment]]:
        plan_of: dict[int, list[Step | Segment]] = {
            k: split_segments(self.program, k) if segments else list(steps)
            for k, steps in self.program.streams.items()}
        for items in plan_of.values():
            for item in items:
                if isinstance(item, Segment):
                    self.segments.prepare(item)
        return plan_of

    def _describe_syncs(self) -> tuple[dict[str, str], dict[torch.fx.Node, str]]:
        origin: dict[str, str] = {}
        following: dict[torch.fx.Node, str] = {}
        for k, steps in self.program.streams.items():
            last_op = None
            pending: list[torch.fx.Node] = []
            for step in steps:
                if step.kind == "op":
                    last_op = step.node.name
                    for w in pending:
                        following[w] = f"op {last_op!r}"
                    pending = []
                elif step.kind == "record":
                    after = f"after {last_op!r}" if last_op else "at its start"
                    origin[step.node.name] = f"recorded on the {_where(k)} {after}"
                else:
                    pending.append(step.node)
            for w in pending:
                following[w] = "the graph's output" if k == 0 else f"the end of {_where(k)}"
        return origin, following

    def __call__(self, *inputs: Any) -> Any:
        with self._lock:
            if self._broken:
                raise RuntimeError(f"runner unusable: {self._broken}")
            state = ThreadState.capture()
            refused = self._refusal(state)
            if refused:
                return self._on_calling_thread(refused, inputs, quiet=state.checks_only)
            call_index, self._calls = self._calls, self._calls + 1
            env = bind_inputs(self.gm, self.program, inputs)
            run = _Call(self, env, call_index, torch.get_num_threads(), state)
            self._run_streams(run)
            self._keep_measures(run)
            return collect_outputs(self.gm, self.program, env)

    def _run_streams(self, run: _Call) -> None:
        """Stream 0 here, the others on their workers; the first error (not an abort) raised."""
        futures = {k: self.workers.submit(lambda k=k: run.run_stream(k))
                   for k in self.program.side_streams}
        errors: list[BaseException] = []
        try:
            run.run_stream(0)
            if run.san:
                found = run.san.output_violations()
                if found:
                    errors.append(RaceError(found))
                    run.fail()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            errors += self._join(futures, run)
            run.restore_caller_threads()
        origin = [e for e in errors if not isinstance(e, _Aborted)]
        if origin:
            raise origin[0]

    def _keep_measures(self, run: _Call) -> None:
        if run.spans is not None:
            t0 = min((a for _, a, _ in run.spans.values()), default=0.0)
            self.last_spans = {n: (s, (a - t0) * 1e6, (b - t0) * 1e6)
                               for n, (s, a, b) in run.spans.items()}
        if run.meter is not None:
            self.last_memory = run.meter.result()

    def wait_timed_out(self, step: Step, token: str) -> StreamWaitTimeout:
        """The error of a wait ``step`` whose ``token`` was not published in time."""
        return StreamWaitTimeout(
            f"{_where(step.stream)} waited {self.wait_timeout_s:g} s at {step.node.name!r} "
            f"for token {token!r} ({self.token_origin[token]}) before running "
            f"{self.next_op[step.node]}; the producing stream is stuck or ran longer than "
            f"wait_timeout_s outside communication (wait_timeout_s=None: no deadline)"
        )

    def _refusal(self, state: ThreadState) -> str | None:
        """Why the workers cannot run under the caller's ``state`` (checked once per state)."""
        if state not in self._refusals:
            why = state.uncarried()
            if why is None and self.program.side_streams:
                got = self.workers.submit(lambda: _state_carried_to_worker(state)).result(
                    timeout=self.wait_timeout_s)
                differences = state.differences(got)
                if differences:
                    why = f"a worker thread cannot be given its state ({'; '.join(differences)})"
            self._refusals[state] = why
        return self._refusals[state]

    def _on_calling_thread(self, why: str, inputs: tuple[Any, ...], quiet: bool) -> Any:
        """The whole graph in program order on the calling thread (one stream)."""
        if why not in self._warned:
            self._warned.add(why)
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "autostream: running the plan on one thread: %s", why)
        if self._sequential is None:
            self._sequential = SequentialRunner(self.gm, self.program)
        return self._sequential(*inputs)

    def _join(self, futures: dict[int, Future], run: _Call) -> list[BaseException]:
        errors = []
        for k, future in futures.items():
            try:
                self._result(future, k, run)
            except FutureTimeout:
                self._broken = f"{_where(k)} did not finish within {self.wait_timeout_s:g} s"
                errors.append(StreamWaitTimeout(
                    f"joining {_where(k)}: it did not finish within {self.wait_timeout_s:g} s"))
            except BaseException as exc:  # noqa: BLE001 - collected for the caller
                errors.append(exc)
        return errors

    def _result(self, future: Future, stream: int, run: _Call) -> None:
        """``future``'s result; under ``wait_timeout_s``, ``FutureTimeout`` once ``stream``
        has run that long outside communication."""
        limit = self.wait_timeout_s

        def finished(timeout: float) -> bool:
            try:
                future.exception(timeout=timeout)
                return True
            except FutureTimeout:
                return False

        if limit is not None and not run.bounded(finished, stream, limit):
            raise FutureTimeout()
        future.result()

    def close(self) -> None:
        """Stop the pool's idle workers now (they would exit after their idle timeout);
        the runner stays usable, a later call starts workers again."""
        self.workers.trim()

    def __enter__(self) -> ThreadsRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
