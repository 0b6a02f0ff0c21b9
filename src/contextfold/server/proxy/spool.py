"""Exchanges the store could not take, kept on local disk until it can.

The proxy commits each exchange before the reply's last byte goes to the client
(``commit``). When that commit fails — a PostgreSQL server restarting or failing over, an
SQLite file locked past its timeout or on a full disk — the client still gets its reply, so the
exchange is written here instead: one row of an SQLite file in contextfold's home
(``spool.db``, synchronous writes), before the reply's last byte, as the commit would have been.
A thread of the proxy (``SpoolReplayer``) stores the rows in the order they came, once the
store takes writes again, then deletes them; one process at a time replays (a lock file), and
a server started later replays what a stopped or killed one left.

A replay stores what a request would: it finds the conversation again by its history (the
request as the client sent it, and the reply) and stores only what the store lacks. So it is
idempotent: when the conversation's next request came first and stored the exchange with its
own history, the replay finds it stored and writes nothing (no duplicate, no fork).

Rows name the store they belong to (``store_key``): several servers sharing one home, on
different stores, replay only their own. A store that lives in memory (``:memory:``) gets no
spool: its exchanges could not outlive the process anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contextfold._bounded import clip
from contextfold.items import Message

__all__ = ["ExchangeSpool", "SpoolReplayer", "Spooled", "is_outage", "store_key"]

logger = logging.getLogger("contextfold.server.proxy")

#: The longest a replayer waits between tries while the store stays down (it starts at
#: ``FIRST_RETRY_S`` and doubles).
MAX_RETRY_S = 10.0
FIRST_RETRY_S = 0.5
#: Rows replayed per read of the spool (the rest in the next read of the same round).
BATCH = 64
#: A row whose replay fails this many times with an error that is not the store being
#: unreachable (``is_outage``) is given up: kept in the file, no longer replayed, so it
#: cannot hold up the rows after it.
MAX_ATTEMPTS = 5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS exchanges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    store_key TEXT NOT NULL,
    spooled_at TEXT NOT NULL,
    format TEXT NOT NULL,
    principal TEXT NOT NULL,
    header TEXT,
    body TEXT NOT NULL,
    reply TEXT NOT NULL,
    partial INTEGER NOT NULL,
    exchange_time TEXT NOT NULL,
    new_session TEXT,
    response_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    given_up INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS exchanges_by_store ON exchanges (store_key, id);
"""


def private(path: Path) -> None:
    """Make ``path`` (empty) readable and writable by its owner only, if it does not exist
    (SQLite gives the file's ``-wal`` and ``-shm`` its mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def store_key(location: str) -> str | None:
    """The key naming a store's rows (``None``: a store in memory, which gets no spool): a
    digest of its location (an absolute path; a URL as its server and database, the password
    already masked by the store)."""
    if not location or location == ":memory:" or location.startswith("file::memory:"):
        return None
    if "://" not in location:
        location = str(Path(location).resolve())
    return hashlib.sha256(location.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Spooled:
    """One exchange waiting for the store: the request as the client sent it (its wire format
    and parsed body), who sent it, and the reply it got."""

    id: int
    format: str
    principal: str
    header: str | None
    body: dict[str, Any]
    reply: Message
    partial: bool
    exchange_time: datetime
    new_session: str | None
    response_id: str | None
    attempts: int  # replays tried
    errors: int  # of them, those that failed with an error that was not an outage


class ExchangeSpool:
    """The spool file (``path``) for one store (``key``: ``store_key``)."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key

    def __repr__(self) -> str:
        return f"ExchangeSpool({str(self.path)!r})"

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to the file, made (readable by its owner only: it holds whole
        prompts and replies) and given its table if it has none — every time, so a file an
        operator deleted is made again."""
        private(self.path)
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=FULL")  # on disk before the reply's last byte
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(exchanges)")}
            for column in ("errors", "given_up"):  # (a spool written before they were kept)
                if column not in columns:
                    conn.execute(
                        f"ALTER TABLE exchanges ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0"
                    )
            yield conn
        finally:
            conn.close()

    def add(
        self,
        *,
        format: str,
        principal: str,
        header: str | None,
        body: dict[str, Any],
        reply: Message,
        partial: bool,
        exchange_time: datetime | None,
        new_session: str | None,
        response_id: str | None,
    ) -> int:
        """Keep one exchange (durably: the call returns once it is on disk); its row id."""
        now = datetime.now(UTC)
        row = (
            self.key,
            now.isoformat(),
            format,
            principal,
            header,
            json.dumps(body, ensure_ascii=False, separators=(",", ":")),
            reply.model_dump_json(),
            int(partial),
            (exchange_time or now).isoformat(),
            new_session,
            response_id,
        )
        with self._connect() as conn:
            cursor = conn.execute(
                "INSERT INTO exchanges (store_key, spooled_at, format, principal, header, body,"
                " reply, partial, exchange_time, new_session, response_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return int(cursor.lastrowid or 0)

    def pending(self, *, given_up: bool = False) -> int:
        """How many exchanges of this store wait (0 when the file does not exist yet); with
        ``given_up``, how many were given up instead."""
        if not self.path.exists():
            return 0
        with self._connect() as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM exchanges WHERE store_key = ? AND given_up = ?",
                (self.key, int(given_up)),
            ).fetchone()
        return int(count)

    def oldest(self, limit: int = BATCH) -> list[Spooled]:
        """The ``limit`` oldest waiting exchanges, in the order they were spooled."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, format, principal, header, body, reply, partial, exchange_time,"
                " new_session, response_id, attempts, errors FROM exchanges WHERE store_key = ?"
                " AND given_up = 0 ORDER BY id LIMIT ?",
                (self.key, limit),
            ).fetchall()
        return [
            Spooled(
                id=r[0],
                format=r[1],
                principal=r[2],
                header=r[3],
                body=json.loads(r[4]),
                reply=Message.model_validate_json(r[5]),
                partial=bool(r[6]),
                exchange_time=datetime.fromisoformat(r[7]),
                new_session=r[8],
                response_id=r[9],
                attempts=r[10],
                errors=r[11],
            )
            for r in rows
        ]

    def done(self, spooled_id: int) -> None:
        with self._connect() as conn:
            conn.execute("DELETE FROM exchanges WHERE id = ?", (spooled_id,))

    def failed(
        self, spooled_id: int, error: str, *, outage: bool = True, give_up: bool = False
    ) -> None:
        """Count a replay that failed (``outage``: the store could not be reached)."""
        with self._connect() as conn:
            conn.execute(
                "UPDATE exchanges SET attempts = attempts + 1, errors = errors + ?,"
                " last_error = ?, given_up = ? WHERE id = ?",
                (int(not outage), clip(error), int(give_up), spooled_id),
            )

    @contextlib.contextmanager
    def replaying(self) -> Iterator[bool]:
        """Whether this process may replay now (no other process is): an exclusive lock on
        ``<spool>.lock`` held for the block, released if the process dies."""
        import fcntl

        lock = Path(f"{self.path}.lock")
        private(lock)
        with lock.open("a+b") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store cannot be reached or written now (retried for as long
    as it lasts), not that this exchange cannot be stored (given up after ``MAX_ATTEMPTS``)."""
    from contextfold.store.postgres.pool import StoreUnavailable

    if isinstance(exc, StoreUnavailable | sqlite3.OperationalError | OSError):
        return True
    return type(exc).__name__ in {"OperationalError", "PoolTimeout", "InterfaceError"} and (
        type(exc).__module__.startswith(("psycopg", "psycopg_pool"))
    )


class SpoolReplayer:
    """A thread that stores the spool's exchanges (``replay``: one exchange into the store,
    raising when the store still fails), oldest first, once the store takes them: at start
    (what an earlier process left), after ``wake`` (an exchange just spooled), and then every
    retry while the store stays down (from ``FIRST_RETRY_S`` doubling to ``MAX_RETRY_S``). The
    first exchange that fails ends a round, so a conversation's exchanges land in order."""

    def __init__(self, spool: ExchangeSpool, replay: Callable[[Spooled], object]) -> None:
        self.spool = spool
        self.replay = replay
        self.replayed = 0  # exchanges stored by this replayer
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="contextfold-spool", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> int:
        """Stop the thread; returns how many exchanges still wait in the spool (0 when the
        spool cannot be read)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            return self.spool.pending()
        except (sqlite3.Error, OSError):
            return 0

    def _run(self) -> None:
        delay: float | None = 0.0  # a first round at once: what an earlier process left
        while not self._stop.is_set():
            if delay is None or delay > 0:
                self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                left = self.round()
            except Exception as exc:  # the spool file itself failed: try again later
                logger.error("the exchange spool %s failed: %s", self.spool.path, exc)
                left = True
            if not left:
                delay = None
            else:
                delay = FIRST_RETRY_S if not delay else min(MAX_RETRY_S, delay * 2)

    def round(self) -> bool:
        """Replay every waiting exchange, oldest first, until one fails; whether any is left
        (or another process holds the spool)."""
        with self.spool.replaying() as mine:
            if not mine:
                return True
            stored = 0
            try:
                while not self._stop.is_set():
                    batch = self.spool.oldest()
                    if not batch:
                        return False
                    for spooled in batch:
                        try:
                            self.replay(spooled)
                        except Exception as exc:
                            error = f"{type(exc).__name__}: {exc}"
                            outage = is_outage(exc)
                            if not outage and spooled.errors + 1 >= MAX_ATTEMPTS:
                                self.spool.failed(spooled.id, error, outage=False, give_up=True)
                                logger.error(
                                    "gave up a spooled exchange (row %d of %s) after %d"
                                    " attempts: %s",
                                    spooled.id,
                                    self.spool.path,
                                    MAX_ATTEMPTS,
                                    clip(error),
                                )
                                continue
                            self.spool.failed(spooled.id, error, outage=outage)
                            if spooled.attempts == 0 or spooled.attempts % 20 == 0:
                                logger.warning(
                                    "a spooled exchange is not stored yet (%d waiting): %s: %s",
                                    self.spool.pending(),
                                    type(exc).__name__,
                                    clip(str(exc)),
                                )
                            return True
                        self.spool.done(spooled.id)
                        stored += 1
                        self.replayed += 1
                return True
            finally:
                if stored:
                    logger.info("stored %d spooled exchange(s) in the memory store", stored)
