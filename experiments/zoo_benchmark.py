"""Zoo benchmark: the whole pass on models nobody here wrote, against its targets.

Every ``autostream.models.hf_zoo`` model (transformers classes at tiny configs) at
``--layers`` layers is captured once; then, for each cost table and stream count,
the pass (plan, rewrite, verify) runs on a copy of the graph, timed per stage.
``pass s`` is everything but capturing the graph; ``again s`` is the same pass on
a fresh copy, which the plan cache answers (and must answer with the same plan).
The gap is cpsat's makespan over the lower bound it reports; ``proven``: CP-SAT
proved every distinct piece's bound optimal.  A second table times the planner on
the small graphs of ``autostream.models.zoo`` (one stream count, every table).  The plan
cache lives in a temporary directory, so the first pass of each case solves.

    python -m experiments.zoo_benchmark                          # 32 layers, all models
    python -m experiments.zoo_benchmark --layers 2 --models llama bert
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import tempfile
import time
from dataclasses import dataclass

from experiments.headline import Headline, record

TABLES = ("ascend910b", "h200")
#: the pass's time budget: up to BIG_OPS ops, and beyond
PASS_S, BIG_OPS, BIG_PASS_S = 5.0, 5000, 20.0
#: a recompile (plan cache hit), and planning a small graph (under SMALL_OPS ops)
AGAIN_S, SMALL_OPS, SMALL_S = 0.5, 100, 0.5
GAP = 0.03


@dataclass(frozen=True)
class Case:
    model: str
    ops: int
    table: str
    streams: int
    pass_seconds: float
    solve_seconds: float
    again_seconds: float
    same_plan: bool
    makespan: float
    heft: float
    bound: float
    proven: bool
    syncs: int

    @property
    def gap(self) -> float:
        return self.makespan / self.bound - 1.0 if self.bound > 0 else 0.0


def run_case(name: str, gm, table: str, streams: int):
    from autostream.passes import AutoStreamPass

    stream_pass = AutoStreamPass(max_streams=streams, cost_table=table)
    first = stream_pass.apply(_fresh(gm))
    again = stream_pass.apply(_fresh(gm))
    plan, s = first.plan, first.plan.schedule
    same = dict(s.stream_of) == dict(again.plan.schedule.stream_of)
    stats = s.stats
    return Case(name, plan.op_graph.number_of_nodes(), table, streams,
                first.figures()["pass_seconds"], plan.stages.solve,
                again.figures()["pass_seconds"], same, s.makespan,
                getattr(stats, "heft_us", s.makespan), s.lower_bound,
                bool(getattr(stats, "proven", False)), len(plan.syncs))


def _fresh(gm):
    """A copy of the captured graph, the garbage of earlier copies collected (so that no
    pass pays for another's)."""
    out = copy.deepcopy(gm)
    gc.collect()
    return out


def zoo_table(cases: list[Case]) -> str:
    lines = ["| model | ops | table | streams | pass s | solve s | again s | same plan | "
             "cpsat us | heft us | bound us | gap | proven | syncs |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|"]
    for c in cases:
        lines.append(
            f"| {c.model} | {c.ops} | {c.table} | {c.streams} | {c.pass_seconds:.2f} | "
            f"{c.solve_seconds:.2f} | {c.again_seconds:.2f} | {'yes' if c.same_plan else 'NO'} | "
            f"{c.makespan:.1f} | {c.heft:.1f} | {c.bound:.1f} | {100 * c.gap:.2f}% | "
            f"{'yes' if c.proven else 'no'} | {c.syncs} |")
    return "\n".join(lines)


def targets(cases: list[Case]) -> str:
    n = len(cases)
    fast = sum(c.pass_seconds <= _budget(c) for c in cases)
    close = sum(_close(c) for c in cases)
    better = sum(c.makespan < c.heft - 1e-9 for c in cases)
    not_worse = sum(c.makespan <= c.heft + 1e-9 for c in cases)
    cached = sum(c.again_seconds <= AGAIN_S for c in cases)
    same = sum(c.same_plan for c in cases)
    return "\n".join([
        f"- pass within {PASS_S:g} s ({BIG_PASS_S:g} s beyond {BIG_OPS:,} ops): {fast}/{n}",
        f"- within {100 * GAP:g}% of the reported bound (or proven optimal): {close}/{n}",
        f"- strictly faster than HEFT: {better}/{n}; never slower: {not_worse}/{n}",
        f"- a recompile (plan cache hit) within {AGAIN_S:g} s: {cached}/{n}; same plan: {same}/{n}",
    ])


def _budget(c: Case) -> float:
    return PASS_S if c.ops <= BIG_OPS else BIG_PASS_S


def _close(c: Case) -> bool:
    return c.gap <= GAP or c.proven


def headlines(cases: list[Case], layers: int, small: list[tuple[int, float]]) -> list[Headline]:
    """The pass's time, gap and recompile on the transformers models; the small graphs'
    planning time (``small``: ops and plan seconds of each)."""
    out = []
    if cases:
        n, ops = len(cases), f"{min(c.ops for c in cases):,}-{max(c.ops for c in cases):,}"
        fast = sum(c.pass_seconds <= _budget(c) for c in cases)
        slowest = max(cases, key=lambda c: c.pass_seconds)
        out.append(Headline(
            f"the pass on hf_zoo models at {layers} layers ({ops} ops, {n} cases): time",
            f"{fast}/{n} in budget; slowest {slowest.pass_seconds:.1f} s "
            f"({slowest.model}, {slowest.ops:,} ops)",
            f"<= {PASS_S:g} s (<= {BIG_PASS_S:g} s beyond {BIG_OPS:,} ops)", fast == n))
        close = sum(_close(c) for c in cases)
        worst = max(c.gap for c in cases)
        out.append(Headline(f"the pass on hf_zoo models at {layers} layers: gap to the bound",
                            f"{close}/{n} within; largest {100 * worst:.2f}%",
                            f"<= {100 * GAP:g}% or proven", close == n))
        again = max(c.again_seconds for c in cases)
        same = sum(c.same_plan for c in cases)
        out.append(Headline("recompile from the plan cache: time, same plan",
                            f"max {again:.2f} s; same plan {same}/{n}", f"<= {AGAIN_S:g} s, same",
                            again <= AGAIN_S and same == n))
    under = [seconds for ops, seconds in small if ops < SMALL_OPS]
    if under:
        out.append(Headline(f"planning the zoo's graphs under {SMALL_OPS} ops "
                            f"({len(under)} cases)", f"max {max(under):.3f} s",
                            f"<= {SMALL_S:g} s", max(under) <= SMALL_S))
    return out


def small_graphs(streams: int) -> tuple[str, list[tuple[int, float]]]:
    """Planning time of the small zoo graphs (the solve stage and the whole plan): the
    table, and the ops and plan seconds of each case."""
    from autostream.models import zoo
    from autostream.planning.plan import plan_model

    lines = ["| graph | ops | table | solve s | plan s | streams used | gap |",
             "|---|---:|---|---:|---:|---:|---:|"]
    timed = []
    for name, factory in zoo.ZOO.items():
        for table in ("cpu", *TABLES):
            model, inputs = factory()
            plan = plan_model(model, inputs, max_streams=streams, cost_table=table)
            s, ops = plan.schedule, plan.op_graph.number_of_nodes()
            timed.append((ops, plan.plan_seconds))
            lines.append(f"| {name} | {ops} | {table} | "
                         f"{plan.stages.solve:.3f} | {plan.plan_seconds:.3f} | "
                         f"{s.streams_used} | {100 * s.gap:.1f}% |")
    return "\n".join(lines), timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--models", nargs="+", default=None, help="hf_zoo names (default: all)")
    ap.add_argument("--streams", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--tables", nargs="+", default=list(TABLES))
    ap.add_argument("--no-small", action="store_true", help="skip the small-graph table")
    args = ap.parse_args(argv)
    os.environ["AUTOSTREAM_PLAN_CACHE"] = tempfile.mkdtemp(prefix="autostream-plans-")
    from autostream.fx.capture import capture_graphs
    from autostream.models import hf_zoo

    names = args.models or hf_zoo.available()
    if not names:
        print("transformers is not installed: pip install -e '.[models]'", file=sys.stderr)
        return 2
    cases = []
    for name in names:
        t0 = time.perf_counter()
        model, inputs = hf_zoo.HF_ZOO[name](layers=args.layers)
        gm = max(capture_graphs(model, inputs), key=lambda g: len(g.graph.nodes))
        print(f"captured {name} ({args.layers} layers) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        for table in args.tables:
            for streams in args.streams:
                cases.append(run_case(name, gm, table, streams))
    print(f"The pass on `autostream.models.hf_zoo` models at {args.layers} layers (default cpsat "
          "options; `pass s` excludes capturing the graph).\n")
    print(zoo_table(cases))
    print()
    print(targets(cases))
    small: list[tuple[int, float]] = []
    if not args.no_small:
        print("\nPlanning the small graphs of `autostream.models.zoo` on 4 streams (default options):\n")
        text, small = small_graphs(4)
        print(text)
    record(__file__, headlines(cases, args.layers, small))
    return 0


if __name__ == "__main__":
    sys.exit(main())
