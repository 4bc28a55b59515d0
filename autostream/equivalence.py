"""Does the compiled model compute what eager computes?  Outputs, dtypes, tensor kinds, state, grads.

:func:`check_against_eager` compiles a deep copy of a model with ``autostream.backend``
and calls it beside another deep copy run eagerly, in lockstep, under one of
:data:`MODES`.  Every call's outputs must match eager in dtype, tensor kind (inference
tensors), shape and value (float32: ``rtol=atol=1e-4``; bfloat16/float16: ``2e-2``), and
so must the models' buffers and caches after each call (running statistics, a
``StaticCache``) and, in training steps, every parameter's gradient.  ``Check.bitwise``
says whether every one of those tensors was also equal to eager's bit for bit (or
differed only within the tolerance: rounding, ``docs/correctness.md``).

Modes: ``no_grad``; ``inference_mode``; ``autocast_bf16`` (CPU autocast to bfloat16,
under ``no_grad``); ``training`` (grad enabled and a backward pass of the outputs' sum;
the model's own train/eval mode is left as it is).

>>> from autostream.models.zoo import two_branch_gemv
>>> check = check_against_eager(lambda: two_branch_gemv(depth=2), "inference_mode",
...                             max_streams=2, cost_table="h200", measure=0, deterministic=True)
>>> check.mismatch, check.applied, check.lifted, check.bitwise
('', True, True, True)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from autostream.backend import backend
from autostream.planning.lift import LiftedPlan

MODES = ("no_grad", "inference_mode", "autocast_bf16", "training")


@dataclass(frozen=True)
class Check:
    """What one model under one mode did, compiled, against eager."""

    applied: bool  # a plan ran on several streams
    lifted: bool  # ... on the graph Dynamo captured
    mismatch: str = ""  # what differed from eager ("" when nothing did)
    not_lifted: tuple[str, ...] = ()  # why applied plans stayed on the ATen graph
    skipped: str = ""  # why nothing was compared: eager itself raised
    #: every tensor compared was equal to eager's bit for bit (else: within the tolerance)
    bitwise: bool = False


@contextlib.contextmanager
def mode_context(mode: str) -> Iterator[None]:
    """The thread state of ``mode`` (one of :data:`MODES`)."""
    contexts = {
        "no_grad": lambda: [torch.no_grad()],
        "inference_mode": lambda: [torch.inference_mode()],
        "autocast_bf16": lambda: [torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16)],
        "training": lambda: [torch.enable_grad()],
    }
    if mode not in contexts:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    with contextlib.ExitStack() as stack:
        for c in contexts[mode]():
            stack.enter_context(c)
        yield


def difference(got: torch.Tensor, expected: torch.Tensor, what: str) -> str:
    """Why ``got`` is not ``expected`` (dtype, tensor kind, shape, values), or ``""``.

    >>> difference(torch.ones(2), torch.ones(2, dtype=torch.bfloat16), "out")
    'out: dtype torch.float32 != torch.bfloat16'
    """
    if got.dtype != expected.dtype:
        return f"{what}: dtype {got.dtype} != {expected.dtype}"
    if got.is_inference() != expected.is_inference():
        return f"{what}: inference tensor {got.is_inference()} != {expected.is_inference()}"
    if got.shape != expected.shape:
        return f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    if not got.is_floating_point():
        return "" if torch.equal(got, expected) else f"{what}: values differ"
    tol = 2e-2 if got.dtype in (torch.bfloat16, torch.float16) else 1e-4
    g, e = got.detach().float(), expected.detach().float()
    close = torch.isclose(g, e, rtol=tol, atol=tol, equal_nan=True)
    if bool(close.all()):
        return ""
    return (f"{what}: {int((~close).sum())} of {g.numel()} values differ "
            f"(max abs {(g - e).abs().max().item():.3g})")


def bitwise_equal(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaNs at the same places count as equal).

    >>> bitwise_equal(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    True
    >>> bitwise_equal(torch.tensor(1.0), torch.tensor(1.0).nextafter(torch.tensor(2.0)))
    False
    """
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return False
    if torch.equal(got, expected):
        return True
    if not got.is_floating_point():
        return False
    nan = got.isnan()
    return torch.equal(nan, expected.isnan()) and torch.equal(got[~nan], expected[~nan])


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters, buffers and the tensors of a cache the model holds (``hf_zoo`` decode)."""
    out = dict(model.state_dict())
    cache = getattr(model, "cache", None)
    for i, layer in enumerate(getattr(cache, "layers", ())):
        for key, value in vars(layer).items():
            if isinstance(value, torch.Tensor):
                out[f"cache.layers.{i}.{key}"] = value
    return out


def _first_difference(got: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> str:
    if len(got) != len(expected):
        return f"{what}: {len(got)} tensors, eager {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        why = difference(g, e, f"{what} {i}")
        if why:
            return why
    return ""


def _step(model: torch.nn.Module, inputs: tuple, training: bool) -> list[torch.Tensor]:
    outputs = _tensors(model(*inputs))
    if training:
        loss = sum(o.float().sum() for o in outputs if o.requires_grad)
        if isinstance(loss, torch.Tensor):
            loss.backward()
    return outputs


def _compare_call(compiled: torch.nn.Module, eager: torch.nn.Module,
                  got: list[torch.Tensor], expected: list[torch.Tensor], call: int
                  ) -> tuple[str, bool]:
    """The first difference beyond the tolerance (or ``""``), and whether every tensor
    was equal bit for bit."""
    def grads(m: torch.nn.Module) -> list[torch.Tensor]:
        return [p.grad for p in m.parameters() if p.grad is not None]

    pairs = [(got, expected, "output"),
             (list(model_state(compiled).values()), list(model_state(eager).values()), "state"),
             (grads(compiled), grads(eager), "grad")]
    for g, e, what in pairs:
        why = _first_difference(g, e, f"call {call} {what}")
        if why:
            return why, False
    exact = all(bitwise_equal(a, b) for g, e, _ in pairs for a, b in zip(g, e, strict=True))
    return "", exact


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:120] if text else ''}"


def _edit(outputs: list[torch.Tensor], inputs: tuple) -> None:
    """Add 1 to every floating output not sharing storage with an input, as a caller may."""
    held = {t.untyped_storage().data_ptr() for t in _tensors(inputs)}
    with torch.no_grad():
        for t in outputs:
            if t.is_floating_point() and t.untyped_storage().data_ptr() not in held:
                t.add_(1)


def _edited_later(kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> str:
    """The first earlier output that later calls left different from eager's same output
    (a later call may write an earlier output only where eager's does too: a cache)."""
    for call, (got, expected) in enumerate(kept):
        why = _first_difference(got, expected, f"after the last call, call {call} output")
        if why:
            return why
    return ""


def check_against_eager(factory: Callable[[], tuple[torch.nn.Module, tuple]], mode: str,
                        calls: int = 3, edit_outputs: bool = False, **options: Any) -> Check:
    """Compile ``factory()``'s model with ``backend(**options)``; ``calls`` calls beside eager.

    ``edit_outputs``: after each call the caller adds 1 to both sides' floating outputs
    (those not sharing storage with an input), and after the last call every earlier
    call's outputs must still match eager's.
    """
    model, inputs = factory()
    eager, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
    torch._dynamo.reset()
    be = backend(**options)
    compiled = torch.compile(compiled_model, backend=be)
    training, mismatch, bitwise = mode == "training", "", True
    kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    try:
        for call in range(calls):
            with mode_context(mode):
                try:
                    expected = _step(eager, inputs, training)
                except Exception as exc:  # noqa: BLE001 - the case does not apply
                    return Check(False, False, skipped=f"eager raised {_first_line(exc)}")
                try:
                    got = _step(compiled, inputs, training)
                except Exception as exc:  # noqa: BLE001 - a failure is a mismatch
                    mismatch = f"call {call} raised {_first_line(exc)}"
                    break
            mismatch, exact = _compare_call(compiled_model, eager, got, expected, call)
            bitwise = bitwise and exact
            if mismatch:
                break
            if edit_outputs:
                with mode_context(mode):
                    _edit(got, inputs)
                    _edit(expected, inputs)
                kept.append((got, expected))
        mismatch = mismatch or _edited_later(kept)
    finally:
        torch._dynamo.reset()
    lifts = list(be.lifts)
    return Check(applied=any(r.applied for r in be.autostream_pass.reports),
                 lifted=any(isinstance(x, LiftedPlan) for x in lifts), mismatch=mismatch,
                 not_lifted=tuple(str(x) for x in lifts if not isinstance(x, LiftedPlan)),
                 bitwise=bitwise and not mismatch)
