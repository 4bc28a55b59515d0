"""GPU check of calibration under graph replay and of the MoE decode layers (issue 41).

    python -m experiments.replay_calibration --out $OUT                  # both parts
    python -m experiments.replay_calibration --out $OUT --part moe       # or: calibrate

``moe``: each MoE decode layer (``autostream.models.moe_decode``: Qwen3-MoE and DeepSeek-V3
shaped, ``scale=1``, bfloat16) at 1, 8 and 64 tokens: the eager forward under
``torch.cuda.set_sync_debug_mode("error")`` (a host sync raises), twice (bitwise equal?),
then captured into a CUDA graph after three warm-up calls on the capture stream and replayed
(bitwise equal to eager?); device time per call, eager and replayed (CUDA events around 20
calls).

``calibrate``: ``autostream calibrate --device cuda`` on GoogLeNet (torchvision, batch 1 and
8; left out when torchvision is missing), the six MoE layers and ``two_branch_gemv``, timed
by wall clock (model capture included) against the 2-minute budget; writes the table
(``h200_replay.json``) and a summary of it.

Both write ``replay_calibration.json`` in ``--out`` (one key per part) and print it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from autostream.models.moe_decode import decode_inputs, deepseek_v3_decode, qwen3_moe_decode

TOKENS = (1, 8, 64)
LAYERS = {"qwen3_moe": qwen3_moe_decode, "deepseek_v3": deepseek_v3_decode}
#: the budget of the whole ``calibrate`` command on these models (seconds)
BUDGET_S = 120.0


# -- MODEL_SPECs for the calibrate part (each takes no argument) ----------------------------

def _googlenet(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    from torchvision.models import googlenet

    torch.manual_seed(0)
    model = googlenet(weights=None, aux_logits=False, init_weights=False).eval()
    return model, (torch.randn(batch, 3, 224, 224),)


def googlenet_b1() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return _googlenet(1)


def googlenet_b8() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return _googlenet(8)


def _moe(name: str, tokens: int) -> Any:
    return LAYERS[name](tokens=tokens, scale=1, device="cuda", dtype=torch.bfloat16)


def qwen3_moe_t1() -> Any:
    return _moe("qwen3_moe", 1)


def qwen3_moe_t8() -> Any:
    return _moe("qwen3_moe", 8)


def qwen3_moe_t64() -> Any:
    return _moe("qwen3_moe", 64)


def deepseek_v3_t1() -> Any:
    return _moe("deepseek_v3", 1)


def deepseek_v3_t8() -> Any:
    return _moe("deepseek_v3", 8)


def deepseek_v3_t64() -> Any:
    return _moe("deepseek_v3", 64)


def specs() -> list[str]:
    """The MODEL_SPECs of the calibrate part (GoogLeNet only with torchvision)."""
    here = "experiments.replay_calibration"
    names = [f"{n}_t{t}" for n in LAYERS for t in TOKENS]
    try:
        import torchvision  # noqa: F401
        names = ["googlenet_b1", "googlenet_b8", *names]
    except ImportError:
        print("torchvision is not installed: GoogLeNet left out", file=sys.stderr)
    return [f"{here}:{n}" for n in names] + ["autostream.models.zoo:two_branch_gemv"]


# -- part moe ---------------------------------------------------------------------------

def _device_us(fn: Any, calls: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def check_layer(name: str) -> list[dict[str, Any]]:
    model, _ = LAYERS[name](tokens=1, scale=1, device="cuda")
    rows = []
    with torch.no_grad():
        for tokens in TOKENS:
            (x,) = decode_inputs(model, tokens)
            row: dict[str, Any] = {"layer": name, "tokens": tokens}
            try:
                torch.cuda.set_sync_debug_mode("error")
                try:
                    first = model(x)
                    second = model(x)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                row["no_host_sync"] = True
            except RuntimeError as exc:
                row["no_host_sync"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                first, second = model(x), model(x)
            row["eager_bitwise_repeatable"] = bool(torch.equal(first, second))
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=stream):
                    static = model(x)
                graph.replay()
                torch.cuda.synchronize()
                row["replay_bitwise_equal_to_eager"] = bool(torch.equal(static, first))
                row["replay_us"] = round(_device_us(graph.replay), 2)
            except RuntimeError as exc:
                row["capture_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["eager_us"] = round(_device_us(lambda x=x: model(x)), 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# -- part calibrate ---------------------------------------------------------------------------

def calibrate(out: Path) -> dict[str, Any]:
    from autostream.cli import main
    from autostream.cost.table import CostTable

    table_path = out / "h200_replay.json"
    names = specs()
    start = time.perf_counter()
    rc = main(["calibrate", *names, "--device", "cuda", "--out", str(table_path)])
    wall = time.perf_counter() - start
    summary: dict[str, Any] = {"specs": names, "rc": rc, "wall_s": round(wall, 1),
                               "budget_s": BUDGET_S, "within_budget": wall <= BUDGET_S}
    if rc != 0 or not table_path.exists():
        return summary
    table = CostTable.load(table_path)
    entries = sorted(table.entries, key=lambda e: -e.time_us)
    p = table.profile
    summary.update({
        "entries": len(table.entries), "skipped": [f"{s.op}: {s.reason}" for s in table.skipped],
        "pairs": len(table.pairs), "notes": table.device.get("notes", ""),
        "graph_kernel_us": p.graph_kernel_us, "graph_sync_us": p.graph_sync_us,
        "graph_call_us": p.graph_call_us, "launch_overhead_us": p.launch_overhead_us,
        "timings": sorted({e.timing for e in table.entries}),
        "median_share": statistics.median(e.share for e in entries) if entries else None,
        "top": [{"op": e.op, "signature": e.signature[:80], "time_us": e.time_us,
                 "share": e.share, "slowdown": e.slowdown} for e in entries[:12]],
        "grouped_mm": [{"signature": e.signature[:80], "time_us": e.time_us, "share": e.share}
                       for e in entries if e.op == "aten._grouped_mm.default"],
    })
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part", choices=("moe", "calibrate", "all"), default="all")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"torch": torch.__version__,
                              "device": torch.cuda.get_device_name()}
    if args.part in ("moe", "all"):
        result["moe"] = []
        for name in LAYERS:
            result["moe"] += check_layer(name)
            torch.cuda.empty_cache()  # the layer's weights (22.5 GB for DeepSeek's experts)
    if args.part in ("calibrate", "all"):
        result["calibrate"] = calibrate(args.out)
    (args.out / "replay_calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
