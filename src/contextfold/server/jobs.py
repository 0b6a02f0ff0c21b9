"""``JobWorker``: the derived work of stored turns (tags, vectors, compaction, tag summaries),
claimed from the store's jobs table by background threads, off every request's path.

The proxy commits each exchange raw and queues a ``derive`` job for its session in the same
transaction (``MemoryStore.commit_exchange``). Workers claim jobs one at a time (a session's
jobs never run at once, so its turns are tagged in order), run ``MemoryEngine.derive`` and
delete the job; a job that raises goes back to pending with its error and is retried a few
times before it is marked failed. Nothing is held in memory: a stop hands the jobs it holds
back to the store, and start-up first gives back the jobs of processes that died on this host
(``kill -9``), so pending work resumes wherever a worker runs next. While it runs, an idle
worker looks for such jobs again every ``reap_every`` seconds: another worker process of the
same server (``serve --workers``) killed meanwhile has its jobs finished here, without waiting
for their lease to run out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from contextfold._bounded import clip
from contextfold.store.models import owner_id

if TYPE_CHECKING:
    from contextfold.memory.compactor import CompactionReport
    from contextfold.memory.engine import MemoryEngine

__all__ = ["Foreground", "JobWorker"]

logger = logging.getLogger("contextfold.server.jobs")


class Foreground:
    """How many requests are doing their memory work right now; background work waits for
    a quiet moment (``wait_quiet``) so it does not compete with them for the interpreter.

    Requests arrive in bursts (clients paced by the same model answer together): derived
    work started in the middle of a burst takes the GIL from the requests of that burst and
    shows up in their tail latency, while it could run a few milliseconds later at no cost."""

    def __init__(self) -> None:
        self._active = 0
        self._cond = threading.Condition()

    def __enter__(self) -> Foreground:
        with self._cond:
            self._active += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    @property
    def active(self) -> int:
        return self._active

    def wait_quiet(self, limit: float) -> bool:
        """Wait until no request is doing memory work, at most ``limit`` seconds (under
        steady load the background work must still advance); whether it is quiet."""
        with self._cond:
            return self._cond.wait_for(lambda: self._active == 0, limit)


class JobWorker:
    """``threads`` background threads running the store's jobs for ``engine``."""

    def __init__(self, engine: MemoryEngine, *, threads: int = 1, idle: float = 0.2) -> None:
        self.engine = engine
        self.threads = threads
        self.idle = idle
        self.owner = owner_id()
        self.done = 0
        self.failed = 0
        self.errors: list[str] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._running: list[threading.Thread] = []
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        #: Called with a session id after its job is done (the dashboard's reply tags).
        self.on_done: Callable[[str], None] | None = None
        #: Called before each job is claimed; it may wait (``Foreground.wait_quiet``).
        self.gate: Callable[[], object] | None = None
        #: How often (seconds) the worker gives back the jobs of dead processes and calls
        #: ``on_tick`` (the dashboard's reply tags of jobs other processes ran).
        self.reap_every = 2.0
        self._reaped = time.monotonic()
        self.on_tick: Callable[[], object] | None = None
        #: Called with the report of each compaction a job ran (the terminal log's
        #: ``COMPACT`` line, the dashboard's compaction events).
        self.on_compacted: Callable[[CompactionReport], object] | None = None

    def start(self) -> None:
        """Give back the jobs of dead processes, then start the threads."""
        released = self.engine.store.jobs.release_jobs_of_dead()
        if released:
            logger.warning("resumed %d job(s) left running by a process that stopped", released)
        pending = self.engine.store.jobs.pending_jobs()
        if pending:
            logger.info("%d derive job(s) pending in the store; working through them", pending)
        for i in range(self.threads):
            thread = threading.Thread(target=self._run, name=f"contextfold-jobs-{i}", daemon=True)
            thread.start()
            self._running.append(thread)

    def idle_now(self) -> bool:
        """No job pending or running in the store, and none in this worker's hands."""
        with self._lock:
            if self._busy:
                return False
        return self.engine.store.jobs.pending_jobs() == 0

    def notify(self) -> None:
        """New work was queued: look now rather than at the next idle tick."""
        self._wake.set()

    def _run(self) -> None:
        store = self.engine.store
        while not self._stop.is_set():
            if self.gate is not None:
                self.gate()
            try:
                with self._lock:
                    job = store.jobs.claim_job(self.owner, skip=frozenset(self._busy))
                    if job is not None:
                        self._busy.add(job.session_id)
            except Exception as exc:  # a locked or broken store: wait and look again
                logger.warning("cannot claim a job: %s: %s", type(exc).__name__, exc)
                self._stop.wait(1.0)
                continue
            self._reap()
            if job is None:
                self._wake.wait(self.idle)
                self._wake.clear()
                continue
            try:
                report = self.engine.derive(job.session_id)
            except Exception as exc:  # kept in the store with its error, retried
                message = f"{type(exc).__name__}: {clip(str(exc))}"
                self.failed += 1
                self.errors = [*self.errors[-9:], message]
                logger.error("job %d (%s) failed: %s", job.id, job.session_id, message)
                self._settle(partial(store.jobs.fail_job, job.id, message, owner=self.owner))
            else:
                self.done += 1
                self._settle(partial(store.jobs.finish_job, job.id, self.owner))
                if report is not None and self.on_compacted is not None:
                    try:
                        self.on_compacted(report)
                    except Exception as exc:
                        logger.warning(
                            "after compaction: %s: %s", type(exc).__name__, clip(str(exc))
                        )
                if self.on_done is not None:
                    try:
                        self.on_done(job.session_id)
                    except Exception as exc:
                        logger.warning(
                            "after job %d: %s: %s", job.id, type(exc).__name__, clip(str(exc))
                        )
            finally:
                with self._lock:
                    self._busy.discard(job.session_id)

    def _reap(self) -> None:
        """Every ``reap_every`` seconds (in one thread of the worker): ``on_tick``, and give
        back the jobs of processes of this host that died."""
        with self._lock:
            if time.monotonic() - self._reaped < self.reap_every:
                return
            self._reaped = time.monotonic()
        if self.on_tick is not None:
            try:
                self.on_tick()
            except Exception as exc:
                logger.warning("on_tick: %s: %s", type(exc).__name__, clip(str(exc)))
        try:
            released = self.engine.store.jobs.release_jobs_of_dead()
        except Exception as exc:
            logger.warning("cannot look for dead workers' jobs: %s: %s", type(exc).__name__, exc)
            return
        if released:
            logger.warning("resumed %d job(s) left running by a process that stopped", released)
            self._wake.set()

    def _settle(self, write: Callable[[], object]) -> None:
        try:
            write()
        except Exception as exc:  # the lease runs out and the job is claimed again
            logger.warning("cannot record a job's outcome: %s: %s", type(exc).__name__, exc)

    def stop(self, timeout: float = 2.0) -> int:
        """Stop the threads (a job still running after ``timeout`` seconds is left to its
        thread, which is a daemon), give back the jobs this process holds, and return how
        many jobs are pending in the store."""
        self._stop.set()
        self._wake.set()
        for thread in self._running:
            thread.join(timeout)
        self._running.clear()
        try:
            self.engine.store.jobs.release_jobs(self.owner)
            return self.engine.store.jobs.pending_jobs()
        except Exception as exc:
            logger.warning("cannot release jobs at stop: %s: %s", type(exc).__name__, exc)
            return -1
