"""Runtimes executing rewritten graphs: ``sequential``, ``threads`` (CPU), ``streams`` and
``graph`` (accelerators: interpreted, or captured into a device graph and replayed).

May import: comm, cost, dialects, fx, memory.
"""

from autostream.runtime.graph_api import GraphAPI, TorchGraphAPI
from autostream.runtime.graphed import GraphRunner
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
    "GraphAPI",
    "GraphRunner",
    "ProgramError",
    "RaceError",
    "SanitizerConfig",
    "SequentialRunner",
    "Step",
    "StreamProgram",
    "StreamWaitTimeout",
    "StreamsRunner",
    "ThreadsRunner",
    "TorchGraphAPI",
    "TorchStreamAPI",
    "Violation",
    "make_runner",
    "parse_program",
    "select_runtime",
    "unordered_dependences",
]
