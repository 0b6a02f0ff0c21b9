"""The conversation-memory store in PostgreSQL: what many processes and hosts share.

``PostgresMemoryStore`` keeps the ``MemoryStorage`` contract (``store/protocols.py``) exactly
as the SQLite store (``store/sqlite/memory.py``) does — the same return values, errors,
orderings and tie-breaks — so the conformance suite runs unchanged against both:

- **Connections.** A ``psycopg_pool`` pool of autocommit connections: a one-statement write
  is its own transaction, a longer one opens a transaction, and ``batch()`` holds one for
  the calling thread, which every write (and read) of that thread joins
  (``connection.Database``).
- **Raw turns are append-only**: a plpgsql trigger refuses an ``UPDATE`` or ``DELETE`` of a
  turn unless ``delete_session`` is deleting its session. An append is one server-side call
  (``cf_append_json``) that assigns the seqs while holding the session's row lock
  (``SELECT … FOR UPDATE``), so writers in any number of processes never collide, and
  ``commit_exchange(expect_last=)`` checks the last seq under that lock.
- **Full text** ranks with FTS5's bm25 over FTS5's own tokens (``fts.py``, ``search.py``):
  a recall scores the same turns the same on either backend.
- **Vectors** are float32 bytes (``bytea``), returned as the numpy matrix the SQLite store
  returns; recall scans them exactly in numpy. (pgvector would move the scan into the server;
  it is not used, so the store runs on any PostgreSQL 13+ with no extension.)
- **Ordering of text** is byte order (``COLLATE "C"``), as SQLite's ``BINARY``.

The store is the core (``MemoryStorage``) and its facets (``store/facets.py``), each a class
made with the store's ``connection.Database``, split over modules by responsibility:
``memory.py`` (``PostgresMemoryStore``: sessions, raw turns, exchanges, the derive's read, turn
search), ``memory_derived.py`` (turn tags and vectors, the derive's write:
``PostgresDerived``), ``memory_branches.py`` (lookups, turn keys, forks: ``PostgresBranches``),
``memory_state.py`` (segments and compaction: ``PostgresSegments``; ``store.paging``: tag
summaries and the working set; ``store.costs``: the cost log), ``memory_jobs.py``
(``store.jobs``), ``memory_vocab.py`` (``store.vocab``: aliases, tag splits, related-tag
counts), ``memory_transfer.py`` (``store.transfer``: dumping and loading whole sessions),
``memory_records.py`` (``store.records``: request records, response links), ``memory_db.py``
(statements they share), ``schema.py`` (migrations), ``connection.py`` (the pool),
``search.py`` and ``fts.py`` (full text). The core's methods whose code lives in
``memory_derived.py``, ``memory_branches.py`` and ``memory_state.py`` call it there.

Needs ``contextfold[postgres]`` (psycopg 3 and psycopg-pool)::

    store = PostgresMemoryStore("postgresql://app:secret@db/memory", counter=CharCounter())
    sid = store.create_session("demo")
    store.append_turns(sid, [Message(role="user", content="Deploy the API on Friday")])
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError
from contextfold.items import Message
from contextfold.store.models import (
    WRITE_CHUNK,
    BranchMoved,
    NewSegment,
    PendingDerive,
    SessionRecord,
    StoredSegment,
    StoredTurn,
    TurnRow,
    _message_json,
    _now,
    check_appended,
    message_key,
)
from contextfold.store.postgres.connection import Database, from_text, to_text, utc
from contextfold.store.postgres.fts import Indexed, Tokenizer
from contextfold.store.postgres.memory_branches import PostgresBranches
from contextfold.store.postgres.memory_db import last_seq
from contextfold.store.postgres.memory_derived import PostgresDerived
from contextfold.store.postgres.memory_jobs import PostgresJobs
from contextfold.store.postgres.memory_records import PostgresRecords
from contextfold.store.postgres.memory_state import PostgresCosts, PostgresPaging, PostgresSegments
from contextfold.store.postgres.memory_transfer import PostgresTransfer
from contextfold.store.postgres.memory_vocab import PostgresVocab
from contextfold.store.postgres.schema import (
    BRANCH_MOVED,
    MIGRATIONS,
    SESSION_COLUMNS,
    UNKNOWN_SESSION,
)
from contextfold.store.postgres.search import SEGMENTS, TURNS, add_totals, ranked, shard
from contextfold.tokens import TiktokenCounter, TokenCounter

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresMemoryStore"]

# A turn's tags with their weights, and its related tags.
_TurnTags = tuple[dict[str, float], list[str]]

_TURN_COLUMNS = "session_id, seq, message_json, created_at, content_hash, token_count, partial"


def _appended(rows: Sequence[tuple[tuple[Any, ...], Indexed]]) -> tuple[str, str]:
    """New turns (``PostgresMemoryStore._turn_rows``) as the server functions take them
    (``schema.cf_append_json``): a JSON array of one [role, text, body, hash, created, tokens,
    key, partial, text tokens] per turn, and one of [turn index from 1, term, positions]."""
    turns = []
    terms: list[tuple[int, str, str]] = []
    for i, (row, indexed) in enumerate(rows, start=1):
        turns.append([*row[:4], row[4].isoformat(), *row[5:]])
        terms.extend(
            (i, term, "{" + ",".join(map(str, offsets)) + "}")
            for term, offsets in indexed.terms.items()
        )
    return (
        json.dumps(turns, ensure_ascii=False, separators=(",", ":")),
        json.dumps(terms, ensure_ascii=False, separators=(",", ":")),
    )


class PostgresMemoryStore:
    """The ``MemoryStorage`` of a PostgreSQL database at ``url`` (``postgresql://…``).

    ``counter`` counts each turn's text once, when it is appended (default ``cl100k_base``);
    ``pool_size`` caps the connections this process opens (threads beyond it wait for one).
    ``path`` is the URL with its password masked.
    """

    def __init__(
        self,
        url: str,
        *,
        counter: TokenCounter | None = None,
        pool_size: int = 10,
    ) -> None:
        self._db = Database(url, min_size=1, max_size=pool_size)
        self.path = self._db.masked
        self.counter: TokenCounter = (
            counter if counter is not None else TiktokenCounter("cl100k_base")
        )
        self._tokenizer = Tokenizer()
        with self._db.pool.connection() as conn:
            MIGRATIONS.apply(conn)
        # The parts of the core kept in modules of their own, and the facets.
        self._derived = PostgresDerived(self._db)
        self._branches = PostgresBranches(self._db, self._tokenizer)
        self._segments = PostgresSegments(self._db, self.counter, self._tokenizer)
        self.records = PostgresRecords(self._db)
        self.vocab = PostgresVocab(self._db)
        self.jobs = PostgresJobs(self._db)
        self.costs = PostgresCosts(self._db)
        self.paging = PostgresPaging(self._db, self.counter)
        self.transfer = PostgresTransfer(self._db, self, self._tokenizer)

    def _tx(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self._db.tx()

    def _read(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self._db.read()

    def _statement(
        self, *, guarded: bool = False
    ) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self._db.statement(guarded=guarded)

    def close(self) -> None:
        self._db.close()

    def batch(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """One transaction around several writes of this thread (each write method joins
        it): ``with store.batch(): ...`` commits them together or not at all."""
        return self._db.tx()

    # -- sessions -------------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        principal: str = "",
    ) -> str:
        """Create a session (a random id when none is given) and return its id."""
        import psycopg

        sid = session_id or uuid.uuid4().hex
        id_tokens = self._tokenizer.session_tokens(sid)
        try:
            with self._db.statement(guarded=True) as conn:
                conn.execute(
                    "INSERT INTO sessions (id, created_at, metadata, principal, id_tokens)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (sid, _now(), json.dumps(dict(metadata or {})), principal, id_tokens),
                )
        except psycopg.errors.UniqueViolation as exc:
            raise ConfigError(f"session {sid!r} already exists") from exc
        return sid

    def session(self, session_id: str) -> SessionRecord:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = %s", (session_id,)
            ).fetchone()
        if row is None:
            raise ConfigError(f"unknown session {session_id!r}; create it with create_session")
        return self._record(row)

    @staticmethod
    def _record(row: Sequence[Any]) -> SessionRecord:
        """The ``SessionRecord`` of a row that starts with ``SESSION_COLUMNS``."""
        return SessionRecord(
            id=row[0],
            created_at=utc(row[1]),
            metadata=json.loads(row[2]),
            compaction_watermark=row[3],
            principal=row[4],
            parent_id=row[5],
            fork_seq=row[6],
            derived_seq=row[7],
            born=row[8],
            generation=row[9],
        )

    def session_version(self, session_id: str) -> tuple[int, int] | None:
        """``(born, generation)`` of the session, ``None`` when there is none; inside
        ``batch()`` the session's row is locked until the batch ends (``FOR SHARE`` would let
        a writer in between; ``FOR UPDATE`` holds them off, as SQLite's write lock does)."""
        with self._db.locking() as (conn, locking):
            row = conn.execute(
                "SELECT born, generation FROM sessions WHERE id = %s"
                + (" FOR UPDATE" if locking else ""),
                (session_id,),
            ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def sessions(self) -> list[str]:
        with self._read() as conn:
            rows = conn.execute('SELECT id FROM sessions ORDER BY created_at, id COLLATE "C"')
            return [r[0] for r in rows]

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything stored for it (its cost log rows are kept,
        detached). The only way raw turns are ever deleted. Whether the session existed."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT id_tokens FROM sessions WHERE id = %s FOR UPDATE", (session_id,)
            ).fetchone()
            if row is None:
                return False
            self._forget_fts(conn, session_id, int(row[0]))
            conn.execute("DELETE FROM turn_terms WHERE session_id = %s", (session_id,))
            conn.execute(
                "INSERT INTO turn_deletions (session_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (session_id,),
            )
            conn.execute("DELETE FROM turns WHERE session_id = %s", (session_id,))
            conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
            conn.execute("DELETE FROM turn_deletions WHERE session_id = %s", (session_id,))
        return True

    # -- turns ----------------------------------------------------------------------------------

    def last_seq(self, session_id: str) -> int:
        """The seq of the session's last turn (0 when it has none)."""
        with self._read() as conn:
            return last_seq(conn, session_id)

    def append_turns(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[int]:
        """Append turns in one transaction; their seqs (consecutive, from 1 per session).
        ``timestamps`` (one per message) default to now; naive ones are taken as UTC."""
        if timestamps is not None and len(timestamps) != len(messages):
            raise ConfigError(
                f"{len(messages)} messages need as many timestamps, got {len(timestamps)}"
            )
        rows = self._turn_rows(session_id, messages, timestamps, partial)
        return self._insert_turns(session_id, rows)

    def _turn_rows(
        self,
        session_id: str,
        messages: Sequence[Message],
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[tuple[tuple[Any, ...], Indexed]]:
        """The column values and full-text tokens of new turns, computed before a write
        transaction opens (token counts, hashes and tokens take time no lock should wait on)."""
        now = _now()
        texts = [message.text() for message in messages]
        indexed = self._tokenizer.rows(texts, session_id)
        rows = []
        for i, message in enumerate(messages):
            body = _message_json(message)
            text = texts[i]
            rows.append(
                (
                    (
                        message.role,
                        to_text(text),
                        body,
                        hashlib.sha256(body.encode("utf-8")).hexdigest(),
                        utc(timestamps[i]) if timestamps is not None else now,
                        self.counter.count(text),
                        message_key(message),
                        bool(partial[i]) if partial is not None else False,
                        indexed[i].text_tokens,
                    ),
                    indexed[i],
                )
            )
        return rows

    def _insert_turns(
        self,
        session_id: str,
        rows: Sequence[tuple[tuple[Any, ...], Indexed]],
        *,
        expected: int | None = None,
        enqueue: str | None = None,
    ) -> list[int]:
        """Insert turns after the session's last one and queue ``enqueue`` (a job kind) when
        given, in one call of ``cf_append_json`` (``schema.py``): one round trip, under the
        session's row lock, so the seqs of concurrent writers never collide. ``ConfigError``
        when the session does not exist; ``BranchMoved`` when ``expected`` is given and the
        last seq is another. Joins this thread's transaction when one is open."""
        import psycopg

        try:
            with self._db.statement(guarded=True) as conn:
                found = conn.execute(
                    "SELECT cf_append_json(%s, %s, %s, %s, %s::jsonb, %s::jsonb)",
                    (
                        session_id,
                        expected,
                        enqueue if rows else None,
                        shard(session_id),
                        *_appended(rows),
                    ),
                ).fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate == UNKNOWN_SESSION:
                raise ConfigError(
                    f"unknown session {session_id!r}; create it with create_session"
                ) from exc
            if exc.sqlstate == BRANCH_MOVED and expected is not None:
                last = int(exc.diag.message_detail or 0)
                raise BranchMoved(session_id, expected, last) from exc
            raise
        last = int(found[0]) if found else 0
        return list(range(last + 1, last + 1 + len(rows)))

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

    def begin_derive(
        self,
        session_id: str,
        *,
        context: int = 0,
        append: Sequence[Message] = (),
        timestamps: Sequence[datetime] | None = None,
    ) -> PendingDerive:
        """Append ``append``, drop the session's pending ``derive`` job and read the session,
        its live tokens and its turns after ``derived_seq - context``: one call of
        ``cf_begin_derive`` (``schema.m006``), one round trip."""
        import psycopg

        check_appended(append, timestamps)
        rows = self._turn_rows(session_id, append, timestamps)
        try:
            with self._db.statement(guarded=True) as conn:
                found = conn.execute(
                    "SELECT * FROM cf_begin_derive(%s, %s, %s, %s::jsonb, %s::jsonb)",
                    (session_id, context, shard(session_id), *_appended(rows)),
                ).fetchall()
        except psycopg.Error as exc:
            if exc.sqlstate == UNKNOWN_SESSION:
                raise ConfigError(
                    f"unknown session {session_id!r}; create it with create_session"
                ) from exc
            raise
        first = found[0]
        turns = [(int(r[11]), r[12], from_text(r[13]), r[14]) for r in found if r[11] is not None]
        return PendingDerive(self._record(first), int(first[10]), turns)

    def _forget_fts(self, conn: psycopg.Connection[Any], session_id: str, id_tokens: int) -> None:
        """Take a session's rows out of the full-text totals."""
        for index, table in ((TURNS, "turns"), (SEGMENTS, "segments")):
            row = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(text_tokens), 0) FROM {table}"
                " WHERE session_id = %s",
                (session_id,),
            ).fetchone()
            if row is not None:
                n, tokens = int(row[0]), int(row[1])
                add_totals(conn, index, session_id, -n, -(tokens + n * id_tokens))

    def turns(
        self, session_id: str, start: int | None = None, end: int | None = None
    ) -> list[StoredTurn]:
        """The session's turns with ``start <= seq <= end`` (either bound optional), in order."""
        lo = start if start is not None else 1
        hi = end if end is not None else 2**62
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turns WHERE session_id = %s"
                " AND seq BETWEEN %s AND %s ORDER BY seq",
                (session_id, lo, hi),
            ).fetchall()
            tags = self._tags(conn, session_id, lo, hi)
        return [self._turn(row, tags.get(row[1], ({}, []))) for row in rows]

    @staticmethod
    def _tags(
        conn: psycopg.Connection[Any], session_id: str, lo: int, hi: int
    ) -> dict[int, _TurnTags]:
        found: dict[int, _TurnTags] = {}
        for seq, tag, weight, related in conn.execute(
            "SELECT seq, tag, weight, related FROM turn_tags WHERE session_id = %s"
            ' AND seq BETWEEN %s AND %s ORDER BY seq, weight DESC, tag COLLATE "C"',
            (session_id, lo, min(hi, 2**31 - 1)),
        ):
            tags, rel = found.setdefault(seq, ({}, []))
            if related:
                rel.append(tag)
            else:
                tags[tag] = weight
        return found

    @staticmethod
    def _turn(row: Sequence[Any], tags: _TurnTags = ({}, [])) -> StoredTurn:
        return StoredTurn(
            session_id=row[0],
            seq=row[1],
            message=Message.model_validate(json.loads(row[2])),
            created_at=utc(row[3]),
            content_hash=row[4],
            token_count=row[5],
            tags=tags[0],
            related_tags=tuple(tags[1]),
            partial=bool(row[6]),
        )

    def turn_texts_after(self, session_id: str, after: int) -> list[tuple[int, str, str, str]]:
        """(seq, role, text, content hash) of the turns after seq ``after``, in order."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT seq, role, content_text, content_hash FROM turns"
                " WHERE session_id = %s AND seq > %s ORDER BY seq",
                (session_id, after),
            ).fetchall()
        return [(int(r[0]), r[1], from_text(r[2]), r[3]) for r in rows]

    def turn_texts_with_incarnation(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, str, str, str]]]:
        """The session's incarnation (``None`` when there is no such session) and
        ``turn_texts_after(session_id, after)``, in one query: one snapshot."""
        born, rows = self._after_with_incarnation(
            session_id, after, "t.role, t.content_text, t.content_hash"
        )
        return born, [(int(r[0]), r[1], from_text(r[2]), r[3]) for r in rows]

    def turn_openings_with_incarnation(
        self, session_id: str, after: int, chars: int
    ) -> tuple[int | None, list[tuple[int, str]]]:
        """The session's incarnation and (seq, first ``chars`` characters of the text) of its
        turns after ``after``, in one query: one snapshot."""
        born, rows = self._after_with_incarnation(
            session_id, after, f"left(t.content_text, {int(chars)})"
        )
        return born, [(int(r[0]), r[1]) for r in rows]

    def _after_with_incarnation(
        self, session_id: str, after: int, columns: str
    ) -> tuple[int | None, list[tuple[Any, ...]]]:
        """The session's ``born`` (``None`` when there is no such session) and ``seq,
        <columns>`` (of ``turns t``) of its turns after ``after``, in order: one query, one
        snapshot."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT s.born, t.seq, {columns} FROM sessions s"
                " LEFT JOIN turns t ON t.session_id = s.id AND t.seq > %s"
                " WHERE s.id = %s ORDER BY t.seq",
                (after, session_id),
            ).fetchall()
        if not rows:
            return None, []
        return int(rows[0][0]), [tuple(r[1:]) for r in rows if r[1] is not None]

    def turn_hash(self, session_id: str, seq: int) -> str | None:
        """The content hash of one turn (``None`` when it is not stored)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT content_hash FROM turns WHERE session_id = %s AND seq = %s",
                (session_id, seq),
            ).fetchone()
        return None if row is None else str(row[0])

    def _turn_columns(
        self, session_id: str, seqs: Sequence[int], columns: str
    ) -> list[tuple[Any, ...]]:
        """``seq, <columns>`` of the given turns (seqs not stored are left out)."""
        with self._read() as conn:
            return conn.execute(
                f"SELECT seq, {columns} FROM turns WHERE session_id = %s AND seq = ANY(%s)",
                (session_id, [s for s in seqs if 0 < s < 2**31]),
            ).fetchall()

    def turn_times(self, session_id: str, seqs: Sequence[int]) -> dict[int, datetime]:
        """When each given turn was said (seqs not stored are left out)."""
        return {r[0]: utc(r[1]) for r in self._turn_columns(session_id, seqs, "created_at")}

    def turn_openings(self, session_id: str, seqs: Sequence[int], chars: int) -> dict[int, str]:
        """The first ``chars`` characters of each given turn's text (seqs not stored are left
        out)."""
        columns = f"left(content_text, {int(chars)})"
        return {int(r[0]): r[1] for r in self._turn_columns(session_id, seqs, columns)}

    def turn_token_counts(self, session_id: str, seqs: Sequence[int]) -> dict[int, int]:
        """The token count of each given turn (seqs not stored are left out)."""
        return {r[0]: r[1] for r in self._turn_columns(session_id, seqs, "token_count")}

    def turn_token_counts_after(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, int]]]:
        """The session's ``born`` and (seq, token count) of its turns after ``after``, in order
        (one query: one snapshot)."""
        born, rows = self._after_with_incarnation(session_id, after, "t.token_count")
        return born, [(int(r[0]), int(r[1])) for r in rows]

    def turn_rows(self, session_id: str, seqs: Sequence[int]) -> dict[int, TurnRow]:
        """Role, text, time and token count of the given turns, without parsing messages."""
        rows = self._turn_columns(session_id, seqs, "role, content_text, created_at, token_count")
        return {r[0]: TurnRow(r[0], r[1], from_text(r[2]), utc(r[3]), r[4]) for r in rows}

    def active_tokens(self, session_id: str) -> int:
        """Tokens of the session's turns at or above its compaction watermark (kept in the
        session's row: ``schema.m005_live_tokens``)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT live_tokens FROM sessions WHERE id = %s", (session_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    # -- search ---------------------------------------------------------------------------------

    def search_turns(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredTurn, float]]:
        """Turns matching any word of ``query``, best first, with their score (FTS5's
        ``-bm25()``, higher is better)."""
        with self._read() as conn:
            hits = ranked(conn, self._tokenizer, TURNS, session_id, query, limit)
            if not hits:
                return []
            seqs = [seq for seq, _ in hits]
            rows = conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turns WHERE session_id = %s AND seq = ANY(%s)",
                (session_id, seqs),
            ).fetchall()
            tags = self._tags(conn, session_id, min(seqs), max(seqs))
        by_seq = {row[1]: row for row in rows}
        return [(self._turn(by_seq[seq], tags.get(seq, ({}, []))), score) for seq, score in hits]

    def search_turn_seqs(
        self, session_id: str, query: str, limit: int = 10, *, common_limit: int | None = None
    ) -> list[tuple[int, float]]:
        """Like ``search_turns`` but only (seq, score) pairs: the fast path for ranking
        (``common_limit`` as the Protocol says)."""
        with self._read() as conn:
            return ranked(conn, self._tokenizer, TURNS, session_id, query, limit, common_limit)

    def search_turn_seqs_many(
        self,
        session_id: str,
        queries: Sequence[str],
        limit: int = 10,
        *,
        common_limit: int | None = None,
    ) -> list[list[tuple[int, float]]]:
        """``search_turn_seqs`` of each query, on one connection."""
        with self._read() as conn:
            return [
                ranked(conn, self._tokenizer, TURNS, session_id, q, limit, common_limit)
                for q in queries
            ]

    # -- tags and vectors (``memory_derived.py``) ------------------------------------------------

    def tag_turn(self, session_id: str, seq: int, tag: str, weight: float = 1.0) -> None:
        self._derived.tag_turn(session_id, seq, tag, weight)

    def set_turn_tags(
        self, session_id: str, seq: int, tags: Mapping[str, float], related: Sequence[str] = ()
    ) -> None:
        self._derived.set_turn_tags(session_id, seq, tags, related)

    def set_tags_many(
        self, session_id: str, tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]]
    ) -> None:
        self._derived.set_tags_many(session_id, tagged)

    def write_derived(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
        derived_seq: int,
    ) -> tuple[int, int]:
        return self._derived.write_derived(session_id, tagged, derived_seq)

    def tag_counts(
        self, session_id: str, *, before: int | None = None, since: int | None = None
    ) -> dict[str, int]:
        return self._derived.tag_counts(session_id, before=before, since=since)

    def topic_counts(self, session_id: str) -> tuple[int, dict[str, int]]:
        return self._derived.topic_counts(session_id)

    def turns_tagged(
        self, session_id: str, tags: Sequence[str]
    ) -> dict[int, list[tuple[str, bool]]]:
        return self._derived.turns_tagged(session_id, tags)

    def tag_overlap_scores(
        self, session_id: str, weights: Mapping[str, tuple[float, float]]
    ) -> dict[int, float]:
        return self._derived.tag_overlap_scores(session_id, weights)

    def tag_overlap_top(
        self, session_id: str, weights: Mapping[str, tuple[float, float]], limit: int
    ) -> tuple[list[tuple[int, float]], float]:
        return self._derived.tag_overlap_top(session_id, weights, limit)

    def tag_last_seen(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, datetime]:
        return self._derived.tag_last_seen(session_id, tags)

    def turns_without_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> list[tuple[int, str]]:
        return self._derived.turns_without_vectors(session_id, model, after=after)

    def last_vector_seq(self, session_id: str, model: str) -> int:
        return self._derived.last_vector_seq(session_id, model)

    def add_turn_vectors(
        self, session_id: str, model: str, seqs: Sequence[int], vectors: npt.NDArray[Any]
    ) -> None:
        self._derived.add_turn_vectors(session_id, model, seqs, vectors)

    def turn_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> tuple[list[int], npt.NDArray[np.float32]]:
        return self._derived.turn_vectors(session_id, model, after=after)

    # -- compaction and segments (``memory_state.py``) -------------------------------------------

    def compact(
        self,
        session_id: str,
        segments: Sequence[NewSegment],
        watermark: int,
        *,
        _before_commit: Callable[[], None] | None = None,
    ) -> list[int]:
        return self._segments.compact(
            session_id, segments, watermark, _before_commit=_before_commit
        )

    def segments(
        self, session_id: str, *, tag: str | None = None, full_text: bool = True
    ) -> list[StoredSegment]:
        return self._segments.segments(session_id, tag=tag, full_text=full_text)

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]:
        return self._segments.search_segments(session_id, query, limit)

    # -- lookups and branches (``memory_branches.py``) -------------------------------------------

    def principal_of(self, session_id: str) -> str | None:
        return self._branches.principal_of(session_id)

    def turns_with_key(
        self, principal: str, key: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[tuple[str, int]]:
        return self._branches.turns_with_key(principal, key, session_id=session_id, limit=limit)

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        return self._branches.latest_session(principal)

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        return self._branches.turn_keys(session_id, lo, hi)

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str:
        return self._branches.fork(session_id, upto, session_id_new=session_id_new)
