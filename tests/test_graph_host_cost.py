"""The host-cost experiment runs, on the graph it claims (no timing asserted)."""

from __future__ import annotations

from experiments import graph_host_cost


def test_the_host_cost_experiment_times_a_captured_288_parameter_graph(capsys):
    graph_host_cost.main(["--calls", "3", "--rounds", "1"])
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    assert "289 inputs of which 288 parameters" in out
    assert "captured 1 graph" in out and "288 inputs by address, 1 copied" in out
    assert "target <= 30 us: " in out and "reading the 288 parameters' addresses alone" in out
