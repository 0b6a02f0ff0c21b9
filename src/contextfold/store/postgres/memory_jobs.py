"""``PostgresMemoryStore.jobs`` (``PostgresJobs``): the queue of derived work that every
process sharing the database takes from — the same semantics as the SQLite store's
``memory_jobs.py``, made safe for workers in many processes: ``claim_job`` locks its candidate
with ``FOR UPDATE SKIP LOCKED`` (workers never wait on each other's candidates) and takes a
transaction-scoped advisory lock on the job's session before checking that the session has no
other running job, so two workers never run one session's work at once; leases are measured
on the server's clock, which every host shares.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from contextfold.store.models import MAX_ATTEMPTS, Job, _now, pid_alive
from contextfold.store.postgres.connection import Database

if TYPE_CHECKING:
    import psycopg

__all__ = ["LEASE_SECONDS", "PostgresJobs", "enqueue"]

#: How long a claimed job is its worker's before another may take it (seconds).
LEASE_SECONDS = 60.0

_SERVER_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"


def _held(job_id: int, owner: str | None) -> tuple[str, tuple[object, ...]]:
    """The WHERE clause of "job ``job_id``, while ``owner`` runs it"."""
    if owner is None:
        return "id = %s", (job_id,)
    return "id = %s AND state = 'running' AND owner = %s", (job_id, owner)


def enqueue(conn: psycopg.Connection[Any], session_id: str, kind: str) -> None:
    """Queue ``kind`` for the session on ``conn``, in its transaction (nothing when one is
    already pending)."""
    conn.execute(
        "INSERT INTO jobs (session_id, kind, created_at) VALUES (%s, %s, %s)"
        " ON CONFLICT (session_id, kind) WHERE state = 'pending' DO NOTHING",
        (session_id, kind, _now()),
    )


class PostgresJobs:
    """``store.jobs``: enqueue, claim, finish, fail and release jobs, over the store's
    ``Database``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def enqueue_job(self, session_id: str, kind: str = "derive") -> None:
        """Queue ``kind`` for the session (nothing when one is already pending)."""
        with self._db.statement() as conn:
            enqueue(conn, session_id, kind)

    def drop_pending_job(self, session_id: str, kind: str = "derive") -> None:
        """Remove the session's pending ``kind`` job (its work is about to be done in line)."""
        with self._db.statement() as conn:
            conn.execute(
                "DELETE FROM jobs WHERE session_id = %s AND kind = %s AND state = 'pending'",
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
        with self._db.tx() as conn:
            found = conn.execute(_SERVER_NOW).fetchone()
            now = float(found[0]) if found else 0.0
            candidates = conn.execute(
                "SELECT j.id, j.session_id, j.kind, j.attempts FROM jobs j"
                " WHERE (j.state = 'pending' OR (j.state = 'running' AND j.lease_until < %s))"
                " AND NOT (j.session_id = ANY(%s))"
                " AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.session_id = j.session_id"
                " AND r.id != j.id AND r.state = 'running' AND r.lease_until >= %s)"
                " ORDER BY j.id LIMIT 64 FOR UPDATE SKIP LOCKED",
                (now, sorted(skip), now),
            ).fetchall()
            for job_id, session_id, kind, attempts in candidates:
                if not self._session_is_free(conn, job_id, session_id, now):
                    continue
                conn.execute(
                    "UPDATE jobs SET state = 'running', owner = %s, lease_until = %s,"
                    " attempts = attempts + 1 WHERE id = %s",
                    (owner, now + lease, job_id),
                )
                return Job(id=job_id, session_id=session_id, kind=kind, attempts=attempts + 1)
        return None

    @staticmethod
    def _session_is_free(
        conn: psycopg.Connection[Any], job_id: int, session_id: str, now: float
    ) -> bool:
        """Whether this worker may run a job of the session: it holds the session's claim
        lock (until its transaction ends) and, seen after taking it, no other job of the
        session runs — a claim committed by another worker meanwhile is seen here."""
        locked = conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (session_id,)
        ).fetchone()
        if not locked or not locked[0]:
            return False
        busy = conn.execute(
            "SELECT 1 FROM jobs WHERE session_id = %s AND id != %s AND state = 'running'"
            " AND lease_until >= %s",
            (session_id, job_id, now),
        ).fetchone()
        return busy is None

    def finish_job(self, job_id: int, owner: str | None = None) -> bool:
        """Remove a job its worker has done; whether it was still that worker's."""
        held, params = _held(job_id, owner)
        with self._db.statement() as conn:
            return conn.execute(f"DELETE FROM jobs WHERE {held}", params).rowcount > 0

    def fail_job(
        self, job_id: int, error: str, *, retry: bool = True, owner: str | None = None
    ) -> bool:
        """Give a job back after an error: pending again (or ``failed`` for good after
        ``MAX_ATTEMPTS``, or when ``retry`` is false), its error kept; whether it was still
        the worker's."""
        held, params = _held(job_id, owner)
        with self._db.tx() as conn:
            row = conn.execute(
                f"SELECT session_id, kind, attempts FROM jobs WHERE {held} FOR UPDATE", params
            ).fetchone()
            if row is None:
                return False
            again = retry and row[2] < MAX_ATTEMPTS
            if again:
                # A pending job of the session may have been queued meanwhile: it covers this.
                conn.execute(
                    "DELETE FROM jobs WHERE session_id = %s AND kind = %s AND state = 'pending'",
                    (row[0], row[1]),
                )
            conn.execute(
                "UPDATE jobs SET state = %s, owner = NULL, lease_until = NULL, error = %s"
                " WHERE id = %s",
                ("pending" if again else "failed", error[:2000], job_id),
            )
        return True

    def release_jobs(self, owner: str) -> int:
        """Give back every job ``owner`` holds (it is stopping); returns how many."""
        with self._db.tx() as conn:
            return self._release(conn, owner)

    def release_jobs_of_dead(self, alive: Callable[[int], bool] | None = None) -> int:
        """Give back the running jobs whose owner is a process of this host that no longer
        runs (a crash); returns how many. Owners on other hosts are left to their lease."""
        host = socket.gethostname()
        check = alive or pid_alive
        dead = []
        with self._db.read() as conn:
            owners = conn.execute(
                "SELECT DISTINCT owner FROM jobs WHERE state = 'running' AND owner IS NOT NULL"
            ).fetchall()
        for (owner,) in owners:
            name, _, pid = str(owner).rpartition(":")
            if name == host and pid.isdigit() and not check(int(pid)):
                dead.append(owner)
        with self._db.tx() as conn:
            return sum(self._release(conn, owner) for owner in dead)

    @staticmethod
    def _release(conn: psycopg.Connection[Any], owner: str) -> int:
        rows = conn.execute(
            "SELECT id, session_id, kind FROM jobs WHERE state = 'running' AND owner = %s"
            " ORDER BY id FOR UPDATE",
            (owner,),
        ).fetchall()
        for job_id, session_id, kind in rows:
            pending = conn.execute(
                "SELECT 1 FROM jobs WHERE session_id = %s AND kind = %s AND state = 'pending'",
                (session_id, kind),
            ).fetchone()
            if pending:  # the pending one does the same work
                conn.execute("DELETE FROM jobs WHERE id = %s", (job_id,))
            else:
                conn.execute(
                    "UPDATE jobs SET state = 'pending', owner = NULL, lease_until = NULL"
                    " WHERE id = %s",
                    (job_id,),
                )
        return len(rows)

    def pending_jobs(self) -> int:
        """Jobs not done yet (pending or running)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE state IN ('pending', 'running')"
            ).fetchone()
        return int(row[0]) if row else 0

    def job_counts(self) -> dict[str, int]:
        """Jobs by state (``pending``, ``running``, ``failed``)."""
        with self._db.read() as conn:
            rows = conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}
