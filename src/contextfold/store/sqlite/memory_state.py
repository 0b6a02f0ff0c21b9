"""``MemoryStore``'s paging state and bookkeeping: the one summary per tag, each
session's working set (the topics paged in and at which depth) and the log of LLM calls with
their cost (summed by ``cost_report``, read whole by ``cost_entries``).

``SqlitePaging`` (``MemoryStore.paging``: tag summaries, the working set) and ``SqliteCosts``
(``MemoryStore.costs``: the cost log) hold these methods, each made with the store's
connections (``memory_db.MemoryDb``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from contextfold.errors import ConfigError
from contextfold.store.models import (
    CostEntry,
    CostReport,
    Depth,
    TagRollForward,
    TagSummary,
    WorkingSetEntry,
    _iso,
    _now,
    tag_roll_forward,
)
from contextfold.store.sqlite.connection import select_in
from contextfold.store.sqlite.memory_db import MemoryDb
from contextfold.tokens import TokenCounter

__all__ = ["SqliteCosts", "SqlitePaging"]


class SqlitePaging:
    """``store.paging``: tag summaries and the working set, over the store's ``MemoryDb``
    (``counter`` counts a summary given without its token count)."""

    def __init__(self, db: MemoryDb, counter: TokenCounter) -> None:
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
        while there is none). Whether it was stored."""
        count = self.counter.count(summary) if tokens is None else tokens
        now = _iso(_now())
        with self._db.tx() as conn:
            if replaces == "any":
                conn.execute(
                    "INSERT INTO tag_summaries (session_id, tag, summary, tokens,"
                    " source_watermark, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (session_id, tag) DO UPDATE SET summary = excluded.summary,"
                    " tokens = excluded.tokens, source_watermark = excluded.source_watermark,"
                    " updated_at = excluded.updated_at",
                    (session_id, tag, summary, count, source_watermark, now),
                )
                return True
            if replaces is None:
                cur = conn.execute(
                    "INSERT INTO tag_summaries (session_id, tag, summary, tokens,"
                    " source_watermark, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (session_id, tag) DO NOTHING",
                    (session_id, tag, summary, count, source_watermark, now),
                )
            else:
                cur = conn.execute(
                    "UPDATE tag_summaries SET summary = ?, tokens = ?, source_watermark = ?,"
                    " updated_at = ? WHERE session_id = ? AND tag = ? AND source_watermark = ?",
                    (summary, count, source_watermark, now, session_id, tag, replaces),
                )
            return cur.rowcount == 1

    def tag_summaries(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, TagSummary]:
        """The session's tag summaries by tag (only those of ``tags`` when given: a read of
        their rows alone), each flagged ``stale`` when its tag has a turn after its
        ``source_watermark``."""
        query = (
            "SELECT ts.*, EXISTS (SELECT 1 FROM turn_tags tt WHERE tt.session_id = ts.session_id"
            " AND tt.tag = ts.tag AND tt.related = 0 AND tt.seq > ts.source_watermark) AS stale"
            " FROM tag_summaries ts WHERE ts.session_id = ?{} ORDER BY ts.tag"
        )
        if tags is None:
            rows = self._db.conn.execute(query.format(""), (session_id,)).fetchall()
        else:
            in_tags = query.format(" AND ts.tag IN ({})")
            rows = select_in(self._db.conn, in_tags, tags, before=(session_id,))
        return {
            r["tag"]: TagSummary(
                session_id=r["session_id"],
                tag=r["tag"],
                summary=r["summary"],
                tokens=r["tokens"],
                source_watermark=r["source_watermark"],
                stale=bool(r["stale"]),
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
        rows = self._db.conn.execute(
            "WITH due AS (SELECT st.tag AS tag, ts.summary AS summary,"
            " ts.source_watermark AS wm FROM tag_stats st LEFT JOIN tag_summaries ts"
            " ON ts.session_id = st.session_id AND ts.tag = st.tag"
            " WHERE st.session_id = :sid AND st.segments > 0"
            " AND (:tags IS NULL OR st.tag IN (SELECT value FROM json_each(:tags)))"
            " AND (ts.tag IS NULL OR st.segment_last_seq > ts.source_watermark))"
            " SELECT 0 AS part, tag, summary, wm, NULL AS fs, NULL AS id FROM due"
            " UNION ALL"
            " SELECT 1, j.value, s.summary, s.last_seq, s.first_seq, s.id"
            " FROM segments s, json_each(s.tags) j, due d"
            " WHERE s.session_id = :sid"
            " AND s.last_seq > (SELECT MIN(COALESCE(wm, -1)) FROM due)"
            " AND d.tag = j.value AND (d.wm IS NULL OR s.last_seq > d.wm)"
            " ORDER BY 1, 5, 6",
            {"sid": session_id, "tags": None if tags is None else json.dumps(list(tags))},
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
        try:
            with self._db.tx() as conn:
                conn.execute(
                    "INSERT INTO working_set (session_id, tag, depth, last_used, tokens)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, tag) DO UPDATE SET"
                    " depth = excluded.depth, last_used = excluded.last_used,"
                    " tokens = excluded.tokens",
                    (session_id, tag, depth, _iso(last_used or _now()), tokens),
                )
        except sqlite3.IntegrityError as exc:
            raise ConfigError(
                f"cannot set topic {tag!r} of session {session_id!r} to depth {depth!r}: {exc}"
            ) from exc

    def working_set(self, session_id: str) -> dict[str, WorkingSetEntry]:
        """The session's working set by tag, least recently used first."""
        rows = self._db.conn.execute(
            "SELECT tag, depth, last_used, tokens FROM working_set WHERE session_id = ?"
            " ORDER BY last_used, tag",
            (session_id,),
        )
        return {
            r["tag"]: WorkingSetEntry(
                tag=r["tag"],
                depth=r["depth"],
                last_used=datetime.fromisoformat(r["last_used"]),
                tokens=r["tokens"],
            )
            for r in rows
        }


class SqliteCosts:
    """``store.costs``: the cost log, over the store's ``MemoryDb``."""

    def __init__(self, db: MemoryDb) -> None:
        self._db = db

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
        with self._db.tx() as conn:
            conn.execute(
                "INSERT INTO cost_log (session_id, at, kind, model, prompt_tokens,"
                " completion_tokens, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    _iso(at or _now()),
                    kind,
                    model,
                    prompt_tokens,
                    completion_tokens,
                    cost_usd,
                ),
            )

    def cost_report(self, session_id: str | None = None) -> CostReport:
        """Sums over the whole log, or over one session's calls."""
        where, params = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        total = self._db.conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens),"
            f" 0), COALESCE(SUM(cost_usd), 0.0) FROM cost_log {where}",
            params,
        ).fetchone()
        by_kind = self._db.conn.execute(
            f"SELECT kind, SUM(cost_usd) FROM cost_log {where} GROUP BY kind ORDER BY kind",
            params,
        )
        return CostReport(
            calls=total[0],
            prompt_tokens=total[1],
            completion_tokens=total[2],
            cost_usd=total[3],
            by_kind={r[0]: r[1] for r in by_kind},
        )

    def cost_entries(self) -> list[CostEntry]:
        """The whole cost log, oldest first (by ``at``; calls logged at the same moment in the
        order they were written)."""
        rows = self._db.conn.execute(
            "SELECT session_id, at, kind, model, prompt_tokens, completion_tokens, cost_usd"
            " FROM cost_log ORDER BY at, id"
        )
        return [
            CostEntry(
                session_id=r["session_id"],
                at=datetime.fromisoformat(r["at"]),
                kind=r["kind"],
                model=r["model"],
                prompt_tokens=r["prompt_tokens"],
                completion_tokens=r["completion_tokens"],
                cost_usd=r["cost_usd"],
            )
            for r in rows
        ]
