"""``MemoryStore``'s segments: compaction (segments stored and the watermark moved in one
transaction), reading segments back, and full-text search over their summaries.

``SqliteSegments`` holds these methods, a part of the store's core: ``MemoryStore``'s methods
of the same names (``memory.py``) call it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime

from contextfold.errors import ConfigError, StoreError
from contextfold.store.models import NewSegment, StoredSegment, _iso, _now, check_compaction
from contextfold.store.sqlite.memory_db import MemoryDb, last_seq
from contextfold.store.sqlite.memory_fts import _fts_query
from contextfold.tokens import TokenCounter

__all__ = ["SqliteSegments"]


class SqliteSegments:
    """The part of ``MemoryStore``'s core that holds compaction and segments; the store's
    methods of these names call it. Made with the store's connections and its token counter
    (a segment given without its token counts is counted)."""

    def __init__(self, db: MemoryDb, counter: TokenCounter) -> None:
        self._db = db
        self.counter = counter

    # -- compaction and segments ----------------------------------------------------------------

    def topic_counts(self, session_id: str) -> tuple[int, dict[str, int]]:
        """The session's compaction watermark and, read with it, for each tag a segment
        carries, how many compacted turns (below the watermark) carry it: from the counts
        kept on write (``tag_stats``), one row per tag; one statement, so the two agree."""
        rows = self._db.conn.execute(
            "SELECT s.compaction_watermark, t.tag, t.compacted FROM sessions s"
            " LEFT JOIN tag_stats t ON t.session_id = s.id AND t.compacted > 0"
            " AND t.segments > 0 WHERE s.id = ? ORDER BY t.tag",
            (session_id,),
        ).fetchall()
        if not rows:
            raise ConfigError(f"unknown session {session_id!r}")
        return int(rows[0][0]), {r[1]: int(r[2]) for r in rows if r[1] is not None}

    def compact(
        self,
        session_id: str,
        segments: Sequence[NewSegment],
        watermark: int,
        *,
        _before_commit: Callable[[], None] | None = None,
    ) -> list[int]:
        """Store ``segments`` and move the session's watermark to ``watermark`` in ONE
        transaction; returns the new segment ids. Raw turns are never touched.

        ``watermark`` may not go below the current one nor beyond the last turn + 1 (turns
        below it are compacted); every segment must lie within ``[current, watermark)``.
        ``_before_commit`` (tests only) runs after the segments are inserted and before the
        watermark moves."""
        try:
            with self._db.tx() as conn:
                row = conn.execute(
                    "SELECT compaction_watermark FROM sessions WHERE id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    raise ConfigError(f"unknown session {session_id!r}")
                current, last = int(row[0]), last_seq(conn, session_id)
                check_compaction(current, last, segments, watermark)
                ids = [self._insert_segment(conn, session_id, seg) for seg in segments]
                if _before_commit is not None:
                    _before_commit()
                conn.execute(
                    "UPDATE sessions SET compaction_watermark = ? WHERE id = ?",
                    (watermark, session_id),
                )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"compaction of session {session_id!r} failed: {exc}") from exc
        return ids

    def _insert_segment(self, conn: sqlite3.Connection, session_id: str, seg: NewSegment) -> int:
        summary_tokens = seg.summary_tokens
        if summary_tokens is None:
            summary_tokens = self.counter.count(seg.summary)
        full_tokens = seg.full_tokens
        if full_tokens is None:
            full_tokens = self.counter.count(seg.full_text)
        cursor = conn.execute(
            "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text, tags,"
            " related_tags, summary_tokens, full_tokens, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                seg.first_seq,
                seg.last_seq,
                seg.summary,
                seg.full_text,
                json.dumps(list(seg.tags)),
                json.dumps(list(seg.related_tags)),
                summary_tokens,
                full_tokens,
                _iso(_now()),
            ),
        )
        segment_id = int(cursor.lastrowid or 0)
        conn.executemany(
            "INSERT INTO segment_turns (segment_id, seq) VALUES (?, ?)",
            [(segment_id, seq) for seq in range(seg.first_seq, seg.last_seq + 1)],
        )
        return segment_id

    def segments(
        self, session_id: str, *, tag: str | None = None, full_text: bool = True
    ) -> list[StoredSegment]:
        """The session's segments, earliest first (those carrying ``tag`` when given; their
        ``full_text`` left empty, unread, with ``full_text=False``)."""
        return self._segments(session_id, None, tag=tag, full_text=full_text)

    def _segments(
        self,
        session_id: str,
        ids: Sequence[int] | None,
        *,
        tag: str | None = None,
        full_text: bool = True,
    ) -> list[StoredSegment]:
        if ids is not None and not ids:
            return []
        where = " WHERE s.session_id = ?"
        params: list[object] = [session_id]
        if ids is not None:
            where += f" AND s.id IN ({','.join('?' * len(ids))})"
            params += ids
        if tag is not None:
            where += " AND EXISTS (SELECT 1 FROM json_each(s.tags) j WHERE j.value = ?)"
            params.append(tag)
        text = "s.full_text" if full_text else "''"
        rows = self._db.conn.execute(
            "SELECT s.id, s.session_id, s.first_seq, s.last_seq, s.summary,"
            f" {text} AS full_text, s.tags, s.related_tags, s.summary_tokens, s.full_tokens,"
            f" s.created_at FROM segments s{where} ORDER BY s.first_seq, s.id",
            params,
        ).fetchall()
        seqs: dict[int, list[int]] = {}
        if rows:
            # The source turns of these segments only (not every segment's of the session).
            for r in self._db.conn.execute(
                "SELECT st.segment_id, st.seq FROM segment_turns st JOIN segments s"
                f" ON s.id = st.segment_id{where} ORDER BY st.segment_id, st.seq",
                params,
            ):
                seqs.setdefault(r[0], []).append(r[1])
        return [
            StoredSegment(
                id=r["id"],
                session_id=r["session_id"],
                first_seq=r["first_seq"],
                last_seq=r["last_seq"],
                summary=r["summary"],
                full_text=r["full_text"],
                tags=tuple(json.loads(r["tags"])),
                related_tags=tuple(json.loads(r["related_tags"])),
                summary_tokens=r["summary_tokens"],
                full_tokens=r["full_tokens"],
                created_at=datetime.fromisoformat(r["created_at"]),
                seqs=tuple(seqs.get(r["id"], ())),
            )
            for r in rows
        ]

    # -- search ---------------------------------------------------------------------------------

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]:
        """Segments whose summary matches any word of ``query``, best first, with ``-bm25()``."""
        match = _fts_query(query, "summary", session_id)
        if match is None:
            return []
        rows = self._db.conn.execute(
            "SELECT s.id, -bm25(segments_fts, 1, 0) AS score FROM segments_fts JOIN segments s"
            " ON s.id = segments_fts.rowid WHERE segments_fts MATCH ? AND s.session_id = ?"
            " ORDER BY bm25(segments_fts, 1, 0), s.first_seq LIMIT ?",
            (match, session_id, limit),
        ).fetchall()
        by_id = {s.id: s for s in self._segments(session_id, [r[0] for r in rows])}
        return [(by_id[r[0]], float(r[1])) for r in rows]
