"""``autostream check SPEC``: check the streams placed by hand in a model's graph.

``SPEC`` is resolved as ``autostream plan`` resolves it (``module:function`` or
``file.py:function`` returning ``(model, example_inputs)``); a returned
``torch.fx.GraphModule`` that carries stream ops is checked as it is, any other model is
captured first (its largest graph).  ``autostream check --list`` prints the shipped
layers placed by hand (``autostream.models.experts``), each a SPEC.
"""

from __future__ import annotations

import argparse
import inspect
import json
import textwrap
from pathlib import Path
from typing import Any

#: the module of the experts' layers placed by hand: one SPEC per recipe
EXPERTS = "autostream.models.experts"
EXIT_CODES = """\
exit status:
  0  nothing found: no race, no other problem, collectives on one stream
  1  the placement has races or other problems (printed, and in --json)
  2  bad usage, or SPEC cannot be checked (not importable, no stream ops, bad table)
  3  an internal error (a traceback follows)"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="check a hand placement of streams: races, collectives, predicted times",
        description=textwrap.fill(
            "Read the streams placed by hand in SPEC's graph (TorchAir scopes, record/wait, "
            "wait_tensor, Dynamo user streams), report every race (ops, streams, storage, "
            "source line) and collectives on several streams, and predict its time beside "
            "autostream's plan, the bound and one stream, on the cost table it names. SPEC "
            "is module.path:function or path/to/file.py:function returning (model, "
            "example_inputs); `autostream check --list` prints the shipped layers placed by "
            "hand. E.g.:", 80) + f"\n\n  autostream check {EXPERTS}:fine_bf16_race --mode ge",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC", nargs="?",
                   help="module:function or file.py:function")
    p.add_argument("--list", action="store_true",
                   help=f"print the shipped layers placed by hand ({EXPERTS}), one SPEC a line")
    p.add_argument("--mode", default="cuda", choices=("cuda", "ge", "acl"),
                   help="the target's semantics: CUDA events, TorchAir GE (max-autotune) or "
                        "TorchAir ACL graph (reduce-overhead) (default cuda)")
    p.add_argument("--cost-table", default=None,
                   help="cost table name or path (default: ascend910b with --mode ge or acl, "
                        "else the table of the graph's device: cpu for CPU or fake tensors)")
    p.add_argument("--streams", type=int, default=2,
                   help="streams autostream's plan may use, at least the placement's (default 2)")
    p.add_argument("--time-limit", type=float, default=None, help="CP-SAT's seconds")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="also write the check as JSON to OUT")
    p.set_defaults(func=run)


def shipped_specs() -> list[tuple[str, str]]:
    """``(SPEC, what it is)`` of every shipped layer placed by hand.

    >>> specs = dict(shipped_specs())
    >>> specs["autostream.models.experts:fine_bf16_race"][:40]
    "MoE, recipe (b) with vLLM #28942's race:"
    """
    from autostream.models import experts

    return [(f"{EXPERTS}:{recipe}", inspect.getdoc(getattr(experts, recipe)).splitlines()[0])
            for recipe in experts.RECIPES]


def check_spec(spec: str, mode: str = "cuda", cost_table: str | None = None,
               streams: int = 2, time_limit: float | None = None) -> Any:
    """The :class:`~autostream.planning.check.HandCheck` of SPEC's graph."""
    import torch.fx

    from autostream.dialects.hand import has_placement
    from autostream.fx.capture import capture_graphs
    from autostream.models.modelspec import load_model_spec
    from autostream.planning.check import check

    if streams < 1:
        raise ValueError(f"--streams must be >= 1, got {streams}")
    model, inputs = load_model_spec(spec)
    if isinstance(model, torch.fx.GraphModule) and has_placement(model.graph.nodes):
        gm = model
    else:
        graphs = capture_graphs(model, tuple(inputs))
        if not graphs:
            raise ValueError("torch.compile captured no graph for this model; nothing to check")
        gm = max(graphs, key=lambda g: len(g.graph.nodes))
    if not has_placement(gm.graph.nodes):
        raise ValueError(f"{spec}: the graph has no stream ops and no stream annotations: "
                         f"nothing placed by hand to check (use `autostream plan`; "
                         f"`autostream check --list` prints layers placed by hand)")
    return check(gm, mode, cost_table, streams, time_limit)


def run(args: argparse.Namespace) -> int:
    if args.list:
        specs = shipped_specs()
        width = max(len(s) for s, _ in specs)
        print("\n".join(f"{s:<{width}}  {what}" for s, what in specs))
        return 0
    if not args.spec:
        raise ValueError(f"give a SPEC (module:function or file.py:function), e.g. "
                         f"{EXPERTS}:fine_bf16_race; --list prints the shipped ones")
    result = check_spec(args.spec, args.mode, args.cost_table, args.streams, args.time_limit)
    print(result.summary())
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result.figures(), indent=2) + "\n")
    return 0 if result.ok else 1
