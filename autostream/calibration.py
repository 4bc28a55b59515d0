"""Calibrate a model or its graphs into a :class:`~autostream.cost.CostTable`.

Ties the op timings of :mod:`autostream.cost.calibrate` (eager launches) or
:mod:`autostream.cost.replay` (inside captured graphs replayed: the default on devices
with graph capture) to the device profile, the runtime's own costs
(:mod:`autostream.runtime.overhead`) and ``torch.compile``'s per-call cost, and writes
the table's descriptor.  ``autostream calibrate`` calls it.

>>> import torch
>>> table = calibrate_model(torch.nn.ReLU(), (torch.randn(4, 4),), warmup=1, repeat=3,
...                         measure_device=False, progress=False)
>>> [(e.op, e.signature) for e in table.entries]
[('aten.relu.default', 'f32[4, 4]')]
"""

from __future__ import annotations

import datetime
import platform
import socket
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx

from autostream.cost.calibrate import (
    CONTENTION_TARGET_US,
    ROUNDS,
    calibrate_ops,
    collect_ops,
    device_name,
    graph_op_times,
    measure_profile,
    with_graph_times,
)
from autostream.cost.profile import GENERIC_CPU, DeviceProfile
from autostream.cost.recorded import recorded_inputs
from autostream.cost.replay import (
    DEFAULT_SETTINGS,
    EventTimer,
    ReplayDevice,
    ReplaySettings,
    calibrate_replay,
    graph_figures,
)
from autostream.cost.table import CostTable
from autostream.cost.timing import available_device, make_timer
from autostream.fx.capture import capture
from autostream.fx.intra_op import threads_here
from autostream.runtime.graph_api import TorchGraphAPI
from autostream.runtime.overhead import runtime_costs
from autostream.runtime.streams import TorchStreamAPI

__all__ = ["calibrate_graphs", "calibrate_model", "replay_device", "to_device"]


def to_device(v: Any, device: torch.device) -> Any:
    """``v`` with every tensor in it (also inside lists and tuples) moved to ``device``."""
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(to_device(x, device) for x in v)
    return v


def replay_device(device: torch.device, replay: ReplayDevice | bool | None = None
                  ) -> ReplayDevice | None:
    """The device to time ops under graph replay on, or ``None`` for eager timing.

    ``replay``: ``None`` replays on devices with graph capture (CUDA, NPU) and times
    eagerly elsewhere; ``False`` times eagerly; ``True`` replays (an error on a device
    without capture); a :class:`ReplayDevice` is used as given (tests pass a fake one).

    >>> replay_device(torch.device("cpu")) is None
    True
    """
    if isinstance(replay, ReplayDevice):
        return replay
    capturable = TorchGraphAPI.graph_class_name(device) is not None
    if replay is None:
        replay = capturable
    if not replay:
        return None
    if not capturable:
        raise ValueError(f"ops cannot be timed under graph replay on {device.type}: it has no "
                         "graph capture; time them eagerly (drop the replay request)")
    return ReplayDevice(TorchGraphAPI(device), TorchStreamAPI(device), EventTimer(device))


def calibrate_graphs(graphs: Sequence[torch.fx.GraphModule], device: str | torch.device = "cpu",
                     warmup: int = 5, repeat: int = 30, measure_device: bool = True,
                     progress: bool = True, models: Sequence[str] = (),
                     threads: int | None = None, in_graph: bool = True,
                     graph_args: Sequence[Sequence[Any] | None] = (),
                     replay: ReplayDevice | bool | None = None,
                     replay_settings: ReplaySettings = DEFAULT_SETTINGS) -> CostTable:
    """A :class:`CostTable` for the op signatures of ``graphs`` measured on ``device``.

    ``threads`` sets torch's intra-op thread count while measuring (CPU); the table
    records it.  On a loaded machine one thread gives far steadier numbers.
    ``in_graph`` replaces each entry's time by its time inside its graph (see
    :mod:`autostream.cost.incontext`); the isolated time stays in ``isolated_us``.
    ``graph_args`` holds each graph's real arguments (``None``: random inputs), which the
    in-graph timing runs on: some ops' times depend on their data.  ``replay`` (see
    :func:`replay_device`; by default on devices with graph capture) times each op
    inside a captured graph replayed instead, on the inputs its first node had in its
    graph's run on ``graph_args``, and fits its share to pairs of ops timed together
    (:mod:`autostream.cost.replay`); ``warmup``, ``repeat`` and ``in_graph`` then do not
    apply (``replay_settings`` says how much it measures).
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        with threads_here(threads):
            return calibrate_graphs(graphs, device, warmup, repeat, measure_device, progress,
                                    models, None, in_graph, graph_args, replay, replay_settings)
    dev = device if isinstance(device, torch.device) else available_device(device)
    timer = make_timer(dev)
    name = device_name(dev)
    cases = collect_ops(graphs)
    replayed = replay_device(dev, replay)
    notes: list[str] = []
    pairs: tuple = ()
    if replayed is not None:
        inputs, notes = recorded_inputs(graphs, graph_args, dev)
        result = calibrate_replay(cases, dev, replayed, replay_settings, inputs, progress)
        entries, skipped, pairs = list(result.entries), list(result.skipped), result.pairs
        notes += result.notes
    else:
        entries, skipped = calibrate_ops(cases, dev, timer, warmup, repeat, progress)
        if in_graph:
            pooled, notes = graph_op_times(graphs, dev, warmup, repeat, graph_args=graph_args)
            entries = with_graph_times(entries, pooled)
    if measure_device:
        with torch.no_grad():
            profile = measure_profile(dev, timer, name, runtime_costs(dev, timer))
        if replayed is not None:
            try:
                figures = graph_figures(replayed, dev, replay_settings)
                profile = replace(profile, **figures.as_profile())
            except Exception as exc:  # noqa: BLE001 - the op entries are worth keeping
                notes.append(f"graph figures (profile.graph_*) not measured: "
                             f"{type(exc).__name__}: {str(exc).strip()[:200]}")
    else:
        profile = DeviceProfile(name=name, kind=dev.type, origin="measured",
                                peak_flops=dict(GENERIC_CPU.peak_flops),
                                bandwidth=GENERIC_CPU.bandwidth,
                                launch_overhead_us=GENERIC_CPU.launch_overhead_us,
                                record_wait_us=GENERIC_CPU.record_wait_us,
                                stream_switch_us=GENERIC_CPU.stream_switch_us)
    descriptor = {
        "name": name, "kind": dev.type, "origin": "measured",
        "host": socket.gethostname(), "platform": platform.platform(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"device_profile": "measured" if measure_device else "generic defaults",
                     **({"timing": "replay", "replay": replay_settings.as_json()}
                        if replayed is not None else
                        {"warmup": warmup, "repeat": repeat,
                         "contention_target_us": CONTENTION_TARGET_US, "rounds": ROUNDS,
                         "timing": "graph" if in_graph else "isolated"})},
        "models": sorted(set(models)),
    }
    if notes:
        descriptor["notes"] = "; ".join(notes)
    return CostTable(device=descriptor, profile=profile, entries=tuple(entries),
                     skipped=tuple(skipped), pairs=tuple(pairs))


def calibrate_model(model: torch.nn.Module, example_inputs: Sequence[Any],
                    device: str | torch.device = "cpu", warmup: int = 5, repeat: int = 30,
                    measure_device: bool = True, progress: bool = True,
                    models: Sequence[str] = (), threads: int | None = None,
                    in_graph: bool = True) -> CostTable:
    """Capture ``model``'s post-grad graphs on ``device`` and calibrate their ops, timing
    them inside their graphs on the model's own data (parameters, buffers, inputs)."""
    dev = device if isinstance(device, torch.device) else available_device(device)
    if dev.type != "cpu" and isinstance(model, torch.nn.Module):
        model = model.to(dev)
    captured = capture(model, to_device(tuple(example_inputs), dev))
    return calibrate_graphs([c.gm for c in captured], dev, warmup, repeat, measure_device,
                            progress, models, threads, in_graph,
                            [c.args or None for c in captured])
