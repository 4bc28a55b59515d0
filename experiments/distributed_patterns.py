"""Valid SPMD patterns that a library collective would break (issue 26), on real gloo ranks.

autostream issues no collective of its own: plans agree by construction, the plan
digests are compared through the process group's store, and graphs that communicate
keep their plan by prediction (``docs/distributed.md``).  Each pattern runs a small
model (:class:`Branches`: a chain whose batch-independent Gram matrix is all-reduced,
beside a local chain) compiled with ``autostream.backend()`` (default ``measure``),
``dynamic=False``, every call compared with eager on every rank:

- ``recompile one rank (shape)``: rank 0's batch grows at call 3 (only it recompiles);
- ``recompile one rank (dtype)``: rank 0's input turns float64 at call 3;
- ``call counts per graph``: two compiled graphs, each rank picking one per call from
  its own data (graph A runs a different number of times per rank);
- ``rank-dependent shapes``: rank ``r`` has batch ``4 + 2 r`` from the start;
- ``sub-groups``: an all-reduce on a sub-group (pairs of ranks) beside the world's;
- ``slow rank``: the last rank sleeps ``slow_s`` before call 10 (a checkpoint), the
  process group's timeout being far longer: the others must wait, not fail;
- ``rank dies``: the last rank raises at call 10 and exits; the others must get an
  error (not hang), and the table gives how long after the death.

``hangs`` counts runs that did not finish within their bound (every rank killed);
``wrong`` counts calls whose output differs from eager's by more than float32 rounding
(:data:`ROUNDING`, on the output's scale: ``max |got - want| / max |want|``).  Why not
bitwise, nor ``allclose``: a first call was once seen off by 4.4e-5 (3e-5 of the output's
scale) on both ranks of a loaded run and in a one-process run of the same model
without communication (rounding, cause not pinned: ``docs/correctness.md``), which
``allclose(rtol=1e-5, atol=1e-6)`` counted wrong, since an element's rounding error
follows the size of the terms summed into it, not its own; a real fault (an all-reduce
read before it completed, or paired with another call's) is off by 0.6-1.2 here.

    python -m experiments.distributed_patterns
    python -m experiments.distributed_patterns --ranks 2 --slow-s 5 --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from autostream.comm.spawn import RanksFailed, run_ranks
from experiments.headline import Headline, record

WIDTH, DEPTH = 48, 3
CALLS = 16
#: the call at which a rank sleeps or dies, and at which rank 0 recompiles
AT, RECOMPILE_AT = 10, 3
#: the process group's timeout (torch's default for gloo: 30 minutes)
PG_TIMEOUT_S = 1800.0
#: float32 rounding of one output, relative to the output's scale: each side's result is
#: within ``WIDTH`` eps (one product of ``WIDTH`` terms) per step of its longest chain of
#: dependent steps (``DEPTH`` matmuls, the Gram matrix, the all-reduce, the last matmul)
#: of the exact one, and both sides round
ROUNDING = 2 * (DEPTH + 3) * WIDTH * torch.finfo(torch.float32).eps
BACKEND = {"max_streams": 2, "cost_table": "h200", "time_limit": 1.0, "solver": "critical_path"}
PATTERNS = ("recompile one rank (shape)", "recompile one rank (dtype)", "call counts per graph",
            "rank-dependent shapes", "sub-groups", "slow rank", "rank dies")


class Branches(torch.nn.Module):
    """``tanh`` matmul chain ``a`` whose Gram matrix (``width x width``, whatever the
    batch) is all-reduced on the world (and on ``subgroup``), beside chain ``b``."""

    def __init__(self, seed: int, subgroup: Any = None, width: int = WIDTH, depth: int = DEPTH):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.a = torch.nn.ParameterList(torch.randn(width, width, generator=gen) / width ** 0.5
                                        for _ in range(depth))
        self.b = torch.nn.ParameterList(torch.randn(width, width, generator=gen) / width ** 0.5
                                        for _ in range(depth))
        self.subgroup = subgroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed import _functional_collectives as ft_c

        x = x.float()
        h = x
        for w in self.a:
            h = torch.tanh(h @ w)
        gram = ft_c.all_reduce(h.t() @ h / h.shape[0], "sum", dist.group.WORLD)
        v = x
        for w in self.b:
            v = torch.tanh(v @ w)
        out = v @ gram
        if self.subgroup is not None:
            out = out + v @ ft_c.all_reduce(v.t() @ v / v.shape[0], "sum", self.subgroup)
        return out


@dataclass(frozen=True)
class RankOutcome:
    """What one rank saw of one pattern."""

    calls: int
    wrong: int
    error: str | None = None  # the first line of the error a call raised
    error_at: float | None = None  # when (``time.time()``), for the survivors of a death
    died_at: float | None = None  # when the dying rank raised
    applied: bool = False  # some graph ran a plan
    worst: float = 0.0  # the largest difference from eager of its calls (``difference``)


def _inputs(rank: int, step: int, rows: int = 8, dtype: torch.dtype = torch.float32
            ) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(rows, WIDTH, generator=gen).to(dtype)


def _compile(model: torch.nn.Module, wait_timeout_s: float | None) -> tuple[Any, Any]:
    import autostream
    import autostream.runtime.select as select
    from autostream.runtime.threads import ThreadsRunner

    if wait_timeout_s is not None:  # the threads runtime's waits bounded (tests: shorter)
        select.ThreadsRunner = lambda *a, **k: ThreadsRunner(*a, **k,
                                                             wait_timeout_s=wait_timeout_s)
    backend = autostream.backend(**BACKEND)
    return torch.compile(model, backend=backend, dynamic=False), backend


def difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want|`` relative to ``max |want|`` (``inf``: other shapes or dtypes).

    >>> want = torch.tensor([1.5, 0.0005])
    >>> difference(want + torch.tensor([0.0, 4.4e-5]), want) < ROUNDING  # rounding
    True
    >>> difference(torch.tensor([1.5, 0.6]), want) > 1000 * ROUNDING  # a wrong value
    True
    """
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf")
    if not want.numel():
        return 0.0
    scale = max(want.abs().max().item(), torch.finfo(want.dtype).tiny)
    return (got - want).abs().max().item() / scale


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return difference(got, want) <= ROUNDING


def _pattern(rank: int, world: int, name: str, calls: int, slow_s: float,
             wait_timeout_s: float | None) -> RankOutcome:
    import torch.distributed as dist

    torch._dynamo.reset()
    last = world - 1
    subgroup = None
    if name == "sub-groups":
        subgroup, _ = dist.new_subgroups(group_size=max(1, world // 2))
    models = [Branches(seed=1, subgroup=subgroup), Branches(seed=2)]
    compiled = [_compile(m, wait_timeout_s) for m in models]
    wrong = done = 0
    worst = 0.0
    with torch.no_grad():
        for step in range(calls):
            rows = 4 + 2 * rank if name == "rank-dependent shapes" else 8
            if name == "recompile one rank (shape)" and rank == 0 and step >= RECOMPILE_AT:
                rows = 12
            dtype = (torch.float64 if name == "recompile one rank (dtype)" and rank == 0
                     and step >= RECOMPILE_AT else torch.float32)
            x = _inputs(rank, step, rows, dtype)
            which = 0
            if name == "call counts per graph":
                which = int(x.sum() > 0)  # each rank's own data picks the graph
            if step == AT and rank == last and name == "slow rank":
                time.sleep(slow_s)
            if step == AT and rank == last and name == "rank dies":
                return RankOutcome(done, wrong, "raised on purpose", died_at=time.time(),
                                   worst=worst)
            try:
                got = compiled[which][0](x)
                want = models[which](x)
            except Exception as exc:  # noqa: BLE001 - the survivors of a death report it
                first = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                return RankOutcome(done, wrong, first[:300], error_at=time.time(),
                                   applied=_applied(compiled), worst=worst)
            diff = difference(got, want)
            wrong += not diff <= ROUNDING
            worst = max(worst, diff)
            done += 1
    return RankOutcome(done, wrong, applied=_applied(compiled), worst=worst)


def _applied(compiled: list) -> bool:
    return any(r.applied for _, backend in compiled for r in backend.autostream_pass.reports)


@dataclass(frozen=True)
class Row:
    pattern: str
    ranks: int
    calls: int  # calls made, all ranks
    wrong: int
    hang: bool
    errors: tuple[str, ...]  # distinct errors the ranks saw
    seconds: float
    #: rank dies: the slowest survivor's time from the death to its error
    to_error_s: float | None = None
    applied: bool = False
    worst: float = 0.0  # the largest difference from eager of its calls, all ranks


def run_pattern(name: str, world: int, calls: int = CALLS, slow_s: float = 150.0,
                wait_timeout_s: float | None = None, pg_timeout_s: float = PG_TIMEOUT_S,
                bound_s: float | None = None) -> Row:
    """One pattern on ``world`` gloo ranks; a run past ``bound_s`` is a hang."""
    bound = bound_s if bound_s is not None else 300.0 + (slow_s if name == "slow rank" else 0)
    t0 = time.monotonic()
    try:
        ranks = run_ranks(_pattern, world, args=(name, calls, slow_s, wait_timeout_s),
                          timeout_s=bound, pg_timeout_s=pg_timeout_s)
    except RanksFailed as failed:
        hang = "did not finish within" in str(failed)
        return Row(name, world, 0, 0, hang, (str(failed).splitlines()[0][:300],),
                   time.monotonic() - t0)
    seconds = time.monotonic() - t0
    errors = tuple(sorted({r.error for r in ranks if r.error}))
    to_error = None
    died = [r.died_at for r in ranks if r.died_at is not None]
    if died:
        survivors = [r.error_at for r in ranks if r.error_at is not None]
        to_error = (max(survivors) - died[0]) if len(survivors) == world - 1 else None
    return Row(name, world, sum(r.calls for r in ranks), sum(r.wrong for r in ranks), False,
               errors, seconds, to_error, any(r.applied for r in ranks),
               max(r.worst for r in ranks))


def failures(row: Row) -> list[str]:
    """What went wrong in ``row`` (empty: the pattern behaved)."""
    out = []
    if row.hang:
        out.append("hang")
    if row.wrong:
        out.append(f"{row.wrong} wrong calls (largest difference {row.worst:.1e} of the "
                   f"output's scale; rounding bound {ROUNDING:.1e})")
    if row.pattern == "rank dies":
        if row.to_error_s is None:
            out.append(f"not every survivor got an error: {row.errors}")
    elif row.errors:
        out.append(f"errors: {row.errors}")
    return out


def table(rows: list[Row]) -> str:
    lines = ["| pattern | ranks | calls | hangs | wrong | worst | plan applied | errors | "
             "death to error s | run s |", "|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        errors = "; ".join(e.replace("|", "\\|") for e in r.errors) or "-"
        to_error = f"{r.to_error_s:.2f}" if r.to_error_s is not None else "-"
        lines.append(f"| {r.pattern} | {r.ranks} | {r.calls} | {int(r.hang)} | {r.wrong} | {r.worst:.0e} | "
                     f"{'yes' if r.applied else 'no'} | {errors} | {to_error} | "
                     f"{r.seconds:.0f} |")
    return "\n".join(lines)


def headlines(rows: list[Row]) -> list[Headline]:
    worlds = "/".join(str(w) for w in sorted({r.ranks for r in rows}))
    hangs = sum(r.hang for r in rows)
    wrong = sum(r.wrong for r in rows)
    bad = [f"{r.pattern} x{r.ranks}" for r in rows if failures(r)]
    out = [Headline(f"distributed patterns ({len(PATTERNS)} patterns, {worlds} gloo ranks): "
                    "hangs", str(hangs), "0", hangs == 0),
           Headline("distributed patterns: calls that differ from eager", str(wrong), "0",
                    wrong == 0),
           Headline("distributed patterns: patterns that misbehaved (hang, wrong call, error "
                    "on a healthy run, a survivor of a death without an error)",
                    ", ".join(bad) or "none", "none", not bad)]
    deaths = [r for r in rows if r.pattern == "rank dies" and r.to_error_s is not None]
    if deaths:
        worst = max(r.to_error_s for r in deaths)
        out.append(Headline("distributed patterns: a rank dies at call 10: time until every "
                            "other rank has an error", f"{worst:.2f} s (worst of "
                            f"{len(deaths)} runs; process group timeout {PG_TIMEOUT_S:.0f} s)",
                            f"< {PG_TIMEOUT_S:.0f} s", worst < PG_TIMEOUT_S))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--slow-s", type=float, default=150.0,
                        help="how long the slow rank sleeps (default 150 s: more than the "
                             "threads runtime's former 120 s wait timeout)")
    parser.add_argument("--quick", action="store_true", help="2 ranks, 5 s of slowness")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.slow_s = [2], 5.0
    names = args.patterns.split(",")
    unknown = sorted(set(names) - set(PATTERNS))
    if unknown:
        parser.error(f"unknown patterns {unknown}; known: {', '.join(PATTERNS)}")
    rows = [run_pattern(name, world, args.calls, args.slow_s)
            for world in args.ranks for name in names]
    print(f"gloo ranks, {args.calls} calls per rank and pattern, `autostream.backend("
          f"{', '.join(f'{k}={v!r}' for k, v in BACKEND.items())})`, process group timeout "
          f"{PG_TIMEOUT_S:.0f} s; the slow rank sleeps {args.slow_s:g} s. `wrong`: calls "
          f"that differ from eager by more than float32 rounding ({ROUNDING:.1e} of the "
          "output's scale); `worst`: the largest difference seen.")
    print()
    print(table(rows))
    record(__file__, headlines(rows))
    return 0 if not any(failures(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
