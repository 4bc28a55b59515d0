"""Distributed graphs on real ranks: 2 processes on gloo, every run bounded in time.

One spawn runs every scenario (``_scenarios``) so the suite pays for process start-up
and imports once; each test then checks one scenario's outcome.  A hang (the
collectives of issue 14 issued in different orders) fails the fixture within its
timeout instead of hanging CI.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from autostream.comm.spawn import RanksFailed, run_ranks
from autostream.models.zoo_parallel import PARALLEL_ZOO
from autostream.passes import load_table
from experiments import distributed as distributed_experiment

CALLS = 200
TIMEOUT_S = 1800.0  # a hang guard: the scenarios take minutes, more on a loaded machine
#: two ranks that start and end at once: only a hang takes this long, not a loaded machine
HANG_RANKS_S = 600.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one rank saw of one scenario."""

    wrong: int
    calls: int
    applied: bool
    reason: str
    streams_used: int
    comm_streams: tuple[int, ...]  # streams the plan gave the collective launches
    digest: str | None
    choice: str | None = None
    #: the plan's all-reduces, and how many of them run in place (``dialects.reinplace``)
    all_reduces: int = 0
    in_place: int = 0
    mismatch: str | None = None  # the plan digests of other ranks that differ, in words
    #: the most collectives of one group in flight at once in the graph that runs
    in_flight: int = 0


def _equal(got, want) -> bool:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return all(torch.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got, want, strict=True))


def _run(rank: int, world: int, model_name: str, calls: int, measure: int = 0,
         **options) -> Outcome:
    import autostream
    from autostream.comm import comm_op
    from autostream.comm.inflight import most_in_flight
    from autostream.comm.registry import qualified_name

    torch._dynamo.reset()
    model, make_inputs = PARALLEL_ZOO[model_name](rank, world)
    backend = autostream.backend(max_streams=2, measure=measure, time_limit=1.0, **options)
    compiled = torch.compile(model, backend=backend)
    wrong = 0
    with torch.no_grad():
        for step in range(calls):
            inputs = make_inputs(step)
            got = compiled(*inputs)
            wrong += not _equal(got, model(*inputs))
    report = next(r for r in reversed(backend.autostream_pass.reports) if r.plan is not None)
    schedule = report.plan.schedule
    comm = tuple(schedule.stream_of[n] for n, d in report.plan.op_graph.nodes(data=True)
                 if comm_op(d["fx"]) is not None and comm_op(d["fx"]).orders)
    choices = backend.measured_choices
    names = [qualified_name(d["fx"].target) for _, d in report.plan.op_graph.nodes(data=True)]
    lifted = backend.lifts[-1] if backend.lifts else None
    runs = (lifted.gm.graph.nodes if hasattr(lifted, "gm") else
            [report.plan.op_graph.nodes[n]["fx"] for n in schedule.order
             if n in report.plan.op_graph])
    return Outcome(wrong, calls, report.applied, report.reason, schedule.streams_used, comm,
                   report.rank_digest, choices[-1].choice if choices else None,
                   sum(n in ("_c10d_functional::all_reduce", "_c10d_functional::all_reduce_")
                       for n in names), names.count("_c10d_functional::all_reduce_"),
                   mismatch=report.rank_mismatch,
                   in_flight=max(most_in_flight(runs).values(), default=0))


def _diverging(rank: int, world: int) -> Outcome:
    """Rank 1 plans with another solver: the ranks' digests differ.  Rank 1 compiles
    after rank 0 has set its digest in the store (a store wait: the test's own
    synchronisation), so rank 1 sees the mismatch."""
    import torch.distributed as dist

    import autostream.passes
    from autostream.planning.plan import plan_graph

    if rank == 1:
        autostream.passes.plan_graph = lambda gm, options, *costs: plan_graph(
            gm, dataclasses.replace(options, solver="critical_path"), *costs)
        store = dist.distributed_c10d._get_default_store()
        store.wait(["test/rank0-compiled"])
    else:
        autostream.passes.plan_graph = lambda gm, options, *costs: _then_signal(
            plan_graph(gm, options, *costs))
    try:
        return _run(rank, world, "tp_mlp", 50, cost_table="h200")
    finally:
        autostream.passes.plan_graph = plan_graph


def _then_signal(plan):
    """Rank 0's plan, and a key telling rank 1 that the digest is about to be set."""
    import threading

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    # the pass sets its digest right after planning: give it a moment before rank 1 goes
    threading.Timer(2.0, store.set, ("test/rank0-compiled", "1")).start()
    return plan


def _calibrated_table(rank: int, world: int) -> dict:
    """The experiment's in-run calibration of tp_mlp: the table every rank plans with."""
    import torch.distributed as dist

    from autostream.cost import CostTable

    model, make_inputs = PARALLEL_ZOO["tp_mlp"](rank, world)
    shared = Path(tempfile.gettempdir()) / f"autostream-test-{os.getppid()}"  # both ranks' parent
    shared.mkdir(exist_ok=True)
    links = load_table("cpu").table.links
    path = distributed_experiment._calibrated(model, make_inputs(0), torch.device("cpu"), links,
                                              shared / "tp_mlp.json", rank)
    table = CostTable.load(path)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(shared)
    return {"digest": table.digest(), "ops": {e.op for e in table.entries},
            "skipped": {s.op: s.reason for s in table.skipped}, "links": len(table.links)}


def _scenarios(rank: int, world: int) -> dict[str, Outcome]:
    experiment = distributed_experiment._rank(rank, world, ["probe"], 2, 1, "cpu",
                                             {"cost_table": "cpu", "time_limit": 1.0})
    return {
        "experiment": experiment,
        "calibrated": _calibrated_table(rank, world),
        # the report of issue 14: 74 of 200 calls wrong before collectives were ordered
        "two_allreduces": _run(rank, world, "two_allreduces", CALLS, cost_table="h200"),
        "tp_mlp_h200": _run(rank, world, "tp_mlp", CALLS, cost_table="h200"),
        # two streams, the all-reduces on the side stream: its worker thread issues them
        # beside the main stream's compute (the race of issue 14 was two threads issuing);
        # on gloo one at a time, so no solver puts them on both streams any more
        "tp_mlp_two_streams": _run(rank, world, "tp_mlp", CALLS, solver="opara",
                                   cost_table="h200"),
        "ep_moe": _run(rank, world, "ep_moe", CALLS, cost_table="h200"),
        "fsdp": _run(rank, world, "fsdp", CALLS, cost_table="h200"),
        "measured": _run(rank, world, "ep_moe", 30, measure=2, cost_table="h200"),
        "diverging": _diverging(rank, world),
        "graph_mode_overlaps": _graph_mode_overlaps(rank, world),
    }


def _graph_mode_overlaps(rank: int, world: int) -> dict[str, tuple[int, bool]]:
    """Each model's hand-written graph-mode overlap compiled in program order (the
    experiment's ``ceiling compiled``): (calls that differ from eager, whether some op
    runs between a launch and its wait in the one graph Dynamo traced)."""
    from autostream.comm import comm_op
    from autostream.models.zoo_parallel import GraphModeOverlap

    out = {}
    for name, build in PARALLEL_ZOO.items():
        torch._dynamo.reset()
        model, make_inputs = build(rank, world)
        graphs: list[torch.fx.GraphModule] = []

        def program_order(gm, _, graphs=graphs):
            graphs.append(gm)
            return gm.forward

        compiled = torch.compile(GraphModeOverlap(model), backend=program_order)
        with torch.no_grad():
            wrong = sum(not _equal(compiled(*make_inputs(step)), model(*make_inputs(step)))
                        for step in range(20))
        [graph] = graphs
        nodes = [n for n in graph.graph.nodes if n.op == "call_function"]
        hidden = False
        for i, node in enumerate(nodes):
            op = comm_op(node)
            if op is not None and op.role == "collective":
                wait = next(j for j, n in enumerate(nodes) if node in n.all_input_nodes
                            and comm_op(n) is not None and comm_op(n).role == "wait")
                hidden |= any(comm_op(n) is None for n in nodes[i + 1:wait])
        out[name] = (wrong, hidden)
    return out


@pytest.fixture(scope="module")
def outcomes() -> dict[str, list[Outcome]]:
    by_rank = run_ranks(_scenarios, world_size=2, timeout_s=TIMEOUT_S)
    return {name: [r[name] for r in by_rank] for name in by_rank[0]}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["two_allreduces", "tp_mlp_h200", "tp_mlp_two_streams",
                                      "ep_moe", "fsdp"])
def test_every_call_equals_eager_on_every_rank(outcomes, scenario):
    for rank, o in enumerate(outcomes[scenario]):
        assert o.calls == CALLS
        assert o.wrong == 0, f"rank {rank}: {o.wrong} of {o.calls} calls differ from eager"
        assert o.applied, f"rank {rank}: the plan was not applied: {o.reason}"
        # two streams, or the collectives overlapped with compute on one
        assert o.streams_used == 2 or o.reason.startswith("collectives overlapped on one stream")


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["two_allreduces", "tp_mlp_h200", "tp_mlp_two_streams",
                                      "ep_moe", "fsdp"])
def test_plan_digests_equal_across_ranks(outcomes, scenario):
    digests = {o.digest for o in outcomes[scenario]}
    assert len(digests) == 1 and None not in digests


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["tp_mlp_h200", "ep_moe"])
def test_all_reduces_of_private_buffers_run_in_place(outcomes, scenario):
    # each all-reduce reduces a matmul's result that nothing else reads
    for o in outcomes[scenario]:
        assert o.all_reduces > 0 and o.in_place == o.all_reduces


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["two_allreduces", "tp_mlp_h200", "tp_mlp_two_streams",
                                      "ep_moe", "fsdp"])
def test_gloo_collectives_of_a_group_run_one_at_a_time(outcomes, scenario):
    """As in the program: fsdp's plan had all three gathers in flight at once, and a rank
    died now and then inside gloo (heap corruption; docs/distributed.md)."""
    for o in outcomes[scenario]:
        assert o.in_flight == 1


@pytest.mark.slow
def test_collectives_issued_by_a_side_stream_still_match(outcomes):
    """The all-reduces on the side stream's worker thread: the syncs keep their order."""
    for o in outcomes["tp_mlp_two_streams"]:
        assert o.streams_used == 2 and set(o.comm_streams) == {1}


@pytest.mark.slow
def test_rank_divergent_plans_are_named_and_still_pair_their_collectives(outcomes):
    ranks = outcomes["diverging"]
    assert ranks[0].digest != ranks[1].digest
    assert ranks[0].mismatch is None  # it set its digest first: nothing to compare yet
    assert ranks[1].mismatch.startswith(
        f"ranks planned this graph differently: rank 0 digest {ranks[0].digest[:10]}, "
        f"rank 1 digest {ranks[1].digest[:10]}")
    for o in ranks:  # each keeps its plan; both issue the collectives in program order
        assert o.wrong == 0


@pytest.mark.slow
def test_graphs_that_communicate_keep_the_plan_by_prediction(outcomes):
    """No measured choice (its timings differ per rank): the plan on every rank."""
    ranks = outcomes["measured"]
    for o in ranks:
        assert o.choice is None and o.applied and o.wrong == 0


@pytest.mark.slow
def test_hand_written_graph_mode_overlaps_equal_eager_and_overlap(outcomes):
    """The experiment's compiled ceiling: Dynamo keeps each hand-placed wait after the
    compute it hides, and every call equals eager."""
    for rank, overlaps in enumerate(outcomes["graph_mode_overlaps"]):
        assert set(overlaps) == set(PARALLEL_ZOO)
        for name, (wrong, hidden) in overlaps.items():
            assert wrong == 0, f"rank {rank}, {name}: {wrong} calls differ from eager"
            assert hidden, f"{name}: no compute between a launch and its wait"


def _hangs(rank: int, world: int) -> None:
    import time

    import torch.distributed as dist

    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    else:
        time.sleep(120)


@pytest.mark.slow
def test_run_ranks_kills_a_hang_and_says_so():
    with pytest.raises(RanksFailed, match="did not finish within 20 s"):
        run_ranks(_hangs, world_size=2, timeout_s=20.0)


def _raises(rank: int, world: int) -> None:
    raise ValueError(f"boom on rank {rank}")


@pytest.mark.slow
def test_run_ranks_reports_a_rank_that_raises():
    with pytest.raises(RanksFailed, match="boom on rank"):
        run_ranks(_raises, world_size=2, timeout_s=HANG_RANKS_S)


def _rank_of(rank: int, world: int) -> int:
    return rank


@pytest.mark.slow
def test_run_ranks_does_not_rely_on_a_port_staying_free(monkeypatch):
    """A port found free and released (``free_port``) is taken by another process before
    rank 0 binds it, as on a loaded machine running other suites: the former run failed
    (rank 0: ``EADDRINUSE``, rank 1 waiting for a store that never came)."""
    import socket

    from autostream.comm import spawn

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(spawn, "free_port", lambda: taken.getsockname()[1])
        assert run_ranks(_rank_of, world_size=2, timeout_s=HANG_RANKS_S) == [0, 1]


@pytest.mark.slow
def test_the_experiments_calibrated_table_is_one_table_for_every_rank(outcomes):
    rank0, rank1 = outcomes["calibrated"]
    assert rank0["digest"] == rank1["digest"]  # one table: one plan
    assert "aten.mm.default" in rank0["ops"] and rank0["links"] > 0
    # the collectives ran inside the graph on both ranks, never alone
    assert "calibrate --collectives" in rank0["skipped"]["_c10d_functional.all_reduce.default"]


@pytest.mark.slow
def test_experiment_measures_every_variant_and_prints_its_table(outcomes):
    experiment = distributed_experiment
    rows = experiment.rows_from_ranks(["probe"], outcomes["experiment"], runs=2)
    [row] = rows
    assert row.wrong == 0
    assert set(row.ms) == set(experiment.VARIANTS) and all(v > 0 for v in row.ms.values())
    assert row.plan.startswith("lifted") and row.predicted_speedup > 1.0
    text = experiment.table(rows)
    assert text.startswith("| model |") and "| probe |" in text


def _aborts(rank: int, world: int) -> None:
    if rank == 1:
        os.abort()  # what a failed C++ check does
    import time

    time.sleep(2 * HANG_RANKS_S)  # alive until rank 1's death ends the run


@pytest.mark.slow
def test_run_ranks_quotes_where_a_rank_that_died_was():
    with pytest.raises(RanksFailed, match="died") as failed:
        run_ranks(_aborts, world_size=2, timeout_s=HANG_RANKS_S)
    assert "rank 1 at its death" in str(failed.value)
    assert "_aborts" in str(failed.value), "its Python traceback names the function"
