"""Distributed graphs on real ranks: autostream against the hand-written overlap (issue 14).

For each model of ``autostream.models.zoo_parallel`` (2 ranks on gloo here; NCCL with
``--backend nccl`` on GPUs), nine variants run side by side in one run, in rounds,
every rank calling the same variant at the same time (a barrier before each timed
call; a call's time is its slowest rank's):

- ``eager``: the module as written; functional collectives wait lazily, on first use;
- ``single``: ``torch.compile`` with Dynamo's eager backend: one stream, each
  collective's wait right after its launch (as Dynamo traces it);
- ``autostream``: ``autostream.backend(max_streams=2)``, the plan applied as planned
  (``measure=0``);
- ``chosen``: the same backend as users get it (``measure=3``): plan or single-stream
  graph, timed on the first calls and decided once for all ranks (slowest rank);
- ``ceiling``: the hand-written overlap, the usual idiom: ``torch.distributed``
  collectives launched with ``async_op=True`` before the compute they can hide behind
  (``model.overlapped``);
- ``ceiling compiled``: the same overlap written by hand for graph mode and compiled
  like ``single`` (Dynamo's graph run in program order): ``_c10d_functional`` launches
  and their ``wait_tensor`` placed by hand, an all-reduce in place on a value nothing
  else reads (``model.overlapped_graph``).  It pays Dynamo's frame as autostream does,
  so autostream's share of *its* gain compares the schedules alone (``of ceiling
  compiled``, the target); ``of ceiling`` is the share of the eager overlap's gain;
- ``single graph`` and ``autostream graph``: the graph ``single`` and ``autostream`` run,
  called directly, without Dynamo's frame (its guards and bytecode, a cost every
  compiled variant pays on every call and the eager ones do not): the schedule alone,
  against the ceiling on equal terms (``of ceiling, graphs``; ``dynamo us``: what
  Dynamo's frame adds to ``single graph``);
- ``functional``: the hand-written overlap with the ops a compiled graph holds: the
  forward's functional collectives in the same order, each result first used as late
  as the computation allows (``model.overlapped_functional``; for some models the
  forward itself, whose results wait on first use), run eagerly.  It shows what the
  collectives' own implementation costs: in-place ``c10d`` calls are cheaper than
  the functional ops (and their eager wrappers) on gloo, which no schedule of the
  graph can change.

Speed-ups are over ``single``; ``of ceiling`` is autostream's gain as a share of the
ceiling's (``(x_auto - 1) / (x_ceiling - 1)``, shown where the ceiling gains at
least 5%).  The headline gives the share's 90% bootstrap interval over the rounds,
and judges the target only where the interval does not contain it (the rounds of
2 ranks on 2 cores often do not resolve it).  The variants run in a new random order
every round (seeded by the round, the same on every rank): with an alternating order
a variant inherits the state its neighbours leave (freed buffers, the other rank's
lag).  ``predicted`` is the
planner's speed-up over one stream and its predicted time against the measured one,
planned with a cost table calibrated in the run
(on gloo): the collectives' link fits (``calibrate_collectives``) and the model's ops timed
inside its graphs on every rank, with the ranks' own thread count and beside the other
rank; all ranks plan with rank 0's table (``--cost-table`` plans with a given table
instead).
Every call of every variant is compared
with eager; ``wrong`` counts the calls that differ (on any rank).

    python -m experiments.distributed
    python -m experiments.distributed --models probe --runs 40
    python -m experiments.distributed --backend nccl --cost-table h200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autostream.comm.spawn import run_ranks
from experiments.headline import Headline, record

VARIANTS = ("eager", "single", "single graph", "autostream", "autostream graph", "chosen",
            "ceiling", "ceiling compiled", "functional")
#: the probe's all-reduce and matmul sizes; its depth (matmuls) is sized in the run so
#: that the chain takes about as long as the all-reduce (:func:`_probe_depth`)
PROBE = {"elements": 1 << 18, "rows": 64, "width": 512}
#: autostream's share of the hand-written overlap's gain, where that gain is CEILING or
#: more; the predicted speed-up within PREDICTION of the measured one
SHARE, CEILING, PREDICTION = 0.8, 1.2, 0.2
#: the share's interval: this central mass of its bootstrap over the rounds
INTERVAL, RESAMPLES = 0.9, 1000


@dataclass(frozen=True)
class Row:
    model: str
    ms: dict[str, float]  # variant -> median ms (slowest rank per call)
    wrong: int
    predicted_speedup: float
    predicted_ms: float
    plan: str
    sizes: dict = field(default_factory=dict)  # the builder's sizes, where the run chose them
    #: variant -> each round's time, ms (slowest rank), where the run kept them
    rounds: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def speedup(self, variant: str, over: str = "single") -> float:
        return self.ms[over] / self.ms[variant]

    @property
    def share_of_ceiling(self) -> float | None:
        """autostream's gain over ``single`` as a share of the eager ceiling's."""
        return self._share("autostream", "single")

    @property
    def share_of_compiled_ceiling(self) -> float | None:
        """autostream's gain over ``single`` as a share of the compiled ceiling's (both
        through Dynamo): the target."""
        return self._share("autostream", "single", ceiling="ceiling compiled")

    @property
    def graph_share_of_ceiling(self) -> float | None:
        """The same share with the compiled graphs called directly (no Dynamo frame)."""
        return self._share("autostream graph", "single graph")

    @property
    def dynamo_us(self) -> float:
        """What Dynamo's frame adds to a call of the single-stream graph."""
        return 1e3 * (self.ms["single"] - self.ms["single graph"])

    def _share(self, variant: str, over: str, ceiling: str = "ceiling") -> float | None:
        gain = self.speedup(ceiling, over) - 1.0
        return (self.speedup(variant, over) - 1.0) / gain if gain >= 0.05 else None

    def share_interval(self) -> tuple[float, float] | None:
        """The central ``INTERVAL`` of :attr:`share_of_compiled_ceiling` over bootstrap
        resamples of the rounds (each resample: rounds drawn with replacement, medians
        again; seeded, so the same rounds give the same interval); ``None`` without the
        rounds.  It says whether the rounds resolve the target at all."""
        if not self.rounds:
            return None
        picked = ("single", "autostream", "ceiling compiled")
        n = len(self.rounds["single"])
        rng = random.Random(0)
        shares = []
        for _ in range(RESAMPLES):
            rows = [rng.randrange(n) for _ in range(n)]
            ms = {v: statistics.median(self.rounds[v][i] for i in rows) for v in picked}
            share = dataclasses.replace(self, ms={**self.ms, **ms}).share_of_compiled_ceiling
            shares.append(share if share is not None else math.nan)
        shares = sorted(x for x in shares if not math.isnan(x))
        if len(shares) < RESAMPLES / 2:  # the ceiling's gain is under 5% in most resamples
            return None
        tail = (1 - INTERVAL) / 2
        return shares[int(tail * len(shares))], shares[int((1 - tail) * len(shares)) - 1]


def _same(a: Any, b: Any) -> bool:
    import torch

    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(a, b, strict=True))


def _to(values: tuple, device) -> tuple:
    return tuple(v.to(device) for v in values)


def _variants(model, backend_options: dict):
    import torch

    import autostream
    from autostream.models.zoo_parallel import GraphModeOverlap

    torch._dynamo.reset()
    planned = _Recorded(autostream.backend(max_streams=2, measure=0, **backend_options))
    chosen = autostream.backend(max_streams=2, measure=3, **backend_options)
    single = _Recorded(lambda gm, example_inputs: gm.forward)  # Dynamo's "eager" backend
    return {
        "eager": model,
        "single": torch.compile(model, backend=single),
        "single graph": _GraphCall(single),
        "autostream": torch.compile(model, backend=planned),
        "autostream graph": _GraphCall(planned),
        "chosen": torch.compile(model, backend=chosen),
        "ceiling": model.overlapped,
        "ceiling compiled": torch.compile(GraphModeOverlap(model),
                                          backend=lambda gm, example_inputs: gm.forward),
        "functional": model.overlapped_functional,
    }, planned


class _Recorded:
    """A backend that keeps what the backend it wraps returned, and its example inputs
    (its other attributes are the wrapped backend's)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.graphs: list[tuple[Any, list]] = []

    def __call__(self, gm, example_inputs):
        fn = self.backend(gm, example_inputs)
        self.graphs.append((fn, list(example_inputs)))
        return fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


class _GraphCall:
    """The one graph a compiled variant runs, called without Dynamo's frame.  Bound on its
    first call, which must follow the variant's first (compiling) call with the same
    inputs: each graph input that is one of them takes that input on later calls; the
    others (parameters, buffers) stay as they were."""

    def __init__(self, recorded: _Recorded) -> None:
        self._recorded = recorded
        self._slots: list[tuple[int | None, Any]] | None = None

    def __call__(self, *inputs):
        if self._slots is None:
            self._slots = self._bind(inputs)
        fn = self._recorded.graphs[0][0]
        return tuple(fn(*(inputs[i] if i is not None else value for i, value in self._slots)))

    def _bind(self, inputs: tuple) -> list[tuple[int | None, Any]]:
        if len(self._recorded.graphs) != 1:
            raise RuntimeError(f"{len(self._recorded.graphs)} graphs compiled; the direct "
                               "call needs exactly one (no graph break)")
        _, examples = self._recorded.graphs[0]
        return [(next((i for i, x in enumerate(inputs) if x is e), None), e) for e in examples]


def _prediction(planned) -> tuple[float, float, str]:
    """(predicted speed-up, predicted ms, what ran) of the last graph the backend planned."""
    report = next((r for r in reversed(planned.autostream_pass.reports) if r.plan), None)
    if report is None:
        return 1.0, float("nan"), "no graph"
    plan = report.plan
    lifted = planned.lifts[-1] if planned.lifts else None
    shape = "1 stream, reordered" if plan.reorders else f"{plan.schedule.streams_used} streams"
    if report.applied and lifted is not None and not isinstance(lifted, Exception):
        return lifted.predicted_speedup, lifted.predicted_us / 1e3, f"lifted, {shape}"
    if report.applied:
        return plan.predicted_speedup, plan.predicted_us / 1e3, f"ATen graph, {shape}"
    return 1.0, plan.single_stream_us / 1e3, "one stream: " + report.reason[:60]


def _calibrated(model, inputs: tuple, device, links: tuple, path: Path, rank: int) -> str:
    """Every rank times ``model``'s ops inside its graphs (their collectives run together,
    the same number of times); rank 0's table, with ``links``, is saved to ``path``, the
    table every rank plans with (one table: one plan)."""
    import torch.distributed as dist

    from autostream.calibration import calibrate_model

    table = calibrate_model(model, inputs, device, warmup=3, repeat=20, progress=False)
    if rank == 0:
        table.with_links(links).save(path)
    dist.barrier()
    return str(path)


def _rank(rank: int, world: int, names: list[str], runs: int, warmup: int, device_kind: str,
          backend_options: dict, calibrate_into: str | None = None, links: tuple = ()) -> dict:
    import torch
    import torch.distributed as dist

    from autostream.models.zoo_parallel import PARALLEL_ZOO

    device = torch.device(device_kind, rank) if device_kind != "cpu" else torch.device("cpu")
    out = {}
    for name in names:
        sizes = {}
        if name == "probe":
            sizes = dict(PROBE, depth=_probe_depth(device, links, backend_options["cost_table"]))
        model, make_inputs = PARALLEL_ZOO[name](rank, world, **sizes)
        model = model.to(device)
        options = dict(backend_options)
        if calibrate_into is not None:
            options["cost_table"] = _calibrated(
                model, _to(make_inputs(0), device), device, links,
                Path(calibrate_into) / f"{name}.json", rank)
        variants, planned = _variants(model, options)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        wrong = 0
        with torch.no_grad():
            for step in range(warmup + runs):
                inputs = _to(make_inputs(step), device)
                reference = model(*inputs)
                order = list(VARIANTS)
                random.Random(step).shuffle(order)
                for v in order:
                    dist.barrier()
                    if device.type != "cpu":
                        torch.accelerator.synchronize(device)
                    t0 = time.perf_counter()
                    got = variants[v](*inputs)
                    if device.type != "cpu":
                        torch.accelerator.synchronize(device)
                    elapsed = time.perf_counter() - t0
                    wrong += not _same(got, reference)
                    if step >= warmup:
                        times[v].append(elapsed)
        out[name] = {"times": times, "wrong": wrong, "prediction": _prediction(planned),
                     "sizes": sizes}
    return out


def _probe_depth(device, links: tuple, cost_table: str) -> int:
    """Matmuls in the probe's chain so that it takes about as long as its all-reduce: the
    all-reduce from the link fits (``links``, else ``cost_table``'s), a matmul and tanh
    timed here, on this rank's threads beside the other ranks; the largest depth of the
    ranks (every rank builds the same model)."""
    import torch
    import torch.distributed as dist

    from autostream.cost.collectives import estimate_transfer
    from autostream.cost.timing import make_timer
    from autostream.passes import load_table

    table = load_table(cost_table)
    transfer = estimate_transfer(links or table.table.links, table.profile, "all_reduce",
                                 4 * PROBE["elements"], dist.get_backend(),
                                 dist.get_world_size())
    b = torch.randn(PROBE["rows"], PROBE["width"], device=device)
    w = torch.randn(PROBE["width"], PROBE["width"], device=device) / PROBE["width"] ** 0.5
    layer_us = statistics.median(make_timer(device).samples(lambda: torch.tanh(b @ w),
                                                            warmup=5, repeat=25))
    depth = torch.tensor([max(1, round(transfer.duration_us / layer_us))], device=device)
    dist.all_reduce(depth, op=dist.ReduceOp.MAX)
    return int(depth.item())


def run(names: list[str], runs: int, warmup: int, backend: str, nproc: int,
        cost_table: str, time_limit: float, timeout_s: float = 1800.0,
        calibrate: bool = False) -> list[Row]:
    """The rows of ``names``; with ``calibrate``, each model is planned with a table
    calibrated in the run: its collectives' link fits and its ops on the ranks."""
    from autostream.cost.calibrate_collectives import DEVICE_OF_BACKEND, calibrate_collectives

    device = DEVICE_OF_BACKEND[backend]
    options = {"cost_table": cost_table, "time_limit": time_limit}
    links = tuple(calibrate_collectives(backend, nproc, timeout_s=timeout_s, progress=False)
                  if calibrate else ())
    with tempfile.TemporaryDirectory(prefix="autostream-distributed-") as tables:
        per_rank = run_ranks(_rank, nproc, args=(names, runs, warmup, device, options,
                                                tables if calibrate else None, links),
                             backend=backend, timeout_s=timeout_s)
    return rows_from_ranks(names, per_rank, runs)


def rows_from_ranks(names: list[str], per_rank: list[dict], runs: int) -> list[Row]:
    """One row per model: each call's slowest rank, medians over the runs."""
    rows = []
    for name in names:
        ranks = [r[name] for r in per_rank]
        rounds = {v: tuple(1e3 * max(r["times"][v][i] for r in ranks) for i in range(runs))
                  for v in VARIANTS}
        ms = {v: statistics.median(t) for v, t in rounds.items()}
        speedup, predicted_ms, what = ranks[0]["prediction"]
        rows.append(Row(name, ms, sum(r["wrong"] for r in ranks), speedup, predicted_ms, what,
                        ranks[0]["sizes"], rounds))
    return rows


def table(rows: list[Row]) -> str:
    head = ("| model | eager ms | single ms | single graph ms | autostream ms | autostream graph ms "
            "| chosen ms | ceiling ms | ceiling compiled ms | functional ms | autostream x | "
            "chosen x | ceiling x | ceiling compiled x | functional x | of ceiling compiled | "
            "of ceiling | of ceiling, graphs | dynamo us | predicted x | "
            "predicted / measured ms | wrong | plan |\n"
            "|---|" + "---|" * 22 + "\n")
    lines = []
    for r in rows:
        lines.append(
            f"| {r.model} | {r.ms['eager']:.2f} | {r.ms['single']:.2f} | "
            f"{r.ms['single graph']:.2f} | {r.ms['autostream']:.2f} | "
            f"{r.ms['autostream graph']:.2f} | {r.ms['chosen']:.2f} | {r.ms['ceiling']:.2f} | "
            f"{r.ms['ceiling compiled']:.2f} | {r.ms['functional']:.2f} | "
            f"{r.speedup('autostream'):.2f}x | {r.speedup('chosen'):.2f}x | "
            f"{r.speedup('ceiling'):.2f}x | {r.speedup('ceiling compiled'):.2f}x | "
            f"{r.speedup('functional'):.2f}x | {_percent(r.share_of_compiled_ceiling)} | "
            f"{_percent(r.share_of_ceiling)} | {_percent(r.graph_share_of_ceiling)} | "
            f"{r.dynamo_us:.0f} | {r.predicted_speedup:.2f}x | "
            f"{r.predicted_ms:.2f} / {r.ms['autostream']:.2f} | {r.wrong} | {r.plan} |")
    return head + "\n".join(lines)


def _percent(share: float | None) -> str:
    return f"{share:.0%}" if share is not None else "-"


def headlines(rows: list[Row], backend: str) -> list[Headline]:
    """Per model, autostream's share of the hand-written overlap's gain, both compiled (a
    target where that overlap gains CEILING or more), with the share of the eager
    overlap's gain beside it; the wrong calls; the prediction error."""
    out = []
    for r in rows:
        ceiling, share = r.speedup("ceiling compiled"), r.share_of_compiled_ceiling
        interval = r.share_interval()
        met = (share is not None and share >= SHARE) if ceiling >= CEILING else None
        spread = ""
        if interval is not None:
            lo, hi = interval
            spread = f" [{100 * INTERVAL:.0f}% interval {lo:.0%} to {hi:.0%}]"
            if met is not None and lo < SHARE <= hi:
                met, spread = None, spread[:-1] + ": the rounds do not resolve the target]"
        out.append(Headline(
            f"distributed {r.model} ({backend}): autostream's share of the hand-written "
            "overlap's gain, both compiled", f"{_percent(share)}{spread} "
            f"({r.speedup('autostream'):.2f}x vs {ceiling:.2f}x; of the eager overlap's "
            f"{r.speedup('ceiling'):.2f}x: {_percent(r.share_of_ceiling)}; graphs called "
            f"without Dynamo's frame: {_percent(r.graph_share_of_ceiling)}, the frame "
            f"{r.dynamo_us:.0f} us a call)",
            f">= {100 * SHARE:.0f}% where that gains >= {CEILING:g}x", met))
    wrong = sum(r.wrong for r in rows)
    out.append(Headline(f"distributed ({len(rows)} models, every variant and rank): calls "
                        "that differ from eager", str(wrong), "0", wrong == 0))
    errors = {r.model: r.speedup("autostream") / r.predicted_speedup - 1.0 for r in rows}
    if errors:
        worst = max(errors, key=lambda m: abs(errors[m]))
        within = sum(abs(e) <= PREDICTION for e in errors.values())
        out.append(Headline("distributed: predicted against measured speed-up",
                            f"{within}/{len(errors)} within; worst {100 * errors[worst]:+.0f}% "
                            f"({worst})", f"within {100 * PREDICTION:g}%",
                            within == len(errors)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="probe,two_allreduces,tp_mlp,ep_moe,fsdp")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl", "hccl"))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--cost-table", default=None,
                        help="plan with this table (default: on gloo, a table calibrated on the "
                             "ranks with the cpu table's link fits; h200 on nccl, ascend910b on "
                             "hccl)")
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds before a hung run is killed (default 1800)")
    parser.add_argument("--quick", action="store_true", help="8 runs, 2 warm-up")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write each round's time of every variant (ms, slowest rank) "
                             "to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.warmup = 8, 2
    calibrate = args.cost_table is None and args.backend == "gloo"
    cost_table = args.cost_table or {"gloo": "cpu", "nccl": "h200", "hccl": "ascend910b"}[
        args.backend]
    rows = run(args.models.split(","), args.runs, args.warmup, args.backend, args.nproc,
               cost_table, args.time_limit, args.timeout, calibrate)
    table_used = ("links and ops calibrated in the run" if calibrate
                  else f"cost table {cost_table}")
    print(f"{args.nproc} ranks on {args.backend}, {table_used}, median of {args.runs} "
          f"rounds (each call's slowest rank); speed-ups over `single`.")
    for r in rows:
        if r.sizes:
            print(f"{r.model}: " + ", ".join(f"{k}={v}" for k, v in r.sizes.items()) +
                  (" (depth sized in the run: the chain about as long as the all-reduce)"
                   if r.model == "probe" else ""))
    print()
    print(table(rows))
    if args.dump is not None:
        args.dump.write_text(json.dumps({r.model: r.rounds for r in rows}, indent=1))
    record(__file__, headlines(rows, args.backend))
    return 0 if all(r.wrong == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
