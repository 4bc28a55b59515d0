"""Scale benchmark: ``cpsat`` on synthetic decoder-style graphs of growing depth.

The graphs come from ``decoder_graph.decoder_problem`` (158 ops per layer: a
32-layer model is 5,032 ops).  For each layer count, prints the planning time,
the predicted makespan, the Graham lower bound ``max(critical path, work /
streams, contended work / capacity)`` and the same bound summed over the pieces
between cuts (ops every other op precedes or follows, i.e. per layer half;
``cpsat`` reports at least that), the gaps, and the pieces vs the distinct pieces
solved (the rest are copies); ``heft`` beside it with ``--baselines``.  ``--jitter``
perturbs every op's cost so that no two layers are identical (no reuse).

    python -m experiments.scale_benchmark                       # 32 layers, 4 streams
    python -m experiments.scale_benchmark --layers 4 8 16 32    # growth with depth
"""

from __future__ import annotations

import argparse
import sys
import time

from autostream.solvers import solve
from autostream.solvers.cpsat.bounds import graham_by_pieces
from experiments.decoder_graph import decoder_problem
from experiments.headline import Headline, record

#: graphs up to this many ops (a 32-layer decoder: 5,032) are planned within
#: SMALL_S seconds and within GAP of the bound; larger ones within LARGE_S seconds
SMALL_OPS, SMALL_S, GAP, LARGE_S = 6000, 10.0, 0.03, 20.0


def headline(layers: int, ops: int, seconds: float, gap: float) -> Headline:
    """The target of a decoder graph of ``ops`` ops: planning time, and the gap when small."""
    what = f"decoder graph, {ops:,} ops ({layers} layers): cpsat planning time, gap to the bound"
    measured = f"{seconds:.1f} s, {100 * gap:.1f}%"
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
    print("| layers | ops | solver | plan s | makespan us | graham LB us | gap | pieces LB us | "
          "gap | single us | pieces (solved) | plan from |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for layers in args.layers:
        p = decoder_problem(layers=layers, streams=args.streams, jitter=args.jitter)
        lb = p.lower_bound()
        seg = graham_by_pieces(p)
        runs = [("cpsat", {"time_limit": args.time_limit})]
        if args.baselines:
            runs.append(("heft", {}))
        for name, options in runs:
            t0 = time.perf_counter()
            s = solve(p, name, **options)
            seconds = time.perf_counter() - t0
            st = s.stats
            if name == "cpsat":
                windows = f"{st.pieces} ({st.pieces_solved}: {', '.join(st.piece_sources)})"
                source = st.source
                rows.append(headline(layers, len(p.graph), seconds, s.makespan / seg - 1))
            else:
                windows, source = "-", name
            print(f"| {layers} | {len(p.graph)} | {name} | {seconds:.2f} | {s.makespan:.1f} | "
                  f"{lb:.1f} | {100 * (s.makespan / lb - 1):.1f}% | {seg:.1f} | "
                  f"{100 * (s.makespan / seg - 1):.1f}% | {p.single_stream_time():.1f} | "
                  f"{windows} | {source} |", flush=True)
    record(__file__, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
