"""Shared test utilities: a uniform cost model, compile-and-compare, brute-force syncs, an
independent timeline check."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import dataclass

import networkx as nx
import pytest
import torch
import torch.fx

import autostream
from autostream.fx.graph import is_meta_only
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.schedule import JOIN, Schedule

#: how long a test waits for what takes milliseconds before it calls it a hang: only a
#: hang, never a loaded machine, can reach it
HANG_S = 120.0
BASELINES = ("single", "round_robin", "tf_greedy", "opara", "critical_path", "nimble", "heft",
             "overlap")
EPS = 1e-6


@dataclass(frozen=True)
class _Cost:
    duration_us: float
    share: float
    source: str
    split: float = 1.0


class UniformCosts:
    """Every real op takes ``us`` microseconds and contends with nothing: plans show the
    graph's structural parallelism."""

    sync_latency_us = 0.0
    launch_overhead_us = 0.0
    runtime_op_us = 0.0
    runtime_call_us = 0.0
    runtime_segment_us = 0.0

    def __init__(self, us: float = 10.0, share: float = 0.0) -> None:
        self.us, self.share = us, share

    def estimate(self, node: torch.fx.Node) -> _Cost:
        if is_meta_only(node):
            return _Cost(0.0, 0.0, "free")
        return _Cost(self.us, self.share, "roofline")

    def transfer(self, collective, nbytes, backend=None, world_size=None) -> None:
        return None  # collectives cost what their ops cost


class SteppedClock:
    """A clock that stands still until an op moves it, for the runtime's bounded waits.

    ``advance`` (called from a stream's op) lets the other threads read the clock
    ``reads`` times first (a bounded wait reads it twice per poll: it is polling now),
    moves it on by ``seconds``, then holds until they read it ``reads`` times more (a
    whole poll saw the new time): what a wait decides depends on the readings, never on
    how fast the machine is.
    """

    def __init__(self, readers: int = 1, reads: int = 3):
        self.now = 0.0
        self.readers, self.reads = readers, reads
        self._counts: Counter[int] = Counter()
        self._changed = threading.Condition()

    def __call__(self) -> float:
        with self._changed:
            self._counts[threading.get_ident()] += 1
            self._changed.notify_all()
            return self.now

    def advance(self, seconds: float) -> None:
        with self._changed:
            self._read_by_others()
            self.now += seconds
            self._read_by_others()

    def _read_by_others(self) -> None:
        me = threading.get_ident()
        start = Counter({t: n for t, n in self._counts.items() if t != me})

        def enough() -> bool:
            return sum(self._counts[t] - start[t] >= self.reads
                       for t in self._counts if t != me) >= self.readers

        if not self._changed.wait_for(enough, timeout=HANG_S):
            raise AssertionError(f"no {self.readers} other thread(s) read the clock "
                                 f"{self.reads} times within {HANG_S:g} s")


def as_tuple(x):
    return x if isinstance(x, (tuple, list)) else (x,)


def compile_and_compare(model, inputs, **options):
    """Compile with autostream, check outputs equal eager; return the pass's last report."""
    torch._dynamo.reset()
    be = autostream.backend(**options)
    compiled = torch.compile(model, backend=be)
    with torch.no_grad():
        expected = as_tuple(model(*inputs))
        got = as_tuple(compiled(*inputs))
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    return be.autostream_pass.last_report


def minimum_sync_count(deps: nx.DiGraph, schedule: Schedule) -> int:
    """Brute force: the fewest cross-stream dependences (and joins) that, with program order
    on every stream, imply all of them."""
    stream_of = dict(schedule.stream_of)
    stream_of[JOIN] = 0
    order = [*schedule.order, JOIN]
    base = nx.DiGraph()
    base.add_nodes_from(order)
    last: dict[int, str] = {}
    for n in order:
        s = stream_of[n]
        if s in last:
            base.add_edge(last[s], n)
        last[s] = n
    required = {(u, v) for u, v in deps.edges if stream_of[u] != stream_of[v]}
    required |= {(n, JOIN) for s, n in last.items() if s != 0}
    required = sorted(required)
    for k in range(len(required) + 1):
        for subset in itertools.combinations(required, k):
            h = base.copy()
            h.add_edges_from(subset)
            closure = nx.transitive_closure_dag(h)
            if all(closure.has_edge(u, v) for u, v in required):
                return k
    raise AssertionError("unreachable")


def assert_valid(problem: SchedulingProblem, s: Schedule) -> None:
    """The checks a verifier makes on a timeline, written independently of the simulator."""
    g = problem.graph
    assert set(s.stream_of) == set(g) == set(s.order)
    assert len(s.order) == len(g)
    assert all(0 <= k < problem.streams for k in s.stream_of.values())
    pos = {n: i for i, n in enumerate(s.order)}
    for u, v in g.edges:
        assert pos[u] < pos[v], f"launch order puts {v} before its producer {u}"
        lat = problem.sync_latency_us if s.stream_of[u] != s.stream_of[v] else 0.0
        assert s.end[u] + lat <= s.start[v] + EPS, f"{v} starts before {u} ends (+latency)"
    for n in g:
        assert s.end[n] - s.start[n] >= problem.duration(n) - EPS
    for ops in s.stream_sequences().values():
        for a, b in itertools.pairwise(ops):
            assert s.end[a] <= s.start[b] + EPS, f"{a} and {b} overlap on one stream"
    assert s.makespan == pytest.approx(max(s.end.values(), default=0.0))
    assert s.makespan >= problem.lower_bound() - EPS
