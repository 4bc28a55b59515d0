"""What ``deterministic=True`` costs on the threads runtime, and what it buys (issue 26).

By default the threads runtime divides the caller's intra-op threads between the
streams (the main stream ``budget // streams``, side streams one), and a reduction run
with fewer threads than eager may differ from eager's in its last bits.
``deterministic=True`` gives every op eager's count (``autostream.runtime.threads``).

For each model of the speed-up experiment (``experiments.speedup.models``), under
``no_grad``: eager, Dynamo's identity backend (``torch.compile(backend="eager")``:
what any compiled graph computes), and the plan (``measure=0``, so it always runs)
on the threads runtime with and without ``deterministic``, timed alternately (median
of ``--runs`` rounds, as ``experiments.speedup``).  Plans use the ``h200`` table by
default, as the correctness sweep does: it gives these small models plans on two
streams, where the option matters (the ``cpu`` table keeps most of them on one, where
both variants run the same graph the same way).  ``cost`` is deterministic over
default time; ``bitwise`` whether the outputs of 3 calls equal eager's bit for bit
(``dynamo`` is the reference: a graph that differs from eager already under
Dynamo cannot be bitwise for any backend).

    python -m experiments.deterministic
    python -m experiments.deterministic --models moe,two_branch_gemv_d8 --runs 40
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

import autostream
from autostream.equivalence import bitwise_equal
from experiments.headline import Headline, record
from experiments.speedup import add_timing_arguments, cell, selected_models, time_alternating

VARIANTS = ("default", "deterministic")


@dataclass(frozen=True)
class Row:
    model: str
    streams: int
    eager_ms: float
    default_ms: float
    deterministic_ms: float
    #: outputs of every call equal eager's bit for bit: Dynamo's graph, default, deterministic
    bitwise: dict[str, bool]

    @property
    def cost(self) -> float:
        return self.deterministic_ms / self.default_ms


def _tensors(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _bitwise(fn: Callable[[], Any], expected: list[torch.Tensor], calls: int = 3) -> bool:
    return all(all(bitwise_equal(g, e) for g, e in zip(_tensors(fn()), expected, strict=True))
               for _ in range(calls))


def measure_model(name: str, factory, args: argparse.Namespace) -> Row:
    model, inputs = factory()
    options: dict[str, Any] = {"max_streams": 2, "measure": 0, "runtime": "threads"}
    if args.cost_table:
        options["cost_table"] = args.cost_table
    torch._dynamo.reset()
    with torch.no_grad():
        expected = _tensors(model(*inputs))
        variants: dict[str, Callable[[], Any]] = {"eager": partial(model, *inputs)}
        bitwise = {"dynamo": _bitwise(partial(torch.compile(model, backend="eager"), *inputs),
                                      expected)}
        streams = 1
        for variant in VARIANTS:
            be = autostream.backend(deterministic=variant == "deterministic", **options)
            fn = partial(torch.compile(model, backend=be), *inputs)
            bitwise[variant] = _bitwise(fn, expected)
            variants[variant] = fn
            report = be.autostream_pass.last_report
            if report is not None and report.applied:
                streams = report.plan.schedule.streams_used
        medians = time_alternating(variants, args.runs, args.warmup, settle_s=args.settle_ms / 1e3)
    torch._dynamo.reset()
    return Row(name, streams, medians["eager"] * 1e3, medians["default"] * 1e3,
               medians["deterministic"] * 1e3, bitwise)


def print_table(rows: list[Row], threads: int, load: float) -> None:
    print(f"Threads runtime, {threads} intra-op threads, no_grad; ms per call (median); "
          "`cost`: deterministic / default; bitwise: outputs equal to eager's bit for bit "
          "(`dynamo`: Dynamo's own graph, the reference).  Load average at the end: "
          f"{load:.1f} on {os.cpu_count()} cores (other processes' load slows every variant "
          "that runs more intra-op threads than cores are free: eager and deterministic).")
    print()
    print("| model | streams | eager ms | default ms | deterministic ms | cost | bitwise: "
          "dynamo / default / deterministic |")
    print("|---|---:|---:|---:|---:|---:|---|")
    yes = {True: "yes", False: "no"}
    for r in rows:
        flags = " / ".join(yes[r.bitwise[k]] for k in ("dynamo", *VARIANTS))
        print(f"| {r.model} | {r.streams} | {cell(r.eager_ms, 0, 3)} | "
              f"{cell(r.default_ms, 0, 3)} | {cell(r.deterministic_ms, 0, 3)} | "
              f"{r.cost:.2f}x | {flags} |")


def headlines(rows: list[Row]) -> list[Headline]:
    """The cost (median and worst over the multi-stream plans) and the bitwise counts."""
    multi = [r for r in rows if r.streams > 1] or rows
    costs = sorted(r.cost for r in multi)
    reference = [r for r in rows if r.bitwise["dynamo"]]
    exact = {k: sum(r.bitwise[k] for r in reference) for k in VARIANTS}
    worst = max(multi, key=lambda r: r.cost)
    return [
        Headline(f"deterministic=True on the threads runtime ({len(multi)} multi-stream "
                 "plans): time over the default, median (worst)",
                 f"{statistics.median(costs):.2f}x ({worst.cost:.2f}x, {worst.model})",
                 "informational", None),
        Headline(f"outputs bitwise equal to eager, of the {len(reference)} models whose "
                 "Dynamo graph is: default / deterministic=True",
                 f"{exact['default']} / {exact['deterministic']}",
                 f"deterministic: {len(reference)}", exact["deterministic"] == len(reference)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_arguments(ap, warmup=3)
    ap.set_defaults(cost_table="h200")
    args = ap.parse_args(argv)
    rows = [measure_model(name, factory, args)
            for name, factory in selected_models(ap, args.models).items()]
    print_table(rows, torch.get_num_threads(), os.getloadavg()[0])
    record(__file__, headlines(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
