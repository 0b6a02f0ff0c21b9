"""``PostgresMemoryStore.records`` (``PostgresRecords``), shared by every process: the
dashboard's request records and the Responses API's response links — the same semantics as
the SQLite store's.

A record's ``change`` is drawn from the ``records`` row of ``store_counters`` under its row
lock, held to the end of the writing transaction: record writers commit in the order of
their numbers, so a reader polling ``records_after(last seen)`` never misses one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contextfold.store.models import StoredRecord, retention_cut
from contextfold.store.postgres.connection import Database

__all__ = ["PostgresRecords"]

_COLUMNS = "id, session_id, origin, change, body"


def _record(row: Sequence[Any]) -> StoredRecord:
    return StoredRecord(id=row[0], session_id=row[1], origin=row[2], change=row[3], body=row[4])


class PostgresRecords:
    """``store.records``: request records and response links, over the store's
    ``Database``."""

    def __init__(self, db: Database) -> None:
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
        """Write ``(id, session_id, body)`` records in one transaction (an id already stored
        is replaced, keeping its place), each drawing a new ``change``; then drop the oldest
        past the newest ``keep`` or past ``max_bytes`` of bodies (the newest always stays)."""
        if not records:
            return
        with self._db.tx() as conn:
            for record_id, session_id, body in records:
                found = conn.execute(
                    "UPDATE store_counters SET value = value + 1 WHERE name = 'records'"
                    " RETURNING value"
                ).fetchone()
                assert found is not None  # m003 inserts the row
                conn.execute(
                    "INSERT INTO request_records (id, session_id, origin, change, size, body)"
                    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                    " session_id = excluded.session_id, origin = excluded.origin,"
                    " change = excluded.change, size = excluded.size, body = excluded.body",
                    (record_id, session_id, origin, found[0], len(body.encode()), body),
                )
            totals = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM request_records"
            ).fetchone()
            if totals is None or (totals[0] <= keep and totals[1] <= max_bytes):
                return
            cut = retention_cut(
                conn.execute("SELECT pos, size FROM request_records ORDER BY pos DESC"),
                keep,
                max_bytes,
            )
            if cut is not None:
                conn.execute("DELETE FROM request_records WHERE pos <= %s", (cut,))

    def recent_records(
        self, limit: int = 500, *, session_id: str | None = None
    ) -> list[StoredRecord]:
        """The newest records (by first write), newest first; one session's when given."""
        with self._db.read() as conn:
            if session_id is None:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM request_records ORDER BY pos DESC LIMIT %s",
                    (limit,),
                ).fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM request_records WHERE session_id = %s"
                    " ORDER BY pos DESC LIMIT %s",
                    (session_id, limit),
                ).fetchall()
        return [_record(r) for r in rows]

    def record(self, record_id: str) -> StoredRecord | None:
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM request_records WHERE id = %s", (record_id,)
            ).fetchone()
        return None if row is None else _record(row)

    def records_after(self, change: int, *, limit: int = 1000) -> list[StoredRecord]:
        """Records written (or rewritten) after ``change``, in the order of their changes."""
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM request_records WHERE change > %s"
                " ORDER BY change LIMIT %s",
                (change, limit),
            ).fetchall()
        return [_record(r) for r in rows]

    def records_cursor(self) -> int:
        """The latest ``change`` drawn (0 when none)."""
        with self._db.read() as conn:
            row = conn.execute("SELECT value FROM store_counters WHERE name = 'records'").fetchone()
        return int(row[0]) if row else 0

    # -- Responses API chains -------------------------------------------------------------------

    def put_response_link(
        self, principal: str, name: str, session_id: str, seq: int, start: int
    ) -> None:
        with self._db.statement() as conn:
            conn.execute(
                "INSERT INTO response_links (principal, name, session_id, seq, start)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (principal, name) DO UPDATE SET"
                " session_id = excluded.session_id, seq = excluded.seq, start = excluded.start",
                (principal, name, session_id, seq, start),
            )

    def response_link(self, principal: str, name: str) -> tuple[str, int, int] | None:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT session_id, seq, start FROM response_links"
                " WHERE principal = %s AND name = %s",
                (principal, name),
            ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))
