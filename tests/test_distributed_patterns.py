"""Valid SPMD patterns on 2 and 4 real gloo ranks: no hang, no wrong call (issue 26).

Each pattern is ``experiments.distributed_patterns``'s, run with short durations: the
slow rank sleeps ``SLOW_S`` against a threads-runtime wait limit of ``LIMIT_S`` (the
former runtime failed the healthy ranks with ``StreamWaitTimeout`` there; the
experiment uses 150 s against the default).  Before autostream stopped issuing
collectives of its own, the one-rank recompile and the different call counts hung
until the run's bound (seen on 2 ranks).
"""

from __future__ import annotations

import pytest

from experiments.distributed_patterns import failures, run_pattern

CALLS = 12
SLOW_S, LIMIT_S = 3.0, 1.0
PG_TIMEOUT_S = 120.0
HEALTHY = ("recompile one rank (shape)", "recompile one rank (dtype)", "call counts per graph",
           "rank-dependent shapes", "sub-groups")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pattern", HEALTHY)
def test_spmd_pattern_neither_hangs_nor_differs_from_eager(pattern, world):
    row = run_pattern(pattern, world, CALLS, pg_timeout_s=PG_TIMEOUT_S, bound_s=240.0)
    assert not failures(row), failures(row)
    assert row.calls == CALLS * world
    assert row.applied, "no plan ran: the pattern would not exercise the plan"


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_slow_rank_is_waited_for_not_timed_out(world):
    row = run_pattern("slow rank", world, CALLS, slow_s=SLOW_S, wait_timeout_s=LIMIT_S,
                      pg_timeout_s=PG_TIMEOUT_S, bound_s=240.0)
    assert not failures(row), failures(row)
    assert row.calls == CALLS * world and row.seconds > SLOW_S


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_that_dies_gives_the_others_a_clear_error_in_time(world):
    row = run_pattern("rank dies", world, CALLS, pg_timeout_s=PG_TIMEOUT_S, bound_s=240.0)
    assert not row.hang and row.wrong == 0
    assert row.to_error_s is not None and row.to_error_s < PG_TIMEOUT_S
    assert row.calls == 10 * world  # every rank made the 10 calls before the death
    survivors = [e for e in row.errors if e != "raised on purpose"]
    assert survivors and all("Connection closed by peer" in e or "Connection reset" in e
                             for e in survivors), survivors
