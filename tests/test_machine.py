"""The machine a figure was timed on and the busy rule (``autostream.runtime.machine``), on
fake readings: no test reads the wall clock or the real load."""

from __future__ import annotations

import os

import pytest
import torch

from autostream.runtime.choice import MeasuredChoice
from autostream.runtime.machine import (
    BUSY_LOAD,
    BUSY_SHARE,
    MIN_WINDOW_S,
    Load,
    LoadWatch,
    Reading,
    busy_seconds,
    this_machine,
    worst,
)

XEON = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"


def test_the_machine_names_its_cpu_cores_and_intra_op_threads():
    m = this_machine(XEON)
    assert (m.cpu, m.cores, m.threads) == ("Intel(R) Xeon(R) CPU @ 2.20GHz", os.cpu_count(),
                                           torch.get_num_threads())
    assert str(m) == (f"Intel(R) Xeon(R) CPU @ 2.20GHz, {m.cores} core{'s' * (m.cores != 1)}, "
                      f"{m.threads} intra-op thread{'s' * (m.threads != 1)}")
    # no model name (an ARM /proc/cpuinfo): the platform's words, never empty
    assert this_machine("processor\t: 0\nBogoMIPS\t: 50.00\n").cpu


def _readings(seconds: float, busy_s: float, own_s: float, load: float | None = 0.5,
              stat: bool = True) -> tuple[Reading, Reading]:
    start = Reading(100.0, load, 1000.0 if stat else None, 5.0)
    return start, Reading(100.0 + seconds, load, 1000.0 + busy_s if stat else None, 5.0 + own_s)


def test_other_processes_cpu_time_excludes_this_process_own():
    # 10 s on 2 cores: 17.5 busy core-seconds, 16 of them ours (a 2-thread timing): quiet
    quiet = Load.between(*_readings(10.0, 17.5, 16.0, load=1.9), cores=2)
    assert quiet.others == pytest.approx(0.15) and not quiet.busy and quiet.reason == ""
    # the load average alone (1.9 on 2 cores, our own threads counted) does not make it busy
    assert quiet.before > BUSY_LOAD * 2
    # the same timing with others holding 1.2 cores: busy, and the reason says how busy
    busy = Load.between(*_readings(10.0, 28.0, 16.0, load=3.1), cores=2)
    assert busy.others == pytest.approx(1.2) and busy.busy
    assert busy.reason == ("busy: other processes kept 1.20 of 2 cores busy during the timing "
                           "(load average 3.1 on 2 cores)")


def test_the_busy_threshold_is_a_share_of_the_cores():
    at = BUSY_SHARE * 8 * 10.0  # core-seconds of others in 10 s at the threshold, 8 cores
    assert not Load.between(*_readings(10.0, at, 0.0), cores=8).busy
    assert Load.between(*_readings(10.0, at + 0.5, 0.0), cores=8).busy


def test_the_busy_rule_is_relative_to_the_cores_the_timing_uses():
    # the newcomer's demo: 0.46 other cores on 2 cores, both used by the timing (eager on 2
    # intra-op threads, the plan on 2 streams): a quarter of its cores gone, busy
    shared = Load.between(*_readings(10.0, 4.6, 0.0), cores=2, used=2)
    assert shared.others == pytest.approx(0.46) and shared.busy
    assert shared.reason.startswith("busy: other processes kept 0.46 of 2 cores busy during "
                                    "the timing (")
    # a timing on 2 of 8 cores: others may hold the 6 it leaves idle, not much more
    assert not Load.between(*_readings(10.0, 60.0 + 1.0, 0.0), cores=8, used=2).busy
    crowded = Load.between(*_readings(10.0, 60.0 + 2.5, 0.0), cores=8, used=2)
    assert crowded.busy and ", which used 2 of them (" in crowded.reason
    assert crowded.figures()["used_cores"] == 2
    # the load-average fallback alike: 6.9 on 8 cores beside a 2-core timing is quiet
    assert not Load.between(*_readings(10.0, 0.0, 0.0, load=6.9, stat=False), cores=8,
                            used=2).busy
    assert Load.between(*_readings(10.0, 0.0, 0.0, load=6.9, stat=False), cores=8).busy


def test_without_proc_stat_or_in_a_short_timing_the_load_average_before_decides():
    for readings in (_readings(10.0, 0.0, 0.0, load=1.5, stat=False),
                     _readings(MIN_WINDOW_S / 2, 0.0, 0.0, load=1.5)):
        load = Load.between(*readings, cores=2)
        assert load.others is None and load.busy
        assert load.reason == "busy: load average 1.5 on 2 cores before the timing"
        assert "other processes' CPU time unknown" in str(load)
    assert not Load.between(*_readings(10.0, 0.0, 0.0, load=0.9, stat=False), cores=2).busy
    assert not Load.between(*_readings(10.0, 0.0, 0.0, load=None, stat=False), cores=2).busy


def test_proc_stat_counts_steal_and_leaves_out_idle_and_io_wait():
    # user nice system idle iowait irq softirq steal guest guest_nice
    text = "cpu  200 10 40 5000 300 5 5 40 100 0\ncpu0 100 5 20 2500 150 2 3 20 50 0\n"
    assert busy_seconds(text, 100) == pytest.approx(3.0)
    assert busy_seconds("intr 1 2 3\n", 100) is None


def test_a_watch_reads_the_machine_when_made_and_when_asked():
    readings = iter([Reading(0.0, 0.2, 50.0, 1.0), Reading(2.0, 0.4, 53.0, 2.0)])
    load = LoadWatch(lambda: next(readings), cores=4, used=2).load()
    assert (load.before, load.after, load.others, load.seconds) == (0.2, 0.4, 1.0, 2.0)
    assert not load.busy and load.figures()["others_cores"] == 1.0  # on the 2 idle cores
    readings = iter([Reading(0.0, 0.2, 50.0, 1.0), Reading(2.0, 0.4, 53.0, 2.0)])
    assert LoadWatch(lambda: next(readings), cores=4).load().busy  # a timing on all 4


def test_the_worst_load_is_the_busy_one():
    quiet, busy = Load(2, 0.1, 0.1, 0.1, 5.0), Load(2, 0.1, 0.1, 0.8, 5.0)
    assert worst([quiet, None, busy]) is busy and worst([None]) is None


def test_the_measured_choice_reads_the_load_from_its_first_call_to_its_decision():
    now = [0.0]
    readings = iter([Reading(0.0, 3.0, 0.0, 0.0), Reading(1.0, 3.2, 1.9, 0.4)])
    read_at = []

    def read() -> Reading:
        read_at.append(now[0])
        return next(readings)

    def taking(seconds):
        def run(x):
            now[0] += seconds
            return x
        return run

    choice = MeasuredChoice({"streams": taking(1e-4), "eager": taking(2e-4)}, trials=2,
                            clock=lambda: now[0], settle_s=0.0, default="eager",
                            read_machine=read)
    for _ in range(8):
        assert choice.load is None  # read at the decision, not before
        choice(0)
    assert read_at == [0.0, pytest.approx(1.2e-3)]  # before the first call, at the decision
    assert choice.load is not None and choice.load.busy
    assert choice.load.others == pytest.approx(min(1.5, choice.load.cores))
    for _ in range(5):  # no reading after the decision
        choice(0)
    assert len(read_at) == 2
