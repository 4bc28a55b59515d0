"""Op signatures: what identifies an op's work (overload, input shapes, dtypes, scalars).

A signature is read from a post-AOT ATen FX node whose inputs carry ``meta["val"]``
(FakeTensors, possibly with symbolic sizes).  Symbolic sizes are replaced by their
hints; when a size has no hint a fixed fallback is used and the signature is marked
``approximate`` so the cost model can say so.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.ones(2, 3), torch.ones(3, 4))
>>> mm = next(n for n in gm.graph.nodes if n.op == "call_function")
>>> sig = node_signature(mm)
>>> sig.op, sig.key
('aten.mm.default', 'f32[2, 3], f32[3, 4]')
>>> sig.flops, sig.bytes
(48, 104)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import flop_counter

#: size used for a symbolic dimension that has no hint
FALLBACK_SIZE = 64

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}
_SHORT_DTYPE = {v: k for k, v in _DTYPE_SHORT.items()}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _d = getattr(torch, _name)
        _DTYPE_SHORT[_d] = _name
        _SHORT_DTYPE[_name] = _d


def dtype_short(dtype: torch.dtype) -> str:
    """``torch.float32 -> "f32"``; unknown dtypes keep their torch name.

    >>> dtype_short(torch.bfloat16)
    'bf16'
    """
    return _DTYPE_SHORT.get(dtype, str(dtype).removeprefix("torch."))


def dtype_from_short(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_short`.

    >>> dtype_from_short("f16")
    torch.float16
    """
    if name in _SHORT_DTYPE:
        return _SHORT_DTYPE[name]
    d = getattr(torch, name, None)
    if isinstance(d, torch.dtype):
        return d
    raise ValueError(f"unknown dtype {name!r} in an op signature")


@dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype and strides of one tensor argument (sizes already hinted)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)

    @property
    def contiguous(self) -> bool:
        if self.stride is None:
            return True
        expected, acc = [], 1
        for s in reversed(self.shape):
            expected.append(acc)
            acc *= max(s, 1)
        return all(a == b or n == 1 for a, b, n in zip(self.stride, reversed(expected), self.shape, strict=False))

    def text(self) -> str:
        base = f"{dtype_short(self.dtype)}{list(self.shape)}"
        return base if self.contiguous else base + "T"


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize  # not a tensor's: under a compile's fake mode that costs 0.2 ms


@dataclass(frozen=True)
class OpSignature:
    """One op's identity for costing: overload name plus a canonical argument string.

    ``args``/``kwargs`` keep the argument structure with :class:`TensorSpec` in place
    of tensors and plain Python values (hinted) in place of symbolic scalars, so that
    calibration can rebuild real inputs from a signature.
    """

    op: str
    key: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    outputs: tuple[TensorSpec, ...] = ()
    flops: int = 0
    bytes: int = 0
    has_flop_formula: bool = False
    approximate: bool = False

    @property
    def dtype(self) -> torch.dtype:
        """The dtype that sets the op's peak rate: its first floating input or output."""
        specs = [s for s in _iter_specs(self.args) if s.dtype.is_floating_point]
        specs += [s for s in self.outputs if s.dtype.is_floating_point]
        if specs:
            return specs[0].dtype
        first = next(iter(_iter_specs(self.args)), None) or (self.outputs[0] if self.outputs else None)
        return first.dtype if first is not None else torch.float32

    def tensor_specs(self) -> list[TensorSpec]:
        return list(_iter_specs((self.args, self.kwargs)))


def op_name(target: Any) -> str:
    """Stable name of a call_function target (``"aten.mm.default"``, ``"_operator.getitem"``).

    >>> op_name(torch.ops.aten.mm.default)
    'aten.mm.default'
    """
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}.{name}" if module else name


def symint_hint(v: torch.SymInt) -> int:
    """The size a backed symbolic int had when traced; raises when it has none (unbacked).

    ``optimization_hint`` in recent torch, ``hint_int`` before it.

    >>> symint_hint(3)
    3
    """
    shapes = torch.fx.experimental.symbolic_shapes
    hint = getattr(shapes, "optimization_hint", None) or shapes.hint_int
    return int(hint(v))


class _Hinter:
    """Turns symbolic ints into ints; remembers whether it had to guess."""

    def __init__(self) -> None:
        self.approximate = False

    def int(self, v: Any) -> int:
        if isinstance(v, torch.SymInt):
            try:
                return symint_hint(v)
            except Exception:  # noqa: BLE001 - no hint (unbacked): guess and say so
                self.approximate = True
                return FALLBACK_SIZE
        return int(v)

    def scalar(self, v: Any) -> Any:
        if isinstance(v, torch.SymInt):
            return self.int(v)
        if isinstance(v, torch.SymFloat):
            try:
                return float(v.node.hint)
            except Exception:  # noqa: BLE001
                self.approximate = True
                return 1.0
        if isinstance(v, torch.SymBool):
            try:
                return bool(v.node.hint)
            except Exception:  # noqa: BLE001
                self.approximate = True
                return True
        return v

    def ints(self, sizes: Any) -> tuple[int, ...]:
        """Sizes as ints (a static shape as it is: the common case, and the fast one)."""
        out = tuple(sizes)
        if all(type(v) is int for v in out):
            return out
        return tuple(self.int(v) for v in out)

    def spec(self, t: torch.Tensor) -> TensorSpec:
        shape = self.ints(t.shape)
        try:
            stride = self.ints(t.stride())
        except Exception:  # noqa: BLE001 - sparse/nested tensors have no strides
            stride = None
        return TensorSpec(shape, t.dtype, stride)


def tensor_spec(t: torch.Tensor) -> TensorSpec:
    """The :class:`TensorSpec` of a (fake or real) tensor, symbolic sizes hinted.

    >>> tensor_spec(torch.ones(2, 3).t()).text()
    'f32[3, 2]T'
    """
    return _Hinter().spec(t)


def _encode(v: Any, h: _Hinter) -> Any:
    if isinstance(v, torch.fx.Node):
        return _encode(v.meta.get("val", v.meta.get("example_value")), h)
    if isinstance(v, torch.Tensor):
        return h.spec(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_encode(x, h) for x in v) if isinstance(v, list) else tuple(_encode(x, h) for x in v)
    return h.scalar(v)


def _iter_specs(v: Any):
    if isinstance(v, TensorSpec):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _iter_specs(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _iter_specs(x)


def _text(v: Any) -> str:
    if isinstance(v, TensorSpec):
        return v.text()
    if isinstance(v, list):
        return "[" + ", ".join(_text(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(_text(x) for x in v) + ")"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, torch.dtype):
        return dtype_short(v)
    return str(v)


def signature_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Canonical text of encoded arguments, the table's lookup key."""
    parts = [_text(a) for a in args]
    parts += [f"{k}={_text(v)}" for k, v in sorted(kwargs.items())]
    return ", ".join(parts)


def _shapes(v: Any) -> Any:
    """TensorSpec -> torch.Size, the form torch's flop formulas accept."""
    if isinstance(v, TensorSpec):
        return torch.Size(v.shape)
    if isinstance(v, (list, tuple)):
        return type(v)(_shapes(x) for x in v)
    if isinstance(v, dict):
        return {k: _shapes(x) for k, x in v.items()}
    return v


def _sdpa_flops(q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(q, k, v)


#: attention kernels torch's flop counter does not list, counted like SDPA
_EXTRA_FORMULAS = {"_scaled_dot_product_flash_attention_for_cpu": _sdpa_flops,
                   "_scaled_dot_product_fused_attention_overrideable": _sdpa_flops}


def _formula(op: str, target: Any):
    packet = getattr(target, "overloadpacket", None)
    if packet is None:
        return None
    return flop_counter.flop_registry.get(packet) or _EXTRA_FORMULAS.get(
        getattr(target, "_opname", ""))


def count_work(op: str, target: Any, args: tuple, kwargs: dict, outputs: tuple[TensorSpec, ...]
               ) -> tuple[int, int, bool]:
    """(flops, bytes, has_formula) of one op.

    FLOPs come from torch's registered formulas (matmul, conv, attention); other ops
    count one FLOP per element of their largest input or output.  Bytes are the sizes
    of all tensor inputs and outputs.
    """
    ins = list(_iter_specs((args, kwargs)))
    nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outputs)
    fn = _formula(op, target)
    if fn is not None:
        out = _shapes(outputs[0]) if len(outputs) == 1 else _shapes(outputs)
        try:
            return int(fn(*_shapes(args), out_val=out, **_shapes(kwargs))), nbytes, True
        except Exception:  # noqa: BLE001 - a formula that rejects this arity: count elements
            pass
    elems = max([s.numel for s in ins] + [s.numel for s in outputs] + [0])
    return elems, nbytes, False


def _outputs(val: Any, h: _Hinter) -> tuple[TensorSpec, ...]:
    if isinstance(val, torch.Tensor):
        return (h.spec(val),)
    if isinstance(val, (list, tuple)):
        return tuple(s for v in val for s in _outputs(v, h))
    return ()


def node_cost_key(node: torch.fx.Node) -> tuple[str, str]:
    """``(op, key)`` of ``node``'s signature without counting its work: what a cost cache
    looks up (``node_signature`` has the same two fields)."""
    h = _Hinter()
    args = tuple(_encode(a, h) for a in node.args)
    kwargs = {k: _encode(v, h) for k, v in node.kwargs.items()}
    return op_name(node.target), signature_key(args, kwargs)


def node_signature(node: torch.fx.Node) -> OpSignature:
    """The :class:`OpSignature` of a ``call_function`` node of an ATen FX graph."""
    h = _Hinter()
    args = tuple(_encode(a, h) for a in node.args)
    kwargs = {k: _encode(v, h) for k, v in node.kwargs.items()}
    outputs = _outputs(node.meta.get("val"), h)
    op = op_name(node.target)
    flops, nbytes, formula = count_work(op, node.target, args, kwargs, outputs)
    return OpSignature(op, signature_key(args, kwargs), args, kwargs, outputs, flops, nbytes,
                       formula, h.approximate)
