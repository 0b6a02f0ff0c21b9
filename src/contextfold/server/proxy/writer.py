"""``TurnWriter``: the proxy's memory writes, in order, on one thread, off the response path.

Each proxied turn ends with a job (store and tag the turn with ``on_turn_complete``, update the
dashboard record). Jobs run one at a time, first in first out, so the turns of a session are
stored in the order their replies finished. A job that raises is retried (``attempts`` in
all, with a short pause); a job that still fails is logged with its error and counted in
``failed`` — never dropped silently. ``drain`` waits until every submitted job has run (the
server calls it at shutdown, so no turn is lost when it stops).

>>> writer = TurnWriter()
>>> done = []
>>> writer.submit(lambda: done.append(1))
>>> writer.drain(5.0), done
(True, [1])
>>> writer.close()
True
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from contextfold._bounded import clip

__all__ = ["TurnWriter"]

logger = logging.getLogger("contextfold.server.proxy")

Job = Callable[[], None]


#: Jobs run after one wait for a quiet moment (``gate``).
BATCH = 256


class TurnWriter:
    def __init__(self, *, attempts: int = 3, pause: float = 0.05) -> None:
        self.attempts = attempts
        self.pause = pause
        self.completed = 0
        self.failed = 0
        self.errors: list[str] = []  # the last errors of jobs that failed every attempt
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._open = 0  # streams still running, whose jobs are yet to come
        #: Called before each job runs; it may wait (``Foreground.wait_quiet``).
        self.gate: Callable[[], object] | None = None

    def opened(self) -> None:
        """A stream has started; its job will be submitted when it ends (``closed``)."""
        with self._queue.all_tasks_done:
            self._open += 1

    def closed(self) -> None:
        with self._queue.all_tasks_done:
            self._open -= 1
            self._queue.all_tasks_done.notify_all()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="contextfold-turn-writer", daemon=True
                )
                self._thread.start()
        self._queue.put(job)

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished yet, and streams whose jobs are yet to come."""
        return self._queue.unfinished_tasks + self._open

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is not None and self.gate is not None:
                self.gate()  # once per batch: under steady load the queue still drains
            batch = [job]
            while job is not None and len(batch) < BATCH:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(job)
            for job in batch:
                try:
                    if job is None:
                        return  # ``close``: every job queued before it has run
                    self._attempt(job)
                finally:
                    self._queue.task_done()

    def _attempt(self, job: Job) -> None:
        for attempt in range(1, self.attempts + 1):
            try:
                job()
            except Exception as exc:  # logged and retried; counted when it never succeeds
                if attempt == self.attempts:
                    self.failed += 1
                    message = f"{type(exc).__name__}: {clip(str(exc))}"
                    self.errors = [*self.errors[-9:], message]
                    logger.error("memory write failed %d times, giving up: %s", attempt, message)
                    return
                logger.warning(
                    "memory write failed (attempt %d), retrying: %s", attempt, clip(str(exc))
                )
                time.sleep(self.pause * attempt)
            else:
                self.completed += 1
                return

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every running stream has ended and every job has run; False if
        ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks or self._open:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                done.wait(left)
        return True

    def close(self, timeout: float | None = 30.0) -> bool:
        """Drain, then stop the thread. Returns whether everything was written."""
        drained = self.drain(timeout)
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join(timeout)
        return drained
