"""Race sanitizer for the threads runtime: random delays at op boundaries plus a dependence checker.

Two checks run before every op (and before the graph's output):

- ``early``: one of the op's FX inputs, produced on another stream, has not completed
  yet.  Random delays (seeded per call and stream) shuffle the interleaving, and a
  producer whose value another stream reads is held a little longer before it is
  published, so a missing wait shows up as an early read in most runs.
- ``unordered``: happens-before with vector clocks, as executed: the producer's
  completion is not covered by the consumer stream's clock, i.e. no chain of
  record/wait orders the two.  This flags a missing wait on every run, whatever the
  timing, like ThreadSanitizer.

Each side stream also checks, before its first op, that it runs under the caller's
thread-local state (:class:`~autostream.fx.thread_state.ThreadState`: grad, inference and
autocast modes).

A correct plan never trips these checks: every cross-stream read is preceded by a
wait on a record made after the producer finished.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Literal

import torch.fx

from autostream.fx.thread_state import ThreadState
from autostream.runtime.program import StreamProgram

SANITIZE_ENV = "AUTOSTREAM_SANITIZE"


@dataclass(frozen=True)
class SanitizerConfig:
    """Settings of the race sanitizer.

    ``max_delay_s``: each op boundary sleeps ``uniform(0, max_delay_s)``;
    ``hold_s``: a producer read by another stream publishes its result after an extra
    ``uniform(hold_s / 2, hold_s)``; ``seed``: delays of call ``i`` on stream ``k``
    come from ``random.Random(f"{seed}:{i}:{k}")``.

    >>> SanitizerConfig(seed=3).seed
    3
    """

    seed: int = 0
    max_delay_s: float = 0.0005
    hold_s: float = 0.004
    happens_before: bool = True
    completion: bool = True

    def __post_init__(self) -> None:
        if self.max_delay_s < 0 or self.hold_s < 0:
            raise ValueError("sanitizer delays must be >= 0 seconds")


def sanitize_from_env(sanitize: bool | SanitizerConfig, seed: int) -> SanitizerConfig | None:
    """The sanitizer config to use: the argument, else ``AUTOSTREAM_SANITIZE=1`` in the environment.

    >>> sanitize_from_env(False, 0) is None or os.environ.get(SANITIZE_ENV) == "1"
    True
    """
    if isinstance(sanitize, SanitizerConfig):
        return sanitize
    if sanitize or os.environ.get(SANITIZE_ENV, "") not in ("", "0"):
        return SanitizerConfig(seed=seed)
    return None


@dataclass(frozen=True)
class Violation:
    """A consumer that started without its producer being completed or ordered before it."""

    kind: Literal["early", "unordered"]
    producer: str
    producer_stream: int
    consumer: str
    consumer_stream: int

    def __str__(self) -> str:
        what = ("started before it completed" if self.kind == "early"
                else "is not ordered after it by any record/wait")
        return (f"{self.consumer!r} (stream {self.consumer_stream}) reads {self.producer!r} "
                f"(stream {self.producer_stream}) and {what}")


class RaceError(RuntimeError):
    """The sanitizer found cross-stream reads not protected by a record/wait."""

    def __init__(self, violations: list[Violation]):
        self.violations = tuple(violations)
        lines = "; ".join(str(v) for v in violations)
        super().__init__(f"race detected: {lines}. Add a record after the producer and a "
                         f"wait on it before the consumer.")


class ThreadStateError(RuntimeError):
    """A stream ran under other thread-local state (grad, inference, autocast) than its caller."""


class SanitizerRun:
    """Per-call sanitizer state, shared by the stream threads of one call."""

    def __init__(self, config: SanitizerConfig, program: StreamProgram, call_index: int):
        self.config = config
        self.program = program
        self.rngs = {k: random.Random(f"{config.seed}:{call_index}:{k}") for k in program.streams}
        self.clock: dict[int, dict[int, int]] = {k: {} for k in program.streams}
        self.stamp: dict[torch.fx.Node, tuple[int, int]] = {}
        self.token_clock: dict[str, dict[int, int]] = {}
        self.done: set[torch.fx.Node] = set()
        self.inputs = frozenset(program.placeholders) | frozenset(program.constants)
        self._lock = threading.Lock()

    def _sleep(self, stream: int, scale: float, low: float = 0.0) -> None:
        if scale > 0:
            time.sleep(self.rngs[stream].uniform(low * scale, scale))

    def violations(self, consumer: torch.fx.Node, stream: int) -> list[Violation]:
        found = []
        for arg in consumer.all_input_nodes:
            producer_stream = self.program.stream_of.get(arg, 0)
            if arg in self.inputs or producer_stream == stream:
                continue
            with self._lock:
                done = arg in self.done
                stamp = self.stamp.get(arg)
            if self.config.completion and not done:
                found.append(Violation("early", arg.name, producer_stream, consumer.name, stream))
            if self.config.happens_before:
                covered = stamp is not None and self.clock[stream].get(stamp[0], 0) >= stamp[1]
                if not covered:
                    found.append(Violation("unordered", arg.name, producer_stream,
                                           consumer.name, stream))
        return found

    def before_op(self, stream: int, node: torch.fx.Node) -> None:
        self._sleep(stream, self.config.max_delay_s)
        found = self.violations(node, stream)
        if found:
            raise RaceError(found)

    def after_op(self, stream: int, node: torch.fx.Node) -> None:
        """Delay publication of ``node``'s result (called before the value is stored)."""
        self._sleep(stream, self.config.max_delay_s)
        if node in self.program.held:
            self._sleep(stream, self.config.hold_s, low=0.5)

    def published(self, stream: int, node: torch.fx.Node) -> None:
        vc = self.clock[stream]
        vc[stream] = vc.get(stream, 0) + 1
        with self._lock:
            self.stamp[node] = (stream, vc[stream])
            self.done.add(node)

    def on_record(self, stream: int, token: str) -> None:
        self.token_clock[token] = dict(self.clock[stream])

    def on_wait(self, stream: int, tokens: tuple[str, ...]) -> None:
        vc = self.clock[stream]
        for t in tokens:
            for s, c in self.token_clock[t].items():
                vc[s] = max(vc.get(s, 0), c)

    def check_state(self, stream: int, expected: ThreadState, actual: ThreadState) -> None:
        """Stream ``stream`` runs under ``actual``; the caller called under ``expected``."""
        differences = expected.differences(actual)
        if differences:
            raise ThreadStateError(
                f"stream {stream} runs under other thread-local state than its caller "
                f"({'; '.join(differences)}): its ops would compute other values, dtypes or "
                f"tensor kinds")

    def output_violations(self) -> list[Violation]:
        return self.violations(self.program.output, 0)
