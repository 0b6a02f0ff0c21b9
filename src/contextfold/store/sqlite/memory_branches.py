"""``MemoryStore``'s conversation tree and its derived work: principals, branches, exchanges
committed with their job (``SqliteBranches``, a part of the store's core) — the jobs table
itself is the ``store.jobs`` facet (``memory_jobs.py``).

**Principals.** Every session belongs to one principal: the keyed hash of the credential that
wrote it (``''`` for sessions the library creates). Lookups by content (``turns_with_key``)
never cross principals.

**Branches.** A conversation is a tree. ``fork(session, upto)`` starts a new session whose
history is its parent's turns ``1..upto`` (copied with their tags and vectors, and with the
compacted segments that lie wholly inside them), so a request that continues an older turn, or
an edited history, sees only its own ancestry and never what the parent said after the fork.

**Exchanges and jobs.** ``commit_exchange`` appends raw turns and queues a ``derive`` job for
the session in the same transaction: the turns are durable the moment it returns, and the
derived work (tags, vectors, compaction, tag summaries) is a row that any worker claims
(``jobs.claim_job``), finishes (``jobs.finish_job``) or gives back (``jobs.fail_job``). A job
whose worker died is claimed again: by lease (``lease_until`` passed) or, on one host, when
its owner process is gone (``jobs.release_jobs_of_dead``).

>>> from contextfold.items import Message
>>> from contextfold.tokens import CharCounter
>>> from contextfold.store.sqlite.memory import MemoryStore
>>> store = MemoryStore(counter=CharCounter())
>>> sid = store.create_session("a", principal="p1")
>>> store.commit_exchange(sid, [Message(role="user", content="hi"),
...                             Message(role="assistant", content="hello")])
[1, 2]
>>> job = store.jobs.claim_job("worker-1")
>>> (job.session_id, job.kind, store.jobs.job_counts())
('a', 'derive', {'running': 1})
>>> store.jobs.finish_job(job.id, "worker-1")  # still the worker's: done
True
>>> store.jobs.pending_jobs()
0
>>> branch = store.fork(sid, 1)
>>> [t.message.text() for t in store.turns(branch)], store.session(branch).parent_id
(['hi'], 'a')
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from contextfold._bounded import SessionLRU
from contextfold.errors import ConfigError
from contextfold.items import Message
from contextfold.store.models import (
    WRITE_CHUNK,
    BranchMoved,
    PendingDerive,
    _iso,
    _now,
    check_appended,
)
from contextfold.store.sqlite.memory_db import MemoryDb, insert_turns, last_seq, turn_rows
from contextfold.store.sqlite.memory_jobs import enqueue

if TYPE_CHECKING:
    from contextfold.store.sqlite.memory import MemoryStore

__all__ = ["KEY_CHAIN_SESSIONS", "SqliteBranches"]


class _KeyChain:
    """One session's turn match keys in seq order (``keys[i]`` is seq ``i + 1``), the content
    hash of the last of them and the incarnation of the session they were read from,
    extended from the store as turns are appended."""

    __slots__ = ("incarnation", "keys", "last_hash", "lock")

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.last_hash: str | None = None
        self.incarnation: int | None = None
        self.lock = threading.Lock()

    def _reset(self) -> None:
        self.keys, self.last_hash, self.incarnation = [], None, None

    def extend(self, conn: sqlite3.Connection, session_id: str) -> bool:
        """Read the turns stored since the last call, with the session's incarnation, in one
        query (one snapshot): from the last known turn, whose hash must not have changed and
        the incarnation neither, else from the start (the session was deleted and created
        again, by this process or another, perhaps ending with the same turn); False when the
        seqs are not 1, 2, … without gaps (the chain is then dropped and the caller reads the
        store itself). No session: no keys."""
        known = len(self.keys)
        rows = conn.execute(
            "SELECT s.born, t.seq, t.match_key, t.content_hash FROM sessions s"
            " LEFT JOIN turns t ON t.session_id = s.id AND t.seq >= ?"
            " WHERE s.id = ? ORDER BY t.seq",
            (max(known, 1), session_id),
        ).fetchall()
        if not rows:  # no such session (now)
            self._reset()
            return True
        incarnation = int(rows[0][0])
        turns = [row[1:] for row in rows if row[1] is not None]
        if known:
            if (
                incarnation == self.incarnation
                and turns
                and turns[0][0] == known
                and turns[0][2] == self.last_hash
            ):
                turns = turns[1:]
            else:  # deleted and written again: start over
                self._reset()
                return self.extend(conn, session_id)
        self.incarnation = incarnation
        for seq, key, content_hash in turns:
            if seq != len(self.keys) + 1:
                self._reset()
                return False
            self.keys.append(str(key))
            self.last_hash = str(content_hash)
        return True


#: Sessions whose turn match keys are kept in memory (``turn_keys``).
KEY_CHAIN_SESSIONS = 256


class SqliteBranches:
    """The part of ``MemoryStore``'s core that holds its lookups by principal and match key,
    its branches and its exchanges; the store's methods of these names call it. Made with
    the store's connections and the store itself (``store``: the sessions and turns it
    reads and writes)."""

    def __init__(self, db: MemoryDb, store: MemoryStore) -> None:
        self._db = db
        self._store = store
        # Match keys of recently used sessions (``turn_keys``).
        self._key_chains: SessionLRU[_KeyChain] = SessionLRU(KEY_CHAIN_SESSIONS)

    # -- lookups --------------------------------------------------------------------------------

    def principal_of(self, session_id: str) -> str | None:
        row = self._db.conn.execute(
            "SELECT principal FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def turns_with_key(
        self, principal: str, key: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[tuple[str, int]]:
        """(session, seq) of the principal's turns whose match key is ``key``, newest first
        (within ``session_id`` only, when given)."""
        sql = (
            "SELECT t.session_id, t.seq FROM turns t JOIN sessions s ON s.id = t.session_id"
            " WHERE t.match_key = ? AND s.principal = ?"
        )
        params: list[object] = [key, principal]
        if session_id is not None:
            sql += " AND t.session_id = ?"
            params.append(session_id)
        sql += " ORDER BY t.id DESC LIMIT ?"
        params.append(limit)
        return [(str(r[0]), int(r[1])) for r in self._db.conn.execute(sql, params)]

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        """(session, last seq) of the principal's conversation that stored a turn last, or
        None when it has none."""
        row = self._db.conn.execute(
            "SELECT t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id"
            " WHERE s.principal = ? ORDER BY t.id DESC LIMIT 1",
            (principal,),
        ).fetchone()
        if row is None:
            return None
        return str(row[0]), last_seq(self._db.conn, str(row[0]))

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        """seq -> match key of the session's turns with ``lo <= seq <= hi``.

        Served from the session's key chain (``_KeyChain``): turns are append-only, so each
        call reads only the turns stored since the last one, plus the session's incarnation
        and the last known turn, in the same query, to check that the session was not deleted
        and written again meanwhile (then it is read over). Recognising a resent history then
        costs one short query, not one row per turn."""
        chain = self._key_chains.get(session_id, _KeyChain)
        with chain.lock:
            if not chain.extend(self._db.conn, session_id):
                rows = self._db.conn.execute(
                    "SELECT seq, match_key FROM turns WHERE session_id = ? AND seq BETWEEN ? AND ?",
                    (session_id, lo, hi),
                )
                return {int(r[0]): str(r[1]) for r in rows}
            keys = chain.keys
            return {seq: keys[seq - 1] for seq in range(max(lo, 1), min(hi, len(keys)) + 1)}

    # -- branches -------------------------------------------------------------------------------

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str:
        """A new branch of ``session_id`` holding its turns ``1..upto`` (with their tags and
        vectors, the segments wholly inside them and the compaction watermark those segments
        reach); returns the new session's id. The derived state past the copy is queued as a
        ``derive`` job. ``ConfigError`` (nothing written) when ``session_id_new`` exists."""
        new = session_id_new or uuid.uuid4().hex
        with self._db.tx() as conn:
            row = conn.execute(
                "SELECT principal, metadata, derived_seq FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise ConfigError(f"unknown session {session_id!r}")
            last = last_seq(conn, session_id)
            if not 0 <= upto <= last:
                raise ConfigError(f"session {session_id!r} has no turn {upto} to fork at")
            segments = conn.execute(
                "SELECT * FROM segments WHERE session_id = ? AND last_seq <= ? ORDER BY first_seq",
                (session_id, upto),
            ).fetchall()
            watermark = max((int(s["last_seq"]) + 1 for s in segments), default=0)
            try:
                conn.execute(
                    "INSERT INTO sessions (id, created_at, metadata, principal, parent_id,"
                    " fork_seq, derived_seq, compaction_watermark)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        new,
                        _iso(_now()),
                        json.dumps({**json.loads(row["metadata"]), "forked_from": session_id}),
                        row["principal"],
                        session_id,
                        upto,
                        min(int(row["derived_seq"]), upto),
                        watermark,
                    ),
                )
            except sqlite3.IntegrityError as exc:  # the first write: the rollback undoes none
                raise ConfigError(f"session {new!r} already exists") from exc
            conn.execute(
                "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
                " content_hash, created_at, token_count, match_key, partial)"
                " SELECT ?, seq, role, content_text, message_json, content_hash, created_at,"
                " token_count, match_key, partial FROM turns WHERE session_id = ? AND seq <= ?"
                " ORDER BY seq",
                (new, session_id, upto),
            )
            conn.execute(
                "INSERT INTO turn_tags (session_id, seq, tag, weight, related)"
                " SELECT ?, seq, tag, weight, related FROM turn_tags"
                " WHERE session_id = ? AND seq <= ?",
                (new, session_id, upto),
            )
            conn.execute(
                "INSERT INTO turn_vectors (session_id, seq, model, vector)"
                " SELECT ?, seq, model, vector FROM turn_vectors WHERE session_id = ? AND seq <= ?",
                (new, session_id, upto),
            )
            for seg in segments:
                cursor = conn.execute(
                    "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text,"
                    " tags, related_tags, summary_tokens, full_tokens, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        new,
                        seg["first_seq"],
                        seg["last_seq"],
                        seg["summary"],
                        seg["full_text"],
                        seg["tags"],
                        seg["related_tags"],
                        seg["summary_tokens"],
                        seg["full_tokens"],
                        seg["created_at"],
                    ),
                )
                conn.execute(
                    "INSERT INTO segment_turns (segment_id, seq)"
                    " SELECT ?, seq FROM segment_turns WHERE segment_id = ?",
                    (cursor.lastrowid, seg["id"]),
                )
            if segments or upto:
                enqueue(conn, new, "derive")
        return new

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
        """Append ``messages`` raw and queue the session's ``derive`` job; returns their seqs.
        With ``expect_last``, raise ``BranchMoved`` instead when the session's last turn is
        no longer that seq (another request continued it first).

        Up to ``WRITE_CHUNK`` messages are one transaction. A longer history (a client's
        first request carrying a long conversation) is written ``WRITE_CHUNK`` turns per
        transaction, the last one with the job, so the writes of other sessions go in
        between instead of waiting for the whole of it (the process's writers take turns,
        ``_tx``); each chunk checks that the branch still ends where the previous one left
        it (``BranchMoved`` otherwise). A crash between chunks leaves the first turns of the
        history stored without the reply: a prefix of what the client sent, which its next
        request continues or forks from like any history."""
        if timestamps is not None and len(timestamps) != len(messages):
            raise ConfigError(
                f"{len(messages)} messages need as many timestamps, got {len(timestamps)}"
            )
        rows = turn_rows(self._store.counter, messages, timestamps, partial)
        seqs: list[int] = []
        expected = expect_last
        starts = range(0, max(len(rows), 1), WRITE_CHUNK)
        for start in starts:
            chunk = rows[start : start + WRITE_CHUNK]
            with self._db.tx() as conn:
                if (
                    conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
                    is None
                ):
                    raise ConfigError(f"unknown session {session_id!r}")
                if expected is not None:
                    last = last_seq(conn, session_id)
                    if last != expected:
                        raise BranchMoved(session_id, expected, last)
                seqs += insert_turns(conn, session_id, chunk)
                if seqs and start == starts[-1]:
                    enqueue(conn, session_id, "derive")
            expected = seqs[-1] if seqs else expected
        return seqs

    def mark_derived(self, session_id: str, seq: int) -> None:
        """Turns up to ``seq`` are derived (tagged and embedded)."""
        with self._db.tx() as conn:
            conn.execute(
                "UPDATE sessions SET derived_seq = MAX(derived_seq, ?) WHERE id = ?",
                (seq, session_id),
            )

    def begin_derive(
        self,
        session_id: str,
        *,
        context: int = 0,
        append: Sequence[Message] = (),
        timestamps: Sequence[datetime] | None = None,
    ) -> PendingDerive:
        """Append ``append``, drop the session's pending ``derive`` job and read the session,
        its live tokens and its turns after ``derived_seq - context``, in one transaction."""
        check_appended(append, timestamps)
        rows = turn_rows(self._store.counter, append, timestamps)
        with self._db.tx() as conn:
            record = self._store.session(session_id)
            if rows:
                insert_turns(conn, session_id, rows)
            conn.execute(
                "DELETE FROM jobs WHERE session_id = ? AND kind = 'derive' AND state = 'pending'",
                (session_id,),
            )
            live = self._store.active_tokens(session_id)
            turns = self._store.turn_texts_after(session_id, max(0, record.derived_seq - context))
        return PendingDerive(record, live, turns)

    def write_derived(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
        derived_seq: int,
    ) -> tuple[int, int]:
        """``set_tags_many`` and ``mark_derived`` in one transaction (``BEGIN IMMEDIATE``: no
        other writer between the two generations read); (generation before, after)."""
        with self._db.tx():
            before = self._store.session_version(session_id)
            if before is None:
                raise ConfigError(f"unknown session {session_id!r}")
            self._store.set_tags_many(session_id, tagged)
            self.mark_derived(session_id, derived_seq)
            after = self._store.session_version(session_id)
        assert after is not None  # the session's row is this transaction's
        return before[1], after[1]
