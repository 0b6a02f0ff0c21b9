"""``Plan`` (what the proxy decided for one request) and the dashboard record made from it.

Building the record counts tokens and copies messages, so it runs on the writer thread after
the reply has gone out, never on the response path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from contextfold._bounded import BoundedMemo, clip, text_size
from contextfold.items import Message
from contextfold.server.events import (
    BudgetRow,
    EventBus,
    InspectedMessage,
    RequestRecord,
    preview,
)
from contextfold.server.proxy.fit import message_costs
from contextfold.server.proxy.turns import user_turns

if TYPE_CHECKING:
    from contextfold.memory.engine import AssembledContext, MemoryEngine
    from contextfold.server.proxy.fit import Fit
    from contextfold.server.proxy.outputs import Compaction
    from contextfold.server.proxy.session import Position
    from contextfold.server.proxy.wire import ParsedRequest, Wire
    from contextfold.store.protocols import MemoryStorage

__all__ = ["Plan", "build_record"]

#: The inspector keeps at most this many messages per record, each cut to this many characters.
MAX_MESSAGES = 200
MAX_TEXT = 2000


@dataclass
class Plan:
    """One request on its way through the proxy."""

    id: str
    format: str
    path: str
    model: str | None
    stream: bool
    instance: str | None = None
    session_id: str | None = None
    session_source: str = "new"  # header, marker, history, new, forged
    principal: str = ""  # the keyed hash of the caller's credential
    header: str | None = None  # the session header the client sent
    position: Position | None = None
    wire: Wire | None = None
    original: dict[str, Any] | None = None  # the client's body as parsed
    committed: tuple[str, list[int]] | None = None  # (session, seqs) stored
    spooled: bool = False  # the store refused the exchange: it waits in the spool
    new_session: str | None = None  # the id a new conversation's session will get
    exchange_time: datetime | None = None  # the time of turns stored before the commit
    parsed: ParsedRequest | None = None
    assembled: AssembledContext | None = None
    dropped: list[int] = field(default_factory=list)  # parsed indices left out of the history
    dropped_notes: list[str] = field(default_factory=list)
    hint: str = ""
    dynamic: str = ""
    body: dict[str, Any] | None = None  # what goes upstream (None: the original bytes)
    #: The client's messages as they go upstream (the history filter applied), before memory:
    #: what sizes the request's tool outputs (``Proxy._compact_outputs``); None: the original.
    bare: dict[str, Any] | None = None
    content: bytes = b""
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    compaction: Compaction | None = None  # the tool outputs stubbed (``outputs``)
    overhead_ms: float = 0.0
    started: float = 0.0
    turn: int | None = None  # the conversation turn, counted in the store (``turns``)
    ingested: int = 0  # earlier turns of the client's history a new conversation brought
    ingested_seqs: tuple[int, int] | None = None  # their first and last seq, when stored apart
    fit: Fit | None = None  # the request counted against the model's window (``fit``)


#: Per message object: (the message, its text, its inspector view). The proxy's parser hands
#: out one ``Message`` per distinct (role, text), so a resent history hits this every time.
#: Bounded by entries and by the bytes of the texts it keeps alive.
_SEEN: BoundedMemo[int, tuple[Message, str, InspectedMessage]] = BoundedMemo(
    entries=50_000, max_bytes=16 << 20
)


def _inspect(message: Message) -> tuple[Message, str, InspectedMessage]:
    text = message.text()
    shown = preview(text, MAX_TEXT)
    inspected = InspectedMessage(
        role=message.role, blocks=tuple(b.type for b in message.content), text=shown
    )
    return message, text, inspected


def _seen(message: Message) -> tuple[Message, str, InspectedMessage]:
    size = text_size(message.text()) + 2 * MAX_TEXT + 600
    entry = _SEEN.get(id(message), lambda: _inspect(message), size=size)
    if entry[0] is not message:  # an id reused by a newer object
        _SEEN.discard(id(message))
        entry = _SEEN.get(id(message), lambda: _inspect(message), size=size)
    return entry


def _budget_rows(
    assembled: AssembledContext, history_tokens: int, kept: int, engine: MemoryEngine
) -> tuple[BudgetRow, ...]:
    mb = assembled.budget
    kinds: dict[str, int] = {}
    for item in assembled.items:
        kind = str(item.metadata.get("kind", "memory"))
        kinds[kind] = kinds.get(kind, 0) + 1
    return (
        BudgetRow(
            section="memory",
            budget=mb.budget,
            used=mb.used,
            items=len(assembled.items),
            truncated=mb.turns_skipped > 0,
        ),
        BudgetRow(
            section="memory: topics hint",
            budget=mb.budget,
            used=mb.hint,
            items=kinds.get("hint", 0),
        ),
        BudgetRow(
            section="memory: paged topics",
            budget=mb.budget,
            used=mb.paged,
            items=kinds.get("paged", 0),
        ),
        BudgetRow(
            section="memory: summaries",
            budget=mb.budget,
            used=mb.summaries,
            items=kinds.get("tag_summary", 0) + kinds.get("segment", 0),
        ),
        BudgetRow(
            section="memory: recalled turns",
            budget=mb.budget,
            used=mb.turns,
            items=mb.turns_recalled,
            truncated=mb.turns_skipped > 0,
        ),
        BudgetRow(
            section="history",
            budget=engine.config.context_window,
            used=history_tokens,
            items=kept,
            truncated=bool(assembled.history and assembled.history.removed),
        ),
    )


def _read_late(plan: Plan) -> list[Message]:
    """The messages of a request forwarded without memory (its memory path failed or ran past
    its deadline, so it has no parsed copy), read here, off the response path, so its record
    still counts what it carried; none when it cannot be read."""
    if plan.wire is None or plan.original is None:
        return []
    try:
        stripped, _ = plan.wire.strip(plan.original)
        return list(plan.wire.parse(stripped).messages)
    except Exception:  # a body the parser cannot read: nothing to count
        return []


def build_record(
    plan: Plan,
    engine: MemoryEngine,
    *,
    status: int | None,
    upstream_ms: float | None,
    reply: Message | None,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
) -> RequestRecord:
    """The dashboard record of a finished request (tokens counted with the engine's counter)."""
    counter = engine.counter
    messages = plan.parsed.messages if plan.parsed is not None else _read_late(plan)
    dropped = set(plan.dropped)
    fit = plan.fit
    # Counted on the request path already (``fit.measure``), else here.
    if fit is not None and len(fit.costs) == len(messages):
        costs = fit.costs
    else:
        costs = message_costs(messages, counter, plan.format)
    tokens_in = sum(costs)
    kept = [m for i, m in enumerate(messages) if i not in dropped]
    history_tokens = sum(c for i, c in enumerate(costs) if i not in dropped)
    memory_text = "\n".join(t for t in (plan.hint, plan.dynamic) if t)
    memory_tokens = counter.count(memory_text) if memory_text else 0
    shown = [*kept, *([reply] if reply is not None else [])]
    omitted = max(0, len(shown) - MAX_MESSAGES)
    turn = plan.turn if plan.turn is not None else user_turns(messages)
    assembled = plan.assembled
    info: dict[str, Any] = {"session_source": plan.session_source}
    if plan.instance:
        info["instance"] = plan.instance
    if plan.tool_calls:
        info["memory_tool_calls"] = plan.tool_calls
    if plan.notes:
        info["notes"] = plan.notes
    if fit is not None and fit.sent is not None:
        info["window"] = {
            "context_window": fit.window,
            "reply_reserve": fit.reserve,
            "tokens_sent": fit.sent,
        }
    if omitted:
        info["messages_omitted"] = omitted
    # The earlier turns the first request brought: the dashboard's ingested-history grid.
    if plan.ingested and plan.ingested_seqs is not None:  # stored before the recall
        info["ingested"] = {"turns": plan.ingested, "seqs": list(plan.ingested_seqs)}
    elif plan.ingested and plan.committed is not None:  # stored with the exchange
        seqs = plan.committed[1]
        info["ingested"] = {"turns": plan.ingested, "seqs": [seqs[0], seqs[-1]]}
    info.update(extra or {})
    return RequestRecord(
        id=plan.id,
        session_id=plan.session_id or "",
        turn=turn,
        format=plan.format,
        path=plan.path,
        model=plan.model,
        stream=plan.stream,
        status=status,
        inbound_tags=assembled.matched_tags if assembled else (),
        broad=assembled.broad if assembled else False,
        temporal=assembled.temporal if assembled else False,
        tokens_in=tokens_in,
        tokens_forwarded=history_tokens + memory_tokens,
        memory_tokens=memory_tokens,
        overhead_ms=round(plan.overhead_ms, 3),
        upstream_ms=None if upstream_ms is None else round(upstream_ms, 3),
        dropped_turns=len(plan.dropped_notes),
        dropped=tuple(plan.dropped_notes),
        messages=tuple(_seen(m)[2] for m in shown[omitted:]),
        context=preview(memory_text),
        budget=_budget_rows(assembled, history_tokens, len(kept), engine) if assembled else (),
        error=clip(error or plan.error or "", 1000) or None,
        extra=info,
    )


@dataclass
class _Awaiting:
    seqs: list[int]
    record: RequestRecord | None = None
    tags: tuple[str, ...] | None = None
    at: float = field(default_factory=time.monotonic)  # when the exchange was committed


class ReplyTags:
    """The reply tags of committed exchanges, published on their dashboard records once the
    session's derived work has tagged them — whichever comes first, the record or the tags.

    ``expect`` at commit, ``publish`` when the record is built, ``derived`` when a session's
    derive job is done. At most ``limit`` sessions wait; the oldest then go without tags."""

    def __init__(self, store: MemoryStorage, events: EventBus, *, limit: int = 1000) -> None:
        self.store = store
        self.events = events
        self.limit = limit
        self._waiting: dict[str, dict[str, _Awaiting]] = {}
        self._lock = threading.Lock()
        #: Called with a record and the milliseconds since its exchange was committed, once
        #: its reply tags are known (the terminal log's ``COMPLETE`` line).
        self.on_tagged: Callable[[RequestRecord, float], object] | None = None

    def expect(self, session_id: str, record_id: str, seqs: list[int]) -> None:
        with self._lock:
            self._waiting.setdefault(session_id, {})[record_id] = _Awaiting(seqs)
            if len(self._waiting) > self.limit:
                self._waiting.pop(next(iter(self._waiting)))

    def publish(self, session_id: str, record: RequestRecord) -> None:
        """Publish ``record``: with its tags when they are known, else now and again later."""
        with self._lock:
            entry = self._waiting.get(session_id, {}).get(record.id)
            if entry is not None and entry.tags is None:
                entry.record = record
            else:
                self._forget(session_id, record.id)
        tags = () if entry is None else entry.tags
        if tags is None:
            self.events.publish(record)
            return
        tagged = record.model_copy(update={"response_tags": tags})
        self.events.publish(tagged)
        if entry is not None:
            self._tagged(tagged, entry)

    def derived(self, session_id: str) -> None:
        """The session's derived work is done: tag its waiting records whose turns it covers."""
        done = self.store.session(session_id).derived_seq
        with self._lock:
            ready = [
                (key, entry)
                for key, entry in self._waiting.get(session_id, {}).items()
                if entry.seqs[-1] <= done
            ]
        for key, entry in ready:
            tags: dict[str, float] = {}
            for turn in self.store.turns(session_id, start=entry.seqs[0], end=entry.seqs[-1]):
                for tag, weight in turn.tags.items():
                    tags[tag] = max(weight, tags.get(tag, 0.0))
            ordered = tuple(sorted(tags, key=lambda t: (-tags[t], t)))
            with self._lock:
                entry.tags = ordered
                record = entry.record
                if record is not None:  # else the record takes them when it is built
                    self._forget(session_id, key)
            if record is not None:
                tagged = record.model_copy(update={"response_tags": ordered})
                self.events.publish(tagged)
                self._tagged(tagged, entry)

    def _tagged(self, record: RequestRecord, entry: _Awaiting) -> None:
        if self.on_tagged is not None:
            self.on_tagged(record, (time.monotonic() - entry.at) * 1000)

    def sweep(self) -> None:
        """``derived`` for every session with records waiting: their jobs may have run in
        another process sharing the store (``serve --workers``)."""
        with self._lock:
            waiting = list(self._waiting)
        for session_id in waiting:
            try:
                self.derived(session_id)
            except Exception:  # deleted meanwhile: its records go without tags
                with self._lock:
                    self._waiting.pop(session_id, None)

    def _forget(self, session_id: str, record_id: str) -> None:
        waiting = self._waiting.get(session_id)
        if waiting is not None:
            waiting.pop(record_id, None)
            if not waiting:
                del self._waiting[session_id]
