"""Correctness sweep: every model x solver x runtime x mode through ``torch.compile``, against eager.

Each case is :func:`autostream.equivalence.check_against_eager`: a deep copy of the model
compiled with ``autostream.backend(max_streams=2, cost_table="h200", measure=0)`` (the
H200 table forces multi-stream plans on these small models; ``measure=0`` always runs
the plan), called ``CALLS`` times beside another deep copy run eagerly; outputs (values,
dtypes, inference tensors), buffers and caches after each call, and gradients in
training steps must match within rounding (``autostream.equivalence``), and each case says
whether they were also equal bit for bit.  Between calls the caller adds 1 to every floating
output on both sides, and after the last call every earlier output must still match eager's
(a runtime keeping a tensor between calls would hand it out again).  Modes: ``no_grad``,
``inference_mode``, ``autocast_bf16``
(under ``no_grad``) and ``training`` (a backward pass; models stay in eval mode, so no
dropout draws random numbers).  Models: the zoo (``autostream.models.zoo.ZOO``), the zoo's
``running_stats`` model (a functional batch norm updating buffers other branches read),
``fresh_tensors`` (branches making tensors with ``zeros``, ``ones``, ``full``, ``arange``
and ``empty``, written in place and returned) and the transformers zoo (``autostream.models.hf_zoo``, every cache mode) when ``transformers``
is installed.

Prints markdown tables: mismatches (the target is 0), cases equal bit for bit and within
rounding only, applied and lifted plans per model and per mode, then every mismatch, the
cases within rounding only, every reason a plan was not lifted and the cases eager itself
cannot run.  Exits 1 when a case mismatches.  ``--deterministic`` compiles with
``deterministic=True`` (every op with eager's intra-op thread count).

    python -m experiments.correctness            # the full sweep (about 40 minutes on 2 cores)
    python -m experiments.correctness --quick    # a few models, cpsat and heft
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autostream.equivalence import MODES, Check, check_against_eager
from autostream.models import hf_zoo, zoo
from autostream.scheduling.solvers import SOLVERS
from experiments.headline import Headline, record

RUNTIMES = ("threads", "sequential")
#: calls per case: segments that kept a tensor between calls returned it from the third on
CALLS = 4
QUICK_MODELS = ("multihead", "running_stats", "fresh_tensors", "llama:decode", "bert:none",
                "qwen3_moe:prefill")
QUICK_SOLVERS = ("cpsat", "heft")


@dataclass(frozen=True)
class Case:
    model: str
    solver: str
    runtime: str
    mode: str


@dataclass(frozen=True)
class Result:
    case: Case
    check: Check


class FreshTensors(torch.nn.Module):
    """Two branches making tensors with factory ops, writing them in place, returning them."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h, g = torch.relu(self.a(x)), torch.tanh(self.b(x))  # bfloat16 under autocast
        rows, width = x.shape
        sums = torch.zeros(8, width, dtype=g.dtype).index_add_(0, idx, g)
        scale = torch.full((rows, 1), 2.0, dtype=x.dtype)
        ones = torch.ones(8, width, dtype=g.dtype).add_(sums)
        ramp = torch.arange(width, dtype=x.dtype).view(1, width).mul_(0.5)
        half = torch.empty(rows, width, dtype=h.dtype).fill_(0.5)
        return h * scale, sums, scale, ones, ramp, half.add_(h)


def fresh_tensors(rows: int = 16, width: int = 256) -> tuple[torch.nn.Module, tuple]:
    """:class:`FreshTensors` and its inputs (``idx``: each row's target among 8)."""
    torch.manual_seed(3)
    return FreshTensors(width).eval(), (torch.randn(rows, width), torch.randint(0, 8, (rows,)))


def models(names: list[str] | None = None) -> dict[str, Callable[[], tuple[Any, tuple]]]:
    """name -> factory of every model swept (``hf`` models as ``name:cache``)."""
    out: dict[str, Callable[[], tuple[Any, tuple]]] = {**zoo.ZOO,
                                                        "running_stats": zoo.running_stats_model,
                                                        "fresh_tensors": fresh_tensors}
    for name in hf_zoo.available():
        caches = ("none",) if name == "bert" else hf_zoo.CACHE_MODES
        for cache in caches:
            out[f"{name}:{cache}"] = lambda name=name, cache=cache: hf_zoo.HF_ZOO[name](cache)
    if names:
        unknown = sorted(set(names) - set(out))
        if unknown:
            raise SystemExit(f"unknown models {unknown}; known: {', '.join(out)}")
        out = {n: out[n] for n in names}
    return out


def _row(name: str, results: list[Result]) -> str:
    ran = [r.check for r in results if not r.check.skipped]
    bad = sum(bool(c.mismatch) for c in ran)
    bitwise = sum(c.bitwise for c in ran)
    return (f"| {name} | {len(ran)} | {bad} | {bitwise} | {len(ran) - bad - bitwise} | "
            f"{sum(c.applied for c in ran)} | {sum(c.lifted for c in ran)} | "
            f"{len(results) - len(ran)} |")


def table(title: str, groups: dict[str, list[Result]]) -> str:
    lines = [f"**{title}**", "",
             "| | cases | mismatches | bitwise | within rounding | applied | lifted | skipped |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [_row(name, rs) for name, rs in groups.items()]
    return "\n".join(lines)


def report(results: list[Result], seconds: float, deterministic: bool = False) -> str:
    by_model: dict[str, list[Result]] = {}
    by_mode: dict[str, list[Result]] = {}
    for r in results:
        by_model.setdefault(r.case.model, []).append(r)
        by_mode.setdefault(r.case.mode, []).append(r)
    threads = torch.get_num_threads()
    parts = [
        f"{len(results)} cases in {seconds:.0f} s, {threads} intra-op thread"
        f"{'s' * (threads != 1)}, deterministic={deterministic}; `bitwise`: every output, "
        "buffer, cache and grad equal to eager's bit for bit, `within rounding`: equal within "
        "the tolerance only (float32 1e-4, bfloat16 2e-2); `applied`: the plan ran on several "
        "streams, `lifted`: on the graph Dynamo captured (inference only); `skipped`: eager "
        "itself raised.", "",
        table("By model", {**by_model, "**all**": results}), "",
        table("By mode", by_mode), "",
    ]
    bad = [r for r in results if r.check.mismatch]
    parts += ["**Mismatches**", ""]
    parts += [f"- {r.case.model} / {r.case.solver} / {r.case.runtime} / {r.case.mode}: "
              f"{r.check.mismatch}" for r in bad] or ["none"]
    rounded = Counter((r.case.model, r.case.runtime) for r in results
                      if not (r.check.skipped or r.check.mismatch or r.check.bitwise))
    parts += ["", "**Within rounding only (not bitwise), by model and runtime**", ""]
    parts += [f"- {model} / {runtime}: {n} cases" for (model, runtime), n in rounded.items()] \
        or ["none"]
    reasons = Counter(_reason_kind(why) for r in results for why in r.check.not_lifted)
    parts += ["", "**Applied plans not lifted, by reason**", ""]
    parts += [f"- {n} x {why}" for why, n in reasons.most_common()] or ["none"]
    skipped = Counter((r.case.model, r.case.mode, r.check.skipped) for r in results
                      if r.check.skipped)
    parts += ["", "**Skipped: eager itself fails**", ""]
    parts += [f"- {model} / {mode}: {why} ({n} cases)"
              for (model, mode, why), n in skipped.items()] or ["none"]
    return "\n".join(parts)


def headlines(results: list[Result]) -> list[Headline]:
    """Mismatches (target 0), and how many cases ran a plan on several streams / lifted."""
    ran = [r.check for r in results if not r.check.skipped]
    models = len({r.case.model for r in results})
    bad = sum(bool(c.mismatch) for c in ran)
    return [Headline(f"correctness sweep ({len(ran)} cases, {models} models): outputs that "
                     "differ from eager", str(bad), "0", bad == 0),
            Headline("correctness sweep: cases equal to eager bit for bit / within rounding "
                     "only", f"{sum(c.bitwise for c in ran)} / "
                     f"{sum(not c.bitwise and not c.mismatch for c in ran)} of {len(ran)}",
                     "informational", None),
            Headline("correctness sweep: cases whose plan ran on several streams / lifted to "
                     "Dynamo's graph", f"{sum(c.applied for c in ran)} / "
                     f"{sum(c.lifted for c in ran)} of {len(ran)}", "informational", None)]


def _reason_kind(why: str) -> str:
    """A refusal without the names that differ from graph to graph."""
    return re.sub(r"'[^']*'", "'...'", why)[:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"models {', '.join(QUICK_MODELS)} and solvers "
                         f"{', '.join(QUICK_SOLVERS)} only")
    ap.add_argument("--models", nargs="*", default=None, help="model names (default: all)")
    ap.add_argument("--solvers", nargs="*", default=None, choices=sorted(SOLVERS))
    ap.add_argument("--runtimes", nargs="*", default=list(RUNTIMES), choices=RUNTIMES)
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    ap.add_argument("--time-limit", type=float, default=2.0, help="cpsat seconds per graph")
    ap.add_argument("--deterministic", action="store_true",
                    help="compile with deterministic=True (eager's intra-op threads per op)")
    args = ap.parse_args(argv)
    names = args.models or (list(QUICK_MODELS) if args.quick else None)
    available = models()
    if args.quick:
        names = [n for n in names if n in available]  # transformers may be missing
    factories = models(names)
    solvers = args.solvers or (list(QUICK_SOLVERS) if args.quick else sorted(SOLVERS))
    t0 = time.perf_counter()
    results = []
    for name, factory in factories.items():
        for mode in args.modes:
            for solver in solvers:
                for runtime in args.runtimes:
                    check = check_against_eager(factory, mode, calls=CALLS, edit_outputs=True,
                                                max_streams=2,
                                                cost_table="h200", measure=0, runtime=runtime,
                                                solver=solver, time_limit=args.time_limit,
                                                deterministic=args.deterministic)
                    results.append(Result(Case(name, solver, runtime, mode), check))
                    print(f"{name} {mode} {solver} {runtime}: "
                          f"{check.skipped or check.mismatch or 'ok'} (bitwise "
                          f"{check.bitwise}, applied "
                          f"{check.applied}, lifted {check.lifted})", file=sys.stderr, flush=True)
    print(report(results, time.perf_counter() - t0, args.deterministic))
    record(__file__, headlines(results))
    return 1 if any(r.check.mismatch for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
