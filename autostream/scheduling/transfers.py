"""Collectives in the scheduling problem: each transfer is a task on its group's link.

A collective's launch returns at once; its transfer then occupies the process
group's link (a serial lane of the ``SchedulingProblem``) beside the compute of
every stream, and whatever reads the result (its ``wait``, through ``getitem`` for
coalesced results) starts only after the transfer.  Transfers on one link run in
launch order (chained).  A *blocking* op (legacy ``c10d``, vendor kernels) runs
its transfer inside itself: its duration grows by it, on its stream.

Everything the planner could not identify is reported in notes: an op that only
looks like communication, a collective whose process group it cannot read, a
cost table without link figures, a world size the table was not fitted at.

>>> import networkx as nx
>>> from autostream.cost.collectives import TransferCost
>>> ops = nx.DiGraph([("ar", "wait"), ("wait", "use")])
>>> nx.set_node_attributes(ops, 0, "order")
>>> nx.set_edge_attributes(ops, "data", "kind")
>>> g = nx.DiGraph(ops.edges); nx.set_node_attributes(g, 1.0, "duration")
>>> add_transfers(g, ops, {"ar": Transfer("ar", "link:0", TransferCost(50.0, 0.0, "exact"),
...                                       "all_reduce", 1024)})
>>> sorted(g.edges)
[('ar', 'ar.transfer'), ('ar', 'wait'), ('ar.transfer', 'wait'), ('wait', 'use')]
>>> g.nodes["ar.transfer"]["lane"], g.nodes["ar.transfer"]["duration"]
('link:0', 50.0)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import networkx as nx

from autostream.comm.groups import GroupInfo, resolve_group
from autostream.comm.ops import CommOp, comm_op
from autostream.cost.collectives import TransferCost

log = logging.getLogger("autostream")


@dataclass(frozen=True)
class Transfer:
    """The transfer of one collective (``launch``) on ``lane``; ``blocking``: it runs
    inside the op itself (no separate task)."""

    launch: str
    lane: str
    cost: TransferCost
    collective: str
    nbytes: int
    blocking: bool = False

    @property
    def task(self) -> str:
        return transfer_task(self.launch)


def transfer_task(launch: str) -> str:
    """The problem's name of a collective's transfer task (FX names never hold a dot).

    >>> transfer_task("all_reduce_1")
    'all_reduce_1.transfer'
    """
    return f"{launch}.transfer"


def _group_size_argument(op: CommOp, node) -> int | None:
    """The ``group_size`` argument of all-gathers and reduce-scatters (just before the
    group name), where a graph planned without a process group still says the size."""
    size = node.kwargs.get("group_size")
    if size is None and op.collective in ("all_gather", "reduce_scatter") and len(node.args) >= 3:
        size = node.args[-2]
    return size if isinstance(size, int) and size > 0 else None


def plan_transfers(
    op_graph: nx.DiGraph, cost_model, resolve: Callable[..., GroupInfo] = resolve_group,
) -> tuple[dict[str, Transfer], tuple[str, ...]]:
    """``(transfers by launch, notes)`` for the collectives of an ``OpGraph``.

    ``cost_model.transfer`` gives each transfer's time; where it answers ``None`` no
    transfer is modelled.
    """
    transfers: dict[str, Transfer] = {}
    notes: dict[str, list[str]] = {}
    for name, data in sorted(op_graph.nodes(data=True), key=lambda x: x[1]["order"]):
        op = comm_op(data["fx"])
        if op is None or op.role == "wait":
            continue
        if not op.registered:
            notes.setdefault(_unregistered_note(op), []).append(name)
            continue
        if op.collective in ("other", "barrier"):
            continue
        group = resolve(op.group, _group_size_argument(op, data["fx"]))
        cost = cost_model.transfer(op.collective, op.nbytes, group.backend, group.world_size)
        if cost is None:
            continue
        if op.group is None:
            notes.setdefault(_unknown_group_note(op), []).append(name)
        if cost.note:
            notes.setdefault(cost.note, []).append(name)
        transfers[name] = Transfer(name, group.link, cost, op.collective, op.nbytes,
                                   blocking=op.role == "blocking")
    text = tuple(f"{note} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
                 for note, names in notes.items())
    for line in text:
        log.warning("autostream: %s", line)
    return transfers, text


def _unregistered_note(op: CommOp) -> str:
    return (f"op {op.qualname} looks like communication but is not in autostream's registry: "
            f"it keeps program order with the collectives and is costed as local compute; "
            f"register it with autostream.comm.register({op.qualname!r}, role, kind, group_arg)")


def _unknown_group_note(op: CommOp) -> str:
    return (f"{op.qualname} names no process group autostream can read: its transfer runs on "
            f"the shared link 'link:?' at the table's world size; it keeps program order "
            f"with the other collectives")


def add_transfers(g: nx.DiGraph, op_graph: nx.DiGraph, transfers: Mapping[str, Transfer]) -> None:
    """Add each transfer to the problem graph ``g`` (whose nodes are ``op_graph``'s ops)."""
    last: dict[str, str] = {}
    for launch in sorted(transfers, key=lambda n: op_graph.nodes[n]["order"]):
        t = transfers[launch]
        if t.blocking:  # communicates inside the op, on its stream
            g.nodes[launch]["duration"] += t.cost.duration_us
            continue
        task = t.task
        g.add_node(task, duration=t.cost.duration_us, share=t.cost.share,
                   order=op_graph.nodes[launch]["order"], kind="transfer", lane=t.lane)
        g.add_edge(launch, task)
        for succ in op_graph.successors(launch):
            if op_graph.edges[launch, succ].get("kind", "data") == "data":
                g.add_edge(task, succ)
        if t.lane in last:
            g.add_edge(last[t.lane], task)
        last[t.lane] = task
