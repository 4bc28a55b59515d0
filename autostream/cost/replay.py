"""Calibration under graph replay: what each op costs inside a captured graph, and how much
two ops slow each other down there.

Replayed, a graph's kernels are issued by the device, not by the host, so an op costs
its device time plus the replay's gap between kernels; eager timing (events around
host-issued calls) measures the host's launch cost instead for small ops.  Here:

- **per op**: a graph of ``calls`` back-to-back calls of the op on its inputs is
  captured and replayed; ``calls`` is chosen from a first estimate (eager calls timed
  with device events) so that the graph runs about ``target_us`` (at most
  ``max_calls``).  Before capture the op runs eagerly on the capture stream (lazy
  initialisation, such as cuBLAS handles and workspaces, must not happen inside a
  capture).  Replays are timed with device events recorded on the current stream around
  ``replay()``, in ``rounds`` interleaved passes over a chunk of graphs (a burst of load
  spreads over many ops); an op's time is the median over rounds of replay time /
  ``calls``;
- **pairs**: for every op with a copy of itself (its own inputs copied: lane B must
  not find lane A's data in the cache), and every two of the ``cross_ops`` most
  expensive ops, three graphs: lane A alone, lane B alone, and both lanes on two side
  streams forked from the capture stream after capture begins and joined back before
  it ends (``docs/gpu-capture.md``); each lane runs about ``target_us`` alone.  The
  timings are kept (:class:`~autostream.cost.pairs.PairTiming`) and each op's device
  share is fitted to them (:func:`~autostream.cost.pairs.fit_shares`);
- **the device's graph costs** (:func:`graph_figures`): per kernel, per cross-stream
  dependence, per replay call.

The device is reached through a :class:`ReplayDevice`: the runtime's graph API
(``autostream.runtime.graph_api.GraphAPI``), its stream API
(``autostream.runtime.streams.StreamAPI``) and a :class:`ReplayTimer`, so that CPU tests
run all of it on a fake device (``tests/fake_device.py``).
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from tqdm import tqdm

from autostream.cost.calibrate import OpCase, _first_line, _quantile, _skip_reason, robust_time
from autostream.cost.inputs import make_inputs
from autostream.cost.pairs import PairTiming, ShareFit, fit_shares
from autostream.cost.signature import dtype_short
from autostream.cost.table import Entry, Skipped

__all__ = ["DEFAULT_SETTINGS", "EventTimer", "GraphFigures", "ReplayCalibration", "ReplayDevice", "ReplaySettings",
           "ReplayTimer", "calibrate_replay", "graph_figures"]

OpKey = tuple[str, str]
Inputs = tuple[tuple[Any, ...], dict[str, Any]]
#: inputs larger than this are shared by the two lanes of an op's self pair instead of
#: copied: far larger than any cache, so reading the same one gains lane B nothing
SHARE_ABOVE_BYTES = 1 << 30


class ReplayTimer(Protocol):
    """Device-event marks on the current stream, and the host's clock."""

    def mark(self) -> Any:
        """A mark recorded on the current stream now."""
        ...

    def elapsed_us(self, start: Any, end: Any) -> float:
        """Device time between two marks (after a synchronize)."""
        ...

    def now_us(self) -> float:
        """The host's monotonic clock."""
        ...


class EventTimer:
    """:class:`ReplayTimer` of a real device: ``torch.Event(enable_timing=True)``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.Event:
        event = torch.Event(device=self.device, enable_timing=True)
        event.record()
        return event

    def elapsed_us(self, start: torch.Event, end: torch.Event) -> float:
        return start.elapsed_time(end) * 1e3

    def now_us(self) -> float:
        return time.perf_counter_ns() / 1e3


@dataclass(frozen=True)
class ReplayDevice:
    """What replay calibration calls: ``graphs`` (``GraphAPI``), ``streams`` (``StreamAPI``)
    and ``timer`` (:class:`ReplayTimer`)."""

    graphs: Any
    streams: Any
    timer: ReplayTimer


@dataclass(frozen=True)
class ReplaySettings:
    """How much replay calibration measures (defaults sized, by :func:`work_estimate`, for
    about 500 op signatures in under two minutes of an H200; not yet timed on a GPU)."""

    #: device time of one timed replay (us): an op graph's, and each lane of a pair's
    target_us: float = 1000.0
    #: most calls of an op in one graph (a tiny op's graph then runs less than target_us)
    max_calls: int = 256
    #: timed replays of each graph, one per interleaved round
    rounds: int = 5
    #: eager calls before capture (lazy initialisation), then eager calls timed for the estimate
    warmup: int = 3
    estimate_calls: int = 5
    #: the most expensive ops, every two of which are timed together as well
    cross_ops: int = 8
    #: graphs alive and interleaved at once
    chunk: int = 48
    #: tiny kernels in the graphs of :func:`graph_figures`, and timed replay calls
    tiny_calls: int = 200
    call_repeat: int = 50

    def __post_init__(self) -> None:
        for name in ("max_calls", "rounds", "chunk", "tiny_calls", "call_repeat"):
            if getattr(self, name) < 1:
                raise ValueError(f"ReplaySettings.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "estimate_calls", "cross_ops"):
            if getattr(self, name) < 0:
                raise ValueError(f"ReplaySettings.{name} must be >= 0, got {getattr(self, name)}")
        if not self.target_us > 0:
            raise ValueError(f"ReplaySettings.target_us must be > 0, got {self.target_us}")

    def as_json(self) -> dict[str, Any]:
        return {"target_us": self.target_us, "max_calls": self.max_calls, "rounds": self.rounds,
                "warmup": self.warmup, "cross_ops": self.cross_ops}


#: the settings ``autostream calibrate`` uses
DEFAULT_SETTINGS = ReplaySettings()


def work_estimate(ops: int, settings: ReplaySettings = DEFAULT_SETTINGS) -> dict[str, float]:
    """Graphs captured, replays run and their device seconds for ``ops`` op signatures.

    >>> w = work_estimate(500)
    >>> w["graphs"], w["replays"], round(w["replay_s"], 1)
    (2087, 12522, 12.5)
    """
    cross = math.comb(min(settings.cross_ops, ops), 2)
    pairs = ops + cross
    graphs = ops + 3 * pairs + 3
    replays = graphs * (settings.rounds + 1)
    return {"graphs": graphs, "pairs": pairs, "replays": replays,
            "replay_s": replays * settings.target_us / 1e6}


# -- capture -------------------------------------------------------------------------

Lane = tuple[Callable[[], object], int]


def _capture(dev: ReplayDevice, stream: Any, lanes: Sequence[Lane], sides: Sequence[Any]) -> Any:
    """A graph of ``lanes``: one lane on the capture stream, or each lane on its own side
    stream, forked from the capture stream inside the capture and joined back before it
    ends."""
    streams = dev.streams

    def body() -> None:
        if len(lanes) == 1:
            run, calls = lanes[0]
            for _ in range(calls):
                run()
            return
        for side in sides:
            streams.wait_stream(side, stream)
        try:
            for side, (run, calls) in zip(sides, lanes, strict=True):
                streams.set_stream(side)
                for _ in range(calls):
                    run()
        finally:
            streams.set_stream(stream)
        for side in sides:
            streams.wait_stream(stream, side)

    graph = dev.graphs.new_graph()
    with warnings.catch_warnings():
        # an op without kernels (``empty_like``) makes an empty graph: expected here
        warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
        dev.graphs.capture(graph, body, stream, dev.graphs.new_pool())
    return graph


def _warm_up(dev: ReplayDevice, stream: Any, run: Callable[[], object], warmup: int,
             timed: int) -> float:
    """Eager calls on ``stream`` (after the caller's stream's work); returns the per-call
    device time of the last ``timed`` of them (an upper bound: it includes launch gaps)."""
    streams = dev.streams
    before = streams.current_stream()
    streams.wait_stream(stream, before)
    streams.set_stream(stream)
    try:
        for _ in range(warmup):
            run()
        start = dev.timer.mark()
        for _ in range(timed):
            run()
        end = dev.timer.mark()
    finally:
        streams.set_stream(before)
    dev.graphs.synchronize()
    return dev.timer.elapsed_us(start, end) / max(timed, 1)


def _calls_for(per_call_us: float, settings: ReplaySettings) -> int:
    """Calls that take about ``target_us`` at ``per_call_us`` each (1 to ``max_calls``).

    >>> _calls_for(3.0, ReplaySettings()), _calls_for(400.0, ReplaySettings())
    (256, 3)
    """
    if per_call_us <= 0:
        return settings.max_calls
    return max(1, min(settings.max_calls, math.ceil(settings.target_us / per_call_us)))


def _time_replays(dev: ReplayDevice, graphs: Sequence[Any], rounds: int) -> list[list[float]]:
    """Device time (us) of each graph's replay in each of ``rounds`` interleaved rounds,
    after one untimed replay of each."""
    for g in graphs:
        dev.graphs.replay(g)
    dev.graphs.synchronize()
    out: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        marks = []
        for g in graphs:
            start = dev.timer.mark()
            dev.graphs.replay(g)
            marks.append((start, dev.timer.mark()))
        dev.graphs.synchronize()
        for times, (start, end) in zip(out, marks, strict=True):
            times.append(dev.timer.elapsed_us(start, end))
    return out


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), max(1, size)):
        yield items[i:i + max(1, size)]


# -- ops -----------------------------------------------------------------------------

def _copy(value: Any) -> Any:
    """``value`` with each tensor copied (strides kept), except very large ones (shared)."""
    if isinstance(value, torch.Tensor):
        if value.numel() * value.element_size() > SHARE_ABOVE_BYTES:
            return value
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


@dataclass
class _Op:
    index: int
    case: OpCase
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    calls: int = 0
    rounds: list[list[float]] = field(default_factory=list)

    @property
    def key(self) -> OpKey:
        return (self.case.sig.op, self.case.sig.key)

    def run(self) -> object:
        return self.case.target(*self.args, **self.kwargs)

    def runner_on_a_copy(self) -> Callable[[], object]:
        target, args, kwargs = self.case.target, _copy(self.args), _copy(self.kwargs)
        return lambda: target(*args, **kwargs)

    @property
    def time_us(self) -> float:
        return robust_time(self.rounds)


def _prepare(cases: Sequence[OpCase], device: torch.device, inputs: Mapping[OpKey, Inputs],
             seed: int) -> tuple[list[_Op], list[Skipped]]:
    ops, skipped = [], []
    for i, case in enumerate(cases):
        reason = _skip_reason(case)
        if reason is None:
            key = (case.sig.op, case.sig.key)
            args, kwargs = inputs[key] if key in inputs else make_inputs(
                case.sig, device, torch.Generator().manual_seed(seed + i))
            op = _Op(i, case, args, kwargs)
            try:
                op.run()  # ops that cannot run fail here, before any capture
                ops.append(op)
                continue
            except Exception as exc:  # noqa: BLE001 - any op failure is a listed skip
                reason = f"failed on {device.type}: {_first_line(exc)}"
        skipped.append(Skipped(case.sig.op, case.sig.key, reason))
    return ops, skipped


def _time_ops(dev: ReplayDevice, stream: Any, ops: list[_Op], settings: ReplaySettings,
              tick: Callable[[str], None]) -> list[Skipped]:
    """Each op's per-call replay times (``op.rounds``), captured on ``stream``; ops that
    cannot be captured are dropped from ``ops`` and returned as skips."""
    failed: list[Skipped] = []
    for chunk in list(_chunks(list(ops), settings.chunk)):
        graphs = []
        for op in chunk:
            tick(op.case.sig.op)
            try:
                estimate = _warm_up(dev, stream, op.run, settings.warmup, settings.estimate_calls)
                op.calls = _calls_for(estimate, settings)
                graphs.append((op, _capture(dev, stream, [(op.run, op.calls)], ())))
            except Exception as exc:  # noqa: BLE001 - e.g. an op that syncs with the host
                ops.remove(op)
                failed.append(Skipped(op.case.sig.op, op.case.sig.key,
                                      f"cannot be captured in a graph: {_first_line(exc)}"))
        times = _time_replays(dev, [g for _, g in graphs], settings.rounds)
        for (op, _), replays in zip(graphs, times, strict=True):
            op.rounds = [[t / op.calls] for t in replays]
    return failed


def _pairs_to_time(ops: Sequence[_Op], cross_ops: int) -> list[tuple[_Op, _Op]]:
    """Every op with itself, then every two of the ``cross_ops`` most expensive ops."""
    top = sorted(ops, key=lambda o: (-o.time_us, o.index))[:cross_ops]
    top.sort(key=lambda o: o.index)
    return [(o, o) for o in ops] + list(itertools.combinations(top, 2))


def _time_pairs(dev: ReplayDevice, stream: Any, pairs: Sequence[tuple[_Op, _Op]],
                settings: ReplaySettings, tick: Callable[[str], None]
                ) -> tuple[list[PairTiming], list[str]]:
    """Each pair's lanes alone and together, captured on ``stream`` (where the ops were
    warmed up by :func:`_time_ops`) and two side streams."""
    sides = (dev.streams.new_stream(), dev.streams.new_stream())
    timings, notes = [], []
    for chunk in _chunks(pairs, max(1, settings.chunk // 3)):
        captured = []
        for a, b in chunk:
            tick(f"{a.case.sig.op} | {b.case.sig.op}")
            run_b = b.runner_on_a_copy() if a is b else b.run
            try:
                # each lane once eagerly on its side stream: per-stream state (a cuBLAS
                # workspace is kept per handle and stream) is set up outside the capture
                _warm_up(dev, sides[0], a.run, 1, 0)
                _warm_up(dev, sides[1], run_b, settings.warmup if a is b else 1, 0)
                lane_a = (a.run, _calls_for(a.time_us, settings))
                lane_b = (run_b, _calls_for(b.time_us, settings))
                graphs = [_capture(dev, stream, [lane_a], ()), _capture(dev, stream, [lane_b], ()),
                          _capture(dev, stream, [lane_a, lane_b], sides)]
            except Exception as exc:  # noqa: BLE001
                notes.append(f"pair {a.case.sig.op} | {b.case.sig.op} not timed: "
                             f"{_first_line(exc)}")
                continue
            # run_b (and its copied inputs) lives as long as the graphs that read them
            captured.append((a, b, lane_a[1], lane_b[1], graphs, run_b))
        times = _time_replays(dev, [g for c in captured for g in c[4]], settings.rounds)
        for i, (a, b, calls_a, calls_b, _, _) in enumerate(captured):
            alone_a, alone_b, together = (statistics.median(t) for t in times[3 * i:3 * i + 3])
            if min(alone_a, alone_b) <= 0:
                notes.append(f"pair {a.case.sig.op} | {b.case.sig.op} not kept: a lane took no "
                             "device time (an op without kernels)")
                continue
            timings.append(PairTiming(a.key, b.key, round(alone_a, 4), round(alone_b, 4),
                                      round(together, 4), calls_a, calls_b))
    return timings, notes


@dataclass(frozen=True)
class ReplayCalibration:
    """Entries (``timing="replay"``, shares fitted to the pairs), skips, the pair timings,
    the share fit and notes."""

    entries: tuple[Entry, ...]
    skipped: tuple[Skipped, ...]
    pairs: tuple[PairTiming, ...]
    fit: ShareFit
    notes: tuple[str, ...]


def _entry(op: _Op, share: float, slowdown: float) -> Entry:
    times = [t for r in op.rounds for t in r]
    spread = _quantile(times, 0.75) - _quantile(times, 0.25) if len(times) > 1 else 0.0
    sig = op.case.sig
    return Entry(op=sig.op, signature=sig.key, dtype=dtype_short(sig.dtype), flops=sig.flops,
                 bytes=sig.bytes, median_us=round(statistics.median(times), 4),
                 time_us=round(op.time_us, 4), spread_us=round(spread, 4), samples=len(times),
                 share=round(share, 4), slowdown=round(slowdown, 4), split=1.0,
                 flop_formula=sig.has_flop_formula, timing="replay")


def calibrate_replay(cases: Sequence[OpCase], device: torch.device, dev: ReplayDevice,
                     settings: ReplaySettings = DEFAULT_SETTINGS,
                     inputs: Mapping[OpKey, Inputs] | None = None, progress: bool = True,
                     seed: int = 0) -> ReplayCalibration:
    """Time ``cases`` under graph replay and fit their shares to pair timings (module
    docstring).  ``inputs`` holds real ``(args, kwargs)`` by ``(op, signature)`` (an op's
    time can depend on its data: a grouped matmul's on its group offsets); other ops run
    on random inputs."""
    with torch.no_grad():
        ops, skipped = _prepare(cases, device, inputs or {}, seed)
        bar = tqdm(total=len(ops), desc="calibrate (replay)", unit="graph",
                   disable=not progress, file=sys.stderr, dynamic_ncols=True)

        def tick(what: str) -> None:
            bar.set_postfix_str(what, refresh=False)
            bar.update()

        # one capture stream throughout: per-stream state set up by the warm-ups (cuBLAS
        # keeps a workspace per handle and stream) serves every capture
        stream = dev.graphs.new_stream()
        skipped += _time_ops(dev, stream, ops, settings, tick)
        pairs = _pairs_to_time(ops, settings.cross_ops)
        bar.total += len(pairs)
        bar.refresh()
        timings, notes = _time_pairs(dev, stream, pairs, settings, tick)
        bar.close()
    fit = fit_shares(timings)
    slowdown = {p.a: p.slowdown for p in timings if p.is_self}
    entries, unpaired = [], []
    for op in ops:
        if op.key not in fit.shares:
            unpaired.append(op.case.sig.op)
        entries.append(_entry(op, fit.shares.get(op.key, 1.0), slowdown.get(op.key, 2.0)))
    if timings:
        notes.append(fit.describe())
    if unpaired:
        notes.append(f"{len(unpaired)} ops without a pair timing keep share 1.0 (a whole "
                     f"device): {', '.join(sorted(set(unpaired)))}")
    return ReplayCalibration(tuple(entries), tuple(skipped), tuple(timings), fit, tuple(notes))


# -- the device's own graph costs ------------------------------------------------------

@dataclass(frozen=True)
class GraphFigures:
    """The device profile's ``graph_kernel_us``, ``graph_sync_us`` and ``graph_call_us``."""

    kernel_us: float
    sync_us: float
    call_us: float

    def as_profile(self) -> dict[str, float]:
        return {"graph_kernel_us": round(self.kernel_us, 4),
                "graph_sync_us": round(self.sync_us, 4),
                "graph_call_us": round(self.call_us, 4)}


def _alternating(dev: ReplayDevice, stream: Any, side: Any, step: Callable[[], object],
                 n: int) -> tuple[Callable[[], None], int]:
    """A capture body of ``n`` dependent ``step`` calls alternating between ``stream`` and
    ``side``, a record/wait at every change (and a join back); and the number of waits."""
    streams = dev.streams
    waits = (n - 1) + (1 if n % 2 == 0 else 0)  # every change, and the join after a side step

    def body() -> None:
        streams.set_stream(stream)  # the chain starts on ``stream``, whoever reruns the body
        current = stream
        for i in range(n):
            target = stream if i % 2 == 0 else side
            if target is not current:
                event = streams.new_event()
                streams.record(event, current)
                streams.wait_event(target, event)
                streams.set_stream(target)
                current = target
            step()
        if current is not stream:
            event = streams.new_event()
            streams.record(event, current)
            streams.wait_event(stream, event)
            streams.set_stream(stream)

    return body, waits


def graph_figures(dev: ReplayDevice, device: torch.device,
                  settings: ReplaySettings = DEFAULT_SETTINGS) -> GraphFigures:
    """The costs of replaying a graph, from tiny kernels (``x.add_(1)`` on one element):

    - ``kernel_us``: a graph of ``tiny_calls`` of them, replay time / ``tiny_calls``;
    - ``sync_us``: the same chain with every kernel on the other stream than the one
      before (a record/wait at each change), less the one-stream chain, per wait;
    - ``call_us``: host wall time of ``replay()`` then ``synchronize()`` of a graph of one
      of them, less that replay's device time (medians).
    """
    tiny = torch.zeros(1, device=device)

    def step() -> object:
        return tiny.add_(1)

    n = settings.tiny_calls
    stream, side = dev.graphs.new_stream(), dev.streams.new_stream()
    with torch.no_grad():
        _warm_up(dev, stream, step, settings.warmup, 0)
        chain = _capture(dev, stream, [(step, n)], ())
        body, waits = _alternating(dev, stream, side, step, n)
        crossing = dev.graphs.new_graph()
        dev.graphs.capture(crossing, body, stream, dev.graphs.new_pool())
        single = _capture(dev, stream, [(step, 1)], ())
        chain_us, crossing_us, single_us = (
            statistics.median(t) for t in _time_replays(dev, [chain, crossing, single],
                                                        settings.rounds))
        walls = []
        for _ in range(settings.call_repeat):
            start = dev.timer.now_us()
            dev.graphs.replay(single)
            dev.graphs.synchronize()
            walls.append(dev.timer.now_us() - start)
    return GraphFigures(kernel_us=chain_us / n,
                        sync_us=max(0.0, (crossing_us - chain_us) / max(waits, 1)),
                        call_us=max(0.0, statistics.median(walls) - single_us))
