"""``MemoryStore.transfer`` (``SqliteTransfer``), whole-session moves: ``dump_session`` reads
everything stored for one session into a ``SessionDump``, ``load_session`` writes one back as
it was — into this store or, through ``contextfold store migrate``, into another backend.

A load is one transaction: the session row (id, creation time, metadata, principal, branch,
watermark, derived seq), its raw turns with their own seqs, hashes, times, token counts and
partial flags, their tags, the segments (new ids, the same turns and times), tag summaries,
working set and turn vectors. Raw turns are only inserted, so the append-only guard stays as it
is. Each turn's content hash is checked against its message before anything is written. Turns
past the derived seq get the session's ``derive`` job, as ``commit_exchange`` would have queued;
turns already derived get none.

>>> from contextfold.items import Message
>>> from contextfold.tokens import CharCounter
>>> from contextfold.store.sqlite.memory import MemoryStore
>>> a, b = MemoryStore(counter=CharCounter()), MemoryStore(counter=CharCounter())
>>> sid = a.create_session("s1")
>>> a.append_turns(sid, [Message(role="user", content="hi")])
[1]
>>> b.transfer.load_session(a.transfer.dump_session("s1"))
>>> [t.message.text() for t in b.turns("s1")], b.jobs.pending_jobs()
(['hi'], 1)
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from contextfold.errors import ConfigError
from contextfold.store.models import (
    SessionDump,
    StoredTurn,
    _iso,
    _message_json,
    _now,
    message_key,
)
from contextfold.store.sqlite.memory_db import MemoryDb
from contextfold.store.sqlite.memory_jobs import enqueue
from contextfold.store.transfer import check_dump

if TYPE_CHECKING:
    from contextfold.store.sqlite.memory import MemoryStore

__all__ = ["SqliteTransfer"]


class SqliteTransfer:
    """``store.transfer``: ``dump_session`` and ``load_session``, over the store's
    ``MemoryDb``; ``store`` is the store whose sessions, turns, segments and facets a dump
    reads."""

    def __init__(self, db: MemoryDb, store: MemoryStore) -> None:
        self._db = db
        self._store = store

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction on this thread's connection: every read inside sees the same
        state, whatever other processes write meanwhile (and nothing is locked for writing;
        the in-memory store, one connection for all threads, takes its writers' turn)."""
        conn = self._db.conn
        if conn.in_transaction:
            yield conn
            return
        if self._db.shared:
            with self._db.tx() as shared:
                yield shared
            return
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def dump_session(self, session_id: str) -> SessionDump:
        """Everything stored for the session (``KeyError`` when there is none), read in one
        transaction so a writer in between cannot tear it."""
        with self._snapshot() as conn:
            row = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise KeyError(session_id)
            vectors = {}
            models = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT model FROM turn_vectors WHERE session_id = ? ORDER BY model",
                    (session_id,),
                )
            ]
            for model in models:
                rows = conn.execute(
                    "SELECT seq, vector FROM turn_vectors WHERE session_id = ? AND model = ?"
                    " ORDER BY seq",
                    (session_id, model),
                ).fetchall()
                matrix = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
                vectors[model] = ([int(r[0]) for r in rows], matrix)
            return SessionDump(
                session=self._store.session(session_id),
                turns=self._store.turns(session_id),
                segments=self._store.segments(session_id),
                tag_summaries=list(self._store.paging.tag_summaries(session_id).values()),
                working_set=list(self._store.paging.working_set(session_id).values()),
                vectors=vectors,
                aliases=self._store.vocab.aliases(session_id),
                tag_splits=self._store.vocab.tag_splits(session_id),
            )

    def load_session(self, dump: SessionDump) -> None:
        """Write a dumped session as it was, in one transaction (``ConfigError`` when its id
        exists here, or when the dump's turns are not seqs 1… with their own hashes)."""
        check_dump(dump)
        record = dump.session
        sid = record.id
        try:
            with self._db.tx() as conn:
                conn.execute(
                    "INSERT INTO sessions (id, created_at, metadata, compaction_watermark,"
                    " principal, parent_id, fork_seq, derived_seq)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        sid,
                        _iso(record.created_at),
                        json.dumps(record.metadata),
                        record.compaction_watermark,
                        record.principal,
                        record.parent_id,
                        record.fork_seq,
                        record.derived_seq,
                    ),
                )
                self._load_turns(conn, sid, dump.turns)
                self._load_derived(conn, dump)
                if dump.turns and dump.turns[-1].seq > record.derived_seq:
                    enqueue(conn, sid, "derive")
        except sqlite3.IntegrityError as exc:
            if "sessions.id" in str(exc):
                raise ConfigError(f"session {sid!r} already exists") from exc
            raise ConfigError(f"session {sid!r} cannot be loaded: {exc}") from exc

    @staticmethod
    def _load_turns(conn: sqlite3.Connection, sid: str, turns: Sequence[StoredTurn]) -> None:
        rows: list[tuple[object, ...]] = []
        tags: list[tuple[str, int, str, float, int]] = []
        for turn in turns:
            text = turn.message.text()
            rows.append(
                (
                    sid,
                    turn.seq,
                    turn.message.role,
                    text,
                    _message_json(turn.message),
                    turn.content_hash,
                    _iso(turn.created_at),
                    turn.token_count,
                    message_key(turn.message),
                    int(turn.partial),
                )
            )
            tags.extend((sid, turn.seq, tag, float(w), 0) for tag, w in turn.tags.items())
            tags.extend(
                (sid, turn.seq, tag, 0.5, 1) for tag in turn.related_tags if tag not in turn.tags
            )
        conn.executemany(
            "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
            " content_hash, created_at, token_count, match_key, partial)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.executemany(
            "INSERT INTO turn_tags (session_id, seq, tag, weight, related) VALUES (?, ?, ?, ?, ?)",
            tags,
        )

    @staticmethod
    def _load_derived(conn: sqlite3.Connection, dump: SessionDump) -> None:
        sid = dump.session.id
        for seg in dump.segments:
            cursor = conn.execute(
                "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text,"
                " tags, related_tags, summary_tokens, full_tokens, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    seg.first_seq,
                    seg.last_seq,
                    seg.summary,
                    seg.full_text,
                    json.dumps(list(seg.tags)),
                    json.dumps(list(seg.related_tags)),
                    seg.summary_tokens,
                    seg.full_tokens,
                    _iso(seg.created_at),
                ),
            )
            conn.executemany(
                "INSERT INTO segment_turns (segment_id, seq) VALUES (?, ?)",
                [(cursor.lastrowid, seq) for seq in seg.seqs],
            )
        now = _iso(_now())
        conn.executemany(
            "INSERT INTO tag_summaries (session_id, tag, summary, tokens, source_watermark,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (sid, s.tag, s.summary, s.tokens, s.source_watermark, now)
                for s in dump.tag_summaries
            ],
        )
        conn.executemany(
            "INSERT INTO working_set (session_id, tag, depth, last_used, tokens)"
            " VALUES (?, ?, ?, ?, ?)",
            [(sid, w.tag, w.depth, _iso(w.last_used), w.tokens) for w in dump.working_set],
        )
        conn.executemany(
            "INSERT INTO session_aliases (session_id, alias, canonical) VALUES (?, ?, ?)",
            [(sid, alias, canonical) for alias, canonical in dump.aliases.items()],
        )
        conn.executemany(
            "INSERT INTO tag_splits (session_id, tag, sub_tags, created_at) VALUES (?, ?, ?, ?)",
            [(sid, tag, json.dumps(list(subs)), now) for tag, subs in dump.tag_splits.items()],
        )
        for model, (seqs, matrix) in dump.vectors.items():
            if len(seqs) != len(matrix):
                raise ConfigError(
                    f"session {sid!r}: {len(seqs)} seqs need as many {model!r} vectors, "
                    f"got {len(matrix)}"
                )
            rows = np.ascontiguousarray(matrix, dtype=np.float32)
            conn.executemany(
                "INSERT INTO turn_vectors (session_id, seq, model, vector) VALUES (?, ?, ?, ?)",
                [(sid, seq, model, row.tobytes()) for seq, row in zip(seqs, rows, strict=True)],
            )
