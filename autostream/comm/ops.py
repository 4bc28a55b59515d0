"""What one FX node communicates: role, cost kind, process group and message size.

>>> g = torch.fx.Graph(); x = g.placeholder("x")
>>> x.meta["val"] = torch.empty(256)
>>> ar = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"))
>>> w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (ar,))
>>> op = comm_op(ar)
>>> op.role, op.collective, op.group, op.nbytes
('collective', 'all_reduce', '0', 1024)
>>> comm_op(w).role
'wait'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from autostream.comm.registry import DEFAULT_REGISTRY, CommRegistry, CommSpec


@dataclass(frozen=True)
class CommOp:
    """A node with a communication role.

    ``group`` is the process group's name when the node names one the pass can
    read (``None`` otherwise); ``registered`` is False for an op that only looks like
    communication.  ``nbytes`` is the message size in the convention of
    ``nccl-tests``: the larger of all inputs and all outputs (an all-gather's whole
    output, a reduce-scatter's whole input).
    """

    name: str
    qualname: str
    role: str
    collective: str
    group: str | None
    nbytes: int
    registered: bool = True

    @property
    def orders(self) -> bool:
        """Keeps program order with the other collectives (launches and blocking ops)."""
        return self.role in ("collective", "blocking")


def _schema(target: Any):
    if isinstance(target, torch._ops.OpOverload):
        return target._schema
    if isinstance(target, torch._ops.OpOverloadPacket):
        overload = getattr(target, "default", None)
        return overload._schema if overload is not None else None
    return None


def _argument(node: torch.fx.Node, name: str) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    schema = _schema(node.target)
    if schema is None:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else None
    return None


def group_name(value: Any) -> str | None:
    """The group name in a collective's group argument (a string, a ``ProcessGroup`` or an
    FX node holding one), or ``None`` when it names none the pass can read.

    >>> group_name("tp"), group_name(None)
    ('tp', None)
    """
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val", value.meta.get("example_value"))
    if isinstance(value, str):
        return value
    name = getattr(value, "group_name", None)
    return name if isinstance(name, str) and name else None


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        try:
            return int(value.numel()) * value.element_size()
        except Exception:  # noqa: BLE001 - symbolic sizes without a hint
            return 0
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _value(node: Any) -> Any:
    if isinstance(node, torch.fx.Node):
        return node.meta.get("val", node.meta.get("example_value"))
    if isinstance(node, (list, tuple)):
        return [_value(n) for n in node]
    return None


def message_bytes(node: torch.fx.Node) -> int:
    """The larger of the bytes a node reads (tensor arguments) and writes (its value)."""
    read = sum(_tensor_bytes(_value(a)) for a in (*node.args, *node.kwargs.values()))
    return max(read, _tensor_bytes(_value(node)))


def comm_op(node: torch.fx.Node, registry: CommRegistry = DEFAULT_REGISTRY) -> CommOp | None:
    """The communication role of ``node``, or ``None`` for an op that computes locally."""
    spec: CommSpec | None = registry.lookup(node)
    if spec is None:
        return None
    group = group_name(_argument(node, spec.group_arg)) if spec.group_arg else None
    nbytes = 0 if spec.role == "wait" else message_bytes(node)
    return CommOp(node.name, spec.qualname, spec.role, spec.collective, group, nbytes,
                  registered=spec.qualname in registry)


def launch_of_wait(wait: torch.fx.Node) -> torch.fx.Node | None:
    """The collective launch whose result ``wait`` waits for (through ``getitem`` of a
    coalesced result), or ``None`` when ``wait`` is no wait or its input is no launch."""
    op = comm_op(wait)
    if op is None or op.role != "wait" or not wait.args or not isinstance(wait.args[0], torch.fx.Node):
        return None
    source = wait.args[0]
    while source.op == "call_function" and getattr(source.target, "__name__", "") == "getitem":
        if not source.args or not isinstance(source.args[0], torch.fx.Node):
            return None
        source = source.args[0]
    launch = comm_op(source)
    return source if launch is not None and launch.role == "collective" else None


def has_communication(graph: torch.fx.Graph, registry: CommRegistry = DEFAULT_REGISTRY) -> bool:
    """Whether any node of ``graph`` communicates (collective, wait or blocking)."""
    return any(comm_op(n, registry) is not None for n in graph.nodes)
