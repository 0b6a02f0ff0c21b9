"""``MemoryStore.records`` (``SqliteRecords``): the records shared by every process, the
dashboard's request records and the Responses API's response links (the PostgreSQL store's
``memory_records.py`` keeps the same semantics).

A record's ``change`` is drawn from the ``records`` row of ``store_counters`` inside the
writing transaction (SQLite has one writer at a time): record writers commit in the order of
their numbers, so a reader polling ``records_after(last seen)`` never misses one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from contextfold.store.models import StoredRecord, retention_cut
from contextfold.store.sqlite.memory_db import MemoryDb

__all__ = ["SqliteRecords"]


def _record(row: sqlite3.Row) -> StoredRecord:
    return StoredRecord(
        id=row["id"],
        session_id=row["session_id"],
        origin=row["origin"],
        change=row["change"],
        body=row["body"],
    )


class SqliteRecords:
    """``store.records``: request records and response links, over the store's
    ``MemoryDb``."""

    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    # -- request records ------------------------------------------------------------------------

    def put_records(
        self,
        records: Sequence[tuple[str, str, str]],
        *,
        origin: str,
        keep: int = 500,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if not records:
            return
        with self._db.tx() as conn:
            for record_id, session_id, body in records:
                change = conn.execute(
                    "UPDATE store_counters SET value = value + 1 WHERE name = 'records'"
                    " RETURNING value"
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO request_records (id, session_id, origin, change, size, body)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                    " session_id = excluded.session_id, origin = excluded.origin,"
                    " change = excluded.change, size = excluded.size, body = excluded.body",
                    (record_id, session_id, origin, change, len(body.encode()), body),
                )
            count, total = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM request_records"
            ).fetchone()
            if count <= keep and total <= max_bytes:
                return
            cut = retention_cut(
                conn.execute("SELECT pos, size FROM request_records ORDER BY pos DESC"),
                keep,
                max_bytes,
            )
            if cut is not None:
                conn.execute("DELETE FROM request_records WHERE pos <= ?", (cut,))

    def recent_records(
        self, limit: int = 500, *, session_id: str | None = None
    ) -> list[StoredRecord]:
        if session_id is None:
            rows = self._db.conn.execute(
                "SELECT * FROM request_records ORDER BY pos DESC LIMIT ?", (limit,)
            )
        else:
            rows = self._db.conn.execute(
                "SELECT * FROM request_records WHERE session_id = ? ORDER BY pos DESC LIMIT ?",
                (session_id, limit),
            )
        return [_record(r) for r in rows]

    def record(self, record_id: str) -> StoredRecord | None:
        row = self._db.conn.execute(
            "SELECT * FROM request_records WHERE id = ?", (record_id,)
        ).fetchone()
        return None if row is None else _record(row)

    def records_after(self, change: int, *, limit: int = 1000) -> list[StoredRecord]:
        rows = self._db.conn.execute(
            "SELECT * FROM request_records WHERE change > ? ORDER BY change LIMIT ?",
            (change, limit),
        )
        return [_record(r) for r in rows]

    def records_cursor(self) -> int:
        row = self._db.conn.execute(
            "SELECT value FROM store_counters WHERE name = 'records'"
        ).fetchone()
        return int(row[0]) if row else 0

    # -- Responses API chains -------------------------------------------------------------------

    def put_response_link(
        self, principal: str, name: str, session_id: str, seq: int, start: int
    ) -> None:
        with self._db.tx() as conn:
            conn.execute(
                "INSERT INTO response_links (principal, name, session_id, seq, start)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (principal, name) DO UPDATE SET"
                " session_id = excluded.session_id, seq = excluded.seq, start = excluded.start",
                (principal, name, session_id, seq, start),
            )

    def response_link(self, principal: str, name: str) -> tuple[str, int, int] | None:
        row = self._db.conn.execute(
            "SELECT session_id, seq, start FROM response_links WHERE principal = ? AND name = ?",
            (principal, name),
        ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))
