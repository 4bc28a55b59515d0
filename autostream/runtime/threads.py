"""CPU runtime: one persistent worker thread per side stream, the calling thread is stream 0.

``record`` sets a ``threading.Event`` once everything before it on its stream has run;
``wait`` blocks on those events (with a timeout that names the token and the op).
ATen ops release the GIL, so streams really overlap.  Each run of two or more ops
between a stream's syncs is traced with TorchScript on the first call and runs as
one call without the GIL afterwards (``autostream.runtime.segments``: small ops
would otherwise pass the GIL back and forth; ``trace_segments=False`` runs every op
from Python).

Intra-op threads: ``torch.set_num_threads`` sets the *calling thread's* OpenMP
thread count (and MKL's thread-local one), so each stream thread sets its own
count: for the whole call every stream gets ``max(1, budget // streams)``, where
``budget`` is the caller's ``torch.get_num_threads()`` and ``streams`` the number
of streams in the plan; side-stream workers never use more than one thread.  The
caller's own count is restored after each call.  Pass ``intra_op_threads=n`` for a
fixed ``n`` per stream instead.

Why fixed and not re-divided as streams block and finish: a thread that ran a
parallel region keeps its OpenMP team spinning for a while after it; on a 2-core
machine, changing counts mid-call (or a worker with its own 2-thread team) left
those idle teams competing with the running ops, and measured runs were up to 4x
slower, eager ops of the calling thread included.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch
import torch.fx

from autostream.dialects.torchair import stream_label
from autostream.runtime.execute import (
    StreamRuntimeError,
    bind_inputs,
    collect_outputs,
    run_node,
)
from autostream.runtime.memory import LiveBytes, MeasuredMemory
from autostream.runtime.program import Step, StreamProgram, parse_program
from autostream.runtime.sanitizer import (
    RaceError,
    SanitizerConfig,
    SanitizerRun,
    sanitize_from_env,
)
from autostream.runtime.segments import Segment, SegmentRunner, split_segments


class StreamWaitTimeout(RuntimeError):
    """A wait was not satisfied within the runner's ``wait_timeout_s``."""


class _Aborted(Exception):
    """Another stream failed; this one stops quietly."""


class _Worker:
    """A daemon thread running the callables it is given, one at a time."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, future = job
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self.jobs.put((fn, future))
        return future

    def stop(self) -> None:
        self.jobs.put(None)


def _stop_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()
    # Join (briefly) so no worker is still inside ATen when the interpreter exits.
    for w in workers:
        if w.thread is not threading.current_thread():
            w.thread.join(timeout=5.0)


def _where(stream: int) -> str:
    return "main stream" if stream == 0 else stream_label(stream)


#: intra-op threads of a side-stream worker (see the module docstring)
SIDE_STREAM_THREADS = 1


class _ThreadCounts:
    """Sets each stream thread's intra-op thread count once per call."""

    def __init__(self, per_stream: int):
        self.per_stream = per_stream
        self.current: dict[int, int] = {}

    def apply(self, stream: int) -> None:
        want = self.per_stream if stream == 0 else min(self.per_stream, SIDE_STREAM_THREADS)
        if self.current.get(stream) != want:
            torch.set_num_threads(want)
            self.current[stream] = want


class _Call:
    """State of one call: environment, events, abort flag, sanitizer."""

    def __init__(self, runner: ThreadsRunner, env: dict, call_index: int, budget: int):
        program = runner.program
        self.runner, self.program, self.env = runner, program, env
        self.events = {token: threading.Event() for token in runner.waited}
        self.abort = threading.Event()
        self.spans: dict[str, tuple[int, float, float]] | None = {} if runner.record_spans else None
        self.meter = LiveBytes() if runner.record_memory else None
        if self.meter is not None:
            self.meter.pin(env.values())
        per_stream = runner.intra_op_threads or max(1, budget // max(1, len(program.streams)))
        self.threads = _ThreadCounts(per_stream)
        self.threads.current[0] = budget
        # Grad mode is thread-local: workers run in the caller's, or an inference call
        # would record autograd history for parameters on the side streams.
        self.grad_enabled = torch.is_grad_enabled()
        config = runner.sanitizer
        self.san = SanitizerRun(config, program, call_index) if config else None

    def fail(self) -> None:
        self.abort.set()
        for ev in self.events.values():
            ev.set()

    def _wait(self, stream: int, step) -> None:
        for token in step.tokens:
            ev = self.events[token]
            if not ev.is_set():
                ok = ev.wait(self.runner.wait_timeout_s)
                if not ok:
                    raise StreamWaitTimeout(
                        f"{_where(stream)} waited {self.runner.wait_timeout_s:g} s at "
                        f"{step.node.name!r} for token {token!r} "
                        f"({self.runner.token_origin[token]}) before running "
                        f"{self.runner.next_op[step.node]}; the producing stream is stuck or "
                        f"slower than wait_timeout_s"
                    )
            if self.abort.is_set():
                raise _Aborted()
        if self.san:
            self.san.on_wait(stream, step.tokens)

    def _release(self, values: tuple[torch.fx.Node, ...]) -> None:
        for v in values:
            dropped = self.env.pop(v, None)
            if self.meter is not None:
                self.meter.drop(dropped)

    def run_stream(self, stream: int) -> None:
        with torch.set_grad_enabled(self.grad_enabled):
            self._run_stream(stream)

    def _run_stream(self, stream: int) -> None:
        gm, env, san, threads = self.runner.gm, self.env, self.san, self.threads
        segments = self.runner.segments
        try:
            for step in self.runner.plan_of[stream]:
                if self.abort.is_set():
                    raise _Aborted()
                if isinstance(step, Segment):
                    threads.apply(stream)
                    segments.run(step, env)
                elif step.kind == "op":
                    threads.apply(stream)
                    if san:
                        san.before_op(stream, step.node)
                    t0 = time.perf_counter()
                    try:
                        value = run_node(gm, step.node, env)
                    except Exception as exc:
                        raise StreamRuntimeError(step.node, stream, exc) from exc
                    if self.spans is not None:
                        self.spans[step.node.name] = (stream, t0, time.perf_counter())
                    if san:
                        san.after_op(stream, step.node)
                    env[step.node] = value
                    if self.meter is not None:
                        self.meter.hold(value, t0)
                    if san:
                        san.published(stream, step.node)
                    self._release(step.release)
                elif step.kind == "record":
                    # no op reads a token's value: nothing to allocate (an ATen call here
                    # would hand the GIL to the other stream once more)
                    if san:
                        san.on_record(stream, step.node.name)
                    event = self.events.get(step.node.name)
                    if event is not None:  # a record no stream waits for needs no event
                        event.set()
                else:
                    self._wait(stream, step)
                    self._release(step.release)
        except BaseException:
            self.fail()
            raise


class ThreadsRunner:
    """Run a rewritten GraphModule with real thread concurrency on CPU.

    Calls are serialised (one call at a time per runner); the worker threads
    persist across calls and stop when the runner is closed or collected.

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
                 wait_timeout_s: float = 120.0, intra_op_threads: int | None = None,
                 record_spans: bool = False, trace_segments: bool = True,
                 record_memory: bool = False):
        if wait_timeout_s <= 0:
            raise ValueError("wait_timeout_s must be > 0")
        if intra_op_threads is not None and intra_op_threads < 1:
            raise ValueError("intra_op_threads must be >= 1 (or None to divide the cores)")
        self.gm = gm
        self.program = program if program is not None else parse_program(gm)
        self.sanitizer = sanitize_from_env(sanitize, seed)
        self.wait_timeout_s = wait_timeout_s
        self.intra_op_threads = intra_op_threads
        #: with ``record_spans``: op -> (stream, start_us, end_us) of the last call,
        #: relative to its start (a measured timeline for traces)
        self.record_spans = record_spans
        self.last_spans: dict[str, tuple[int, float, float]] = {}
        #: with ``record_memory``: the bytes the last call held (``runtime.memory.LiveBytes``)
        self.record_memory = record_memory
        self.last_memory: MeasuredMemory | None = None
        self.token_origin, self.next_op = self._describe_syncs()
        self.waited = frozenset(t for s in self.program.steps if s.kind == "wait" for t in s.tokens)
        #: what each stream runs: steps, and ``Segment``s traced on the first call
        #: (off under the sanitizer, ``record_spans`` and ``record_memory``, which need
        #: every op)
        self.segments = SegmentRunner(gm)
        traced = trace_segments and not (self.sanitizer or record_spans or record_memory)
        self.plan_of: dict[int, list[Step | Segment]] = {
            k: split_segments(self.program, k) if traced else list(steps)
            for k, steps in self.program.streams.items()}
        for items in self.plan_of.values():
            for item in items:
                if isinstance(item, Segment):
                    self.segments.prepare(item)
        self._workers = {k: _Worker(f"autostream-{stream_label(k)}")
                         for k in self.program.side_streams}
        self._finalizer = weakref.finalize(self, _stop_all, list(self._workers.values()))
        self._lock = threading.Lock()
        self._calls = 0
        self._broken: str | None = None

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
            call_index, self._calls = self._calls, self._calls + 1
            env = bind_inputs(self.gm, self.program, inputs)
            caller_threads = torch.get_num_threads()
            run = _Call(self, env, call_index, caller_threads)
            futures = {k: w.submit(lambda k=k: run.run_stream(k))
                       for k, w in self._workers.items()}
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
                errors += self._join(futures)
                if futures or torch.get_num_threads() != caller_threads:
                    # also resets ATen's process-wide default that the workers changed
                    torch.set_num_threads(caller_threads)
            origin = [e for e in errors if not isinstance(e, _Aborted)]
            if origin:
                raise origin[0]
            if run.spans is not None:
                t0 = min((a for _, a, _ in run.spans.values()), default=0.0)
                self.last_spans = {n: (s, (a - t0) * 1e6, (b - t0) * 1e6)
                                   for n, (s, a, b) in run.spans.items()}
            if run.meter is not None:
                self.last_memory = run.meter.result()
            return collect_outputs(self.gm, self.program, env)

    def _join(self, futures: dict[int, Future]) -> list[BaseException]:
        errors = []
        for k, future in futures.items():
            try:
                future.result(timeout=self.wait_timeout_s)
            except FutureTimeout:
                self._broken = f"{_where(k)} did not finish within {self.wait_timeout_s:g} s"
                errors.append(StreamWaitTimeout(
                    f"joining {_where(k)}: it did not finish within {self.wait_timeout_s:g} s"))
            except BaseException as exc:  # noqa: BLE001 - collected for the caller
                errors.append(exc)
        return errors

    def close(self) -> None:
        """Stop the worker threads (also done when the runner is garbage-collected)."""
        self._finalizer()

    def __enter__(self) -> ThreadsRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
