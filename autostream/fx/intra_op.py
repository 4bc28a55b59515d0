"""The calling thread's intra-op thread count, set without touching the process's default.

``torch.set_num_threads(n)`` does three things: it sets the calling thread's OpenMP count
and MKL's count for that thread, and it stores ``n`` as ATen's process-wide default.
Every thread that runs its first ATen op afterwards takes that default as its own
count, and Dynamo's guards read it (``GLOBAL_STATE changed: num_threads``): a runtime
that gives its worker threads one thread each with ``torch.set_num_threads`` gives one
thread to every thread the user starts meanwhile and recompiles their models.

:class:`IntraOpThreads` sets only the first two, through the OpenMP and MKL libraries
torch itself is linked with (``omp_set_num_threads``, ``mkl_set_num_threads_local_``).
Where they cannot be found (a torch without OpenMP, another platform's library names),
:meth:`IntraOpThreads.find` says why and nothing is set.

>>> threads = IntraOpThreads.find()
>>> before = torch.get_num_threads()
>>> if threads.available:
...     previous = threads.set(1)
...     assert torch.get_num_threads() == 1
...     threads.restore(previous)
>>> torch.get_num_threads() == before
True
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

#: torch's CPU library, by platform; OpenMP's and MKL's symbols resolve through it
_TORCH_CPU_LIBRARY = {"linux": "libtorch_cpu.so", "darwin": "libtorch_cpu.dylib",
                      "win32": "torch_cpu.dll"}


@dataclass(frozen=True)
class Previous:
    """A thread's counts before :meth:`IntraOpThreads.set` (what ``restore`` puts back)."""

    openmp: int
    #: MKL's count for this thread (0: MKL's global setting), ``None`` without MKL
    mkl: int | None


@dataclass(frozen=True)
class IntraOpThreads:
    """Setters of the calling thread's intra-op threads; ``why_not`` when there are none."""

    openmp: Callable[[int], None] | None
    #: MKL's Fortran entry point (its argument by reference), ``None`` without MKL
    mkl: Callable[[ctypes.c_int], int] | None = None
    why_not: str = ""

    @classmethod
    def find(cls) -> IntraOpThreads:
        """The setters of the OpenMP and MKL libraries this torch runs ops with."""
        backend = torch.__config__.parallel_info().split("ATen parallel backend:")[-1]
        if "OpenMP" not in backend:
            return cls(None, why_not="torch's intra-op threads are not OpenMP's here: their "
                       "count is process-wide, so every stream keeps the caller's")
        path = os.path.join(os.path.dirname(torch.__file__), "lib",
                            _TORCH_CPU_LIBRARY.get(sys.platform, ""))
        try:
            library = ctypes.CDLL(path)
            openmp = library.omp_set_num_threads
        except (OSError, AttributeError) as exc:
            return cls(None, why_not=f"OpenMP's omp_set_num_threads was not found through "
                       f"{path} ({exc}): every stream keeps the caller's intra-op threads")
        openmp.argtypes, openmp.restype = [ctypes.c_int], None
        mkl = getattr(library, "mkl_set_num_threads_local_", None)
        if mkl is not None:
            mkl.argtypes, mkl.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
        return cls(openmp, mkl)

    @property
    def available(self) -> bool:
        return self.openmp is not None

    def set(self, count: int) -> Previous:
        """Give the calling thread ``count`` intra-op threads; its counts before are returned."""
        if self.openmp is None:
            raise RuntimeError(f"cannot set this thread's intra-op threads: {self.why_not}")
        if count < 1:
            raise ValueError(f"intra-op threads must be >= 1, got {count}")
        # ATen sets a thread's count from its process default at the thread's first use:
        # done now, or it would overwrite ``count`` at the first op
        openmp = torch.get_num_threads()
        self.openmp(count)
        mkl = self.mkl(ctypes.byref(ctypes.c_int(count))) if self.mkl is not None else None
        return Previous(openmp, mkl)

    def restore(self, previous: Previous) -> None:
        """Put back the counts :meth:`set` returned (on the thread that called it)."""
        if self.openmp is None:
            return
        self.openmp(previous.openmp)
        if self.mkl is not None and previous.mkl is not None:
            self.mkl(ctypes.byref(ctypes.c_int(previous.mkl)))


@contextlib.contextmanager
def threads_here(count: int, setter: IntraOpThreads | None = None) -> Iterator[None]:
    """The calling thread runs the block with ``count`` intra-op threads, its own counts
    put back after it.  Where no thread's own count can be set (``setter.available`` is
    false), torch's process-wide count is set and put back instead.

    >>> with threads_here(1):
    ...     torch.get_num_threads()
    1
    """
    setter = setter or IntraOpThreads.find()
    if setter.available:
        previous = setter.set(count)
        try:
            yield
        finally:
            setter.restore(previous)
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["IntraOpThreads", "Previous", "threads_here"]
