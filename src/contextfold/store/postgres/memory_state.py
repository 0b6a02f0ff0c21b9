"""``PostgresMemoryStore``'s derived and bookkeeping state: compaction (segments stored and the
watermark moved in one transaction, under the session's row lock), segments and their
full-text search, the one summary per tag, each session's working set and the cost
log.

``PostgresSegments`` holds compaction and segments, a part of the store's core
(``PostgresMemoryStore``'s methods of the same names call it); ``PostgresPaging``
(``store.paging``: tag summaries, the working set) and ``PostgresCosts`` (``store.costs``: the
cost log) are facets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from contextfold.errors import ConfigError, StoreError
from contextfold.store.models import (
    CostEntry,
    CostReport,
    Depth,
    NewSegment,
    StoredSegment,
    TagRollForward,
    TagSummary,
    WorkingSetEntry,
    _now,
    check_compaction,
    tag_roll_forward,
)
from contextfold.store.postgres.connection import Database, utc
from contextfold.store.postgres.fts import Indexed, Tokenizer
from contextfold.store.postgres.memory_db import last_seq
from contextfold.store.postgres.search import SEGMENTS, index_rows, ranked
from contextfold.tokens import TokenCounter

if TYPE_CHECKING:
    import psycopg


__all__ = ["PostgresCosts", "PostgresPaging", "PostgresSegments"]


class PostgresSegments:
    """The part of ``PostgresMemoryStore``'s core that holds compaction and segments; the
    store's methods of these names call it. Made with the store's ``Database``, its token
    counter (a segment given without its token counts is counted) and its ``Tokenizer``
    (segment summaries are indexed for full text)."""

    def __init__(self, db: Database, counter: TokenCounter, tokenizer: Tokenizer) -> None:
        self._db = db
        self.counter = counter
        self._tokenizer = tokenizer

    # -- compaction and segments ----------------------------------------------------------------

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

        ``watermark`` may not go below the current one nor beyond the last turn + 1; every
        segment must lie within ``[current, watermark)``. ``_before_commit`` (tests only)
        runs after the segments are inserted and before the watermark moves."""
        import psycopg

        indexed = self._tokenizer.rows([seg.summary for seg in segments], session_id)
        try:
            with self._db.tx() as conn:
                row = conn.execute(
                    "SELECT compaction_watermark, id_tokens FROM sessions WHERE id = %s FOR UPDATE",
                    (session_id,),
                ).fetchone()
                if row is None:
                    raise ConfigError(f"unknown session {session_id!r}")
                current, last = int(row[0]), last_seq(conn, session_id)
                check_compaction(current, last, segments, watermark)
                ids = [
                    self.insert_segment(
                        conn,
                        session_id,
                        seg,
                        self._segment_tokens(seg),
                        _now(),
                        range(seg.first_seq, seg.last_seq + 1),
                        index,
                    )
                    for seg, index in zip(segments, indexed, strict=True)
                ]
                index_rows(
                    conn,
                    SEGMENTS,
                    session_id,
                    ids,
                    indexed,
                    int(row[1]),
                    [seg.first_seq for seg in segments],
                )
                if _before_commit is not None:
                    _before_commit()
                conn.execute(
                    "UPDATE sessions SET compaction_watermark = %s WHERE id = %s",
                    (watermark, session_id),
                )
        except psycopg.Error as exc:
            raise StoreError(f"compaction of session {session_id!r} failed: {exc}") from exc
        return ids

    def _segment_tokens(self, seg: NewSegment) -> tuple[int, int]:
        summary = seg.summary_tokens
        if summary is None:
            summary = self.counter.count(seg.summary)
        full = seg.full_tokens
        if full is None:
            full = self.counter.count(seg.full_text)
        return summary, full

    @staticmethod
    def insert_segment(
        conn: psycopg.Connection[Any],
        session_id: str,
        seg: NewSegment | StoredSegment,
        tokens: tuple[int, int],
        created_at: datetime,
        seqs: Sequence[int],
        indexed: Indexed,
    ) -> int:
        row = conn.execute(
            "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text, tags,"
            " related_tags, summary_tokens, full_tokens, created_at, text_tokens)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (
                session_id,
                seg.first_seq,
                seg.last_seq,
                seg.summary,
                seg.full_text,
                json.dumps(list(seg.tags)),
                json.dumps(list(seg.related_tags)),
                tokens[0],
                tokens[1],
                created_at,
                indexed.text_tokens,
            ),
        ).fetchone()
        assert row is not None  # INSERT … RETURNING returns the row
        segment_id = int(row[0])
        conn.execute(
            "INSERT INTO segment_turns (segment_id, seq) SELECT %s, s FROM unnest(%s::int[]) s",
            (segment_id, list(seqs)),
        )
        return segment_id

    def segments(
        self, session_id: str, *, tag: str | None = None, full_text: bool = True
    ) -> list[StoredSegment]:
        """The session's segments, earliest first (those carrying ``tag`` when given; their
        ``full_text`` left empty, unread, with ``full_text=False``)."""
        with self._db.read() as conn:
            return self._segments(conn, session_id, None, tag=tag, full_text=full_text)

    @staticmethod
    def _segments(
        conn: psycopg.Connection[Any],
        session_id: str,
        ids: Sequence[int] | None,
        *,
        tag: str | None = None,
        full_text: bool = True,
    ) -> list[StoredSegment]:
        if ids is not None and not ids:
            return []
        where = " WHERE s.session_id = %s"
        params: list[object] = [session_id]
        if ids is not None:
            where += " AND s.id = ANY(%s)"
            params.append(list(ids))
        if tag is not None:
            where += " AND s.tags::jsonb ? %s"
            params.append(tag)
        text = "s.full_text" if full_text else "''"
        rows = conn.execute(
            "SELECT s.id, s.session_id, s.first_seq, s.last_seq, s.summary,"
            f" {text}, s.tags, s.related_tags, s.summary_tokens, s.full_tokens, s.created_at"
            f" FROM segments s{where} ORDER BY s.first_seq, s.id",
            params,
        ).fetchall()
        seqs: dict[int, list[int]] = {}
        if rows:
            # The source turns of these segments only (not every segment's of the session).
            for segment_id, seq in conn.execute(
                "SELECT st.segment_id, st.seq FROM segment_turns st JOIN segments s"
                f" ON s.id = st.segment_id{where} ORDER BY st.segment_id, st.seq",
                params,
            ):
                seqs.setdefault(segment_id, []).append(seq)
        return [
            StoredSegment(
                id=r[0],
                session_id=r[1],
                first_seq=r[2],
                last_seq=r[3],
                summary=r[4],
                full_text=r[5],
                tags=tuple(json.loads(r[6])),
                related_tags=tuple(json.loads(r[7])),
                summary_tokens=r[8],
                full_tokens=r[9],
                created_at=utc(r[10]),
                seqs=tuple(seqs.get(r[0], ())),
            )
            for r in rows
        ]

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]:
        """Segments whose summary matches any word of ``query``, best first, with FTS5's
        ``-bm25()``."""
        with self._db.read() as conn:
            hits = ranked(conn, self._tokenizer, SEGMENTS, session_id, query, limit)
            by_id = {s.id: s for s in self._segments(conn, session_id, [h[0] for h in hits])}
        return [(by_id[segment_id], score) for segment_id, score in hits]


class PostgresPaging:
    """``store.paging``: tag summaries and the working set, over the store's ``Database``
    (``counter`` counts a summary given without its token count)."""

    def __init__(self, db: Database, counter: TokenCounter) -> None:
        self._db = db
        self.counter = counter

    # -- tag summaries --------------------------------------------------------------------------

    def upsert_tag_summary(
        self,
        session_id: str,
        tag: str,
        summary: str,
        source_watermark: int,
        *,
        tokens: int | None = None,
        replaces: int | Literal["any"] | None = "any",
    ) -> bool:
        """Store the one summary of ``tag``, covering its turns up to ``source_watermark``;
        with ``replaces``, only while the stored summary's watermark is still that (``None``:
        while there is none; one statement, re-checked on a concurrent update). Whether it
        was stored."""
        count = self.counter.count(summary) if tokens is None else tokens
        with self._db.statement() as conn:
            if replaces == "any":
                conn.execute(
                    "INSERT INTO tag_summaries (session_id, tag, summary, tokens,"
                    " source_watermark, updated_at) VALUES (%s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (session_id, tag) DO UPDATE SET summary = excluded.summary,"
                    " tokens = excluded.tokens, source_watermark = excluded.source_watermark,"
                    " updated_at = excluded.updated_at",
                    (session_id, tag, summary, count, source_watermark, _now()),
                )
                return True
            if replaces is None:
                cur = conn.execute(
                    "INSERT INTO tag_summaries (session_id, tag, summary, tokens,"
                    " source_watermark, updated_at) VALUES (%s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (session_id, tag) DO NOTHING",
                    (session_id, tag, summary, count, source_watermark, _now()),
                )
            else:
                cur = conn.execute(
                    "UPDATE tag_summaries SET summary = %s, tokens = %s, source_watermark = %s,"
                    " updated_at = %s WHERE session_id = %s AND tag = %s"
                    " AND source_watermark = %s",
                    (summary, count, source_watermark, _now(), session_id, tag, replaces),
                )
            return cur.rowcount == 1

    def tag_summaries(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, TagSummary]:
        """The session's tag summaries by tag (only those of ``tags`` when given), each
        ``stale`` when its tag has a turn after its ``source_watermark``."""
        only = "" if tags is None else " AND ts.tag = ANY(%s)"
        params: tuple[Any, ...] = (session_id,) if tags is None else (session_id, list(tags))
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT ts.session_id, ts.tag, ts.summary, ts.tokens, ts.source_watermark,"
                " EXISTS (SELECT 1 FROM turn_tags tt WHERE tt.session_id = ts.session_id"
                " AND tt.tag = ts.tag AND NOT tt.related AND tt.seq > ts.source_watermark)"
                f" FROM tag_summaries ts WHERE ts.session_id = %s{only}"
                ' ORDER BY ts.tag COLLATE "C"',
                params,
            ).fetchall()
        return {
            r[1]: TagSummary(
                session_id=r[0],
                tag=r[1],
                summary=r[2],
                tokens=r[3],
                source_watermark=r[4],
                stale=bool(r[5]),
            )
            for r in rows
        }

    def segments_since_summary(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, TagRollForward]:
        """For each tag (of ``tags`` when given), its summary and the summaries of its
        segments past that summary's watermark (all of them when it has none), earliest
        first, in one statement (one snapshot). The tags that have some are found from
        ``tag_stats`` (the newest segment's ``last_seq`` per tag) beside ``tag_summaries``,
        one row per tag; only when there are some are segments read, those past the lowest
        watermark among those tags (``segments_by_last_seq``)."""
        with self._db.read() as conn:
            rows = conn.execute(
                "WITH due AS (SELECT st.tag AS tag, ts.summary AS summary,"
                " ts.source_watermark AS wm FROM tag_stats st LEFT JOIN tag_summaries ts"
                " ON ts.session_id = st.session_id AND ts.tag = st.tag"
                " WHERE st.session_id = %(sid)s AND st.segments > 0"
                " AND (%(tags)s::text[] IS NULL OR st.tag = ANY(%(tags)s::text[]))"
                " AND (ts.tag IS NULL OR st.segment_last_seq > ts.source_watermark))"
                " SELECT 0 AS part, tag, summary, wm, NULL::integer AS fs, NULL::bigint AS id"
                " FROM due"
                " UNION ALL"
                " SELECT 1, j.tag, s.summary, s.last_seq, s.first_seq, s.id"
                " FROM segments s CROSS JOIN LATERAL"
                " jsonb_array_elements_text(s.tags::jsonb) AS j(tag) JOIN due d ON d.tag = j.tag"
                " WHERE s.session_id = %(sid)s"
                " AND s.last_seq > (SELECT MIN(COALESCE(wm, -1)) FROM due)"
                " AND (d.wm IS NULL OR s.last_seq > d.wm)"
                " ORDER BY 1, 5, 6",
                {"sid": session_id, "tags": None if tags is None else list(tags)},
            ).fetchall()
        return tag_roll_forward(rows)

    # -- working set ----------------------------------------------------------------------------

    def set_working_set(
        self,
        session_id: str,
        tag: str,
        depth: Depth,
        tokens: int,
        *,
        last_used: datetime | None = None,
    ) -> None:
        """Record the depth a topic is paged in at (``last_used`` defaults to now)."""
        import psycopg

        try:
            with self._db.statement(guarded=True) as conn:
                conn.execute(
                    "INSERT INTO working_set (session_id, tag, depth, last_used, tokens)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session_id, tag) DO UPDATE SET"
                    " depth = excluded.depth, last_used = excluded.last_used,"
                    " tokens = excluded.tokens",
                    (session_id, tag, depth, utc(last_used or _now()), tokens),
                )
        except psycopg.errors.IntegrityError as exc:
            raise ConfigError(
                f"cannot set topic {tag!r} of session {session_id!r} to depth {depth!r}: {exc}"
            ) from exc

    def working_set(self, session_id: str) -> dict[str, WorkingSetEntry]:
        """The session's working set by tag, least recently used first."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT tag, depth, last_used, tokens FROM working_set WHERE session_id = %s"
                ' ORDER BY last_used, tag COLLATE "C"',
                (session_id,),
            ).fetchall()
        return {
            r[0]: WorkingSetEntry(tag=r[0], depth=r[1], last_used=utc(r[2]), tokens=r[3])
            for r in rows
        }


class PostgresCosts:
    """``store.costs``: the cost log, over the store's ``Database``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- costs ----------------------------------------------------------------------------------

    def log_cost(
        self,
        session_id: str | None,
        kind: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float,
        *,
        at: datetime | None = None,
    ) -> None:
        """Record one LLM call (``kind`` e.g. ``"tagging"``, ``"summary"``)."""
        with self._db.statement() as conn:
            conn.execute(
                "INSERT INTO cost_log (session_id, at, kind, model, prompt_tokens,"
                " completion_tokens, cost_usd) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    session_id,
                    utc(at or _now()),
                    kind,
                    model,
                    prompt_tokens,
                    completion_tokens,
                    cost_usd,
                ),
            )

    def cost_report(self, session_id: str | None = None) -> CostReport:
        """Sums over the whole log, or over one session's calls."""
        where, params = ("WHERE session_id = %s", (session_id,)) if session_id else ("", ())
        with self._db.read() as conn:
            total = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(prompt_tokens), 0),"
                " COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_usd), 0.0)"
                f" FROM cost_log {where}",
                params,
            ).fetchone()
            by_kind = conn.execute(
                f"SELECT kind, SUM(cost_usd) FROM cost_log {where} GROUP BY kind"
                ' ORDER BY kind COLLATE "C"',
                params,
            ).fetchall()
        assert total is not None  # an aggregate returns one row
        return CostReport(
            calls=total[0],
            prompt_tokens=total[1],
            completion_tokens=total[2],
            cost_usd=total[3],
            by_kind={r[0]: r[1] for r in by_kind},
        )

    def cost_entries(self) -> list[CostEntry]:
        """The whole cost log, oldest first (in the order the calls were logged)."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT session_id, at, kind, model, prompt_tokens, completion_tokens, cost_usd"
                " FROM cost_log ORDER BY id"
            ).fetchall()
        return [
            CostEntry(
                session_id=r[0],
                at=utc(r[1]),
                kind=r[2],
                model=r[3],
                prompt_tokens=r[4],
                completion_tokens=r[5],
                cost_usd=r[6],
            )
            for r in rows
        ]
