"""The communication ops autostream knows: one registry, keyed by qualified op name.

Three roles:

- ``collective``: launches a transfer and returns at once (``_c10d_functional.*``);
  its result may be read only after a ``wait`` on it;
- ``wait``: blocks until a collective's transfer is done (``wait_tensor``); it
  writes nothing;
- ``blocking``: communicates and completes inside the op (legacy ``c10d`` ops,
  vendor kernels such as torch_npu's HCCL MoE dispatch/combine).

Every op with a communication role keeps its program order relative to every
other collective or blocking op (``graph.build_op_graph`` chains them): ranks match
collectives by issue order, so two ranks issuing them in different orders reduce
the wrong tensors or hang.  An op that is not registered but whose name looks like
communication (:func:`looks_like_communication`) is treated as ``blocking`` with
an unknown kind, and the planner says so.

>>> spec = DEFAULT_REGISTRY.spec("_c10d_functional::all_reduce")
>>> spec.role, spec.collective
('collective', 'all_reduce')
>>> DEFAULT_REGISTRY.spec("aten::mm") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.fx

ROLES = ("collective", "wait", "blocking")
#: cost kinds: the algorithm's traffic factor depends on it (``cost.collectives``)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
         "send_recv", "barrier", "other")


@dataclass(frozen=True)
class CommSpec:
    """One communication op: its qualified name, role, cost kind and group argument.

    ``group_arg`` names the argument that identifies the process group (a group
    name string, or a ``ProcessGroup``), ``None`` where the op has none.
    """

    qualname: str
    role: str
    collective: str = "other"
    group_arg: str | None = "group_name"

    def __post_init__(self) -> None:
        if "::" not in self.qualname:
            raise ValueError(f"qualified op name {self.qualname!r} must look like "
                             "'namespace::name' (e.g. 'npu::npu_moe_distribute_dispatch')")
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} of {self.qualname}: expected one of {ROLES}")
        if self.collective not in KINDS:
            raise ValueError(f"collective kind {self.collective!r} of {self.qualname}: "
                             f"expected one of {KINDS}")


def _functional() -> list[CommSpec]:
    kinds = {
        "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
        "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
        "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
        "all_gather_into_tensor_coalesced": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter",
        "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
        "isend": "send_recv", "irecv": "send_recv", "batch_p2p_ops": "send_recv",
    }
    specs = [CommSpec(f"_c10d_functional::{name}", "collective", kind)
             for name, kind in kinds.items()]
    specs += [CommSpec(f"_c10d_functional_autograd::{name}", "collective", kind)
              for name, kind in kinds.items()
              if name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")]
    specs.append(CommSpec("_c10d_functional::wait_tensor", "wait", "other", None))
    return specs


def _legacy_c10d() -> list[CommSpec]:
    kinds = {
        "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
        "allgather_": "all_gather", "_allgather_base_": "all_gather",
        "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
        "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
        "reduce_scatter_tensor_coalesced_": "reduce_scatter",
        "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "broadcast_": "broadcast",
        "reduce_": "all_reduce", "gather_": "all_gather", "scatter_": "broadcast",
        "send": "send_recv", "recv_": "send_recv", "recv_any_source_": "send_recv",
        "barrier": "barrier", "monitored_barrier_": "barrier",
    }
    return [CommSpec(f"c10d::{name}", "blocking", kind, "process_group")
            for name, kind in kinds.items()]


def _vendor() -> list[CommSpec]:
    """torch_npu ops that communicate over HCCL inside one kernel (by qualified name)."""
    ops = {
        "npu::npu_moe_distribute_dispatch": ("all_to_all", "group_ep"),
        "npu::npu_moe_distribute_combine": ("all_to_all", "group_ep"),
        "npu::npu_moe_distribute_dispatch_v2": ("all_to_all", "group_ep"),
        "npu::npu_moe_distribute_combine_v2": ("all_to_all", "group_ep"),
        "npu::npu_mm_all_reduce_base": ("all_reduce", "hcom"),
        "npu::npu_all_gather_base_mm": ("all_gather", "hcom"),
        "npu::npu_mm_reduce_scatter_base": ("reduce_scatter", "hcom"),
    }
    return [CommSpec(name, "blocking", kind, group) for name, (kind, group) in ops.items()]


_COMM_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd",
                              "c10d_functional", "_dtensor", "hccl", "nccl", "hcom", "gloo"})
_COMM_WORDS = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoallv?|broadcast|"
    r"(^|[_.:])(i?send|i?recv|p2p)($|[_.])|hccl|nccl|hcom|distribute_(dispatch|combine)|"
    r"(^|[_.:])barrier($|[_.])")


#: namespaces of ops that compute locally, whatever their names say (``aten::broadcast_to``)
_LOCAL_NAMESPACES = frozenset({"aten", "prims", "prim", "air", "quantized", "higher_order"})


def looks_like_communication(qualname: str) -> bool:
    """Whether an op's name suggests it communicates (namespace or name).

    Ops of ``aten``/``prims`` never do (``aten::broadcast_to`` is a view); a Python
    callable (no ``::``) only when it comes from ``torch.distributed``.

    >>> [looks_like_communication(n) for n in
    ...  ("npu::npu_moe_distribute_dispatch_v3", "mylib::my_allreduce", "aten::mm",
    ...   "aten::broadcast_to", "torch.distributed.distributed_c10d.all_gather",
    ...   "torch.functional.broadcast_tensors")]
    [True, True, False, False, True, False]
    """
    if "::" not in qualname:
        return qualname.startswith("torch.distributed.")
    namespace = qualname.split("::", 1)[0]
    if namespace in _LOCAL_NAMESPACES:
        return False
    return namespace in _COMM_NAMESPACES or bool(_COMM_WORDS.search(qualname.lower()))


def qualified_name(target: object) -> str | None:
    """``namespace::name`` of an op overload or packet; ``module.name`` of a Python callable.

    >>> qualified_name(torch.ops._c10d_functional.all_reduce.default)
    '_c10d_functional::all_reduce'
    >>> qualified_name(torch.ops._c10d_functional.all_reduce)
    '_c10d_functional::all_reduce'
    """
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    if callable(target) and not isinstance(target, str):
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
        return f"{module}.{name}" if name else None
    return None


class CommRegistry:
    """Qualified op name -> :class:`CommSpec`; extend it with :meth:`register`.

    >>> r = CommRegistry()
    >>> r.register(CommSpec("mylib::ep_dispatch", "blocking", "all_to_all", "group"))
    >>> r.spec("mylib::ep_dispatch").collective
    'all_to_all'
    """

    def __init__(self, specs: Iterable[CommSpec] = ()) -> None:
        self._specs: dict[str, CommSpec] = {}
        #: (node op, target) -> what ``lookup`` made of it: every op of a graph is looked
        #: up, several times
        self._by_target: dict[tuple[str, object], CommSpec | None] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: CommSpec) -> None:
        """Add (or replace) the entry of ``spec.qualname``."""
        self._specs[spec.qualname] = spec
        self._by_target.clear()

    def spec(self, qualname: str) -> CommSpec | None:
        return self._specs.get(qualname)

    def __contains__(self, qualname: object) -> bool:
        return qualname in self._specs

    def lookup(self, node: torch.fx.Node) -> CommSpec | None:
        """The spec of ``node``'s target: registered, or ``blocking``/``other`` when its
        name only looks like communication (see :func:`looks_like_communication`)."""
        if node.op not in ("call_function", "call_method"):
            return None
        key = (node.op, node.target)
        try:
            return self._by_target[key]
        except KeyError:
            spec = self._by_target[key] = self._lookup(node)
            return spec
        except TypeError:  # an unhashable target
            return self._lookup(node)

    def _lookup(self, node: torch.fx.Node) -> CommSpec | None:
        name = qualified_name(node.target) if node.op == "call_function" else str(node.target)
        if name is None:
            return None
        return self._specs.get(name) or _guess(name)


def _guess(name: str) -> CommSpec | None:
    """The spec of an unregistered op: ``blocking`` when its name looks like communication."""
    if looks_like_communication(name):
        return CommSpec(name if "::" in name else f"python::{name}", "blocking", "other", None)
    return None


#: The registry the planner uses unless given another; ``register`` adds vendor ops.
DEFAULT_REGISTRY = CommRegistry([*_functional(), *_legacy_c10d(), *_vendor()])


def register(qualname: str, role: str = "blocking", collective: str = "other",
             group_arg: str | None = None, registry: CommRegistry = DEFAULT_REGISTRY) -> CommSpec:
    """Register a communication op by qualified name (e.g. a vendor's fused MoE dispatch).

    >>> r = CommRegistry()
    >>> register("npu::my_dispatch", "blocking", "all_to_all", "group_ep", registry=r).role
    'blocking'
    """
    spec = CommSpec(qualname, role, collective, group_arg)
    registry.register(spec)
    return spec
