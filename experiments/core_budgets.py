"""Core budgets per side stream on the ``ascend910b`` table: predicted makespans, no device.

Each model's graphs are planned by the pass's planner (cpsat) on the shipped
``ascend910b`` table at 2 and 4 streams; then CP-SAT's budget model, warm-started from
that plan, chooses the streams and each side stream's budget (quarters of the chip)
together, replayed on the simulator (:func:`autostream.scheduling.core_budgets.plan_budgets`, what
``PlanOptions.core_budgets`` runs).  Printed per model and stream count: the
predicted makespan of the plan without budgets and of the plan with them, the gap of
each to the lower bound of the plan without budgets (budgets only lengthen ops, so
it bounds both), and the budgets chosen.  No memory budget, so that only the core
budgets differ.  Every figure is a prediction of the simulator: no Ascend device was
used, and the table's shares are the roofline's guesses (no profiled block counts
exist for these models here).  The last row is the illustration graph of
``experiments.core_budget_demo`` on its hand-written table, where a budget helps by
construction.

    python -m experiments.core_budgets            # zoo MoE and transformers MoE, 2 layers
    python -m experiments.core_budgets --layers 32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from autostream.cost import TableCostModel
from autostream.fx.capture import capture_graphs
from autostream.models import hf_zoo, zoo
from autostream.planning.plan import PlanOptions, plan_graph
from autostream.scheduling.core_budgets import plan_budgets
from experiments.headline import Headline, record

HF_MOE = ("qwen3_moe", "olmoe", "gpt_oss", "granite_moe")
#: the zoo MoE as shipped (8 tokens of 256) and at a size whose matmuls fill the chip
ZOO_MOE = {"moe_model": {}, "moe_model (512 x 1024)": {"tokens": 512, "hidden": 1024,
                                                        "inner": 1024}}
DEMO = "core_budget_demo (hand-written table)"


def _gap(makespan: float, bound: float) -> str:
    return f"{100 * (makespan / bound - 1):.1f}%" if bound > 0 else "-"


def _factory(name: str, layers: int):
    if name in ZOO_MOE:
        return lambda: zoo.moe_model(**ZOO_MOE[name])
    if name == DEMO:
        from experiments.core_budget_demo import demo_model

        return demo_model
    return lambda: hf_zoo.HF_ZOO[name](layers=layers)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2, help="transformers layers (default 2)")
    ap.add_argument("--streams", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--time-limit", type=float, default=5.0, help="cpsat seconds per plan")
    ap.add_argument("--quick", action="store_true", help="zoo MoE and one transformers model")
    ap.add_argument("--table", default="ascend910b",
                    help="cost table (default the shipped ascend910b; a table read from an "
                         "Ascend profile by `calibrate --from-profile` has profiled shares)")
    args = ap.parse_args(argv)
    hf = [m for m in HF_MOE if m in hf_zoo.available()]
    models = [*ZOO_MOE, *(hf if not args.quick else hf[:1]), DEMO]
    t0 = time.perf_counter()
    cm = TableCostModel.load(args.table, device="npu")
    from experiments.core_budget_demo import demo_table

    demo_cm = TableCostModel.load(demo_table(Path(tempfile.mkdtemp()) / "demo.json"))
    print(f"table: {cm.describe()}; predictions of the simulator, no device; side-stream "
          f"budgets from quarters of the chip, chosen by CP-SAT with the streams\n")
    print("| model | streams | ops | ops wider than a quarter | without budgets us | gap | "
          "with budgets us | gap | budgets |")
    print("|---|---|---|---|---|---|---|---|---|")
    gains: dict[str, float] = {}
    worse = 0
    for name in models:
        model, inputs = _factory(name, args.layers)()
        graphs = capture_graphs(model, inputs)
        costs = demo_cm if name == DEMO else cm
        for streams in args.streams:
            without = with_ = bound = 0.0
            ops, wide, chosen = 0, 0, []
            for gm in graphs:
                plain = plan_graph(gm, PlanOptions(max_streams=streams,
                                                   time_limit=args.time_limit,
                                                   max_memory_increase=None), costs)
                choice = plan_budgets(plain.problem, plain.schedule, costs.profile.cores,
                                      time_s=args.time_limit)
                without += choice.without_us
                with_ += choice.with_us
                bound += plain.schedule.lower_bound
                ops += len(plain.problem.graph)
                wide += sum(1 for v in plain.problem.shares.values() if v > 0.25)
                chosen += [f"{k}: {v:g}" for k, v in choice.budgets.items()]
                worse += choice.with_us > choice.without_us
            gains[f"{name} x{streams}"] = without / with_ if with_ else 1.0
            print(f"| {name} | {streams} | {ops} | {wide} | {without:.1f} | "
                  f"{_gap(without, bound)} | {with_:.1f} | {_gap(with_, bound)} | "
                  f"{', '.join(chosen) or 'none'} |", flush=True)
    real = {k: g for k, g in gains.items() if not k.startswith(DEMO)}
    helped = [k for k, g in real.items() if g > 1.0 + 1e-9]
    best = max(real, key=real.__getitem__)
    print(f"\nbudgets shorten {len(helped)} of {len(real)} predicted plans of the zoo and "
          f"transformers MoE models (best: {best}, {real[best]:.3f}x); plans predicted slower "
          f"with budgets than without: {worse}")
    print("\nA budget can only change a plan where an op wider than it (the column of ops "
          "wider than a quarter) overlaps others, and can only gain what separates the plan "
          "without budgets from its bound (the first gap).  This table's shares are the "
          "roofline's (the fraction of an op's time spent working rather than launching), "
          "not profiled block counts; the demo row shows the case budgets are for: a wide "
          "side op that would slow a narrow critical chain.")
    print(f"\n({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    record(__file__, [
        Headline("core budgets on ascend910b (predicted, no device): plans a budget shortens",
                 f"{len(helped)} of {len(real)} (best {real[best]:.3f}x)", "informational",
                 None),
        Headline("core budgets: plans predicted slower with budgets than without",
                 str(worse), "0", worse == 0),
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
