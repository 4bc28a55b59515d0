"""Inductor with autostream's streams: eager, single-stream Inductor and Inductor with
``AutoStreamPass(inductor_streams=True)`` side by side.

On CUDA (bf16): a two-branch model, the zoo MoE and a transformers Qwen3-MoE decoder at a
decode shape (1 token, no KV cache): correctness against eager over 20 calls, median
time of 50 calls, the wrapper's stream switches, waits and unsynced cross-stream touches
(``dialects.inductor.wrapper_structure``), and the plan's predicted speed-up beside the
measured one.  On a torch whose Inductor has no multi-stream support it says so and
measures ``backend="autostream"`` (eager kernels on streams) instead.  Without a GPU it
prints the CPU wrappers' structure (generated with the CPU device accepted; not run).

    python -m experiments.inductor_streams [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from autostream import AutoStreamPass
from autostream.dialects import inductor
from experiments.headline import Headline, record

CALLS, RUNS = 20, 50


class TwoBranch(nn.Module):
    """Two independent GEMV-shaped chains joined by an add."""

    def __init__(self, width: int = 2048, depth: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        make = lambda: nn.Parameter(torch.randn(width, width, generator=g) / width ** 0.5)  # noqa: E731
        self.a = nn.ParameterList(make() for _ in range(depth))
        self.b = nn.ParameterList(make() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for w in self.a:
            x = torch.relu(x @ w)
        for w in self.b:
            y = torch.tanh(y @ w)
        return x + y


class _CpuAccepted(AutoStreamPass):
    """The pass accepting the CPU device: only to print a CPU wrapper's structure."""

    def _inductor_refusal(self, graph, device):
        return super()._inductor_refusal(graph, "cuda")


def models(device: str):
    from autostream.models.hf_zoo import qwen3_moe
    from autostream.models.zoo import moe_model

    out = [("two-branch", TwoBranch(), (torch.randn(4, 2048),))]
    moe, moe_in = moe_model(tokens=4, hidden=1024, inner=1024, experts=8)
    out.append(("zoo MoE", moe, moe_in))
    try:
        hf, _ = qwen3_moe(cache="none")
        out.append(("qwen3-moe decode", hf, (torch.randint(3, 128, (1, 1)),)))
    except ModuleNotFoundError as exc:
        print(f"(qwen3-moe skipped: {exc})")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cast = lambda t: t.to(device, dtype) if t.is_floating_point() else t.to(device)  # noqa: E731
    return [(n, m.to(device, dtype).eval(), tuple(cast(t) for t in i)) for n, m, i in out]


def _solver() -> str:
    try:
        import ortools  # noqa: F401
        return "cpsat"
    except ImportError:
        return "heft"


def _first(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def _time(fn, inputs) -> float:
    times = []
    for _ in range(RUNS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*inputs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _max_err(fn, inputs, want) -> float:
    return max(float((_first(fn(*inputs)).float() - want).abs().max()) for _ in range(CALLS))


def _compiled(model, inputs, p=None, backend="inductor", **config):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    settings = {"post_grad_custom_post_pass": p, **config} if p is not None else config
    with torch._inductor.config.patch(**settings), torch.no_grad():
        fn = torch.compile(model, backend=backend)
        if backend != "inductor":
            fn(*inputs)
            return fn, ""
        _, code = run_and_get_code(fn, *inputs)
    return fn, code[0] if code else ""


def cuda_rows(solver: str) -> list[dict]:
    rows = []
    missing = inductor.missing_support()
    for name, model, inputs in models("cuda"):
        with torch.no_grad():
            want = _first(model(*inputs)).float()
            row = {"model": name, "eager_us": _time(model, inputs)}
            single, _ = _compiled(model, inputs)
            row["inductor_us"] = _time(single, inputs)
            row["inductor_err"] = _max_err(single, inputs, want)
            if missing:  # the backend's streams runtime instead: eager kernels, no fusion
                from autostream import backend

                runtime = backend(runtime="auto", measure=0,  # streams on CUDA
                                  max_streams=2, solver=solver,
                                  cost_table="h200")
                streams, _ = _compiled(model, inputs, backend=runtime)
                row.update(autostream_backend_us=_time(streams, inputs),
                           autostream_backend_err=_max_err(streams, inputs, want))
            else:
                p = AutoStreamPass(max_streams=2, solver=solver, cost_table="h200",
                                   inductor_streams=True)
                fn, code = _compiled(model, inputs, p, allow_buffer_reuse=False)
                report = p.last_report
                s = inductor.wrapper_structure(code)
                row.update(target=report.target if report else None,
                           reason=report.reason if report else "the pass did not run",
                           predicted=round(report.plan.predicted_speedup, 2)
                           if report and report.plan else None,
                           switches=s.switches, waits=len(s.waits), hazards=len(s.hazards),
                           checked=s.checked, streams_us=_time(fn, inputs),
                           streams_err=_max_err(fn, inputs, want))
                row["measured"] = round(row["inductor_us"] / row["streams_us"], 2)
        rows.append(row)
        torch._dynamo.reset()
    return rows


def cpu_rows(solver: str) -> list[dict]:
    from torch._inductor.scheduler import Scheduler
    from torch._inductor.utils import get_code

    rows, seen, per_stream = [], [], []
    original, codegen = Scheduler._populate_stream_assignments, Scheduler.codegen

    def record(self) -> None:
        original(self)
        seen.append(dict(self.stream_idx_to_user_obj_idx))

    def count(self):
        counts: dict[int, int] = {}
        for n in self.nodes:
            counts[self.node_to_stream.get(n, 0)] = counts.get(self.node_to_stream.get(n, 0), 0) + 1
        per_stream.append(counts)
        return codegen(self)

    Scheduler._populate_stream_assignments, Scheduler.codegen = record, count
    try:
        for name, model, inputs in models("cpu"):
            p = _CpuAccepted(max_streams=2, solver=solver, cost_table="h200",
                             inductor_streams=True)
            torch._dynamo.reset()
            one = lambda *a, m=model: _first(m(*a))  # noqa: E731  (get_code: one output)
            with torch._inductor.config.patch(post_grad_custom_post_pass=p,
                                              allow_buffer_reuse=False), torch.no_grad():
                code = get_code(torch.compile(one), *inputs)[0]
            report = p.last_report
            objects = {o: f"stream{s}" for s, o in (seen[-1] if seen else {}).items()}
            s = inductor.wrapper_structure(code, objects)
            rows.append({"model": name, "target": report.target if report else None,
                         "reason": report.reason if report else "the pass did not run",
                         "predicted": round(report.plan.predicted_speedup, 2)
                         if report and report.plan else None,
                         "scheduler_nodes": per_stream[-1] if per_stream else {},
                         "switches": s.switches, "waits": len(s.waits)})
    finally:
        Scheduler._populate_stream_assignments, Scheduler.codegen = original, codegen
        torch._dynamo.reset()
    return rows


def headlines(rows: list[dict], cuda: bool, missing: tuple[str, ...]) -> list[Headline]:
    """The rows atop RESULTS.md, from this run's figures."""
    out = []
    for r in rows:
        name = r["model"]
        if not cuda:
            nodes = r["scheduler_nodes"]
            out.append(Headline(f"{name} (CPU, no GPU): Inductor scheduler nodes per stream, "
                                f"waits", f"{nodes}, {r['waits']} waits",
                                "both streams used", len(nodes) >= 2 and min(nodes.values()) > 0))
        elif missing:
            out.append(Headline(f"{name}: streams runtime (eager kernels) over single-stream "
                                f"Inductor (torch {torch.__version__} has no multi-stream "
                                f"Inductor)", f"{r['inductor_us'] / r['autostream_backend_us']:.2f}x",
                                "-", None))
        elif r["target"] != "inductor":
            out.append(Headline(f"{name}: Inductor with the pass", "left unchanged",
                                "streams", False))
        else:
            out.append(Headline(f"{name}: Inductor with streams over single-stream Inductor "
                                f"(predicted {r['predicted']}x), max error",
                                f"{r['measured']:.2f}x, {r['streams_err']:.2g}",
                                ">= 1.00x, no unsynced touch",
                                r["measured"] >= 1.0 and r["hazards"] == 0))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    solver, missing = _solver(), inductor.missing_support()
    print(f"torch {torch.__version__}; solver {solver}; multi-stream Inductor: "
          + ("yes" if not missing else f"no (missing: {', '.join(missing)})"))
    cuda = torch.cuda.is_available()
    if cuda:
        rows = cuda_rows(solver)
        cols = (["eager_us", "inductor_us", "autostream_backend_us", "autostream_backend_err"]
                if missing else ["eager_us", "inductor_us", "streams_us", "measured",
                                 "predicted", "switches", "waits", "hazards", "streams_err"])
    else:
        print("No GPU: the CPU wrappers' structure (the CPU device accepted only to write "
              "the wrapper; it is not run: CPU wrappers never define their streams). "
              "scheduler_nodes: Inductor's scheduler nodes per stream (0: the current "
              "stream); the C++ backend may group consecutive pointwise nodes of both "
              "streams into one kernel, so CPU wrappers' kernels and touches say nothing "
              "about CUDA's.")
        rows = cpu_rows(solver)
        cols = ["target", "predicted", "scheduler_nodes", "switches", "waits"]
    print("\n| model | " + " | ".join(cols) + " |\n" + "|---" * (len(cols) + 1) + "|")
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) and c.endswith("_us")
                 else f"{r[c]:.2g}" if isinstance(r.get(c), float) else str(r.get(c))
                 for c in cols]
        print(f"| {r['model']} | " + " | ".join(cells) + " |")
    for r in rows:
        if r.get("reason"):
            print(f"- {r['model']}: {r['reason']}")
    record(__file__, headlines(rows, cuda, missing))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        figures = {"torch": torch.__version__, "cuda": cuda, "solver": solver,
                   "missing": list(missing), "rows": rows}
        (args.out / "inductor_streams.json").write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
