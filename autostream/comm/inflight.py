"""Collectives of one gloo process group are never in flight together unless the program
had them so.

``ProcessGroupGloo`` hands each collective to one of its worker threads (two by default),
so collectives of one group that are in flight together run at once on that group's
one gloo context.  With torch 2.13 on CPU this corrupted the heap now and then: a rank
died in a gloo worker thread (glibc's tcache found a freed chunk written to) in a
graph whose plan launched three all-gathers before waiting for the first
(docs/distributed.md).
So, for a gloo group, every wait of a collective that precedes the group's next launch
in program order keeps preceding it: a plan holds no more collectives of that group in
flight than the program does.  Launches still move early and waits late between them
(a gather still overlaps the compute before its wait).

>>> one_at_a_time(None)  # no process group here
False
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.fx

from autostream.comm.groups import GroupInfo, resolve_group
from autostream.comm.ops import comm_op, launch_of_wait

#: backends whose process group runs the collectives in flight concurrently, unsafely
ONE_AT_A_TIME = frozenset({"gloo"})


def one_at_a_time(group: str | None, info: GroupInfo | None = None) -> bool:
    """Whether collectives of ``group`` (a process group name) must run one at a time:
    its backend is gloo.  ``info``: the group as resolved already (``resolve_group``).

    >>> one_at_a_time("tp", GroupInfo("tp", 2, "gloo")), one_at_a_time("tp", GroupInfo("tp", 2, "nccl"))
    (True, False)
    """
    info = info if info is not None else resolve_group(group)
    return info.backend in ONE_AT_A_TIME


def most_in_flight(nodes: Iterable[torch.fx.Node]) -> dict[str | None, int]:
    """Process group -> the most of its collectives launched and not yet waited for at
    once, run in the order of ``nodes`` (a blocking op counts while it runs).

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> f = torch.ops._c10d_functional
    >>> gm = make_fx(lambda a, b: (f.all_reduce(a, "sum", "0"), f.all_reduce(b, "sum", "0")),
    ...              tracing_mode="fake")(torch.ones(2), torch.ones(2))
    >>> most_in_flight(gm.graph.nodes)  # two launches, never waited
    {'0': 2}
    """
    pending: dict[str, str | None] = {}  # launch -> its group
    most: dict[str | None, int] = {}
    for node in nodes:
        op = comm_op(node)
        if op is None:
            continue
        if op.role == "wait":
            launch = launch_of_wait(node)
            pending.pop(launch.name if launch is not None else "", None)
            continue
        pending[node.name] = op.group
        now = sum(g == op.group for g in pending.values())
        most[op.group] = max(most.get(op.group, 0), now)
        if op.role != "collective":
            del pending[node.name]
    return most
