"""Offline calibration: time each distinct op signature of a model on a real device.

Every distinct op signature of a model's post-grad ATen graphs runs on random
tensors of those shapes (warm-up, then ``repeat`` timed runs), has its device share
measured by running a second copy concurrently, and is timed again inside its whole
graph (:mod:`autostream.cost.incontext`); the device profile (peak FLOP/s, bandwidth,
launch, record/wait and stream-switch costs) is measured too.  Ops that cannot run
alone are skipped with a reason.

Split factor and device share.  A multi-stream plan runs on its own share of the
intra-op threads (CPU: half of them for two streams; accelerator streams do not
split the device).  With ``alone`` the time of ``n`` calls alone with every thread,
``alone_split`` the same calls with half of them and ``together`` the time of ``n``
calls each of two copies running concurrently at half the threads:
``split = alone_split / alone`` (>= 1) scales the op's time in a multi-stream plan,
and the slowdown ``r = together / alone_split`` (1 = perfect overlap, 2 = fully
serialised) gives
``share = clamp(r / 2, 0, 1)``.  Under the simulator's processor-sharing model two
copies of an op with share ``s > 0.5`` each run at ``1 / (2 s)`` of full speed, so
this share reproduces the measured pair slowdown exactly; ``r <= 1`` (no slowdown)
maps to ``0.5``, the conservative end of the shares that predict no slowdown.

The whole calibration of a model (these op times, the device profile, the runtime's
own costs) is :func:`autostream.calibration.calibrate_model`.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda a: (a @ a).relu())(torch.ones(4, 4))
>>> [case.sig.op for case in collect_ops([gm])]
['aten.mm.default', 'aten.relu.default']
"""

from __future__ import annotations

import logging
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx
from tqdm import tqdm

from autostream.comm.registry import DEFAULT_REGISTRY, looks_like_communication, qualified_name
from autostream.cost.free import is_free_target
from autostream.cost.incontext import GraphTimer, own_inputs
from autostream.cost.inputs import make_inputs
from autostream.cost.profile import DeviceProfile
from autostream.cost.signature import OpSignature, dtype_short, node_signature
from autostream.cost.table import Entry, Skipped

log = logging.getLogger("autostream")

#: contention measurements per op (the median is kept): an op's share moves between
#: calibrations on a shared machine, which ``--runs`` narrows further
CONTENTION_REPEATS = 7
#: target wall time of each contention measurement (us); keeps calibration quick
CONTENTION_TARGET_US = 20_000.0
#: timing passes over all ops (samples of one op are spread over time; see _time_rounds)
ROUNDS = 10


@dataclass(frozen=True)
class OpCase:
    """One distinct op signature to calibrate and the callable that runs it."""

    sig: OpSignature
    target: Any


def collect_ops(graphs: Iterable[torch.fx.GraphModule]) -> list[OpCase]:
    """Distinct non-free ``call_function`` signatures, in first-appearance order.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: (x + 1) + 1, tracing_mode="fake")(torch.ones(3))
    >>> [c.sig.op for c in collect_ops([gm])]
    ['aten.add.Tensor']
    """
    seen: dict[tuple[str, str], OpCase] = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function" or is_free_target(node.target):
                continue
            sig = node_signature(node)
            seen.setdefault((sig.op, sig.key), OpCase(sig, node.target))
    return list(seen.values())


def op_keys(gm: torch.fx.GraphModule) -> dict[str, tuple[str, str]]:
    """Each non-free ``call_function`` node's name -> its cost key ``(op, signature)``.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> op_keys(make_fx(lambda x: (x + 1).view(-1), tracing_mode="fake")(torch.ones(2)))
    {'add': ('aten.add.Tensor', 'f32[2], 1')}
    """
    out = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_free_target(node.target):
            sig = node_signature(node)
            out[node.name] = (sig.op, sig.key)
    return out


def _skip_reason(case: OpCase) -> str | None:
    name = qualified_name(case.target)
    if name is not None and (name in DEFAULT_REGISTRY or looks_like_communication(name)):
        # alone it would wait for peers that are not calling it (and the contention
        # measurement runs two copies at once); its time is its link's
        return ("communication: timed on real ranks by `autostream calibrate --collectives`, "
                "not alone")
    if case.sig.approximate:
        return "data-dependent shape: a symbolic size has no hint"
    if not isinstance(case.target, torch._ops.OpOverload):
        return f"not an ATen op overload ({type(case.target).__name__}); cannot run it alone"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _runners(case: OpCase, device: torch.device, seed: int
             ) -> tuple[Callable[[], object], Callable[[], object]]:
    """Two independent closures running the op on their own random inputs."""
    gen = torch.Generator().manual_seed(seed)
    target = case.target
    args, kwargs = make_inputs(case.sig, device, gen)
    args2, kwargs2 = make_inputs(case.sig, device, gen)
    return (lambda: target(*args, **kwargs)), (lambda: target(*args2, **kwargs2))


@dataclass
class _Job:
    index: int
    case: OpCase
    run: Callable[[], object]
    run2: Callable[[], object]
    rounds: list[list[float]]

    @property
    def times(self) -> list[float]:
        return [t for r in self.rounds for t in r]


def _prepare(cases: Sequence[OpCase], device: torch.device, seed: int
             ) -> tuple[list[_Job], list[Skipped]]:
    jobs, skipped = [], []
    for i, case in enumerate(cases):
        reason = _skip_reason(case)
        if reason is None:
            try:
                run, run2 = _runners(case, device, seed + i)
                run()  # a trial call: ops that cannot run fail here, before any timing
                jobs.append(_Job(i, case, run, run2, []))
                continue
            except Exception as exc:  # noqa: BLE001 - any op failure is a listed skip
                reason = f"failed on {device.type}: {_first_line(exc)}"
        skipped.append(Skipped(case.sig.op, case.sig.key, reason))
    return jobs, skipped


def _time_rounds(jobs: list[_Job], timer: Any, warmup: int, repeat: int, rounds: int,
                 tick: Callable[[str], None]) -> list[Skipped]:
    """Collect ``repeat`` samples per job in ``rounds`` interleaved passes over all jobs,
    so that a burst of load from elsewhere spreads over many ops instead of biasing one."""
    rounds = max(1, min(rounds, repeat))
    failed: list[Skipped] = []
    for r in range(rounds):
        per = repeat // rounds + (1 if r < repeat % rounds else 0)
        for job in list(jobs):
            tick(job.case.sig.op)
            try:
                job.rounds.append(timer.samples(job.run, warmup if r == 0 else min(warmup, 1),
                                                per))
            except Exception as exc:  # noqa: BLE001
                jobs.remove(job)
                failed.append(Skipped(job.case.sig.op, job.case.sig.key,
                                      f"failed while timing: {_first_line(exc)}"))
    return failed


def time_ops(cases: Sequence[OpCase], device: torch.device, timer: Any, warmup: int = 5,
             repeat: int = 30, rounds: int = ROUNDS, seed: int = 0
             ) -> dict[int, list[list[float]]]:
    """Per-call times (us) of each runnable case (by index in ``cases``), grouped by
    timing round; no share."""
    jobs, _ = _prepare(cases, device, seed)
    with torch.no_grad():
        _time_rounds(jobs, timer, warmup, repeat, rounds, lambda op: None)
    return {j.index: j.rounds for j in jobs}


def robust_time(rounds: Sequence[Sequence[float]]) -> float:
    """Median over rounds of each round's fastest sample: what the op costs when no
    other process takes the core away in the middle of it.

    >>> robust_time([[10, 12], [11, 40], [900, 13]])
    11
    """
    return statistics.median(min(r) for r in rounds if r)


def _entry(job: _Job, timer: Any) -> Entry:
    times = job.times
    median = statistics.median(times)
    spread = _quantile(times, 0.75) - _quantile(times, 0.25) if len(times) > 1 else 0.0
    n = int(min(400, max(10, math.ceil(CONTENTION_TARGET_US / max(median, 1e-3)))))
    ratios, splits = [], []
    for _ in range(CONTENTION_REPEATS):
        alone, together, alone_split = timer.contention(job.run, job.run2, n)
        splits.append(alone_split / alone if alone > 0 else 1.0)
        ratios.append(together / alone_split if alone_split > 0 else 1.0)
    slowdown = statistics.median(ratios)
    split = max(1.0, statistics.median(splits))
    sig = job.case.sig
    return Entry(
        op=sig.op, signature=sig.key, dtype=dtype_short(sig.dtype),
        flops=sig.flops, bytes=sig.bytes, median_us=round(median, 4),
        time_us=round(robust_time(job.rounds), 4),
        spread_us=round(spread, 4), samples=len(times),
        share=round(min(1.0, max(0.0, slowdown / 2)), 4), slowdown=round(slowdown, 4),
        split=round(split, 4), flop_formula=sig.has_flop_formula,
    )


def calibrate_ops(cases: Sequence[OpCase], device: torch.device, timer: Any, warmup: int = 5,
                  repeat: int = 30, progress: bool = True, rounds: int = ROUNDS, seed: int = 0
                  ) -> tuple[list[Entry], list[Skipped]]:
    """Measure every case (time, then device share); failures become :class:`Skipped`
    with their reason, in case order."""

    jobs, skipped = _prepare(cases, device, seed)
    rounds = max(1, min(rounds, repeat))
    bar = tqdm(total=len(jobs) * (rounds + 1), desc="calibrate", unit="step",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)

    def tick(op: str) -> None:
        bar.set_postfix_str(op, refresh=False)
        bar.update()

    entries = []
    with torch.no_grad():
        skipped += _time_rounds(jobs, timer, warmup, repeat, rounds, tick)
        for job in jobs:
            tick(job.case.sig.op)
            try:
                entries.append(_entry(job, timer))
            except Exception as exc:  # noqa: BLE001
                skipped.append(Skipped(job.case.sig.op, job.case.sig.key,
                                       f"failed while measuring contention: {_first_line(exc)}"))
    bar.close()
    return entries, skipped


def graph_op_times(graphs: Sequence[torch.fx.GraphModule], device: torch.device,
                   warmup: int = 3, repeat: int = 30, rounds: int = ROUNDS,
                   graph_args: Sequence[Sequence[Any] | None] = ()
                   ) -> tuple[dict[tuple[str, str], list[list[float]]], list[str]]:
    """In-graph times (us) pooled per op signature and grouped by round, over ``repeat``
    runs of each graph in interleaved rounds; plus a note for each graph that could not
    run.  A graph runs on its real arguments where ``graph_args`` has them (an op's time
    can depend on its data: ``masked_fill`` under a causal mask runs several times faster
    than under a random one), else on random inputs."""
    timers, notes = [], []
    for gi, gm in enumerate(graphs):
        real = graph_args[gi] if gi < len(graph_args) else None
        try:
            timer = GraphTimer(gm, device, None if real is None else own_inputs(gm, real, device),
                               seed=gi)
            timer.run(warmup, 1)
        except Exception as exc:  # noqa: BLE001 - e.g. data-dependent control on random inputs
            inputs = "random inputs" if real is None else "its real arguments"
            notes.append(f"graph {gi} could not run on {inputs} ({_first_line(exc)}); "
                         "its ops keep their isolated times")
            continue
        timers.append((timer, op_keys(gm)))
    pooled: dict[tuple[str, str], list[list[float]]] = {}
    rounds = max(1, min(rounds, repeat))
    for r in range(rounds):
        per = repeat // rounds + (1 if r < repeat % rounds else 0)
        this_round: dict[tuple[str, str], list[float]] = {}
        for timer, names in timers:
            for name, times in timer.run(1, per).items():
                if name in names:
                    this_round.setdefault(names[name], []).extend(times)
        for key, times in this_round.items():
            pooled.setdefault(key, []).append(times)
    return pooled, notes


def with_graph_times(entries: list[Entry], pooled: dict[tuple[str, str], list[list[float]]]
                      ) -> list[Entry]:
    out = []
    for e in entries:
        rounds = pooled.get(e.key)
        times = [t for r in rounds or () for t in r]
        if not times:
            out.append(e)
            continue
        spread = _quantile(times, 0.75) - _quantile(times, 0.25) if len(times) > 1 else 0.0
        out.append(replace(e, median_us=round(statistics.median(times), 4),
                           spread_us=round(spread, 4), samples=len(times), timing="graph",
                           isolated_us=e.time_us, time_us=round(robust_time(rounds), 4)))
    return out


def _median_call_us(fn: Callable[[], object], timer: Any, warmup: int, repeat: int) -> float:
    return statistics.median(timer.samples(fn, warmup, repeat))


#: the most a measured f64 peak may exceed the f32 one by (no device computes f64 faster;
#: beyond timing noise the machine was busy while one of them was timed)
F64_OVER_F32 = 1.5
#: peak measurements before a profile whose peaks contradict each other is refused
PEAK_TRIES = 3


def measure_peaks(device: torch.device, timer: Any) -> dict[str, float]:
    """Peak FLOP/s per dtype this device runs: a square matmul's."""
    peaks = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        # CPUs without native half-precision units run those dtypes ~50x slower: keep it short
        n = 4096 if device.type != "cpu" else (384 if dtype in (torch.float32, torch.float64)
                                                else 128)
        try:
            a = torch.randn(n, n, device=device).to(dtype)
            t = _median_call_us(lambda a=a: torch.mm(a, a), timer, 2, 5)
            peaks[dtype_short(dtype)] = 2 * n**3 / (t * 1e-6)
        except Exception:  # noqa: BLE001 - dtype unsupported on this device
            continue
    return peaks


def peak_contradiction(peaks: dict[str, float]) -> str | None:
    """Why measured peaks contradict each other, in words (``None``: they do not).

    >>> peak_contradiction({"f32": 13.7e9, "f64": 107e9})
    'the f64 peak (107.0 GFLOP/s) is 7.8x the f32 peak (13.7 GFLOP/s): no device computes f64 faster than f32'
    >>> peak_contradiction({"f32": 60e9, "f64": 31e9}) is None
    True
    """
    f32, f64 = peaks.get("f32"), peaks.get("f64")
    if not f32 or not f64 or f64 <= F64_OVER_F32 * f32:
        return None
    return (f"the f64 peak ({f64 / 1e9:.1f} GFLOP/s) is {f64 / f32:.1f}x the f32 peak "
            f"({f32 / 1e9:.1f} GFLOP/s): no device computes f64 faster than f32")


def checked_peaks(measure: Callable[[], dict[str, float]], tries: int = PEAK_TRIES
                  ) -> dict[str, float]:
    """``measure()``'s peaks, measured again while they contradict each other (a stall of
    the machine during one dtype's timing), up to ``tries`` times; then refused.

    >>> checked_peaks(lambda: {"f32": 13.7e9, "f64": 107e9})
    Traceback (most recent call last):
    ...
    ValueError: device profile refused: the f64 peak (107.0 GFLOP/s) is 7.8x the f32 peak (13.7 GFLOP/s): no device computes f64 faster than f32, in 3 measurements; the machine was busy while they were timed: calibrate on a quiet machine (`--threads 1 --runs 3` steady a shared one)
    """
    for _ in range(max(1, tries)):
        peaks = measure()
        why = peak_contradiction(peaks)
        if why is None:
            return peaks
    raise ValueError(f"device profile refused: {why}, in {max(1, tries)} measurements; the "
                     f"machine was busy while they were timed: calibrate on a quiet machine "
                     f"(`--threads 1 --runs 3` steady a shared one)")


def measure_profile(device: torch.device, timer: Any, name: str,
                    runtime_us: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> DeviceProfile:
    """Peak FLOP/s per dtype (a square matmul: :func:`measure_peaks`, refused where they
    contradict each other: :func:`checked_peaks`), bandwidth (a large copy), launch
    overhead (host time of a tiny op), record/wait and stream-switch costs, and
    ``torch.compile``'s per-call cost; ``runtime_us`` is the multi-stream runtime's
    ``(per_node, per_call, per_segment)`` (:func:`autostream.runtime.overhead.runtime_costs`)."""

    peaks = checked_peaks(lambda: measure_peaks(device, timer))
    numel = (8 << 20) if device.type == "cpu" else (256 << 20)
    x = torch.empty(numel, device=device)
    y = torch.empty_like(x)
    t = _median_call_us(lambda: y.copy_(x), timer, 2, 7)
    bandwidth = 2 * x.numel() * x.element_size() / (t * 1e-6)
    # launch overhead: host time of one call of a 1-element op through the same dispatch
    # path as the calibrated ops (median of single calls, no synchronisation)
    tiny = torch.ones(1, device=device)
    add = torch.ops.aten.add.Tensor
    timer.synchronize()
    for _ in range(20):
        add(tiny, tiny)
    clock, calls = time.perf_counter_ns, []
    for _ in range(500):
        t0 = clock()
        add(tiny, tiny)
        calls.append((clock() - t0) / 1e3)
    launch = statistics.median(calls)
    timer.synchronize()
    per_node, per_call, per_segment = runtime_us
    compile_call = compile_call_cost(device)
    return DeviceProfile(
        name=name, kind=device.type, origin="measured", peak_flops=peaks, bandwidth=bandwidth,
        launch_overhead_us=round(launch, 4), record_wait_us=round(timer.record_wait_us(), 4),
        stream_switch_us=round(timer.stream_switch_us(), 4),
        runtime_op_us=round(per_node, 4), runtime_call_us=round(per_call, 4),
        runtime_segment_us=round(per_segment, 4), compile_call_us=round(compile_call, 4),
    )


def compile_call_cost(device: torch.device, repeat: int = 400, rounds: int = ROUNDS) -> float:
    """What ``torch.compile`` adds to each call over eager, in us (0.0 if it cannot compile here).

    A module of two small linear layers, compiled with Dynamo's identity backend
    (the graph it runs is the eager code itself), against the same module called
    eagerly: median host time of single calls, interleaved in ``rounds``.  What is
    left is ``torch.compile``'s own per-call work (the compiled module's wrapper,
    Dynamo's frame evaluation, guards on inputs and parameters) that every backend
    pays, autostream's included.  It grows with the guards, so a model with many
    parameters pays somewhat more.

    >>> compile_call_cost(torch.device("cpu"), repeat=20, rounds=2) >= 0.0
    True
    """
    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    small = Small().to(device)
    args = (torch.randn(1, 4, device=device),)
    clock = time.perf_counter_ns
    samples: dict[str, list[float]] = {"eager": [], "compiled": []}
    try:
        compiled = torch.compile(small, backend="eager")
        with torch.no_grad():
            compiled(*args)
            for _ in range(max(1, rounds)):
                for name, fn in (("eager", small), ("compiled", compiled)):
                    for _ in range(50):  # the first calls after compiling are slower
                        fn(*args)
                    for _ in range(max(1, repeat // max(1, rounds))):
                        t0 = clock()
                        fn(*args)
                        samples[name].append((clock() - t0) / 1e3)
    except Exception as exc:  # noqa: BLE001 - e.g. Dynamo unsupported on this Python
        log.warning("autostream calibrate: torch.compile's per-call cost not measured (%s); "
                    "it is recorded as 0", _first_line(exc))
        return 0.0
    return max(0.0, statistics.median(samples["compiled"]) - statistics.median(samples["eager"]))


def device_name(device: torch.device) -> str:
    """A label for the machine: CPU model and core count, or the accelerator's name."""
    if device.type == "cpu":
        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return f"{model} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    backend = getattr(torch, device.type, None)
    get = getattr(backend, "get_device_name", None)
    return get(device) if get else device.type
