"""Mutation, randomness and state from what calls really do, not from their names."""

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autostream.equivalence import check_against_eager
from autostream.fx.call_effects import EffectsUnknown, trace_call_effects
from autostream.fx.capture import capture
from autostream.fx.graph import draws_random_numbers
from autostream.models.zoo import running_stats_model
from autostream.planning.lift import LiftError, lift_plan
from autostream.planning.plan import PlanOptions, plan_graph

from .helpers import UniformCosts

BACKEND = dict(max_streams=2, cost_table="h200", measure=0, time_limit=1.0)


def _effects(model, *inputs):
    [graph] = capture(model, inputs)
    return graph, trace_call_effects(graph.dynamo)


@pytest.mark.parametrize("runtime", ["threads", "sequential"])
def test_a_functional_batch_norm_on_buffers_stays_between_their_readers(runtime):
    """The issue's report: the branch reading the running mean read it after the update."""
    check = check_against_eager(running_stats_model, "no_grad", runtime=runtime, **BACKEND)
    assert check.mismatch == "" and check.applied and check.lifted


def test_the_lifted_graph_orders_the_readers_around_the_write():
    model, inputs = running_stats_model()
    [graph] = capture(model, inputs)
    plan = plan_graph(graph.gm, PlanOptions(max_streams=2), UniformCosts())
    lifted = lift_plan(graph.dynamo, plan, mutated_inputs=graph.mutated_inputs)
    assert graph.mutated_inputs == {"l_self_buffers_mean_", "l_self_buffers_var_"}
    memory = {(u, v) for u, v, d in lifted.op_graph.edges(data=True) if d["kind"] == "memory"}
    assert ("mul", "normed") in memory and ("normed", "after") in memory


class Norms(nn.Module):
    """Modules and functions that write buffers: BatchNorm1d in training, instance norm with
    running statistics, and a write through a view of a buffer."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(64).train()
        self.register_buffer("rm", torch.zeros(4))
        self.register_buffer("rv", torch.ones(4))
        self.register_buffer("acc", torch.zeros(8, 64))
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        seen = self.bn.running_mean * 3 + self.acc.sum()
        y = self.bn(torch.tanh(self.a(x)))
        z = F.instance_norm(self.b(x).view(2, 4, 64), self.rm, self.rv, use_input_stats=True)
        self.acc[:4].add_(y[:4])
        return seen, y, z, self.acc * 1, self.rm + self.bn.running_var.sum()


@pytest.mark.parametrize("runtime", ["threads", "sequential"])
def test_buffers_written_without_an_underscore_in_any_name(runtime):
    factory = lambda: (Norms(), (torch.randn(8, 64),))  # noqa: E731
    check = check_against_eager(factory, "no_grad", runtime=runtime, **BACKEND)
    assert check.mismatch == "" and check.applied and check.lifted


def test_calls_are_judged_by_the_ops_they_dispatch():
    class Calls(nn.Module):
        def forward(self, q, mask):
            both = mask & (q > 0)  # operator.and_: not in-place
            attn = F.scaled_dot_product_attention(q, q, q)  # dropout_p=0: draws nothing
            dropped = F.dropout(q, 0.5, training=True)
            return both, attn, dropped, q.numel()

    q = torch.randn(1, 2, 4, 8)
    graph, effects = _effects(Calls(), q, torch.ones(1, 2, 4, 8, dtype=torch.bool))
    targets = {n.name: n.target for n in graph.dynamo.graph.nodes}
    [and_] = [n for n, t in targets.items() if t is operator.and_]
    [sdpa] = [n for n, t in targets.items() if "scaled_dot_product" in str(t)]
    [drop] = [n for n, t in targets.items() if "dropout" in str(t)]
    assert not effects.calls[and_].writes and not effects.calls[and_].ordered
    assert not effects.calls[sdpa].random and effects.calls[drop].random
    assert effects.written_inputs() == set()


def test_attention_without_dropout_draws_no_random_numbers():
    """The premise of ``draws_random_numbers``: the generator's state does not move."""
    q = torch.randn(1, 2, 4, 8)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    state = torch.get_rng_state()
    op(q, q, q, 0.0)
    assert torch.equal(state, torch.get_rng_state())
    assert not draws_random_numbers(op, (q, q, q, 0.0), {})
    assert draws_random_numbers(torch.ops.aten.bernoulli.p, (q, 0.5), {})


def test_calls_changing_the_thread_state_are_seen():
    class GradOn(nn.Module):
        def forward(self, x):
            with torch.enable_grad():
                y = x * 2
            return y + 1

    [graph] = capture(GradOn(), (torch.randn(4),))  # compiled under no_grad
    with torch.no_grad():
        effects = trace_call_effects(graph.dynamo)
        assert not torch.is_grad_enabled()  # the trace ran on a thread of its own
    changes = [c.state_change for c in effects.calls.values() if c.state_change]
    assert changes == ["grad: False != True", "grad: True != False"]


def test_a_mutation_aotautograd_reports_but_no_call_shows_refuses_lifting(monkeypatch):
    import autostream.planning.lift as lift_module

    model, inputs = running_stats_model()
    [graph] = capture(model, inputs)
    plan = plan_graph(graph.gm, PlanOptions(max_streams=2), UniformCosts())
    real = lift_module.trace_call_effects

    def blind(gm):  # a trace that missed the batch norm's writes
        effects = real(gm)
        calls = {n: type(c)(c.aten_ops, c.reads, frozenset()) for n, c in effects.calls.items()}
        return type(effects)(calls, effects.input_storage)

    monkeypatch.setattr(lift_module, "trace_call_effects", blind)
    with pytest.raises(LiftError, match="AOTAutograd found inputs .*mean.* mutated"):
        lift_plan(graph.dynamo, plan, mutated_inputs=graph.mutated_inputs)


def test_effects_unknown_without_example_values():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(EffectsUnknown, match="no example value"):
        trace_call_effects(gm)


@pytest.mark.slow
def test_a_training_step_updates_the_buffers_and_grads_as_eager_does():
    check = check_against_eager(running_stats_model, "training", runtime="threads", **BACKEND)
    assert check.mismatch == "" and check.applied


def test_a_value_read_into_python_is_a_read_not_an_unknown():
    """With dynamic shapes Dynamo passes a float attribute as a tensor and reads it back with
    ``.item()``, which fake tensors cannot run: Dynamo's example value stands in for it."""

    class FloatAttribute(nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-5

        def forward(self, x):
            return torch.tanh(x) + self.eps, torch.sigmoid(x) * 2

    [graph] = capture(FloatAttribute(), (torch.randn(8, 8),), dynamic=True)
    effects = trace_call_effects(graph.dynamo)
    if "item" not in effects.calls:
        pytest.skip("this torch's Dynamo keeps the float a constant: no .item() to check")
    item = effects.calls["item"]
    assert item.aten_ops == ("aten._local_scalar_dense.default",)
    assert not item.writes and not item.ordered and effects.written_inputs() == set()


def test_a_tensor_moved_to_another_storage_orders_its_later_readers():
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    before = g.call_function(operator.mul, (x, 2))
    moved = g.call_method("set_", (x, y))  # x now reads y's storage
    after = g.call_function(operator.add, (x, 1))
    g.output((before, after))
    x.meta["example_value"], y.meta["example_value"] = torch.randn(4), torch.randn(4)
    effects = trace_call_effects(torch.fx.GraphModule(nn.Module(), g))
    assert set(effects.input_storage.values()) <= effects.calls[moved.name].writes
    edges = set(effects.memory_edges())
    assert (before.name, moved.name) in edges and (moved.name, after.name) in edges
