"""Op signatures from profiler records: the same ``(op, key)`` a graph node of that call has.

A profiler records an ATen op by its schema name (``aten::add``) and, with
``record_shapes``, each schema argument: a tensor's sizes, strides and dtype name, a
scalar's or a scalar list's value (``Concrete Inputs``), or nothing (``None``,
devices, generators).  The overload is the one whose schema has exactly that many
arguments of matching kinds; the arguments are then normalised as the dispatcher
hands them to a graph (trailing arguments equal to their defaults dropped,
keyword-only ones as keywords only when they differ from their defaults), so the
key is the one :func:`autostream.cost.signature.node_signature` gives the same call.

>>> call = ProfiledCall("aten::add", dims=[[4, 8], [4, 8], []], types=["float", "float", "Scalar"],
...                     strides=[[8, 1], [8, 1], []], concrete=["", "", "1"], duration_us=3.0)
>>> sig = call_signature(call)
>>> sig.op, sig.key
('aten.add.Tensor', 'f32[4, 8], f32[4, 8]')
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autostream.cost.signature import (
    OpSignature,
    TensorSpec,
    count_work,
    signature_key,
    tensor_spec,
)

#: dtype names as ``record_function`` writes them (``c10::toString`` of the scalar type)
PROFILER_DTYPES = {
    "float": torch.float32, "double": torch.float64, "c10::Half": torch.float16, "Half": torch.float16,
    "c10::BFloat16": torch.bfloat16, "BFloat16": torch.bfloat16, "long int": torch.int64,
    "long": torch.int64, "int": torch.int32, "short int": torch.int16, "short": torch.int16,
    "signed char": torch.int8, "unsigned char": torch.uint8, "bool": torch.bool,
    "c10::complex<float>": torch.complex64, "c10::complex<double>": torch.complex128,
}
for _name in ("Float8_e4m3fn", "Float8_e5m2"):
    if hasattr(torch, _name.lower()):
        PROFILER_DTYPES[f"c10::{_name}"] = getattr(torch, _name.lower())

#: ``c10::ScalarType`` by its integer code, as a profiler records a ``dtype`` argument
_SCALAR_TYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
                 torch.bool, torch.qint8, torch.quint8, torch.qint32, torch.bfloat16)
_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)
_LAYOUTS = (torch.strided, torch.sparse_coo)


@dataclass(frozen=True)
class ProfiledCall:
    """One call of one op in a profile: its recorded arguments and its time.

    ``dims``/``types``/``strides``/``concrete`` are the profiler's per-argument lists
    (``Input Dims``, ``Input type``, ``Input Strides``, ``Concrete Inputs``);
    ``duration_us`` the call's time (its kernels' sum on an accelerator, its own span
    on CPU); ``share`` the device share its kernels occupied, when the profile says;
    ``where`` names the record for messages.
    """

    name: str
    dims: list[Any]
    types: list[Any]
    strides: list[Any] = field(default_factory=list)
    concrete: list[Any] = field(default_factory=list)
    duration_us: float = 0.0
    share: float | None = None
    where: str = ""
    step: int | None = None


class _Unknown:
    """A scalar argument whose value the profile did not record (torch_npu records none)."""

    def __repr__(self) -> str:
        return "?"

    __str__ = __repr__


UNKNOWN = _Unknown()


class Unresolved(ValueError):
    """A profiled op whose overload or arguments cannot be recovered (reported, not fatal)."""


def _parse(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    text = text.strip()
    if text in ("", "None"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if text in ("inf", "-inf", "nan"):
            return float(text)
        return text


def split_list(value: Any, kind: str) -> list[Any]:
    r"""A per-argument list as the profiler wrote it: a JSON list (torch.profiler) or a
    ``;``-separated string (torch_npu: ``"8,64;\r\n64,32"``, ``"c10::Half;\r\nfloat"``).

    >>> split_list("[8, 64];\r\n[64, 32];\r\n", "dims"), split_list("8,64;", "dims")
    ([[8, 64], [64, 32], []], [[8, 64], []])
    >>> split_list("float;\r\nScalar", "types")
    ['float', 'Scalar']
    """
    if not isinstance(value, str):
        return list(value or [])
    parts = [p.strip() for p in value.split(";")]
    if kind == "types":
        return parts
    out = []
    for p in parts:
        if p.startswith("["):
            out.append(list(ast.literal_eval(p)))
        else:
            out.append([int(x) for x in p.split(",") if x.strip()])
    return out


def _arg(call: ProfiledCall, i: int) -> tuple[str, Any]:
    """``(kind, value)`` of argument ``i``: tensor, tensors, scalar, list or none."""
    typ = call.types[i] if i < len(call.types) else ""
    dims = call.dims[i] if i < len(call.dims) else []
    strides = call.strides[i] if i < len(call.strides) else []
    concrete = call.concrete[i] if i < len(call.concrete) else UNKNOWN
    if typ == "TensorList":
        n = len(dims or [])
        st = strides if isinstance(strides, list) and len(strides) == n else [None] * n
        # torch.profiler records no dtypes inside a tensor list: the op's other tensors' dtype
        dtype = next((PROFILER_DTYPES[t] for t in call.types if t in PROFILER_DTYPES
                      and t != "Scalar"), torch.float32)
        return "tensors", [TensorSpec(tuple(d), dtype, tuple(s) if s else None)
                           for d, s in zip(dims, st, strict=True)]
    if typ in PROFILER_DTYPES:
        return "tensor", TensorSpec(tuple(dims or ()), PROFILER_DTYPES[typ],
                                    tuple(strides) if strides else None)
    if typ == "ScalarList":
        return "list", _parse(concrete) if concrete is not UNKNOWN else UNKNOWN
    if typ == "Scalar":
        return "scalar", _parse(concrete) if concrete is not UNKNOWN else UNKNOWN
    if typ in ("", None):
        return "none", None
    raise Unresolved(f"argument {i} has a type the reader does not know ({typ!r})")


def _convert(kind: str, value: Any, arg: Any) -> Any:
    """``value`` as schema argument ``arg`` takes it; raises Unresolved when it does not fit."""
    t = str(arg.type)
    optional = t.startswith("Optional[")
    base = t[len("Optional["):-1] if optional else t
    if kind == "none" and base == "List[Optional[Tensor]]":
        return UNKNOWN  # index's indices: torch.profiler records nothing for them
    if kind == "none":
        if optional or arg.has_default_value():
            return arg.default_value if not optional else None
        raise Unresolved(f"{arg.name} ({t}) was not recorded")
    if base == "Tensor":
        if kind == "tensor":
            return value
        raise Unresolved(f"{arg.name} is a Tensor, got a {kind}")
    if base.startswith("List[") and "Tensor" in base:
        if kind == "tensors":
            return value
        if kind == "none" and "Optional[Tensor]" in base:  # index's indices: not recorded
            return UNKNOWN
        raise Unresolved(f"{arg.name} is a tensor list, got a {kind}")
    if kind == "tensor":
        raise Unresolved(f"{arg.name} is {t}, got a tensor")
    if value is UNKNOWN:
        return UNKNOWN
    if base.startswith("List["):
        if kind == "list" and isinstance(value, (list, tuple)):
            return list(value)
        if kind == "scalar" and base in ("List[int]",) and isinstance(value, int):
            return [value]
        raise Unresolved(f"{arg.name} is {t}, got {value!r}")
    if arg.name == "dtype" and isinstance(value, int):
        return _SCALAR_TYPES[value] if 0 <= value < len(_SCALAR_TYPES) else value
    if arg.name == "memory_format" and isinstance(value, int):
        return _MEMORY_FORMATS[value] if 0 <= value < len(_MEMORY_FORMATS) else value
    if arg.name == "layout" and isinstance(value, int):
        return _LAYOUTS[value] if 0 <= value < len(_LAYOUTS) else value
    if base == "bool":
        if isinstance(value, bool):
            return value
        raise Unresolved(f"{arg.name} is bool, got {value!r}")
    if base in ("int", "SymInt"):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise Unresolved(f"{arg.name} is int, got {value!r}")
    if base == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise Unresolved(f"{arg.name} is float, got {value!r}")
    if base in ("number", "Scalar"):
        if isinstance(value, (int, float, bool, complex)):
            return value
        raise Unresolved(f"{arg.name} is a Scalar, got {value!r}")
    if base == "str" and isinstance(value, str):
        return value
    raise Unresolved(f"{arg.name} is {t}, got {value!r}")


def _bind(overload: torch._ops.OpOverload, call: ProfiledCall
          ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    schema = overload._schema
    n = len(call.types)
    # the profiler may leave out trailing arguments that keep their defaults
    if n > len(schema.arguments) or any(not a.has_default_value() and not str(a.type).startswith(
            "Optional[") for a in schema.arguments[n:]):
        raise Unresolved(f"{n} arguments, the schema has {len(schema.arguments)}")
    args, kwargs = [], {}
    for i, a in enumerate(schema.arguments):
        kind, value = _arg(call, i) if i < n else ("none", None)
        v = _convert(kind, value, a)
        if a.kwarg_only:
            if not (a.has_default_value() and _same(v, a.default_value)):
                kwargs[a.name] = v
        else:
            args.append((v, a))
    while args and args[-1][1].has_default_value() and _same(args[-1][0], args[-1][1].default_value):
        args.pop()
    return tuple(v for v, _ in args), kwargs


def _same(v: Any, default: Any) -> bool:
    if v is UNKNOWN or isinstance(v, TensorSpec) or isinstance(default, TensorSpec):
        return False
    if isinstance(v, torch.dtype) and isinstance(default, int):
        return False
    try:
        return type(v) is type(default) and v == default or (v is None and default is None)
    except Exception:  # noqa: BLE001
        return False


def _overloads(name: str) -> tuple[str, list[torch._ops.OpOverload]]:
    ns, _, op = name.partition("::")
    if not op:
        raise Unresolved(f"{name!r} is not a namespaced op name (ns::op)")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
    except (AttributeError, RuntimeError):
        raise Unresolved(f"no op {ns}.{op} is registered in this torch") from None
    names = sorted(packet.overloads(), key=lambda o: (o != "default", o))
    return f"{ns}.{op}", [getattr(packet, o) for o in names if o != "out" and not o.endswith("_out")]


def _meta(v: Any) -> Any:
    if isinstance(v, TensorSpec):
        stride = v.stride or None
        if stride is None:
            return torch.empty(v.shape, dtype=v.dtype, device="meta")
        return torch.empty_strided(v.shape, stride, dtype=v.dtype, device="meta")
    if isinstance(v, list):
        return [_meta(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_meta(x) for x in v)
    return v


def _outputs(overload: Any, args: tuple, kwargs: dict) -> tuple[TensorSpec, ...]:
    try:
        out = overload(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - no meta kernel: bytes count the inputs only
        return ()
    outs = out if isinstance(out, (list, tuple)) else (out,)
    return tuple(tensor_spec(o) for o in outs if isinstance(o, torch.Tensor))


def call_signature(call: ProfiledCall) -> OpSignature:
    """The :class:`OpSignature` a graph node making ``call`` has; raises :class:`Unresolved`
    when no overload of the op takes the recorded arguments.  A scalar the profile did
    not record stays ``?`` and marks the signature ``approximate``."""
    qual, overloads = _overloads(call.name)
    call = replace(call, dims=split_list(call.dims, "dims"), types=split_list(call.types, "types"))
    problems = []
    for ov in overloads:
        try:
            args, kwargs = _bind(ov, call)
        except Unresolved as exc:
            problems.append(f"{ov._overloadname}: {exc}")
            continue
        unknown = any(v is UNKNOWN for v in (*args, *kwargs.values()))
        outputs = () if unknown else _outputs(ov, args, kwargs)
        flops, nbytes, formula = count_work(str(ov), ov, args, kwargs, outputs)
        return OpSignature(str(ov), signature_key(args, kwargs), args, kwargs, outputs, flops,
                           nbytes, formula, approximate=unknown)
    raise Unresolved(f"no overload of {qual} takes the recorded arguments ("
                     + "; ".join(problems[:4]) + ")")


def kernel_share(core: str, blocks: int, mix_blocks: int, cores: dict[str, int]) -> float | None:
    """Device share of one kernel: its blocks over the cores of its core type.

    ``cores`` maps ``cube``, ``vector`` (NPU) or ``sm`` (CUDA) to the device's count.
    A MIX kernel occupies cube and vector cores together (``Block Num`` of its main
    type, ``Mix Block Num`` of the other; its share is the larger fraction); an
    AI_CPU kernel, or a task on no AI core (HCCL, DMA), shares none.  A core type
    whose count the device profile lacks gives ``None`` (no profiled share).

    >>> kernel_share("AI_CORE", 12, 0, {"cube": 24, "vector": 48})
    0.5
    >>> kernel_share("MIX_AIC", 24, 24, {"cube": 24, "vector": 48})
    1.0
    >>> kernel_share("AI_CPU", 1, 0, {"cube": 24, "vector": 48})
    0.0
    """
    need = {"AI_CORE": (("cube", blocks),), "AI_VECTOR_CORE": (("vector", blocks),),
            "MIX_AIC": (("cube", blocks), ("vector", mix_blocks)),
            "MIX_AIV": (("vector", blocks), ("cube", mix_blocks)), "SM": (("sm", blocks),)}
    if core not in need:
        return 0.0
    if any(not cores.get(kind) for kind, _ in need[core]):
        return None
    return min(1.0, max(n / cores[kind] for kind, n in need[core]))
