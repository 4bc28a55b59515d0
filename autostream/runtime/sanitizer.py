"""Race sanitizer for the threads runtime: random delays at op boundaries plus a dependence checker.

What it checks, before every op: every dependence of it whose first op runs on another
stream, as :func:`autostream.dialects.verify.verify_rewrite` and
:func:`autostream.planning.check.check` (``mode="cuda"``) find them in the graph
(:mod:`autostream.runtime.orders`, computed once per runner): a read of a value, memory
hazards on storages, views included (read-after-write, write-after-read,
write-after-write), random and side-effect order, collective order; and, before the
graph's output, its reads of values.  (The hazards ``check`` adds for TorchAir's
compilers, ``mode="ge"`` or ``"acl"``, are not the threads runtime's.)  Two checks:

- ``early``: the op that must come first has not completed yet.  Random delays (seeded
  per call and stream) shuffle the interleaving, and a producer whose value another
  stream reads is held a little longer before it is published, so a missing wait shows
  up as an early start in most runs.
- ``unordered`` (a read of a value) and ``hazard`` (any other dependence): happens-before
  with vector clocks, as executed: the first op's completion is not covered by the
  second's stream clock, i.e. no chain of record/wait orders the two.  This flags a
  missing wait on every run, whatever the timing, like ThreadSanitizer.

Each side stream also checks, before its first op, that it runs under the caller's
thread-local state (:class:`~autostream.fx.thread_state.ThreadState`: grad, inference and
autocast modes).

A correct plan never trips these checks: every cross-stream dependence is preceded by a
wait on a record made after its first op finished.  Not checked: a side stream left
unjoined before the output (the runtime joins every stream before it returns).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch.fx

from autostream.fx.thread_state import ThreadState
from autostream.runtime.orders import Order
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
    """An op that started without an op it depends on, on another stream, being completed
    (``early``) or ordered before it (``unordered``: a read of a value; ``hazard``: any
    other dependence, ``dependence`` says which, ``storage`` and ``hazard_kind`` the memory
    hazard's storage and kind).

    >>> print(Violation("hazard", "mm", 1, "mul_", 0, "memory", "x", "write-after-read"))
    'mul_' (stream 0) writes storage 'x' that 'mm' (stream 1) reads before it (write-after-read) and is not ordered after it by any record/wait: record after 'mm' and wait on that record before 'mul_'
    """

    kind: Literal["early", "unordered", "hazard"]
    producer: str
    producer_stream: int
    consumer: str
    consumer_stream: int
    dependence: str = "data"
    storage: str = ""
    hazard_kind: str = ""

    def __str__(self) -> str:
        when = ("started before it completed" if self.kind == "early"
                else "is not ordered after it by any record/wait")
        first = f"{self.producer!r} (stream {self.producer_stream})"
        second = f"{self.consumer!r} (stream {self.consumer_stream})"
        if self.dependence == "data":
            return f"{second} reads {first} and {when}"
        fix = (f": record after {self.producer!r} and wait on that record before "
               f"{self.consumer!r}")
        return f"{second} {self._relation(first)} and {when}{fix}"

    def _relation(self, first: str) -> str:
        storage, hazard = f"storage {self.storage!r}", self.hazard_kind
        if hazard == "write-after-read":
            return f"writes {storage} that {first} reads before it ({hazard})"
        if hazard == "write-after-write":
            return f"writes {storage} that {first} writes before it ({hazard})"
        if hazard == "read-after-write":
            return f"reads {storage} that {first} writes before it ({hazard})"
        if self.dependence == "memory":
            return f"touches {storage}, which {first} touches before it, one of them writing it"
        if self.dependence == "effect":
            return f"draws random numbers or has side effects after {first} in program order"
        if self.dependence == "comm":
            return f"communicates after {first} in program order (ranks match by issue order)"
        return f"depends on {first} ({self.dependence})"


class RaceError(RuntimeError):
    """The sanitizer found cross-stream dependences not protected by a record/wait."""

    def __init__(self, violations: list[Violation]):
        self.violations = tuple(violations)
        lines = "; ".join(str(v) for v in violations)
        super().__init__(f"race detected: {lines}. Add a record after the first op and a "
                         f"wait on it before the second.")


class ThreadStateError(RuntimeError):
    """A stream ran under other thread-local state (grad, inference, autocast) than its caller."""


class SanitizerRun:
    """Per-call sanitizer state, shared by the stream threads of one call.

    ``orders``: what each op needs before it from other streams
    (:func:`autostream.runtime.orders.cross_stream_orders`, the runner's, computed once).
    """

    def __init__(self, config: SanitizerConfig, program: StreamProgram, call_index: int,
                 orders: Mapping[torch.fx.Node, tuple[Order, ...]]):
        self.config = config
        self.program = program
        self.orders = orders
        self.rngs = {k: random.Random(f"{config.seed}:{call_index}:{k}") for k in program.streams}
        self.clock: dict[int, dict[int, int]] = {k: {} for k in program.streams}
        self.stamp: dict[torch.fx.Node, tuple[int, int]] = {}
        self.token_clock: dict[str, dict[int, int]] = {}
        self.done: set[torch.fx.Node] = set()
        self._lock = threading.Lock()

    def _sleep(self, stream: int, scale: float, low: float = 0.0) -> None:
        if scale > 0:
            time.sleep(self.rngs[stream].uniform(low * scale, scale))

    def violations(self, consumer: torch.fx.Node, stream: int) -> list[Violation]:
        found = []
        config = self.config
        for order in self.orders.get(consumer, ()):
            first = order.before
            with self._lock:
                done = first in self.done
                stamp = self.stamp.get(first)
            if config.completion and not done:
                found.append(self._violation("early", order, consumer, stream))
            if config.happens_before and not (
                    stamp is not None and self.clock[stream].get(stamp[0], 0) >= stamp[1]):
                kind = "unordered" if order.kind == "data" else "hazard"
                found.append(self._violation(kind, order, consumer, stream))
        return found

    @staticmethod
    def _violation(kind: Literal["early", "unordered", "hazard"], order: Order,
                   consumer: torch.fx.Node, stream: int) -> Violation:
        return Violation(kind, order.before.name, order.stream, consumer.name, stream,
                         order.kind, order.storage, order.hazard)

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
