"""Scale benchmark: ``cpsat`` on synthetic decoder-style graphs of growing depth.

The graphs come from ``decoder_graph.decoder_problem`` (158 ops per layer: a
32-layer model is 5,032 ops).  For each layer count, prints the planning time,
the predicted makespan, the Graham lower bound ``max(critical path, work /
streams, contended work / capacity)`` and the bound over the pieces between cuts
(ops every other op precedes or follows, i.e. per layer half): Graham's per piece,
summed, or the bound ``cpsat`` proved where larger (with its head-body-tail and
CP-SAT terms), the gaps, and the pieces vs the distinct pieces solved (the rest are
copies); ``heft`` beside it with ``--baselines``.  ``--jitter``
perturbs every op's cost so that no two layers are identical (no reuse).

Each depth is planned twice: the plain decoder, and one rank's graph of a
distributed deployment (``parallel=True``: tensor-parallel all-reduces and
expert-parallel all-to-alls, each transfer on its group's link), planned as the
pass plans graphs that communicate (no wall-clock cut, so every rank gets the same
plan); ``over heft`` is HEFT's makespan over cpsat's, HEFT being cpsat's warm start.

    python -m experiments.scale_benchmark                       # 32 layers, 4 streams
    python -m experiments.scale_benchmark --layers 4 8 16 32    # growth with depth
"""

from __future__ import annotations

import argparse
import sys
import time

from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.cpsat.bounds import graham_by_pieces
from experiments.decoder_graph import decoder_problem
from experiments.headline import Headline, record

#: graphs up to this many ops (a 32-layer decoder: 5,032) are planned within
#: SMALL_S seconds and within GAP of the bound; larger ones within LARGE_S seconds
SMALL_OPS, SMALL_S, GAP, LARGE_S = 6000, 10.0, 0.03, 20.0


def headline(layers: int, ops: int, seconds: float, gap: float,
             over_heft: float | None = None) -> Headline:
    """The target of a decoder graph of ``ops`` ops: planning time, and the gap when small;
    ``over_heft`` (HEFT's makespan over cpsat's) marks the graph with collectives."""
    kind = "decoder graph" if over_heft is None else "decoder graph with collectives"
    what = f"{kind}, {ops:,} ops ({layers} layers): cpsat planning time, gap to the bound"
    measured = f"{seconds:.1f} s, {100 * gap:.1f}%"
    if over_heft is not None:
        measured += f" ({over_heft:.2f}x over HEFT)"
    if ops <= SMALL_OPS:
        return Headline(what, measured, f"<= {SMALL_S:g} s, <= {100 * GAP:g}%",
                        seconds <= SMALL_S and gap <= GAP)
    return Headline(what, measured, f"<= {LARGE_S:g} s", seconds <= LARGE_S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", type=int, default=[32])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=5.0, help="cpsat time limit (s)")
    ap.add_argument("--jitter", type=float, default=0.0, help="per-op cost perturbation, 0..1")
    ap.add_argument("--baselines", action="store_true", help="also time heft (slow beyond 2k ops)")
    args = ap.parse_args(argv)
    print("| layers | collectives | ops | solver | plan s | makespan us | graham LB us | gap | "
          "pieces LB us | gap | single us | over heft | pieces (solved) | plan from |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for parallel in (False, True):
        for layers in args.layers:
            rows += _plan_depth(layers, parallel, args)
    record(__file__, rows)
    return 0


def _plan_depth(layers: int, parallel: bool, args: argparse.Namespace) -> list[Headline]:
    """Plan one decoder graph (and HEFT with ``--baselines``); print its rows."""
    p = decoder_problem(layers=layers, streams=args.streams, jitter=args.jitter,
                        parallel=parallel)
    lb = p.lower_bound()
    seg = graham_by_pieces(p)
    single = solve(p, "single").makespan
    # a planning time is a solve's: never a hit of the persistent plan cache
    runs = [("cpsat", {"time_limit": args.time_limit, "wall_clock": not parallel,
                       "cache": False})]
    if args.baselines:
        runs.append(("heft", {}))
    rows = []
    for name, options in runs:
        t0 = time.perf_counter()
        s = solve(p, name, **options)
        seconds = time.perf_counter() - t0
        st = s.stats
        over_heft, bound = "-", seg
        if name == "cpsat":
            windows = f"{st.pieces} ({st.pieces_solved}: {', '.join(st.piece_sources)})"
            source = st.source
            over_heft = f"{st.heft_us / s.makespan:.2f}x"
            bound = max(seg, st.bound)  # what the solve proved, where it beats the pieces'
            rows.append(headline(layers, len(p.graph), seconds, s.makespan / bound - 1,
                                 st.heft_us / s.makespan if parallel else None))
        else:
            windows, source = "-", name
        print(f"| {layers} | {'TP, EP' if parallel else '-'} | {len(p.graph)} | {name} | "
              f"{seconds:.2f} | {s.makespan:.1f} | {lb:.1f} | {100 * (s.makespan / lb - 1):.1f}% | "
              f"{bound:.1f} | {100 * (s.makespan / bound - 1):.1f}% | {single:.1f} | "
              f"{over_heft} | {windows} | {source} |", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
