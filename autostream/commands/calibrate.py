"""``autostream calibrate MODEL_SPEC... --device cpu|cuda|npu --out FILE``: profile ops
into a cost table (format: ``cost_models/README.md``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="time a model's ops on a device and write a cost table",
        description="Capture each model's post-grad ATen graph, time every distinct op "
                    "signature on real tensors (alone and with a concurrent copy, for the "
                    "device share), measure launch/record-wait/stream-switch costs, and write "
                    "a JSON cost table usable as cost_table=FILE. On a device with graph "
                    "capture (cuda, npu) ops are timed inside captured graphs replayed, and "
                    "shares are fitted to pairs of ops timed together (--eager: eager "
                    "launches instead).")
    p.add_argument("model_spec", nargs="*", metavar="MODEL_SPEC",
                   help="module.path:function or path/to/file.py:function returning "
                        "(model, example_inputs); several may be given (none with "
                        "--collectives)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "npu"))
    p.add_argument("--out", required=True, type=Path, help="table file to write")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per op (default 5)")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per op (default 30)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads while measuring (CPU; default: torch's "
                        "current setting). Use 1 on a shared or loaded machine, and plan "
                        "with the same setting")
    p.add_argument("--isolated", action="store_true",
                   help="keep each op's isolated time instead of its time inside the whole "
                        "graph (the default measures both and uses the in-graph one)")
    p.add_argument("--eager", action="store_true",
                   help="on a device with graph capture, time ops with eager launches (the "
                        "costs of runtime='streams') instead of inside captured graphs "
                        "replayed (the costs of runtime='graph', the default there)")
    p.add_argument("--runs", type=int, default=1,
                   help="calibrate N times and keep each number's median (default 1; on a "
                        "shared machine 3 or more give a steadier table)")
    p.add_argument("--merge", nargs="?", const=True, default=None, metavar="TABLE",
                   help="merge into an existing table (new measurements win): --out's when "
                        "given alone, else TABLE (a path or a shipped name: cpu, h200, "
                        "ascend910b)")
    p.add_argument("--from-profile", type=Path, default=None, metavar="PATH",
                   help="read op times from a profile instead of timing ops: a torch.profiler "
                        "Chrome trace (export_chrome_trace, record_shapes=True) or a torch_npu "
                        "profiler folder (*_ascend_pt); MODEL_SPECs, if given, get a coverage "
                        "report")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    g = p.add_argument_group("collectives (link fits of the alpha-beta model)")
    g.add_argument("--collectives", action="store_true",
                   help="time collectives on --nproc real ranks and write their link fits into "
                        "--out (an existing table keeps its op entries)")
    g.add_argument("--backend", default="gloo", choices=("gloo", "nccl", "hccl"))
    g.add_argument("--nproc", type=int, default=2, help="ranks to spawn (default 2)")
    g.add_argument("--sizes", type=int, nargs="+", default=None, metavar="BYTES",
                   help="message sizes (default 4 KiB .. 4 MiB)")
    g.add_argument("--link-share", type=float, default=None,
                   help="device share of a running transfer (default: measured)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.collectives:
        return run_collectives(args)
    if args.from_profile is not None:
        return run_from_profile(args)
    if not args.model_spec:
        raise ValueError("give at least one MODEL_SPEC (or --collectives for link fits)")
    from autostream.calibration import calibrate_graphs, replay_device, to_device
    from autostream.cost.table import CostTable, median_table
    from autostream.cost.timing import available_device
    from autostream.models.modelspec import load_model_spec

    if args.warmup < 0 or args.repeat < 1:
        raise ValueError("--warmup must be >= 0 and --repeat >= 1")
    if args.runs < 1:
        raise ValueError("--runs must be >= 1")
    device = available_device(args.device)
    replay = False if args.eager else None
    if args.isolated and not args.eager and replay_device(device) is not None:
        raise ValueError(f"--isolated chooses between eager timings; on {device.type} ops are "
                         "timed inside captured graphs replayed (each op alone already): drop "
                         "--isolated, or add --eager for eager timing")
    existing = None
    if isinstance(args.merge, str):
        existing = _merge_table(args.merge, device.type)
    elif args.merge and args.out.exists():
        existing = CostTable.load(args.out, expect_kind=device.type)

    from autostream.fx.capture import capture

    captured = []
    for spec in args.model_spec:
        model, inputs = load_model_spec(spec)
        if device.type != "cpu" and hasattr(model, "to"):
            model = model.to(device)
        captured += capture(model, to_device(inputs, device))
    graphs = [c.gm for c in captured]
    watch = _watch(args.threads)
    tables = [calibrate_graphs(graphs, device, args.warmup, args.repeat,
                               progress=not args.no_progress, models=args.model_spec,
                               threads=args.threads, in_graph=not args.isolated,
                               graph_args=[c.args or None for c in captured], replay=replay)
              for _ in range(args.runs)]
    table = median_table(tables) if args.runs > 1 else tables[0]
    load = watch.load()
    table = with_load(table, load)
    if existing is not None:
        table = existing.merged(table)
    table.save(args.out)
    print(f"wrote {args.out}: {len(table.entries)} op signatures on {table.device['name']}"
          f" ({len(table.skipped)} skipped)")
    for s in table.skipped:
        print(f"  skipped {s.op}({s.signature}): {s.reason}", file=sys.stderr)
    if load.busy:
        print(f"warning: {args.out} was calibrated while the machine was {load.reason}: its "
              f"times and peaks are unreliable (recorded in its device.load); calibrate on a "
              f"quiet machine (`--threads 1 --runs 3` steady a shared one)", file=sys.stderr)
    return 0


def _watch(threads: int | None):
    """Watch the machine's load while calibrating on ``threads`` intra-op threads."""
    import torch

    from autostream.runtime import machine

    return machine.LoadWatch(machine.read, used=threads or torch.get_num_threads())


def with_load(table, load):
    """``table`` with the machine's load while it was calibrated in ``device["load"]``
    (``runtime.machine.Load.figures()``: ``busy`` says whether its figures are reliable).

    >>> from autostream.cost.table import CostTable
    >>> from autostream.runtime.machine import Load
    >>> with_load(CostTable.from_profile(), Load(2, 0.4, 1.9, 1.2, 60.0)).device["load"]["busy"]
    True
    """
    from dataclasses import replace

    return replace(table, device={**table.device, "load": load.figures()})


def _merge_table(name: str, kind: str | None = None):
    from autostream.cost.model import TableCostModel

    return TableCostModel.load(name, device=kind).table


def run_from_profile(args: argparse.Namespace) -> int:
    """``--from-profile``: a table from a profile, with coverage and disagreement reports."""
    from autostream.cost.from_profile import coverage, report, table_from_profile
    from autostream.fx.capture import capture_graphs
    from autostream.models.modelspec import load_model_spec

    given = [flag for flag, on in (("--runs", args.runs != 1), ("--threads", args.threads),
                                   ("--isolated", args.isolated), ("--collectives", args.collectives),
                                   ("--eager", args.eager))
             if on]
    if given:
        raise ValueError(f"{', '.join(given)} apply to timing ops, not to --from-profile (which "
                         "reads the times the profile has); drop them")
    merge = None
    if isinstance(args.merge, str):
        merge = _merge_table(args.merge)
    elif args.merge and args.out.exists():
        merge = _merge_table(str(args.out))
    graphs = []
    for spec in args.model_spec:
        model, inputs = load_model_spec(spec)
        graphs += capture_graphs(model, inputs)
    result = table_from_profile(args.from_profile, merge=merge, graphs=graphs)
    result.table.save(args.out)
    device = result.table.device
    print(f"wrote {args.out}: {len(result.table.entries)} op signatures on {device['name']}\n"
          f"  {device['profile'].get('note') or device.get('notes', '')}")
    for line in report(result, coverage(graphs, result.table) if graphs else None):
        print(line)
    return 0


#: a link fit whose largest relative error is above this is said to be rough
ROUGH_FIT = 0.25


def run_collectives(args: argparse.Namespace) -> int:
    """``--collectives``: link fits on real ranks, written into ``--out``."""
    from autostream.cost.calibrate_collectives import DEVICE_OF_BACKEND, calibrate_collectives
    from autostream.cost.table import CostTable

    if args.model_spec:
        raise ValueError("--collectives times collectives only; calibrate MODEL_SPECs separately")
    kind = DEVICE_OF_BACKEND[args.backend]
    _reject_op_flags(args, kind)
    if args.out.exists():
        table = CostTable.load(args.out, expect_kind=kind)
    elif kind == "cpu":
        table = CostTable.from_profile()
    else:
        raise ValueError(f"{args.out} does not exist: link fits go into a {kind} table; write one "
                         f"first with `autostream calibrate MODEL_SPEC --device {kind} --out "
                         f"{args.out}` (or copy a shipped table)")
    fits = calibrate_collectives(args.backend, args.nproc, sizes=args.sizes,
                                 warmup=args.warmup, repeat=args.repeat,
                                 progress=not args.no_progress, share=args.link_share)
    table.with_links(fits).save(args.out)
    print(f"wrote {args.out}: link fits on {args.backend} x{args.nproc}")
    for f in fits:
        print(f"  {f.collective:15s} alpha {f.alpha_us:8.1f} us  bus bandwidth "
              f"{f.bandwidth / 1e9:7.3f} GB/s  share {f.share:.2f}  max error {f.max_error:.0%}")
    rough = [f.collective for f in fits if f.max_error > ROUGH_FIT]
    print("max error: the fit's largest relative error over the message sizes"
          + (f"; {', '.join(rough)} over {ROUGH_FIT:.0%}: their times do not follow one "
             f"alpha + bytes / bandwidth line here (ranks sharing the CPU with other work, or "
             f"a protocol change between sizes): rerun with a larger --repeat on a quiet "
             f"machine, or take their predictions as rough" if rough else ""))
    return 0


def _reject_op_flags(args: argparse.Namespace, kind: str) -> None:
    """Op calibration's flags that mean nothing to ``--collectives``: an error, not ignored."""
    if args.device != "cpu" and args.device != kind:
        raise ValueError(f"--device {args.device} does not match --backend {args.backend}, "
                         f"which runs on {kind}; drop --device (the backend decides)")
    given = [flag for flag, on in (("--runs", args.runs != 1), ("--threads", args.threads),
                                   ("--isolated", args.isolated), ("--eager", args.eager)) if on]
    if given:
        raise ValueError(f"{', '.join(given)} apply to op calibration, not to --collectives "
                         "(which always merges its link fits into --out); drop them")
