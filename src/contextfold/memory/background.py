"""``Background``: the derived work a write leaves for later (a compaction ``on_turn_complete``
trips), run by one thread of the engine, off the caller's path.

Each piece of work is kept in the store first, as the session's pending ``derive`` job
(``MemoryStorage.jobs.enqueue_job``): a process stopped before its thread ran it leaves the job
for the next ``derive`` of the session or for a job worker (``server.jobs.JobWorker``), so
nothing is lost with the thread. A session queued here and not started yet is not queued
twice; a failure is logged, and the job goes back to the store for the next try.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from contextfold._bounded import clip
from contextfold.store.protocols import MemoryStorage

__all__ = ["Background"]

logger = logging.getLogger("contextfold.memory.background")


class Background:
    """Runs ``work(session_id)`` on one thread, for sessions whose job is kept in ``store``."""

    def __init__(self, store: MemoryStorage, work: Callable[[str], object]) -> None:
        self.store = store
        self.work = work
        self.failed = 0
        self._pool: ThreadPoolExecutor | None = None
        self._waiting: set[str] = set()  # queued here, not started yet
        self._futures: set[Future[None]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, session_id: str) -> None:
        """Keep the session's job in the store, then run it here (once, if already waiting)."""
        self.store.jobs.enqueue_job(session_id)
        with self._lock:
            if self._closed or session_id in self._waiting:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="contextfold-derive")
            self._waiting.add(session_id)
            future = self._pool.submit(self._run, session_id)
            self._futures.add(future)
            future.add_done_callback(self._futures.discard)

    def _run(self, session_id: str) -> None:
        with self._lock:
            self._waiting.discard(session_id)
        try:
            self.work(session_id)
        except Exception as exc:  # back to the store's queue, for the next derive or worker
            self.failed += 1
            logger.error(
                "background derive of %s failed: %s: %s",
                session_id[:16],
                type(exc).__name__,
                clip(str(exc)),
            )
            with contextlib.suppress(Exception):
                self.store.jobs.enqueue_job(session_id)

    @property
    def pending(self) -> int:
        """How many submitted runs have not finished."""
        with self._lock:
            return len(self._futures)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for every run submitted so far (at most ``timeout`` seconds); whether all
        finished."""
        with self._lock:
            futures = list(self._futures)
        _, not_done = wait(futures, timeout=timeout)
        return not not_done

    def close(self) -> None:
        """Finish the runs submitted, then stop the thread; later submits only keep the job."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
