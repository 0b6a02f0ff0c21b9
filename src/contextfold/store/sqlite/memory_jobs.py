"""``MemoryStore.jobs`` (``SqliteJobs``): the queue of derived work that every process sharing
the store takes from (``memory_branches.py``'s docstring tells how a job comes and goes).

``commit_exchange``, ``fork`` and ``load_session`` queue a session's ``derive`` in their own
transactions with ``enqueue``.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from contextfold.store.models import MAX_ATTEMPTS, Job, _iso, _now
from contextfold.store.sqlite.memory_db import MemoryDb

__all__ = ["LEASE_SECONDS", "SqliteJobs", "enqueue"]

#: How long a claimed job is its worker's before another may take it (seconds).
LEASE_SECONDS = 60.0


def _held(job_id: int, owner: str | None) -> tuple[str, tuple[object, ...]]:
    """The WHERE clause of "job ``job_id``, while ``owner`` runs it" (any state without an
    owner)."""
    if owner is None:
        return "id = ?", (job_id,)
    return "id = ? AND state = 'running' AND owner = ?", (job_id, owner)


def enqueue(conn: sqlite3.Connection, session_id: str, kind: str) -> None:
    """Queue ``kind`` for the session on ``conn``, in its transaction (nothing when one is
    already pending)."""
    conn.execute(
        "INSERT INTO jobs (session_id, kind, created_at) VALUES (?, ?, ?)"
        " ON CONFLICT (session_id, kind) WHERE state = 'pending' DO NOTHING",
        (session_id, kind, _iso(_now())),
    )


class SqliteJobs:
    """``store.jobs``: enqueue, claim, finish, fail and release jobs, over the store's
    ``MemoryDb``."""

    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def enqueue_job(self, session_id: str, kind: str = "derive") -> None:
        """Queue ``kind`` for the session (nothing when one is already pending)."""
        with self._db.tx() as conn:
            enqueue(conn, session_id, kind)

    def drop_pending_job(self, session_id: str, kind: str = "derive") -> None:
        """Remove the session's pending ``kind`` job (its work is about to be done in line)."""
        with self._db.tx() as conn:
            conn.execute(
                "DELETE FROM jobs WHERE session_id = ? AND kind = ? AND state = 'pending'",
                (session_id, kind),
            )

    def claim_job(
        self,
        owner: str,
        *,
        lease: float = LEASE_SECONDS,
        skip: AbstractSet[str] = frozenset(),
    ) -> Job | None:
        """Take the oldest job that is pending, or running with its lease expired, and whose
        session has no other running job (a session's work runs in order); ``None`` when
        there is none. ``skip``: sessions not to take now."""
        now = time.time()
        with self._db.tx() as conn:
            rows = conn.execute(
                "SELECT j.id, j.session_id, j.kind, j.attempts FROM jobs j"
                " WHERE (j.state = 'pending' OR (j.state = 'running' AND j.lease_until < ?))"
                " AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.session_id = j.session_id"
                " AND r.id != j.id AND r.state = 'running' AND r.lease_until >= ?)"
                " ORDER BY j.id LIMIT 64",
                (now, now),
            ).fetchall()
            row = next((r for r in rows if r[1] not in skip), None)
            if row is None:
                return None
            conn.execute(
                "UPDATE jobs SET state = 'running', owner = ?, lease_until = ?,"
                " attempts = attempts + 1 WHERE id = ?",
                (owner, now + lease, row[0]),
            )
        return Job(id=row[0], session_id=row[1], kind=row[2], attempts=row[3] + 1)

    def finish_job(self, job_id: int, owner: str | None = None) -> bool:
        """Remove a job its worker has done; whether it was still that worker's. ``owner``:
        only while ``owner`` holds it — a job given back meanwhile (``release_jobs`` at a
        stop, or claimed again after its lease) stands for work queued since the claim and
        stays."""
        held, params = _held(job_id, owner)
        with self._db.tx() as conn:
            return conn.execute(f"DELETE FROM jobs WHERE {held}", params).rowcount > 0

    def fail_job(
        self, job_id: int, error: str, *, retry: bool = True, owner: str | None = None
    ) -> bool:
        """Give a job back after an error: pending again (or ``failed`` for good after
        ``MAX_ATTEMPTS``, or when ``retry`` is false), its error kept; whether it was still
        the worker's (``owner`` as in ``finish_job``: a job given back meanwhile is left as
        it is)."""
        held, params = _held(job_id, owner)
        with self._db.tx() as conn:
            row = conn.execute(
                f"SELECT session_id, kind, attempts FROM jobs WHERE {held}", params
            ).fetchone()
            if row is None:
                return False
            again = retry and row[2] < MAX_ATTEMPTS
            if again:
                # A pending job of the session may have been queued meanwhile: it covers this.
                conn.execute(
                    "DELETE FROM jobs WHERE session_id = ? AND kind = ? AND state = 'pending'",
                    (row[0], row[1]),
                )
            conn.execute(
                "UPDATE jobs SET state = ?, owner = NULL, lease_until = NULL, error = ?"
                " WHERE id = ?",
                ("pending" if again else "failed", error[:2000], job_id),
            )
        return True

    def release_jobs(self, owner: str) -> int:
        """Give back every job ``owner`` holds (it is stopping); returns how many."""
        with self._db.tx() as conn:
            return self._release(conn, "owner = ?", (owner,))

    def release_jobs_of_dead(self, alive: Callable[[int], bool] | None = None) -> int:
        """Give back the running jobs whose owner is a process of this host that no longer
        runs (a crash); returns how many."""
        host = socket.gethostname()
        check = alive or _pid_alive
        dead = []
        for (owner,) in self._db.conn.execute(
            "SELECT DISTINCT owner FROM jobs WHERE state = 'running' AND owner IS NOT NULL"
        ):
            name, _, pid = str(owner).rpartition(":")
            if name == host and pid.isdigit() and not check(int(pid)):
                dead.append(owner)
        with self._db.tx() as conn:
            return sum(self._release(conn, "owner = ?", (owner,)) for owner in dead)

    @staticmethod
    def _release(conn: sqlite3.Connection, where: str, params: tuple[object, ...]) -> int:
        rows = conn.execute(
            f"SELECT id, session_id, kind FROM jobs WHERE state = 'running' AND {where}", params
        ).fetchall()
        for job_id, session_id, kind in rows:
            pending = conn.execute(
                "SELECT 1 FROM jobs WHERE session_id = ? AND kind = ? AND state = 'pending'",
                (session_id, kind),
            ).fetchone()
            if pending:  # the pending one does the same work
                conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            else:
                conn.execute(
                    "UPDATE jobs SET state = 'pending', owner = NULL, lease_until = NULL"
                    " WHERE id = ?",
                    (job_id,),
                )
        return len(rows)

    def pending_jobs(self) -> int:
        """Jobs not done yet (pending or running)."""
        row = self._db.conn.execute(
            "SELECT COUNT(*) FROM jobs WHERE state IN ('pending', 'running')"
        ).fetchone()
        return int(row[0])

    def job_counts(self) -> dict[str, int]:
        """Jobs by state (``pending``, ``running``, ``failed``)."""
        rows = self._db.conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {str(r[0]): int(r[1]) for r in rows}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
