"""Collectives overlapped on one stream: launched early, waited for late, no second stream.

Dynamo traces each functional collective's wait right after its launch; the planner's
``overlap`` candidate moves the wait past the compute that does not need the result, so
the transfer runs beside it (what a hand-written ``async_op=True`` does), without the
multi-stream runtime's costs.
"""

from __future__ import annotations

import pytest
import torch

from autostream import passes
from autostream.comm.spawn import run_ranks
from autostream.passes import AutoStreamPass, Outcome
from autostream.planning.plan import PlanOptions, plan_graph
from autostream.scheduling.problem import SchedulingProblem
from autostream.scheduling.solvers import solve
from autostream.scheduling.solvers.overlap import sink_transfer_readers
from tests.helpers import UniformCosts
from tests.test_comm import gloo_table, two_allreduces


def _calls(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function"]


def test_waits_move_past_the_compute_that_does_not_need_them():
    gm = two_allreduces(depth=4, elements=1 << 20, eager_waits=True)
    plan = plan_graph(gm, PlanOptions(max_streams=2), gloo_table())
    assert plan.reorders and plan.changes_graph and plan.is_single_stream
    assert plan.predicted_us < plan.single_stream_us
    order = [n for n in plan.schedule.order if n in set(_calls(gm))]
    assert order.index("wait_tensor") > order.index("tanh3")  # the chain hides the transfer
    assert order.index("all_reduce") < order.index("all_reduce_1")  # program order kept


def test_the_pass_applies_the_reorder_and_the_verifier_accepts_it(monkeypatch):
    monkeypatch.setattr(passes, "plan_graph",
                        lambda gm, options, *costs: plan_graph(gm, options, gloo_table()))
    gm = two_allreduces(depth=4, elements=1 << 20, eager_waits=True)
    before = _calls(gm)
    report = AutoStreamPass(max_streams=2).run(gm)
    assert report.outcome is Outcome.APPLIED
    assert report.reason.startswith("collectives overlapped on one stream")
    after = _calls(gm)
    assert sorted(after) == sorted(before), "moved, never added: no stream ops on one stream"
    assert after.index("wait_tensor") > after.index("tanh3") > before.index("wait_tensor")


def _short_transfer_problem() -> SchedulingProblem:
    """A launch whose transfer is predicted shorter than the chain beside it, its wait and
    the wait's reader; a 4-op chain; a second (coalesced) launch of the chain's second op,
    read through a ``getitem``."""
    import networkx as nx

    g = nx.DiGraph([("launch", "xfer"), ("xfer", "wait"), ("wait", "add"), ("c1", "launch2"),
                    ("launch2", "xfer2"), ("xfer2", "get"), ("get", "wait2"),
                    ("c0", "c1"), ("c1", "c2"), ("c2", "c3"), ("launch", "launch2")])
    g.add_nodes_from(["launch", "wait", "add", "launch2", "get", "wait2", "c0", "c1", "c2", "c3"],
                     duration=10.0)
    g.add_node("get", duration=0.0)
    g.add_nodes_from(["xfer", "xfer2"], duration=5.0, lane="link:0")
    return SchedulingProblem(g, streams=1)


def test_a_wait_goes_after_the_compute_that_does_not_need_it_even_when_the_transfer_looks_short():
    """HEFT places the wait where the predicted transfer ends (free in the model); a real
    transfer that takes longer then stalls the stream.  The sunk order waits last."""
    p = _short_transfer_problem()
    heft = solve(p, "heft")
    assert heft.order.index("wait") < heft.order.index("c3")  # the early wait being fixed
    order = sink_transfer_readers(p, heft.order)
    assert order.index("wait") > order.index("c3") and order.index("add") > order.index("wait")
    assert order.index("get") < order.index("wait2")
    fixed = [n for n in heft.order if n not in {"wait", "add", "get", "wait2"}]
    assert [n for n in order if n in fixed] == fixed  # launches and compute keep their order
    s = solve(p, "overlap")
    assert s.solver == "overlap" and s.makespan <= heft.makespan + 1e-9


def test_a_graph_without_collectives_keeps_its_program_order():
    gm = two_allreduces(depth=4, eager_waits=True)
    for n in list(gm.graph.nodes):  # the same graph with its collectives made local
        if n.op == "call_function" and "c10d" in str(n.target):
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
    plan = plan_graph(gm, PlanOptions(max_streams=1), UniformCosts())
    assert not plan.reorders and not plan.changes_graph


def _probe(rank: int, world: int) -> tuple[int, str, int]:
    import autostream
    from autostream.models.zoo_parallel import PARALLEL_ZOO

    model, make_inputs = PARALLEL_ZOO["probe"](rank, world)
    # one stream: the overlap can only come from reordering (whatever the table says)
    backend = autostream.backend(max_streams=1, measure=0, cost_table="cpu")
    compiled = torch.compile(model, backend=backend)
    wrong = 0
    with torch.no_grad():
        for step in range(30):
            inputs = make_inputs(step)
            got, want = compiled(*inputs), model(*inputs)
            wrong += not all(torch.allclose(g, w, rtol=1e-5, atol=1e-6)
                             for g, w in zip(got, want, strict=True))
    report = backend.autostream_pass.last_report
    lifted = backend.lifts[-1] if backend.lifts else None
    return wrong, report.reason, getattr(lifted, "streams_used", -1)


@pytest.mark.slow
def test_a_reordered_plan_on_real_ranks_equals_eager_every_call():
    outcomes = run_ranks(_probe, world_size=2, timeout_s=300.0)
    for wrong, reason, lifted_streams in outcomes:
        assert wrong == 0
        assert reason.startswith("collectives overlapped on one stream"), reason
        assert lifted_streams == 1, "the reorder runs on Dynamo's graph, no worker thread"
