"""CPU worker threads shared by every graph in the process (the threads runtime's side streams).

A call hands each of its side streams to an idle worker, starting one when none is idle;
a worker goes back to the idle list the moment its job returns.  So the workers alive are
bounded by the side streams of the calls running at once, not by the graphs compiled:
24 graphs of 2-4 streams called in turn use 3 workers.  A worker idle for ``idle_s``
seconds exits, so nothing outlives its use, even a runner that is never collected
(Dynamo keeps the compiled function of code after a graph break inside a helper in the
helper's module globals, ``__compiled_fn_N_...``, and never removes it).

Two side streams of one call never share a worker (each waits for the other's records);
two calls never share one either (a worker runs one job at a time and is only handed
out while idle), so concurrent calls cannot deadlock on the pool.

After ``os.fork`` the child's pool is empty (its threads do not exist there): workers
start again on its first call.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["IDLE_S", "WORKERS", "WorkerPool"]

#: seconds a worker waits for a job before it exits
IDLE_S = 5.0


class _Worker:
    """A daemon thread running the jobs its pool hands it, one at a time."""

    def __init__(self, pool: WorkerPool, name: str):
        self.pool = pool
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        pool = self.pool
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=pool.idle_s)
                except queue.Empty:
                    if pool._expire(self):
                        return
                    continue  # handed a job just now: it is in the queue
                if job is None:
                    return
                fn, future = job
                try:
                    result, error = fn(), None
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    result, error = None, exc
                # idle before the caller hears, so its next call finds this worker again
                pool._idle_again(self)
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
                # the finished job holds its call and so its runner: kept in this frame
                # while the loop waits for the next, it would keep the runner alive
                del job, fn, future, result, error
        finally:
            pool._gone(self)


class WorkerPool:
    """Worker threads handed out one job at a time; idle ones exit after ``idle_s`` seconds.

    >>> pool = WorkerPool(idle_s=60.0)
    >>> pool.submit(lambda: 6 * 7).result(timeout=60.0), pool.alive()
    (42, 1)
    >>> pool.trim(); pool.idle()
    0
    """

    def __init__(self, idle_s: float = IDLE_S, name: str = "autostream-worker"):
        if not idle_s > 0:
            raise ValueError(f"idle_s must be > 0 seconds, got {idle_s!r}")
        #: seconds a worker waits for a job before it exits (read at each wait)
        self.idle_s = idle_s
        self.name = name
        #: threads this pool started so far (counts for tests and reports)
        self.started = 0
        self._reset()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (pool := ref()) and pool._reset())

    def _reset(self) -> None:
        # reentrant: a runner collected by a gc pass inside a locked section may trim
        self._lock = threading.RLock()
        self._idle: list[_Worker] = []
        self._alive: set[_Worker] = set()

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on an idle worker (a new one if none is idle); its future."""
        future: Future = Future()
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                self.started += 1
                worker = _Worker(self, f"{self.name}-{self.started}")
                self._alive.add(worker)
                worker.thread.start()
        worker.jobs.put((fn, future))
        return future

    def alive(self) -> int:
        """Workers whose threads run now (busy or idle)."""
        with self._lock:
            return len(self._alive)

    def idle(self) -> int:
        """Workers waiting for a job."""
        with self._lock:
            return len(self._idle)

    def trim(self) -> None:
        """Stop every idle worker now (busy ones go on, and idle out later)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.jobs.put(None)

    def _idle_again(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def _expire(self, worker: _Worker) -> bool:
        """Leave the pool if still idle (True); False if it was just handed a job."""
        with self._lock:
            if worker not in self._idle:
                return False
            self._idle.remove(worker)
            return True

    def _gone(self, worker: _Worker) -> None:
        with self._lock:
            self._alive.discard(worker)


#: the process-wide pool every threads runner takes its workers from
WORKERS = WorkerPool()
