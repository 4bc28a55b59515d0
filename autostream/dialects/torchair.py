"""TorchAir's stream ops: ``air.scope_enter / scope_exit / record / wait``.

TorchAir registers each op only ``if not hasattr(torch.ops.air, NAME)``.  A stand-in
defined first would therefore stop TorchAir from installing its real kernels, so
:func:`air_ops` first lets TorchAir register (when ``torch_npu`` is installed) and
only defines the stand-ins, with exactly TorchAir's schemas, when the ops are still
missing afterwards.  Nothing here runs at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

log = logging.getLogger("autostream")

STREAM_LABEL_KEY = "_user_stream_label"

_SCHEMAS = {
    "scope_enter": "scope_enter(str[] keys, str[] values, bool need_execute=False) -> None",
    "scope_exit": "scope_exit(bool need_execute=False) -> None",
    "record": "record(*, Device? device=None) -> Tensor",
    "wait": "wait(Tensor[] x) -> ()",
}
_QUALIFIED = frozenset(f"air::{n}" for n in _SCHEMAS)
#: ``torchair.scope.npu_wait_tensor``'s op (``scope/_wait_tensor.py``): ``self`` once
#: ``dependency`` is ready, an ordering edge only (GE: an ``Identity`` of ``self`` with a
#: control edge from ``dependency``'s producer)
_WAIT_TENSOR_SCHEMA = "wait_tensor(Tensor self, Tensor dependency) -> Tensor"
WAIT_TENSOR = "air::wait_tensor"

# The stand-in library must outlive every graph that uses its ops: a
# ``torch.library.Library`` deregisters its ops when garbage-collected.
_LIBRARY_LOCK = threading.Lock()
_STANDIN: list[torch.library.Library] = []


@dataclass(frozen=True)
class AirOps:
    """The four op overloads and whether they are TorchAir's own or autostream's stand-ins."""

    scope_enter: Any
    scope_exit: Any
    record: Any
    wait: Any
    from_torchair: bool

    def targets(self) -> tuple[Any, ...]:
        return (self.scope_enter, self.scope_exit, self.record, self.wait)


def _try_import_torchair() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
        importlib.import_module("torchair")
        # Importing the scope module registers the air ops in TorchAir.
        importlib.import_module("torchair.scope")
    except Exception as exc:  # CANN missing, version mismatch, ...
        log.debug("TorchAir not usable (%s); using autostream's stand-in air ops", exc)
        return False
    try:
        # TorchAir imports wait_tensor's module lazily and defines its op unconditionally:
        # it must come before any stand-in of it
        importlib.import_module("torchair.scope._wait_tensor")
    except Exception as exc:  # noqa: BLE001 - its GE converter's imports
        log.debug("TorchAir's wait_tensor not importable (%s)", exc)
    return True


#: the stand-ins' scope attribute stack, per thread, as TorchAir's ``scope/_scope_attr.py``
#: keeps it (``local.scope_attr``, pushed and popped only when ``need_execute``, never reset)
_SCOPE_LOCAL = threading.local()


def scope_stack() -> list[dict[str, str]]:
    """The calling thread's scope attributes pushed by ``scope_enter(..., need_execute=True)``.

    >>> ops = air_ops()
    >>> depth = len(scope_stack())
    >>> ops.scope_enter(["_user_stream_label"], ["stream_1"], True) is None
    True
    >>> scope_stack()[-1], len(scope_stack()) - depth
    ({'_user_stream_label': 'stream_1'}, 1)
    >>> ops.scope_exit(True); len(scope_stack()) - depth
    0
    """
    if not hasattr(_SCOPE_LOCAL, "stack"):
        _SCOPE_LOCAL.stack = []
    return _SCOPE_LOCAL.stack


def _define_standins() -> None:
    """TorchAir 2.14's definitions (``scope/_scope.py``, ``ops/_record_wait.py``): the same
    schemas, kernels on the same dispatch keys, the same results."""
    lib = torch.library.Library("air", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        if not hasattr(torch.ops.air, name):
            lib.define(schema)

    def scope_enter(keys: list[str], values: list[str], need_execute: bool = False) -> None:
        if need_execute:
            scope_stack().append(dict(zip(keys, values)))

    def scope_exit(need_execute: bool = False) -> None:
        if need_execute and scope_stack():
            scope_stack().pop()

    def record(*, device: torch.device | None = None) -> torch.Tensor:
        return torch.empty(0, device=device)

    def record_meta(*, device: torch.device | None = None) -> torch.Tensor:
        return torch.empty(0, device="meta")

    def wait(x: list[torch.Tensor]) -> None:
        return None

    for key in ("Meta", "CPU", "PrivateUse1", "BackendSelect"):
        lib.impl("scope_enter", scope_enter, key)
        lib.impl("scope_exit", scope_exit, key)
    lib.impl("record", record, "BackendSelect")
    lib.impl("record", record_meta, "Meta")
    lib.impl("wait", wait, "BackendSelect")
    lib.impl("wait", wait, "Meta")
    _STANDIN.append(lib)


def air_ops() -> AirOps:
    """The ``air`` op overloads, registering stand-ins only if TorchAir cannot provide them.

    >>> ops = air_ops()
    >>> str(ops.record._schema)
    'air::record(*, Device? device=None) -> Tensor'
    """
    with _LIBRARY_LOCK:
        from_torchair = hasattr(torch.ops.air, "scope_enter") and not _STANDIN
        if not all(hasattr(torch.ops.air, n) for n in _SCHEMAS):
            from_torchair = _try_import_torchair() and all(hasattr(torch.ops.air, n) for n in _SCHEMAS)
            if not from_torchair:
                _define_standins()
        ops = AirOps(
            scope_enter=torch.ops.air.scope_enter.default,
            scope_exit=torch.ops.air.scope_exit.default,
            record=torch.ops.air.record.default,
            wait=torch.ops.air.wait.default,
            from_torchair=from_torchair,
        )
        for op in (ops.scope_enter, ops.scope_exit, ops.wait):
            torch.fx.node.has_side_effect(op)
        return ops


def wait_tensor_op() -> Any:
    """``torch.ops.air.wait_tensor.default`` (``npu_wait_tensor``), TorchAir's own when it
    can be imported, else a stand-in with its schema whose kernels return ``self`` (TorchAir's
    Meta kernel does; its CPU kernel raises, autostream's runs it as the identity).

    >>> str(wait_tensor_op()._schema)
    'air::wait_tensor(Tensor self, Tensor dependency) -> Tensor'
    """
    with _LIBRARY_LOCK:
        if not hasattr(torch.ops.air, "wait_tensor"):
            _try_import_torchair()
        if not hasattr(torch.ops.air, "wait_tensor"):
            lib = torch.library.Library("air", "FRAGMENT")
            lib.define(_WAIT_TENSOR_SCHEMA)

            def wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
                return self

            for key in ("Meta", "CPU", "PrivateUse1"):
                lib.impl("wait_tensor", wait_tensor, key)
            _STANDIN.append(lib)
        return torch.ops.air.wait_tensor.default


def _qualname(node: torch.fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    name = getattr(node.target, "name", None)
    return name() if callable(name) else None


def is_stream_op(node: torch.fx.Node) -> bool:
    """True for call_function nodes whose target is one of the ``air`` stream ops
    (``wait_tensor`` included)."""
    name = _qualname(node)
    return name in _QUALIFIED or name == WAIT_TENSOR


def is_wait_tensor(node: torch.fx.Node) -> bool:
    """True for ``air.wait_tensor`` (``npu_wait_tensor``) nodes."""
    return _qualname(node) == WAIT_TENSOR


def air_kind(node: torch.fx.Node) -> str | None:
    """``"scope_enter" | "scope_exit" | "record" | "wait"`` for air nodes, else ``None``
    (``wait_tensor`` too: :func:`is_wait_tensor`)."""
    if _qualname(node) not in _QUALIFIED:
        return None
    return node.target.name().split("::", 1)[1]


def stream_label(stream: int) -> str:
    """TorchAir label of side stream ``stream`` (``stream_1``, ``stream_2``...)."""
    if stream < 1:
        raise ValueError("stream 0 is the main stream and has no scope label")
    return f"stream_{stream}"


def stream_index(label: str) -> int:
    """Inverse of :func:`stream_label`: ``"stream_3" -> 3``."""
    prefix, _, number = label.partition("_")
    if prefix != "stream" or not number.isdigit() or int(number) < 1:
        raise ValueError(f"unknown stream label {label!r}; expected 'stream_<k>' with k >= 1")
    return int(number)


def scope_label(node: torch.fx.Node) -> str | None:
    """The ``_user_stream_label`` value of a ``scope_enter`` node, if it sets one."""
    keys, values = node.args[0], node.args[1]
    for k, v in zip(keys, values):
        if k == STREAM_LABEL_KEY:
            return v
    return None
