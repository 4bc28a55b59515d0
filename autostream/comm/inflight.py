"""Collectives of one gloo process group are never in flight together unless the program
had them so.

``ProcessGroupGloo`` hands each collective to one of its worker threads (two by default),
so collectives of one group that are in flight together run at once on that group's
one gloo context.  With torch 2.13 on CPU this corrupted the heap now and then: a rank
died in a gloo worker thread (``malloc(): unaligned tcache chunk detected`` while an
all-reduce created its buffer, SIGSEGV elsewhere) about once in 10,000 calls of a graph
whose plan launched three all-gathers before waiting for the first (docs/distributed.md).
So, for a gloo group, every wait of a collective that precedes the group's next launch
in program order keeps preceding it: a plan holds no more collectives of that group in
flight than the program does.  Launches still move early and waits late between them
(a gather still overlaps the compute before its wait).

>>> one_at_a_time(None)  # no process group here
False
"""

from __future__ import annotations

from autostream.comm.groups import GroupInfo, resolve_group

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
