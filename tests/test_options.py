"""Every option is checked where it is written, and the messages name the fix."""

from __future__ import annotations

import logging

import pytest

import autostream
from autostream.cli import main
from autostream.fx.capture import capture
from autostream.models.zoo import two_branch_gemv
from autostream.planning.plan import PlanOptions


@pytest.mark.parametrize("name, value, why", [
    ("core_budgets", "no", "core_budgets must be True or False, got str 'no'"),
    ("core_budgets", 1, "core_budgets must be True or False, got int 1"),
    ("solver", 3, "solver must be a solver's name (a string), got int 3"),
    ("max_streams", 2.0, "max_streams must be an integer >= 1"),
    ("time_limit", "10", "time_limit must be a number of seconds"),
])
def test_every_option_checks_its_type(name, value, why):
    for make in (PlanOptions, autostream.AutoStreamPass, autostream.backend):
        with pytest.raises(ValueError) as info:
            make(**{name: value})
        assert why in str(info.value)


def test_the_unknown_option_message_lists_every_backend_option():
    with pytest.raises(ValueError) as info:
        autostream.backend(streams=2)
    message = str(info.value)
    assert message.startswith("unknown option streams; backend() takes runtime, sanitize, "
                              "measure, fallback, deterministic, graph_outputs and the pass "
                              "options ")
    for option in ("max_streams", "solver", "cost_table", "time_limit", "max_memory_increase",
                   "core_budgets", "history"):
        assert option in message


def test_core_budgets_with_a_default_table_without_core_counts_warns(caplog):
    p = autostream.AutoStreamPass(core_budgets=True)  # the cpu default table has no cores
    with caplog.at_level(logging.WARNING, logger="autostream"):
        for _ in range(2):
            [c] = capture(*two_branch_gemv(depth=2))
            p.run(c.gm)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("autostream: core_budgets=True, but cpu graphs are planned with "
                              "the default table 'cpu', which cannot hold them, so without "
                              "core budgets: the device profile has no cube and vector core "
                              "counts")
    with pytest.raises(ValueError, match="cost_table='cpu': the device profile has no cube"):
        autostream.backend(core_budgets=True, cost_table="cpu")  # a table given: an error


@pytest.mark.parametrize("value, why", [
    ("10", "'10' is a bare number: write '10%' for a percentage of the single-stream peak, "
           "or a size with its unit such as '10MiB'"),
    ("10%,2MiB,3", "'10%,2MiB,3' has 3 parts"),
])
def test_the_command_line_refuses_a_bare_number_and_names_the_forms(value, why, capsys):
    assert main(["plan", "autostream.models.zoo:two_branch_gemv",
                 "--max-memory-increase", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autostream plan: error: --max-memory-increase: ") and why in err


def test_verbose_works_before_and_after_the_command(caplog):
    logger = logging.getLogger("autostream")
    level = logger.level
    spec = ["autostream.models.zoo:two_branch_gemv", "--streams", "2", "--solver", "heft"]
    try:
        for args, told in ((["plan", *spec], False), (["-v", "plan", *spec], True),
                           (["plan", *spec, "-v"], True)):
            logger.setLevel(logging.WARNING)
            caplog.clear()
            assert main(args) == 0
            lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO
                     and r.name == "autostream"]
            assert bool(lines) == told, args
            if told:
                [line] = lines
                assert line.startswith("autostream pass, graph of 19 nodes (cpu): left unchanged")
                assert "cost table 'cpu' (the default of cpu graphs" in line
    finally:
        logger.setLevel(level)
