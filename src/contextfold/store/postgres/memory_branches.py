"""``PostgresMemoryStore``'s conversation tree: lookups by principal and match key, and
branches (forks) — the same semantics as the SQLite store's ``memory_branches.py`` (read its
docstring), made safe for writers in many processes. ``PostgresBranches`` holds them, a part of
the store's core; exchanges (``commit_exchange``: seqs assigned under the session's row lock,
``expect_last`` checked under it) are in ``memory.py``, the jobs table is the ``store.jobs``
facet (``memory_jobs.py``).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from contextfold._bounded import SessionLRU
from contextfold.errors import ConfigError
from contextfold.store.keychain import KEY_CHAIN_SESSIONS, KeyChain
from contextfold.store.models import _now
from contextfold.store.postgres.connection import Database
from contextfold.store.postgres.fts import Tokenizer
from contextfold.store.postgres.memory_db import count_live, last_seq
from contextfold.store.postgres.memory_jobs import enqueue
from contextfold.store.postgres.search import SEGMENTS, TURNS, add_totals

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresBranches"]


class PostgresBranches:
    """The part of ``PostgresMemoryStore``'s core that holds its lookups by principal and
    match key and its branches; the store's methods of these names call it. Made with the
    store's ``Database`` and its ``Tokenizer`` (a branch's id is indexed for full text)."""

    def __init__(self, db: Database, tokenizer: Tokenizer) -> None:
        self._db = db
        self._tokenizer = tokenizer
        # Match keys of recently used sessions (``turn_keys``).
        self._key_chains: SessionLRU[KeyChain] = SessionLRU(KEY_CHAIN_SESSIONS)

    # -- lookups --------------------------------------------------------------------------------

    def principal_of(self, session_id: str) -> str | None:
        with self._db.read() as conn:
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
        with self._db.read() as conn:
            return [(str(r[0]), int(r[1])) for r in conn.execute(sql, params)]

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        """(session, last seq) of the principal's conversation that stored a turn last."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id"
                " WHERE s.principal = %s ORDER BY t.id DESC LIMIT 1",
                (principal,),
            ).fetchone()
            if row is None:
                return None
            return str(row[0]), last_seq(conn, str(row[0]))

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        """seq -> match key of the session's turns with ``lo <= seq <= hi``, from the
        session's ``KeyChain`` (each call reads only the turns stored since the last one).

        The chain recognises the last turn it knows by the turn's row id rather than its
        content hash: row ids are never reused, so a session deleted and written again is
        read over even when its new last turn says the same as the old one."""
        chain = self._key_chains.get(session_id, KeyChain)
        with chain.lock, self._db.read() as conn:

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
        with self._db.tx() as conn:
            row = conn.execute(
                "SELECT principal, metadata, derived_seq FROM sessions WHERE id = %s FOR SHARE",
                (session_id,),
            ).fetchone()
            if row is None:
                raise ConfigError(f"unknown session {session_id!r}")
            last = last_seq(conn, session_id)
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
            count_live(conn, new)
            for segment_id, _ in segments:
                self._copy_segment(conn, int(segment_id), new, id_tokens)
            if segments or upto:
                enqueue(conn, new, "derive")
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
