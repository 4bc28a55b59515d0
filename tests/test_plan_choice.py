"""The planner picks among its candidates by the time each has after every rule a plan
goes through (issue 51, item 3), not by its solver's own timing."""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from autostream.fx.capture import capture_graphs
from autostream.models.zoo_parallel import PARALLEL_ZOO
from autostream.planning.plan import PlanOptions, plan_graph


@contextlib.contextmanager
def _one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_plan_shipped_is_the_fastest_candidate_once_its_collective_waits_moved(tmp_path):
    """tp_mlp on h200, 3 streams: CP-SAT's plan and HEFT's tie by the solvers' timing; the
    wait rule (``scheduling.waits``) re-times CP-SAT's, not HEFT's."""
    with _one_rank(tmp_path):
        model, make_inputs = PARALLEL_ZOO["tp_mlp"](0, 1)
        [gm] = capture_graphs(model, make_inputs(0))
        plan = plan_graph(gm, PlanOptions(max_streams=3, cost_table="h200"))
        heft = plan_graph(gm, PlanOptions(max_streams=3, solver="heft", cost_table="h200"))
    assert heft.schedule.streams_used > 1
    assert plan.predicted_us <= heft.predicted_us + 1e-9
    assert plan.predicted_us == min(w.predicted_us for w in plan.weighed if w.eligible)
    [own] = [w for w in plan.weighed if w.how == "cpsat plan"]
    assert own.predicted_us > plan.predicted_us  # re-timed by the rule: not shipped
    assert {"heft plan", "collectives overlapped on one stream"} <= {w.how for w in plan.weighed}
    assert any("using heft plan" in n for n in plan.notes)


def test_a_candidate_on_one_stream_is_said_in_words():
    """Issue 51, item 13: no "on 1 streams" in the note that keeps one stream."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from tests.helpers import UniformCosts

    gm = make_fx(lambda x: torch.tanh(torch.relu(x) * 2) + 1)(torch.randn(4))
    plan = plan_graph(gm, PlanOptions(max_streams=2), UniformCosts())
    assert plan.is_single_stream
    assert "on one stream) is not faster than one stream" in plan.notes[0]
    assert "1 streams" not in " ".join(plan.notes)
