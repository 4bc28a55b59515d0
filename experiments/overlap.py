"""What two CPU streams can gain on this machine, and what running ops as segments buys (issues 5, 26).

**Ceiling.**  For each model, two copies of its own Dynamo graph (separate inputs,
so no shared cache) run on two streams by the threads runtime, against the same
two copies on one stream (the graph's own code, all intra-op threads).  The copies
are independent, so this is the most any two-stream plan can gain from overlapping
this model's ops here: a plan of one copy overlaps less (its dependences allow
less).  A ceiling below 1 says overlap cannot pay for this op mix on this machine,
whatever the plan; the planner should then keep one stream.

**Segments.**  The threads runtime runs each stream's runs of ops between syncs as
one generated Python function (``autostream.runtime.segments``).  Each ceiling and
each plan is run three ways, in the same rounds: ``python`` (every op through the
interpreter loop), ``segments`` (the runtime's default) and ``torchscript``: the
former mechanism, traces run without the GIL (``experiments.torchscript_segments``,
outside the package: it returns shared tensors from segments with factory ops, so
its outputs are checked on the first two calls only).  The first row is a probe of
small ops, where the GIL matters most: two chains of 32 ``softmax(x @ w)`` on 4x256
inputs.

Plans: the planner's two-stream plan, lifted to Dynamo's graph (as the backend
runs it), against Dynamo's graph on one stream; ``-`` where the planner kept one
stream or the plan could not be lifted.  Times are medians over ``--runs``
alternating rounds, each timed call after ``--settle-ms`` of untimed calls.

    python -m experiments.overlap
    python -m experiments.overlap --models moe,two_branch_gemv --runs 40
    python -m experiments.overlap --inductor    # also segments compiled by Inductor
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from autostream.cost.runtime_target import RuntimeCosts
from autostream.fx.capture import capture
from autostream.planning.lift import lift_plan
from autostream.planning.plan import PlanOptions, load_cost_model, plan_graph
from autostream.runtime import ThreadsRunner
from autostream.runtime.builder import DialectBuilder, two_chains
from experiments.headline import Headline, record
from experiments.inductor_segments import inductor_runner
from experiments.speedup import add_timing_arguments, cell, selected_models, time_alternating
from experiments.torchscript_segments import torchscript_runner


def copies_on_streams(gm: torch.fx.GraphModule, streams: int) -> torch.fx.GraphModule:
    """Two copies of ``gm``: the second on stream 1 when ``streams == 2``, joined at the end.

    Inputs: ``gm``'s inputs for the first copy, then for the second; outputs: both
    copies' outputs, flattened.
    """
    b = DialectBuilder()
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = [{p: b.input(f"{p.name}_{c}") for p in places} for c in (0, 1)]
    outs: dict[int, list[Any]] = {}
    token = None
    for copy in (1, 0):  # the side copy first: its worker starts while the main copy runs
        env = dict(inputs[copy])
        with b.stream(copy if streams == 2 else 0):
            for n in gm.graph.nodes:
                if n.op == "output":
                    outs[copy] = pytree.tree_leaves(torch.fx.node.map_arg(n.args[0], env.get))
                elif n.op != "placeholder":
                    env[n] = b.graph.node_copy(n, lambda a, env=env: env[a])
            if copy == 1 and streams == 2:
                token = b.record()
    if token is not None:
        b.wait(token)
    b.graph.output(tuple(o for o in outs[0] + outs[1] if isinstance(o, torch.fx.Node)))
    return torch.fx.GraphModule(gm, b.graph)


@dataclass
class Row:
    model: str
    ops: int
    one_ms: float
    python_x: float
    segments_x: float
    torchscript_x: float
    plan_one_ms: float | None = None
    plan_python_x: float | None = None
    plan_segments_x: float | None = None
    plan_torchscript_x: float | None = None
    note: str = ""
    #: with ``--inductor``: speed-ups with Inductor-compiled segments, seconds compiling
    inductor_x: float | None = None
    plan_inductor_x: float | None = None
    compile_s: float = 0.0


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)


def _ways(one: Callable[..., Any], multi: torch.fx.GraphModule, args: tuple[Any, ...],
          options: argparse.Namespace) -> tuple[float, float, float, float, float | None, float]:
    """One-stream ms; speed-ups with python ops, segments, TorchScript segments and (with
    ``--inductor``, else ``None``) Inductor's; seconds Inductor spent compiling."""
    runners = {"python": ThreadsRunner(multi, segments=False), "segments": ThreadsRunner(multi),
               "torchscript": torchscript_runner(multi)}
    if options.inductor:
        runners["inductor"] = inductor_runner(multi)
    try:
        expected = pytree.tree_leaves(one(*args))
        for runner in runners.values():
            for _ in range(2):  # the second call runs TorchScript's traces
                got = pytree.tree_leaves(runner(*args))
                torch.testing.assert_close(got, expected)
        calls = {k: (lambda r=r: r(*args)) for k, r in runners.items()}
        med = time_alternating({"one": lambda: one(*args), **calls}, options.runs,
                               options.warmup, None, options.settle_ms / 1e3)
    finally:
        for runner in runners.values():
            runner.close()
    x = {k: med["one"] / med[k] for k in runners}
    compile_s = runners["inductor"].segments.compile_s if options.inductor else 0.0
    return (med["one"] * 1e3, x["python"], x["segments"], x["torchscript"], x.get("inductor"),
            compile_s)


def measure_probe(args: argparse.Namespace) -> Row:
    one, inputs = two_chains(depth=32, rows=4, width=256, streams=1, softmax=True)
    two, _ = two_chains(depth=32, rows=4, width=256, streams=2, softmax=True)
    ms, py, seg, ts, ind, compile_s = _ways(one, two, inputs, args)
    return Row("probe_small_2x32", 129, ms, py, seg, ts, note="hand-written plan, ceiling only",
               inductor_x=ind, compile_s=compile_s)


def measure_model(name: str, factory, args: argparse.Namespace) -> Row:
    model, inputs = factory()
    with torch.no_grad():
        graphs = capture(model, inputs)
        captured = max(graphs, key=lambda c: len(c.gm.graph.nodes))
        dyn, dyn_args = captured.dynamo, captured.dynamo_args
        ops = sum(n.op not in ("placeholder", "output") for n in dyn.graph.nodes)
        one = copies_on_streams(dyn, 1)
        two = copies_on_streams(dyn, 2)
        both = (*dyn_args, *_clone(dyn_args))
        ms, py, seg, ts, ind, compile_s = _ways(one, two, both, args)
        row = Row(name, ops, ms, py, seg, ts, inductor_x=ind, compile_s=compile_s)
        costs = load_cost_model(args.cost_table)
        plan = plan_graph(captured.gm, PlanOptions(max_streams=2, cost_table=args.cost_table),
                          costs)
        if plan.schedule.streams_used < 2:
            row.note = "planner kept one stream"
            return row
        try:
            lifted = lift_plan(dyn, plan, RuntimeCosts(costs.runtime_op_us, costs.runtime_call_us,
                                                       costs.runtime_segment_us))
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            row.note = f"not lifted: {exc}"
            return row
        (row.plan_one_ms, row.plan_python_x, row.plan_segments_x, row.plan_torchscript_x,
         row.plan_inductor_x, compile_s) = _ways(dyn.forward, lifted.gm, dyn_args, args)
        row.compile_s += compile_s
        row.note = f"plan predicted {lifted.predicted_speedup:.2f}x"
    return row


def print_table(rows: list[Row]) -> None:
    inductor = any(r.inductor_x is not None for r in rows)
    ways = f"{'python':>7} {'segments':>8} {'tscript':>7}" + (f" {'inductor':>8}" if inductor
                                                                else "")

    def cells(py: float | None, seg: float | None, ts: float | None, ind: float | None) -> str:
        return (f"{cell(py, 7, 2)} {cell(seg, 8, 2)} {cell(ts, 7, 2)}"
                + (f" {cell(ind, 8, 2)}" if inductor else ""))

    head = f"{'model':<20} {'ops':>4} | {'2 copies':>9} {ways} | {'plan 1 str':>10} {ways} | note"
    print(head)
    print("-" * len(head))
    for r in rows:
        note = r.note + (f"; Inductor compiled {r.compile_s:.1f} s" if inductor else "")
        print(f"{r.model:<20} {r.ops:>4} | {r.one_ms:9.3f} "
              f"{cells(r.python_x, r.segments_x, r.torchscript_x, r.inductor_x)} | "
              f"{cell(r.plan_one_ms, 10, 3)} "
              f"{cells(r.plan_python_x, r.plan_segments_x, r.plan_torchscript_x, r.plan_inductor_x)}"
              f" | {note}")
    print("2 copies: ms of two copies of the graph on one stream; python / segments / tscript"
          + (" / inductor" if inductor else "") + ": speed-up of the same copies on two streams "
          "(the ceiling of any 2-stream plan), ops through the interpreter loop / runs of ops "
          "as generated functions (the runtime's default) / as TorchScript traces (the former "
          "mechanism, not exact: experiments/torchscript_segments.py)"
          + (" / compiled by Inductor with its C++ wrapper (experiments/inductor_segments.py)"
             if inductor else "") + ". plan 1 str: ms of Dynamo's graph on one stream, then the "
          "lifted plan's speed-up, the same ways. Direct calls, no Dynamo.")


def headlines(rows: list[Row]) -> list[Headline]:
    """Each model's ceiling (informational: what this machine allows, not a target)."""
    return [Headline(f"overlap ceiling, {r.model}: two copies on two CPU streams",
                     f"{r.segments_x:.2f}x segments, {r.python_x:.2f}x ops from Python, "
                     f"{r.torchscript_x:.2f}x former TorchScript segments",
                     "informational", None) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_arguments(parser, warmup=3)
    parser.add_argument("--inductor", action="store_true",
                        help="also time segments compiled by Inductor (seconds per segment)")
    args = parser.parse_args(argv)
    table = selected_models(parser, args.models)
    warnings.filterwarnings("ignore", category=UserWarning)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
          f"cost_table={args.cost_table or 'default'}", flush=True)
    rows = [measure_probe(args)]
    for name, factory in table.items():
        rows.append(measure_model(name, factory, args))
        print(f"  {name}: done", flush=True)
    print()
    print_table(rows)
    record(__file__, headlines(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
