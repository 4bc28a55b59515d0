"""Runtimes executing rewritten graphs: ``sequential``, ``threads`` (CPU), ``streams`` (accelerators).

May import: comm, cost, dialects, fx, memory.
"""

from autostream.runtime.program import (
    ProgramError,
    Step,
    StreamProgram,
    parse_program,
    unordered_dependences,
)
from autostream.runtime.sanitizer import RaceError, SanitizerConfig, Violation
from autostream.runtime.select import RUNTIMES, make_runner, select_runtime
from autostream.runtime.sequential import SequentialRunner
from autostream.runtime.streams import StreamsRunner, TorchStreamAPI
from autostream.runtime.threads import StreamWaitTimeout, ThreadsRunner

__all__ = [
    "RUNTIMES",
    "ProgramError",
    "RaceError",
    "SanitizerConfig",
    "SequentialRunner",
    "Step",
    "StreamProgram",
    "StreamWaitTimeout",
    "StreamsRunner",
    "ThreadsRunner",
    "TorchStreamAPI",
    "Violation",
    "make_runner",
    "parse_program",
    "select_runtime",
    "unordered_dependences",
]
