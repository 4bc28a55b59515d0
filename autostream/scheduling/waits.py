"""A collective's wait runs on the stream that launched it.

A functional collective registers its in-flight work under its output's storage, and
``wait_tensor`` looks the work up there.  Until pytorch/pytorch#171614 the registry was
per host thread: a wait issued from another thread than the launch found nothing and
returned at once, so on the threads runtime (a thread per stream) a wait on another
stream than its launch let readers see the unreduced buffer.  Keeping every wait on
its launch's stream is correct with every torch and runtime; readers on other streams
follow the wait through a sync, as they follow any op (docs/distributed.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import networkx as nx

from autostream.comm.ops import launch_of_wait
from autostream.scheduling.schedule import Schedule


def launches_of_waits(deps: nx.DiGraph) -> dict[str, str]:
    """Each collective wait of a dependence graph (``graph.build_op_graph``) -> its launch.

    >>> import torch
    >>> from autostream.fx.graph import build_op_graph
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> f = torch.ops._c10d_functional
    >>> gm = make_fx(lambda x: f.wait_tensor(f.all_reduce(x, "sum", "0")) + 1,
    ...              tracing_mode="fake")(torch.ones(4))
    >>> launches_of_waits(build_op_graph(gm))
    {'wait_tensor': 'all_reduce'}
    """
    out: dict[str, str] = {}
    for name, data in deps.nodes(data=True):
        node = data.get("fx")
        launch = launch_of_wait(node) if node is not None else None
        if launch is not None and launch.name in deps:
            out[name] = launch.name
    return out


def waits_with_launches(schedule: Schedule, launch_of: Mapping[str, str]) -> Schedule:
    """``schedule`` with every wait of ``launch_of`` (:func:`launches_of_waits`) moved to
    its launch's stream (the same schedule when none moves); the launch order is kept,
    the times are stale.

    >>> s = Schedule("x", {"ar": 0, "wait": 1, "add": 1}, ("ar", "wait", "add"), {}, {},
    ...              0.0, 0.0)
    >>> dict(waits_with_launches(s, {"wait": "ar"}).stream_of)
    {'ar': 0, 'wait': 0, 'add': 1}
    """
    stream_of = schedule.stream_of
    moved = {wait: stream_of[launch] for wait, launch in launch_of.items()
             if wait in stream_of and launch in stream_of and stream_of[launch] >= 0
             and stream_of[wait] != stream_of[launch]}
    if not moved:
        return schedule
    return dataclasses.replace(schedule, stream_of={**stream_of, **moved}, optimal=False)
