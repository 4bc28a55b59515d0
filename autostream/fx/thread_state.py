"""The thread-local state that changes what an op computes, captured on one thread and carried to another.

Grad mode, inference mode, forward-mode AD and autocast (enabled per device type,
its dtype, its cast cache) live in thread-local storage: an op run on a worker thread
would otherwise run in the worker's defaults, and compute float32 where the caller's
autocast asked for bfloat16, or normal tensors where the caller's inference mode made
inference tensors.  Deterministic algorithms, anomaly mode, the default dtype and the
float32 matmul precision are process-wide (every thread sees them) and need no carrying.
What cannot be carried (an active ``TorchFunctionMode`` or ``TorchDispatchMode``, a
functorch transform) is named by :meth:`ThreadState.uncarried`; the dispatch-key sets
are part of the state, so any other thread-local guard shows up as a difference.

>>> import threading
>>> with torch.no_grad():
...     state = ThreadState.capture()
>>> seen = []
>>> def worker():
...     with state.carried():
...         seen.append(ThreadState.capture() == state)
>>> t = threading.Thread(target=worker); t.start(); t.join()
>>> seen
[True]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch


def autocast_device_types() -> tuple[str, ...]:
    """Device types with an autocast mode in this torch (``privateuseone`` under its name)."""
    names = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "maia",
             torch._C._get_privateuse1_backend_name())
    return tuple(dict.fromkeys(d for d in names if torch._C._is_autocast_available(d)))


@dataclass(frozen=True)
class ThreadState:
    """One thread's state that decides what ops compute (equal states compute the same)."""

    grad: bool
    inference: bool
    forward_grad: bool
    #: ``(device_type, dtype)`` of every device type whose autocast is enabled
    autocast: tuple[tuple[str, torch.dtype], ...]
    autocast_cache: bool
    #: thread-local state no worker is given (modes, functorch transforms)
    modes: tuple[str, ...]
    #: the thread-local dispatch-key include and exclude sets (``DispatchKeySet.raw_repr``)
    dispatch_keys: tuple[int, int]

    @classmethod
    def capture(cls) -> ThreadState:
        """The calling thread's state."""
        autocast = tuple((d, torch.get_autocast_dtype(d)) for d in autocast_device_types()
                         if torch.is_autocast_enabled(d)) \
            if torch._C._is_any_autocast_enabled() else ()
        return cls(
            grad=torch.is_grad_enabled(),
            inference=torch.is_inference_mode_enabled(),
            forward_grad=torch._C._is_fwd_grad_enabled(),
            autocast=autocast,
            autocast_cache=torch.is_autocast_cache_enabled() if autocast else True,
            modes=_active_modes(),
            dispatch_keys=(torch._C._dispatch_tls_local_include_set().raw_repr(),
                           torch._C._dispatch_tls_local_exclude_set().raw_repr()),
        )

    @property
    def checks_only(self) -> bool:
        """The only modes are checks that never change what ops compute (nothing to warn of)."""
        return bool(self.modes) and all(m.split()[-1] in _CHECKING_MODES for m in self.modes)

    def uncarried(self) -> str | None:
        """Why this state cannot be given to another thread, or ``None``."""
        if self.modes:
            return f"it runs under {' and '.join(self.modes)}, which other threads do not see"
        return None

    @contextlib.contextmanager
    def carried(self) -> Iterator[None]:
        """Run the block under this state (on a thread in torch's default state)."""
        with contextlib.ExitStack() as stack:
            if self.inference:
                stack.enter_context(torch.inference_mode())
            stack.enter_context(torch.set_grad_enabled(self.grad))
            if self.forward_grad != torch._C._is_fwd_grad_enabled():
                stack.enter_context(torch.autograd.forward_ad._set_fwd_grad_enabled(
                    self.forward_grad))
            for device_type, dtype in self.autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype,
                                                   cache_enabled=self.autocast_cache))
            yield

    def differences(self, other: ThreadState) -> list[str]:
        """``field: mine != theirs`` for each field that differs.

        >>> a = ThreadState.capture()
        >>> with torch.no_grad():
        ...     a.differences(ThreadState.capture())
        ['grad: True != False']
        """
        return [f"{f.name}: {_shown(self, f.name)} != {_shown(other, f.name)}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


def _shown(state: ThreadState, name: str) -> object:
    from_raw = getattr(torch._C.DispatchKeySet, "from_raw_repr", None)  # not in older torch
    if name == "dispatch_keys" and from_raw is not None:
        return tuple(str(from_raw(k)) for k in state.dispatch_keys)
    return getattr(state, name)


#: modes that only check the ops they see (AOTAutograd's first call of a training graph)
_CHECKING_MODES = frozenset({"_AnalyzeCustomOpInputOutputMode"})


def _active_modes() -> tuple[str, ...]:
    modes = []
    if torch._C._len_torch_function_stack():
        modes.append("a TorchFunctionMode")
    for i in range(torch._C._len_torch_dispatch_stack()):
        modes.append(f"TorchDispatchMode {type(torch._C._get_dispatch_stack_at(i)).__name__}")
    if torch._C._functorch.peek_interpreter_stack() is not None:
        modes.append("a functorch transform (vmap, grad, jvp)")
    return tuple(modes)
