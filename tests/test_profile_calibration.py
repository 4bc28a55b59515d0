"""``experiments.profile_calibration`` measures both tables around each graph's timing."""

from __future__ import annotations

import pytest

from experiments import profile_calibration as pc


@pytest.mark.slow
def test_tables_are_measured_in_turn_around_each_graph_timing(monkeypatch):
    calls: list[str] = []

    def spy(name, real):
        def wrapped(*args, **kwargs):
            if name != "profile" or kwargs.get("compiled", True):
                calls.append(name)
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(pc, "calibrate_graphs", spy("micro", pc.calibrate_graphs))
    monkeypatch.setattr(pc, "profile_table", spy("profile", pc.profile_table))
    monkeypatch.setattr(pc, "graph_times", spy("time", pc.graph_times))
    rows = []
    monkeypatch.setattr(pc, "record", lambda script, r: rows.extend(r))
    assert pc.main(["--models", "article_model", "--hf", "--rounds", "2", "--repeat", "2",
                    "--steps", "1"]) == 0
    # drop repeated timing calls: one timing block per model and round
    blocks = [c for i, c in enumerate(calls) if c != "time" or calls[i - 1] != "time"]
    assert blocks == ["micro", "time", "profile", "profile", "time", "micro"]
    assert "median over zoo models of the median over 2 interleaved rounds" in rows[0].what
    assert " of 2)" in rows[0].measured
