"""``PostgresMemoryStore.transfer``, whole-session moves: ``dump_session`` reads
everything stored for one session into a ``SessionDump``; ``load_session`` writes one back as
it was (the same id, seqs, hashes, times, tags, segments, tag summaries, working set,
vectors, watermark, principal, branch and derived seq), in one transaction — from this store
or, through ``contextfold store migrate``, from another backend. The loaded session is a new
incarnation (its ``born`` and ``generation`` are drawn here); its turns past the derived seq
get the session's ``derive`` job, as ``commit_exchange`` would have queued.

``PostgresTransfer`` holds these methods: ``PostgresMemoryStore.transfer``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from contextfold.errors import ConfigError
from contextfold.store.models import (
    SessionDump,
    StoredTurn,
    _message_json,
    _now,
    message_key,
)
from contextfold.store.postgres.connection import Database, to_text, utc
from contextfold.store.postgres.fts import Indexed, Tokenizer
from contextfold.store.postgres.memory_db import count_live
from contextfold.store.postgres.memory_state import PostgresSegments
from contextfold.store.postgres.search import SEGMENTS, TURNS, index_rows
from contextfold.store.transfer import check_dump

if TYPE_CHECKING:
    import psycopg

    from contextfold.store.postgres.memory import PostgresMemoryStore

__all__ = ["PostgresTransfer"]


class PostgresTransfer:
    """``store.transfer``: ``dump_session`` and ``load_session``, over the store's
    ``Database``; ``store`` is the store whose sessions, turns, segments and facets a dump
    reads, ``tokenizer`` indexes a loaded session's text."""

    def __init__(self, db: Database, store: PostgresMemoryStore, tokenizer: Tokenizer) -> None:
        self._db = db
        self._store = store
        self._tokenizer = tokenizer

    # -- moving whole sessions ------------------------------------------------------------------

    def dump_session(self, session_id: str) -> SessionDump:
        """Everything stored for the session (``KeyError`` when there is none)."""
        try:
            record = self._store.session(session_id)
        except ConfigError as exc:
            raise KeyError(session_id) from exc
        with self._db.read() as conn:
            models = [
                r[0]
                for r in conn.execute(
                    "SELECT model FROM turn_vectors WHERE session_id = %s GROUP BY model"
                    ' ORDER BY model COLLATE "C"',
                    (session_id,),
                )
            ]
        return SessionDump(
            session=record,
            turns=self._store.turns(session_id),
            segments=self._store.segments(session_id),
            tag_summaries=list(self._store.paging.tag_summaries(session_id).values()),
            working_set=list(self._store.paging.working_set(session_id).values()),
            vectors={model: self._store.turn_vectors(session_id, model) for model in models},
            aliases=self._store.vocab.aliases(session_id),
            tag_splits=self._store.vocab.tag_splits(session_id),
        )

    def load_session(self, dump: SessionDump) -> None:
        """Write a dumped session as it was: the same id, seqs, hashes, times, tags,
        segments, watermark, branch and derived seq (``ConfigError`` when the id exists)."""
        import psycopg

        check_dump(dump)
        record = dump.session
        sid = record.id
        id_tokens = self._tokenizer.session_tokens(sid)
        texts = [turn.message.text() for turn in dump.turns]
        turn_index = self._tokenizer.rows(texts, sid)
        segment_index = self._tokenizer.rows([s.summary for s in dump.segments], sid)
        with self._db.tx() as conn:
            try:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO sessions (id, created_at, metadata, compaction_watermark,"
                        " principal, parent_id, fork_seq, derived_seq, id_tokens)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (
                            sid,
                            utc(record.created_at),
                            json.dumps(record.metadata),
                            record.compaction_watermark,
                            record.principal,
                            record.parent_id,
                            record.fork_seq,
                            record.derived_seq,
                            id_tokens,
                        ),
                    )
            except psycopg.errors.UniqueViolation as exc:
                raise ConfigError(f"session {sid!r} already exists") from exc
            self._load_turns(conn, sid, dump.turns, texts, turn_index, id_tokens)
            count_live(conn, sid)
            ids = [
                PostgresSegments.insert_segment(
                    conn,
                    sid,
                    seg,
                    (seg.summary_tokens, seg.full_tokens),
                    utc(seg.created_at),
                    seg.seqs,
                    index,
                )
                for seg, index in zip(dump.segments, segment_index, strict=True)
            ]
            index_rows(
                conn,
                SEGMENTS,
                sid,
                ids,
                segment_index,
                id_tokens,
                [seg.first_seq for seg in dump.segments],
            )
            self._load_state(conn, sid, dump)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO session_aliases (session_id, alias, canonical)"
                    " VALUES (%s, %s, %s)",
                    [(sid, alias, canonical) for alias, canonical in dump.aliases.items()],
                )
                cur.executemany(
                    "INSERT INTO tag_splits (session_id, tag, sub_tags, created_at)"
                    " VALUES (%s, %s, %s, %s)",
                    [
                        (sid, tag, json.dumps(list(subs)), _now())
                        for tag, subs in dump.tag_splits.items()
                    ],
                )
            if dump.turns and dump.turns[-1].seq > record.derived_seq:
                conn.execute(
                    "INSERT INTO jobs (session_id, kind, created_at) VALUES (%s, 'derive', %s)",
                    (sid, _now()),
                )

    @staticmethod
    def _load_turns(
        conn: psycopg.Connection[Any],
        sid: str,
        turns: Sequence[StoredTurn],
        texts: Sequence[str],
        indexed: Sequence[Indexed],
        id_tokens: int,
    ) -> None:
        rows = []
        tags: list[tuple[str, int, str, float, bool]] = []
        for turn, text, index in zip(turns, texts, indexed, strict=True):
            body = _message_json(turn.message)
            rows.append(
                (
                    sid,
                    turn.seq,
                    turn.message.role,
                    to_text(text),
                    body,
                    turn.content_hash or hashlib.sha256(body.encode("utf-8")).hexdigest(),
                    utc(turn.created_at),
                    turn.token_count,
                    message_key(turn.message),
                    turn.partial,
                    index.text_tokens,
                )
            )
            tags.extend((sid, turn.seq, tag, float(w), False) for tag, w in turn.tags.items())
            tags.extend(
                (sid, turn.seq, tag, 0.5, True) for tag in turn.related_tags if tag not in turn.tags
            )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
                " content_hash, created_at, token_count, match_key, partial, text_tokens)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
            cur.executemany(
                "INSERT INTO turn_tags (session_id, seq, tag, weight, related)"
                " VALUES (%s, %s, %s, %s, %s)",
                tags,
            )
        index_rows(conn, TURNS, sid, [t.seq for t in turns], indexed, id_tokens)

    @staticmethod
    def _load_state(conn: psycopg.Connection[Any], sid: str, dump: SessionDump) -> None:
        """The tag summaries, working set and vectors of a dumped session."""
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO tag_summaries (session_id, tag, summary, tokens, source_watermark,"
                " updated_at) VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    (sid, s.tag, s.summary, s.tokens, s.source_watermark, _now())
                    for s in dump.tag_summaries
                ],
            )
            cur.executemany(
                "INSERT INTO working_set (session_id, tag, depth, last_used, tokens)"
                " VALUES (%s, %s, %s, %s, %s)",
                [(sid, w.tag, w.depth, utc(w.last_used), w.tokens) for w in dump.working_set],
            )
            for model, (seqs, matrix) in dump.vectors.items():
                cur.executemany(
                    "INSERT INTO turn_vectors (session_id, seq, model, vector)"
                    " VALUES (%s, %s, %s, %s)",
                    [
                        (sid, seq, model, row.astype("float32").tobytes())
                        for seq, row in zip(seqs, matrix, strict=True)
                    ],
                )
