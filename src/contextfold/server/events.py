"""What the dashboard shows: one ``RequestRecord`` per proxied request, published on an
``EventBus`` that keeps the recent records and fans new ones out to live subscribers (SSE).

The proxy publishes a record when a request has been forwarded and updates it (same ``id``)
when the reply is complete and its tags are known; subscribers receive both versions.

Records keep previews, never whole texts: each inspected message's text and the injected
context are cut (``preview``, saying how long they were), and the bus keeps at most ``keep``
records and at most ``max_bytes`` of their text, the oldest going first.

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
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    """One proxied request (or one ``/api/context`` call) as the dashboard sees it."""

    model_config = ConfigDict(frozen=True)
    id: str
    session_id: str
    turn: int = 0
    kind: Literal["proxy", "context"] = "proxy"
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
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            try:
                loop.call_soon_threadsafe(_offer, queue, record)
            except RuntimeError:  # the subscriber's loop has closed
                with self._lock:
                    self._subscribers.discard((loop, queue))

    def recent(self, session_id: str | None = None) -> list[RequestRecord]:
        with self._lock:
            records = list(self._records.values())
        return [r for r in records if session_id is None or r.session_id == session_id]

    def get(self, record_id: str) -> RequestRecord | None:
        with self._lock:
            return self._records.get(record_id)

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
        with self._lock:
            if self._closed:
                return
            self._subscribers.add(entry)
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
