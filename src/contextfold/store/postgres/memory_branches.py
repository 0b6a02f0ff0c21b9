"""``PostgresMemoryStore``'s conversation tree and its derived work: lookups by principal and
match key, branches (forks), exchanges committed with their job, and the jobs table — the
same semantics as the SQLite store's ``memory_branches.py`` (read its docstring), made safe
for writers in many processes:

- an exchange's seqs are assigned under the session's row lock, and ``expect_last`` is
  checked under it (``BranchMoved``);
- ``claim_job`` locks its candidate with ``FOR UPDATE SKIP LOCKED`` (workers never wait on
  each other's candidates) and takes a transaction-scoped advisory lock on the job's session
  before checking that the session has no other running job, so two workers never run one
  session's work at once; leases are measured on the server's clock, which every host
  shares.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from contextfold._bounded import SessionLRU
from contextfold.errors import ConfigError
from contextfold.items import Message
from contextfold.store.keychain import KeyChain
from contextfold.store.models import MAX_ATTEMPTS, WRITE_CHUNK, Job, _now, pid_alive
from contextfold.store.postgres.fts import Indexed, Tokenizer
from contextfold.store.postgres.search import SEGMENTS, TURNS, add_totals

if TYPE_CHECKING:
    from datetime import datetime

    import psycopg

__all__ = ["LEASE_SECONDS", "BranchesMixin"]

#: How long a claimed job is its worker's before another may take it (seconds).
LEASE_SECONDS = 60.0

_SERVER_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"


def _held(job_id: int, owner: str | None) -> tuple[str, tuple[object, ...]]:
    """The WHERE clause of "job ``job_id``, while ``owner`` runs it"."""
    if owner is None:
        return "id = %s", (job_id,)
    return "id = %s AND state = 'running' AND owner = %s", (job_id, owner)


class BranchesMixin:
    """Principals, branches, exchanges and jobs, for ``PostgresMemoryStore``."""

    if TYPE_CHECKING:
        _key_chains: SessionLRU[KeyChain]
        _tokenizer: Tokenizer

        def _tx(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _read(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _statement(
            self, *, guarded: bool = False
        ) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _turn_rows(
            self,
            session_id: str,
            messages: Sequence[Message],
            timestamps: Sequence[datetime] | None = None,
            partial: Sequence[bool] | None = None,
        ) -> list[tuple[tuple[Any, ...], Indexed]]: ...

        def _insert_turns(
            self,
            session_id: str,
            rows: Sequence[tuple[tuple[Any, ...], Indexed]],
            *,
            expected: int | None = None,
            enqueue: str | None = None,
        ) -> list[int]: ...

        @staticmethod
        def _last_seq(conn: psycopg.Connection[Any], session_id: str) -> int: ...

        @staticmethod
        def _count_live(conn: psycopg.Connection[Any], session_id: str) -> None: ...

    # -- lookups --------------------------------------------------------------------------------

    def principal_of(self, session_id: str) -> str | None:
        with self._read() as conn:
            row = conn.execute(
                "SELECT principal FROM sessions WHERE id = %s", (session_id,)
            ).fetchone()
        return None if row is None else str(row[0])

    def turns_with_key(
        self, principal: str, key: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[tuple[str, int]]:
        """(session, seq) of the principal's turns whose match key is ``key``, newest first
        (within ``session_id`` only, when given)."""
        sql = (
            "SELECT t.session_id, t.seq FROM turns t JOIN sessions s ON s.id = t.session_id"
            " WHERE t.match_key = %s AND s.principal = %s"
        )
        params: list[object] = [key, principal]
        if session_id is not None:
            sql += " AND t.session_id = %s"
            params.append(session_id)
        sql += " ORDER BY t.id DESC LIMIT %s"
        params.append(limit)
        with self._read() as conn:
            return [(str(r[0]), int(r[1])) for r in conn.execute(sql, params)]

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        """(session, last seq) of the principal's conversation that stored a turn last."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id"
                " WHERE s.principal = %s ORDER BY t.id DESC LIMIT 1",
                (principal,),
            ).fetchone()
            if row is None:
                return None
            return str(row[0]), self._last_seq(conn, str(row[0]))

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        """seq -> match key of the session's turns with ``lo <= seq <= hi``, from the
        session's ``KeyChain`` (each call reads only the turns stored since the last one).

        The chain recognises the last turn it knows by the turn's row id rather than its
        content hash: row ids are never reused, so a session deleted and written again is
        read over even when its new last turn says the same as the old one."""
        chain = self._key_chains.get(session_id, KeyChain)
        with chain.lock, self._read() as conn:

            def read(start: int) -> list[tuple[Any, ...]]:
                return conn.execute(
                    "SELECT seq, match_key, id::text FROM turns WHERE session_id = %s"
                    " AND seq >= %s ORDER BY seq",
                    (session_id, start),
                ).fetchall()

            if not chain.extend(read):
                rows = conn.execute(
                    "SELECT seq, match_key FROM turns WHERE session_id = %s"
                    " AND seq BETWEEN %s AND %s",
                    (session_id, lo, hi),
                )
                return {int(r[0]): str(r[1]) for r in rows}
            return chain.window(lo, hi)

    # -- branches -------------------------------------------------------------------------------

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str:
        """A new branch of ``session_id`` holding its turns ``1..upto`` (with their tags and
        vectors, the segments wholly inside them and the compaction watermark those segments
        reach); returns the new session's id. The derived state past the copy is queued as a
        ``derive`` job."""
        import psycopg

        new = session_id_new or uuid.uuid4().hex
        id_tokens = self._tokenizer.session_tokens(new)
        with self._tx() as conn:
            row = conn.execute(
                "SELECT principal, metadata, derived_seq FROM sessions WHERE id = %s FOR SHARE",
                (session_id,),
            ).fetchone()
            if row is None:
                raise ConfigError(f"unknown session {session_id!r}")
            last = self._last_seq(conn, session_id)
            if not 0 <= upto <= last:
                raise ConfigError(f"session {session_id!r} has no turn {upto} to fork at")
            segments = conn.execute(
                "SELECT id, last_seq FROM segments WHERE session_id = %s AND last_seq <= %s"
                " ORDER BY first_seq, id",
                (session_id, upto),
            ).fetchall()
            watermark = max((int(s[1]) + 1 for s in segments), default=0)
            try:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO sessions (id, created_at, metadata, principal, parent_id,"
                        " fork_seq, derived_seq, compaction_watermark, id_tokens)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (
                            new,
                            _now(),
                            json.dumps({**json.loads(row[1]), "forked_from": session_id}),
                            row[0],
                            session_id,
                            upto,
                            min(int(row[2]), upto),
                            watermark,
                            id_tokens,
                        ),
                    )
            except psycopg.errors.UniqueViolation as exc:
                raise ConfigError(f"session {new!r} already exists") from exc
            self._copy_turns(conn, session_id, new, upto, id_tokens)
            self._count_live(conn, new)
            for segment_id, _ in segments:
                self._copy_segment(conn, int(segment_id), new, id_tokens)
            if segments or upto:
                self._enqueue(conn, new, "derive")
        return new

    @staticmethod
    def _copy_turns(
        conn: psycopg.Connection[Any], source: str, new: str, upto: int, id_tokens: int
    ) -> None:
        """Copy turns ``1..upto`` of ``source`` into ``new`` with their tags, vectors and
        full-text terms (counted again in the totals: the new id has its own tokens)."""
        conn.execute(
            "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
            " content_hash, created_at, token_count, match_key, partial, text_tokens)"
            " SELECT %s, seq, role, content_text, message_json, content_hash, created_at,"
            " token_count, match_key, partial, text_tokens FROM turns"
            " WHERE session_id = %s AND seq <= %s ORDER BY seq",
            (new, source, upto),
        )
        for table, columns in (
            ("turn_tags", "seq, tag, weight, related"),
            ("turn_vectors", "seq, model, vector"),
            ("turn_terms", "seq, term, positions, text_tokens"),
        ):
            conn.execute(
                f"INSERT INTO {table} (session_id, {columns}) SELECT %s, {columns}"
                f" FROM {table} WHERE session_id = %s AND seq <= %s",
                (new, source, upto),
            )
        row = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(text_tokens), 0) FROM turns WHERE session_id = %s",
            (new,),
        ).fetchone()
        if row is not None:
            n, tokens = int(row[0]), int(row[1])
            add_totals(conn, TURNS, new, n, tokens + n * id_tokens)

    @staticmethod
    def _copy_segment(
        conn: psycopg.Connection[Any], segment_id: int, new: str, id_tokens: int
    ) -> None:
        """Copy one segment into session ``new``, with its turns and full-text terms."""
        row = conn.execute(
            "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text, tags,"
            " related_tags, summary_tokens, full_tokens, created_at, text_tokens)"
            " SELECT %s, first_seq, last_seq, summary, full_text, tags, related_tags,"
            " summary_tokens, full_tokens, created_at, text_tokens FROM segments WHERE id = %s"
            " RETURNING id, text_tokens",
            (new, segment_id),
        ).fetchone()
        assert row is not None  # the segment was read in this transaction
        copy, text_tokens = int(row[0]), int(row[1])
        conn.execute(
            "INSERT INTO segment_turns (segment_id, seq)"
            " SELECT %s, seq FROM segment_turns WHERE segment_id = %s",
            (copy, segment_id),
        )
        conn.execute(
            "INSERT INTO segment_terms (segment_id, session_id, term, positions, text_tokens,"
            " first_seq) SELECT %s, %s, term, positions, text_tokens, first_seq"
            " FROM segment_terms WHERE segment_id = %s",
            (copy, new, segment_id),
        )
        add_totals(conn, SEGMENTS, new, 1, text_tokens + id_tokens)

    # -- exchanges ------------------------------------------------------------------------------

    def commit_exchange(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        partial: Sequence[bool] | None = None,
        expect_last: int | None = None,
        timestamps: Sequence[datetime] | None = None,
    ) -> list[int]:
        """Append ``messages`` raw and queue the session's ``derive`` job; their seqs. With
        ``expect_last``, raise ``BranchMoved`` instead when the session's last turn is no
        longer that seq. A history longer than ``WRITE_CHUNK`` turns is written one chunk per
        transaction, each checking that the branch still ends where the previous one left
        it (as the SQLite store does)."""
        if timestamps is not None and len(timestamps) != len(messages):
            raise ConfigError(
                f"{len(messages)} messages need as many timestamps, got {len(timestamps)}"
            )
        rows = self._turn_rows(session_id, messages, timestamps, partial)
        seqs: list[int] = []
        expected = expect_last
        starts = range(0, max(len(rows), 1), WRITE_CHUNK)
        for start in starts:
            seqs += self._insert_turns(
                session_id,
                rows[start : start + WRITE_CHUNK],
                expected=expected,
                enqueue="derive" if start == starts[-1] else None,
            )
            expected = seqs[-1] if seqs else expected
        return seqs

    def mark_derived(self, session_id: str, seq: int) -> None:
        """Turns up to ``seq`` are derived (tagged and embedded)."""
        with self._statement() as conn:
            conn.execute(
                "UPDATE sessions SET derived_seq = GREATEST(derived_seq, %s) WHERE id = %s",
                (seq, session_id),
            )

    # -- jobs -----------------------------------------------------------------------------------

    @staticmethod
    def _enqueue(conn: psycopg.Connection[Any], session_id: str, kind: str) -> None:
        conn.execute(
            "INSERT INTO jobs (session_id, kind, created_at) VALUES (%s, %s, %s)"
            " ON CONFLICT (session_id, kind) WHERE state = 'pending' DO NOTHING",
            (session_id, kind, _now()),
        )

    def enqueue_job(self, session_id: str, kind: str = "derive") -> None:
        """Queue ``kind`` for the session (nothing when one is already pending)."""
        with self._statement() as conn:
            self._enqueue(conn, session_id, kind)

    def drop_pending_job(self, session_id: str, kind: str = "derive") -> None:
        """Remove the session's pending ``kind`` job (its work is about to be done in line)."""
        with self._statement() as conn:
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
        with self._tx() as conn:
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
        with self._statement() as conn:
            return conn.execute(f"DELETE FROM jobs WHERE {held}", params).rowcount > 0

    def fail_job(
        self, job_id: int, error: str, *, retry: bool = True, owner: str | None = None
    ) -> bool:
        """Give a job back after an error: pending again (or ``failed`` for good after
        ``MAX_ATTEMPTS``, or when ``retry`` is false), its error kept; whether it was still
        the worker's."""
        held, params = _held(job_id, owner)
        with self._tx() as conn:
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
        with self._tx() as conn:
            return self._release(conn, owner)

    def release_jobs_of_dead(self, alive: Callable[[int], bool] | None = None) -> int:
        """Give back the running jobs whose owner is a process of this host that no longer
        runs (a crash); returns how many. Owners on other hosts are left to their lease."""
        host = socket.gethostname()
        check = alive or pid_alive
        dead = []
        with self._read() as conn:
            owners = conn.execute(
                "SELECT DISTINCT owner FROM jobs WHERE state = 'running' AND owner IS NOT NULL"
            ).fetchall()
        for (owner,) in owners:
            name, _, pid = str(owner).rpartition(":")
            if name == host and pid.isdigit() and not check(int(pid)):
                dead.append(owner)
        with self._tx() as conn:
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
        with self._read() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE state IN ('pending', 'running')"
            ).fetchone()
        return int(row[0]) if row else 0

    def job_counts(self) -> dict[str, int]:
        """Jobs by state (``pending``, ``running``, ``failed``)."""
        with self._read() as conn:
            rows = conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}
