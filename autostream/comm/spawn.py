"""Run a function on N real ranks (``torch.multiprocessing`` spawn), bounded in time.

Each rank joins a fresh process group on the given backend, runs
``fn(rank, world_size, *args)`` and sends back its result.  The group's TCP store is
served by the calling process on a port the system picks and that stays bound for the
whole run: the ranks connect to it as clients.  (A port found free and released, for
rank 0 to bind seconds later once torch is imported, can be taken meanwhile by any
process on the machine: rank 0 then failed with ``EADDRINUSE`` and the other ranks
waited for a store that never came, or joined another run's.)  A run
that does not finish within ``timeout_s`` (a hang: collectives issued in different
orders on NCCL/HCCL, or a deadlock) is killed and reported as :class:`RanksFailed`,
as is a rank that raises (its traceback is in the message) or dies: a rank killed
by a signal (an abort in C++ code) leaves the Python traceback of its threads, which
the message quotes.

``fn`` must be importable by the child processes (a module-level function).
"""

from __future__ import annotations

import os
import queue
import socket
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Any

#: the address every rank's store client and process group use
HOST = "127.0.0.1"
#: seconds a rank that has answered gets to exit before it is killed
EXIT_GRACE_S = 10.0


class RanksFailed(RuntimeError):
    """A multi-process run that raised, died or did not finish in time."""


def free_port() -> int:
    """A TCP port free right now on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_store(world_size: int, timeout_s: float | None = None) -> Any:
    """A c10d ``TCPStore`` served by this process on a port the system picks (its
    ``port``), for ``world_size`` ranks that connect as clients.

    >>> store = serve_store(2)
    >>> store.set("k", "v"); store.get("k"), store.port > 0
    (b'v', True)
    """
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s) if timeout_s is not None else (
        dist.constants.default_pg_timeout)
    return dist.TCPStore(HOST, 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=timeout)


def _rank_main(rank: int, world_size: int, port: int, backend: str, threads: int,
               fn: Callable[..., Any], args: Sequence[Any], results, timeout_s: float,
               fault_path: str, pg_timeout_s: float | None = None) -> None:
    import faulthandler
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # a rank killed by a signal leaves its threads' tracebacks for the parent to quote
    fault_file = open(fault_path, "w")  # noqa: SIM115 - open until the process ends
    faulthandler.enable(file=fault_file, all_threads=True)
    # a rank still running just before the parent kills it prints where it is stuck
    faulthandler.dump_traceback_later(max(timeout_s - 5.0, 1.0), exit=False)
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port))
    try:
        torch.set_num_threads(threads)
        timeout = None if pg_timeout_s is None else timedelta(seconds=pg_timeout_s)
        # a client of the caller's store (``serve_store``), whose port is bound all along
        store = dist.TCPStore(HOST, port, world_size, is_master=False,
                              timeout=timeout or dist.constants.default_pg_timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (),
              backend: str = "gloo", timeout_s: float = 300.0, threads: int = 1,
              pg_timeout_s: float | None = None) -> list[Any]:
    """``fn(rank, world_size, *args)`` on every rank; the results by rank.

    Raises :class:`RanksFailed` when a rank raises, dies or the run outlives
    ``timeout_s`` (every rank is then killed).  ``threads``: intra-op threads per rank;
    ``pg_timeout_s``: the process group's timeout (``None``: torch's default).
    """
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = serve_store(world_size, pg_timeout_s)  # bound until the run is over
    port = store.port
    got: dict[int, Any] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="autostream-ranks-") as faults:
        paths = [os.path.join(faults, f"rank{r}.fault") for r in range(world_size)]
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(r, world_size, port, backend, threads, fn, tuple(args),
                                   results, timeout_s, paths[r], pg_timeout_s))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        try:
            _collect(results, got, errors, world_size, timeout_s, procs, paths)
        finally:
            # ranks that answered exit on their own: killing one mid-exit leaves the
            # semaphores it registered for the resource tracker to report as leaked
            for p in procs:
                p.join(0.0 if errors else EXIT_GRACE_S)
                if p.is_alive():
                    p.kill()
                    p.join(5.0)
            results.close()
            results.join_thread()
    del store  # the ranks are gone: stop serving
    if errors:
        raise RanksFailed("\n".join(errors))
    return [got[r] for r in range(world_size)]


def _collect(results, got: dict[int, Any], errors: list[str], world_size: int,
             timeout_s: float, procs, fault_paths: Sequence[str]) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while len(got) + len(errors) < world_size:
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(range(world_size)) - set(got))
            errors.append(f"ranks {missing} did not finish within {timeout_s:g} s "
                          "(a hang: collectives in different orders, or a deadlock); killed")
            return
        try:
            rank, ok, value = results.get(timeout=min(left, 1.0))
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if not p.is_alive() and p.exitcode not in (0, None)
                    and i not in got]
            if dead:
                errors.append(f"ranks {dead} died (exit codes "
                              f"{[procs[i].exitcode for i in dead]})")
                tails = {i: _tail(fault_paths[i]) for i in dead}
                errors += [f"rank {i} at its death:\n{tail}" for i, tail in tails.items() if tail]
                return
            continue
        if ok:
            got[rank] = value
        else:
            errors.append(f"rank {rank} raised:\n{value}")


def _tail(path: str, lines: int = 40) -> str:
    """The last ``lines`` of a rank's fault file ("" when it wrote none)."""
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""
