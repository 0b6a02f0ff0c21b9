"""Statements the PostgreSQL memory store's core and its facets share, each run on a
connection in the caller's transaction (the connections themselves are ``connection.Database``,
one per store, which the store and every facet are made with)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["count_live", "last_seq"]


def last_seq(conn: psycopg.Connection[Any], session_id: str) -> int:
    """The seq of the session's last turn (0 when it has none)."""
    row = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM turns WHERE session_id = %s", (session_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def count_live(conn: psycopg.Connection[Any], session_id: str) -> None:
    """Count the session's live tokens (``sessions.live_tokens``) from its turns: after
    turns were written other than by ``cf_append_json`` (a fork, a loaded session)."""
    conn.execute(
        "UPDATE sessions s SET live_tokens = (SELECT COALESCE(SUM(t.token_count), 0)"
        " FROM turns t WHERE t.session_id = s.id AND t.seq >= s.compaction_watermark)"
        " WHERE s.id = %s",
        (session_id,),
    )
