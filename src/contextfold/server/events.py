"""What the dashboard shows: one ``RequestRecord`` per proxied request, published on an
``EventBus`` that keeps the recent records and fans new ones out to live subscribers (SSE).

The proxy publishes a record when a request has been forwarded and updates it (same ``id``)
when the reply is complete and its tags are known; subscribers receive both versions.

Records keep previews, never whole texts: each inspected message's text and the injected
context are cut (``preview``, saying how long they were), and the bus keeps at most ``keep``
records and at most ``max_bytes`` of their text, the oldest going first.

Attached to a store (``EventBus.attach``: the server does it), the records are also kept
there, written in batches by a thread of the bus (``MemoryStorage.records.put_records``, with the
same bounds), and read back from it: every worker process sharing the store lists, shows and
streams the records of all of them (a stream polls the store for the other processes'
records every ``poll`` seconds while it is open), and a restart keeps them.

>>> import asyncio
>>> bus = EventBus(keep=2)
>>> for n in range(3):
...     bus.publish(RequestRecord(id=f"r{n}", session_id="s", turn=n))
>>> [r.id for r in bus.recent()]
['r1', 'r2']
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contextfold._bounded import clip
from contextfold.store.models import owner_id

if TYPE_CHECKING:
    from contextfold.store.models import StoredRecord
    from contextfold.store.protocols import MemoryStorage

log = logging.getLogger(__name__)

__all__ = [
    "MAX_PREVIEW",
    "BudgetRow",
    "EventBus",
    "InspectedMessage",
    "PassThroughCounts",
    "RequestRecord",
    "preview",
]

#: The characters of a text (the injected context, a result) a record keeps.
MAX_PREVIEW = 8000


def preview(text: str, limit: int = MAX_PREVIEW) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def record_size(record: RequestRecord) -> int:
    """The bytes a record keeps, near enough (its texts, plus a fixed cost per part)."""
    size = 2000 + len(record.context) + len(record.error or "") + len(record.path)
    size += sum(300 + len(m.text) for m in record.messages)
    size += sum(100 + len(d) for d in record.dropped)
    size += len(repr(record.extra)) if record.extra else 0
    return size


class BudgetRow(BaseModel):
    """One section of the per-request budget table."""

    model_config = ConfigDict(frozen=True)
    section: str
    budget: int
    used: int
    items: int = 0
    truncated: bool = False


class InspectedMessage(BaseModel):
    """A message as the turn inspector shows it: its role, its block types and its text."""

    model_config = ConfigDict(frozen=True)
    role: str
    blocks: tuple[str, ...] = ()
    text: str = ""


class RequestRecord(BaseModel):
    """One proxied request (or one ``/api/context`` call, or one compaction: kind
    ``compaction``, its report in ``extra``) as the dashboard sees it."""

    model_config = ConfigDict(frozen=True)
    id: str
    session_id: str
    turn: int = 0
    kind: Literal["proxy", "context", "compaction"] = "proxy"
    format: str = "openai"
    path: str = ""
    model: str | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    stream: bool = False
    status: int | None = None
    inbound_tags: tuple[str, ...] = ()
    response_tags: tuple[str, ...] | None = None  # None until the reply has been tagged
    broad: bool = False
    temporal: bool = False
    tokens_in: int = 0  # the client's request
    tokens_forwarded: int = 0  # what went upstream (memory added, history filtered)
    memory_tokens: int = 0
    overhead_ms: float = 0.0  # time spent in contextfold before forwarding
    upstream_ms: float | None = None
    dropped_turns: int = 0
    dropped: tuple[str, ...] = ()  # one reason per dropped turn
    messages: tuple[InspectedMessage, ...] = ()
    context: str = ""  # the memory / context block that was injected
    budget: tuple[BudgetRow, ...] = ()
    error: str | None = None  # an engine error the proxy failed open on
    extra: dict[str, Any] = Field(default_factory=dict)


#: A subscriber this far behind misses records (the page can reload ``recent()``) rather than
#: holding the publisher up.
_BACKLOG = 1000


def _offer(queue: asyncio.Queue[RequestRecord | None], record: RequestRecord) -> None:
    if queue.qsize() < _BACKLOG:
        queue.put_nowait(record)


_Subscriber = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[RequestRecord | None]"]


class EventBus:
    """Recent records (at most ``keep``, by id: an update replaces its earlier version in
    place) and live subscribers. ``publish`` and ``close`` may be called from any thread.

    ``close()`` ends every subscription (the server calls it when it stops, so open dashboard
    streams finish instead of holding the stop up); records published afterwards are still
    kept, and a subscription started afterwards ends at once.
    """

    def __init__(self, keep: int = 500, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.keep = keep
        self.max_bytes = max_bytes
        self.bytes = 0
        self._sizes: dict[str, int] = {}
        self._records: OrderedDict[str, RequestRecord] = OrderedDict()
        self._subscribers: set[_Subscriber] = set()
        self._lock = threading.Lock()
        self._closed = False
        # The store the records are kept in (``attach``), what waits to be written there, the
        # records read back (by id, with the change they were read at), and the threads that
        # write them and poll for the other processes' records.
        self.store: MemoryStorage | None = None
        self.origin = owner_id()
        self.flush_every = 0.2
        self.poll = 0.5
        self._pending: dict[str, RequestRecord] = {}
        self._parsed: OrderedDict[str, tuple[int, RequestRecord]] = OrderedDict()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._flusher: threading.Thread | None = None
        self._poller: threading.Thread | None = None
        self._store_lock = threading.Lock()  # one flush at a time
        self._failing = False  # the last flush failed (logged once until one succeeds)

    # -- the store ------------------------------------------------------------------------------

    def attach(self, store: MemoryStorage) -> None:
        """Keep the records in ``store`` too, and read them from there (see the module
        docstring); a second call with the same store does nothing."""
        with self._lock:
            self.store = store
            self._stopped.clear()

    def _flush_loop(self) -> None:
        """Write what is published every ``flush_every`` seconds; end after a second with
        nothing to write (``publish`` starts the thread again)."""
        idle = failed = 0
        while not self._stopped.is_set() and idle * self.flush_every < 1.0:
            self._wake.wait(self.flush_every)
            self._wake.clear()
            with self._lock:
                idle = 0 if self._pending else idle + 1
            failed = 0 if self.flush() else failed + 1
            if failed * self.flush_every >= 10.0:  # the store is gone: these records too
                with self._lock:
                    log.warning("dropped %d dashboard record(s) unstored", len(self._pending))
                    self._pending.clear()
        with self._lock:
            if self._flusher is threading.current_thread():
                self._flusher = None
        if self._pending and not self._stopped.is_set():
            self._start_flusher()  # published while this thread was ending

    def _start_flusher(self) -> None:
        with self._lock:
            if self._flusher is not None or self.store is None or self._stopped.is_set():
                return
            thread = self._flusher = threading.Thread(
                target=self._flush_loop, name="contextfold-records", daemon=True
            )
        thread.start()

    def flush(self) -> bool:
        """Write the records published since the last flush to the store now; False when
        the store refused them (they are tried again at the next flush)."""
        store = self.store
        if store is None:
            return True
        with self._store_lock:
            with self._lock:
                batch = list(self._pending.values())
            if not batch:
                return True
            rows = [(r.id, r.session_id, r.model_dump_json()) for r in batch]
            try:
                store.records.put_records(
                    rows, origin=self.origin, keep=self.keep, max_bytes=self.max_bytes
                )
            except Exception as exc:  # locked, closed or down: kept for the next try
                if not self._failing:
                    log.warning("cannot store dashboard records: %s: %s", type(exc).__name__, exc)
                self._failing = True
                return False
            self._failing = False
            with self._lock:
                for record in batch:
                    if self._pending.get(record.id) is record:
                        del self._pending[record.id]
            return True

    def detach(self) -> None:
        """Write what is pending and stop the bus's threads (before the store closes)."""
        self._stopped.set()
        self._wake.set()
        with self._lock:
            threads = (self._flusher, self._poller)
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(5)
        self.flush()
        with self._lock:
            self.store = None
            self._flusher = self._poller = None

    def _parse(self, row: StoredRecord) -> RequestRecord | None:
        with self._lock:
            known = self._parsed.get(row.id)
        if known is not None and known[0] == row.change:
            return known[1]
        try:
            record = RequestRecord.model_validate_json(row.body)
        except ValidationError as exc:  # written by another version: left out
            log.warning("unreadable dashboard record %s: %s", row.id, clip(str(exc), 200))
            return None
        with self._lock:
            self._parsed[row.id] = (row.change, record)
            while len(self._parsed) > 2 * self.keep + 100:
                self._parsed.popitem(last=False)
        return record

    def _stored(self, session_id: str | None) -> list[RequestRecord] | None:
        """The kept records from the store (oldest first) with the ones not written there
        yet; None without a store, or when it cannot be read."""
        store = self.store
        if store is None:
            return None
        try:
            rows = store.records.recent_records(self.keep, session_id=session_id)
        except Exception as exc:
            log.warning("cannot read dashboard records: %s: %s", type(exc).__name__, exc)
            return None
        found: dict[str, RequestRecord] = {}
        for row in reversed(rows):
            record = self._parse(row)
            if record is not None:
                found[row.id] = record
        with self._lock:
            pending = list(self._pending.values())
        for record in pending:
            if session_id is None or record.session_id == session_id:
                found[record.id] = record
        return list(found.values())

    def _poll_loop(self, store: MemoryStorage, cursor: int) -> None:
        """While anyone subscribes: every ``poll`` seconds, the records other processes
        wrote to the store after ``cursor``, to every subscriber."""
        while not self._stopped.wait(self.poll):
            with self._lock:
                if not self._subscribers or self._closed or self.store is not store:
                    self._poller = None
                    return
            try:
                rows = store.records.records_after(cursor)
            except Exception as exc:
                log.warning("cannot poll dashboard records: %s: %s", type(exc).__name__, exc)
                continue
            for row in rows:
                cursor = max(cursor, row.change)
                if row.origin == self.origin:
                    continue  # this process's subscribers had it when it was published
                record = self._parse(row)
                if record is not None:
                    self._fan_out(record)

    # -- publishing -----------------------------------------------------------------------------

    def publish(self, record: RequestRecord) -> None:
        size = record_size(record)
        with self._lock:
            self._records[record.id] = record
            self.bytes += size - self._sizes.get(record.id, 0)
            self._sizes[record.id] = size
            while len(self._records) > self.keep or (
                self.bytes > self.max_bytes and len(self._records) > 1
            ):
                dropped, _ = self._records.popitem(last=False)
                self.bytes -= self._sizes.pop(dropped)
            if self.store is not None:
                self._pending[record.id] = record
                while len(self._pending) > self.keep:  # the store is down: the oldest go
                    self._pending.pop(next(iter(self._pending)))
        if self.store is not None:
            self._start_flusher()
        self._fan_out(record)

    def _fan_out(self, record: RequestRecord) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            try:
                loop.call_soon_threadsafe(_offer, queue, record)
            except RuntimeError:  # the subscriber's loop has closed
                with self._lock:
                    self._subscribers.discard((loop, queue))

    def recent(self, session_id: str | None = None) -> list[RequestRecord]:
        """The kept records (every process's, with a store), oldest first."""
        stored = self._stored(session_id)
        if stored is not None:
            return stored
        with self._lock:
            records = list(self._records.values())
        return [r for r in records if session_id is None or r.session_id == session_id]

    def get(self, record_id: str) -> RequestRecord | None:
        with self._lock:
            found = self._pending.get(record_id)
            store = self.store
            if found is None and store is None:
                return self._records.get(record_id)
        if found is not None or store is None:
            return found
        try:
            row = store.records.record(record_id)
        except Exception as exc:
            log.warning("cannot read a dashboard record: %s: %s", type(exc).__name__, exc)
            with self._lock:
                return self._records.get(record_id)
        return None if row is None else self._parse(row)

    def close(self) -> None:
        """End every subscription: each one yields what it has queued, then stops."""
        with self._lock:
            self._closed = True
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            with contextlib.suppress(RuntimeError):  # the subscriber's loop has closed
                loop.call_soon_threadsafe(queue.put_nowait, None)

    async def subscribe(self) -> AsyncIterator[RequestRecord]:
        """New and updated records as they are published, until the consumer stops or the
        bus is closed."""
        queue: asyncio.Queue[RequestRecord | None] = asyncio.Queue()  # _offer bounds it
        entry = (asyncio.get_running_loop(), queue)
        store = self.store
        cursor = 0
        if store is not None:
            try:  # before the caller's snapshot: a record written in between is streamed
                cursor = store.records.records_cursor()
            except Exception as exc:
                log.warning("cannot poll dashboard records: %s: %s", type(exc).__name__, exc)
        with self._lock:
            if self._closed:
                return
            self._subscribers.add(entry)
            poller = None
            if store is not None and self.store is store and self._poller is None:
                poller = self._poller = threading.Thread(
                    target=self._poll_loop,
                    args=(store, cursor),
                    name="contextfold-records-poll",
                    daemon=True,
                )
        if poller is not None:
            poller.start()
        try:
            while (record := await queue.get()) is not None:
                yield record
        finally:
            with self._lock:
                self._subscribers.discard(entry)


class PassThroughCounts:
    """Requests the proxy forwarded without memory because their route is not a conversation
    it reads (model lists, embeddings, files, token counts, …), counted per route label
    (``label``) so the dashboard and the log show what got no memory. At most ``routes``
    labels are kept; the rest count under ``other``. Thread-safe."""

    OTHER = "other"

    def __init__(self, routes: int = 50) -> None:
        self.routes = routes
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def label(method: str, path: str) -> str:
        """The method and the route's first two path segments (ids and model names past them
        are one route): ``GET /v1/models/…``.

        >>> PassThroughCounts.label("get", "/v1/files/file-123/content")
        'GET /v1/files/…'
        """
        parts = [p for p in path.split("?", 1)[0].split("/") if p]
        route = "/" + "/".join(parts[:2]) + ("/…" if len(parts) > 2 else "")
        return f"{method.upper()} {route}"

    def count(self, method: str, path: str) -> bool:
        """Count one request; whether its route was seen for the first time."""
        key = self.label(method, path)
        with self._lock:
            if key not in self._counts and len(self._counts) >= self.routes:
                key = self.OTHER
            first = key not in self._counts
            self._counts[key] = self._counts.get(key, 0) + 1
            return first

    def snapshot(self) -> dict[str, Any]:
        """``{"total": n, "routes": {label: n, …}}``, the busiest route first."""
        with self._lock:
            routes = dict(sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return {"total": sum(routes.values()), "routes": routes}
