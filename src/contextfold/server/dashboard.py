"""The live dashboard at ``/dashboard`` and the Ask page at ``/dashboard/ask``.

Two static pages (HTML, JS and CSS shipped in ``contextfold/server/static/``, no build step,
nothing loaded from elsewhere) over a small JSON API:

============================================  ================================================
``GET  /dashboard``                            the request grid, turn inspector, session stats
``GET  /dashboard/ask``                        the Ask page (seed 004's budget breakdown UI)
``GET  /dashboard/api/records``                recent ``RequestRecord`` s, newest first
``GET  /dashboard/api/records/{id}``           one record
``GET  /dashboard/api/events``                 SSE: a ``snapshot``, then every ``record``
``GET  /dashboard/api/stats``                  request counts and latencies over the records
``GET  /dashboard/api/sessions``               the sessions seen, with their request counts
``GET  /dashboard/api/sessions/{id}``          one session's memory status and its requests
``GET  /dashboard/api/ingested``               the turns new conversations brought, tagged
``GET  /dashboard/api/captures``               the raw bodies sent upstream (opt-in), listed
``GET  /dashboard/api/captures/{id}``          one of them, credentials redacted
``GET  /dashboard/api/export``                 everything above as one JSON download
``GET  /dashboard/api/ask``                    the Ask page's presets, examples and LLM
``POST /dashboard/api/ask``                    answer a question (``AskRequest``)
============================================  ================================================

Every route is guarded by :class:`~contextfold.server.dashboard_guard.DashboardGuard`
(loopback only, or a token); ``/dashboard/static/*`` serves only the package's own files and
needs no token (``static_guard``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, cast

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from contextfold.server.dashboard_ask import AskRequest, AskService
from contextfold.server.dashboard_guard import DashboardGuard, static_guard
from contextfold.server.events import PassThroughCounts, RequestRecord
from contextfold.server.state import ServerState

__all__ = ["STATIC_FILES", "router", "static_dir", "stats"]

log = logging.getLogger(__name__)

#: The files ``/dashboard/static/`` serves, with their media types; nothing else is served.
STATIC_FILES = {
    "dashboard.css": "text/css; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "ask.js": "text/javascript; charset=utf-8",
}
PAGES = {"dashboard": "dashboard.html", "ask": "ask.html"}

#: Pages load scripts and styles from this server only and send no referrer (the page URL may
#: carry ``?token=``).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def static_dir() -> Path:
    """The folder of the pages, scripts and stylesheet (inside the installed package)."""
    return Path(str(resources.files("contextfold.server") / "static"))


def stats(
    records: Sequence[RequestRecord], started: float, passed: PassThroughCounts | None = None
) -> dict[str, Any]:
    """Counts, tokens and mean latencies over ``records`` (the bus keeps the recent ones),
    the compactions among them (events, tokens freed, and the compression ratio: the
    compacted turns' tokens over their summaries'), and the requests passed through without
    memory since the start, per route."""
    compactions = [r.extra for r in records if r.kind == "compaction"]
    records = [r for r in records if r.kind != "compaction"]
    compacted = sum(int(c.get("tokens_compacted", 0)) for c in compactions)
    summaries = sum(int(c.get("summary_tokens", 0)) for c in compactions)
    upstream = [r.upstream_ms for r in records if r.upstream_ms is not None]
    overhead = [r.overhead_ms for r in records]
    return {
        "uptime_s": round(time.monotonic() - started, 1),
        "requests": len(records),
        "sessions": len({r.session_id for r in records}),
        "completed": sum(r.response_tags is not None for r in records),
        "errors": sum(r.error is not None or (r.status or 0) >= 400 for r in records),
        "broad": sum(r.broad for r in records),
        "temporal": sum(r.temporal for r in records),
        "dropped_turns": sum(r.dropped_turns for r in records),
        "tokens_in": sum(r.tokens_in for r in records),
        "tokens_forwarded": sum(r.tokens_forwarded for r in records),
        "memory_tokens": sum(r.memory_tokens for r in records),
        "avg_overhead_ms": round(sum(overhead) / len(overhead), 2) if overhead else None,
        "avg_upstream_ms": round(sum(upstream) / len(upstream), 2) if upstream else None,
        "compactions": len(compactions),
        "turns_compacted": sum(int(c.get("turns_compacted", 0)) for c in compactions),
        "tokens_freed": sum(int(c.get("tokens_freed", 0)) for c in compactions),
        "compression_ratio": round(compacted / summaries, 2) if summaries else None,
        "passed_through": (passed or PassThroughCounts()).snapshot(),
    }


def _newest_first(records: list[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda r: r.created_at, reverse=True)


def router(state: ServerState) -> APIRouter:
    """The dashboard's routes for ``state`` (none when ``dashboard.enabled`` is off)."""
    if not state.config.dashboard.enabled:
        return APIRouter()
    guard = DashboardGuard.from_config(state.config)
    if guard.refusal is not None:
        log.warning("%s", guard.refusal)
    ask_service = AskService(state)
    started = time.monotonic()
    api = APIRouter(prefix="/dashboard", tags=["dashboard"], dependencies=[Depends(guard)])

    def page(name: str) -> HTMLResponse:
        html = (static_dir() / PAGES[name]).read_text(encoding="utf-8")
        return HTMLResponse(html, headers=SECURITY_HEADERS)

    @api.get("", response_class=HTMLResponse, include_in_schema=False)
    def dashboard_page() -> HTMLResponse:
        return page("dashboard")

    @api.get("/ask", response_class=HTMLResponse, include_in_schema=False)
    def ask_page() -> HTMLResponse:
        return page("ask")

    static = APIRouter(prefix="/dashboard", dependencies=[Depends(static_guard(guard))])

    @static.get("/static/{name}", include_in_schema=False)
    def static_file(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(
            static_dir() / name,
            media_type=STATIC_FILES[name],
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )

    @api.get("/api/records")
    def records(session_id: str | None = None) -> list[dict[str, Any]]:
        """Recent records, newest first; ``session_id`` keeps one session's."""
        return [r.model_dump(mode="json") for r in _newest_first(state.events.recent(session_id))]

    @api.get("/api/records/{record_id}")
    def record(record_id: str) -> dict[str, Any]:
        found = state.events.get(record_id)
        if found is None:
            raise HTTPException(
                404, f"no record {record_id!r} (the dashboard keeps the recent ones)"
            )
        return found.model_dump(mode="json")

    # Left out of the OpenAPI schema: a stream that never ends would hang a schema-driven
    # test client (schemathesis) that calls every operation.
    @api.get("/api/events", response_class=EventSourceResponse, include_in_schema=False)
    async def events() -> AsyncIterator[ServerSentEvent]:
        """A ``snapshot`` event with the recent records, then one ``record`` event per
        published or updated record (an update has the same ``id``), as they happen. The
        stream ends when the server stops (``EventBus.close``), so it never holds the stop up;
        the page reconnects after ``retry``."""
        updates = cast("AsyncGenerator[RequestRecord, None]", state.events.subscribe())
        # The subscription starts when the generator first runs: start it before taking the
        # snapshot, so a record published in between is not lost (the page upserts by id).
        first = asyncio.ensure_future(anext(updates))
        try:
            await asyncio.sleep(0)
            snapshot = _newest_first(state.events.recent())
            yield ServerSentEvent(
                event="snapshot", data=[r.model_dump(mode="json") for r in snapshot], retry=2000
            )
            try:
                item: RequestRecord | None = await first
            except StopAsyncIteration:
                item = None
            while item is not None:  # None: the bus has closed, the server is stopping
                yield ServerSentEvent(event="record", id=item.id, data=item.model_dump(mode="json"))
                item = await anext(updates, None)
        finally:
            if first.done():
                await updates.aclose()  # suspended at its yield (or finished): closes at once
            else:
                first.cancel()  # the cancelled wait ends the generator and unsubscribes

    @api.get("/api/stats")
    def stats_route() -> dict[str, Any]:
        return stats(state.events.recent(), started, state.passed)

    @api.get("/api/ingested")
    def ingested(session_id: str | None = None) -> list[dict[str, Any]]:
        """Per new conversation that brought earlier turns (its first request), those turns
        as the store has them: each user turn with its reply, tags and previews."""
        return ingested_history(state, state.events.recent(session_id))

    @api.get("/api/captures")
    def captures() -> dict[str, Any]:
        """The raw bodies kept (``dashboard.capture``), newest first, without the bodies."""
        return {
            "enabled": state.captures.enabled,
            "keep": state.captures.keep,
            "captures": state.captures.entries(),
        }

    @api.get("/api/captures/{record_id}")
    def capture(record_id: str) -> dict[str, Any]:
        found = state.captures.get(record_id)
        if found is None:
            why = "" if state.captures.enabled else " (capture is off: dashboard.capture)"
            raise HTTPException(404, f"no captured body for {record_id!r}{why}")
        return found

    @api.get("/api/sessions")
    def sessions() -> list[dict[str, Any]]:
        counts: dict[str, int] = {}
        for r in state.events.recent():
            if r.kind == "compaction":
                continue
            counts[r.session_id] = counts.get(r.session_id, 0) + 1
        return [{"session_id": sid, "requests": n} for sid, n in sorted(counts.items())]

    @api.get("/api/sessions/{session_id}")
    def session(session_id: str) -> dict[str, Any]:
        """The session's memory status (turns, live tokens, watermark, tags) and requests."""
        seen = state.events.recent(session_id)
        memory = _memory_status(state, session_id)
        if memory is None and not seen:
            raise HTTPException(404, f"no session {session_id!r} in memory or in recent requests")
        return {
            "session_id": session_id,
            "memory": memory,
            "requests": sum(r.kind != "compaction" for r in seen),
            "stats": stats(seen, started, state.passed),
        }

    @api.get("/api/export")
    def export() -> JSONResponse:
        """Every kept record, the stats and each session's memory status, as a download."""
        recent = _newest_first(state.events.recent())
        now = datetime.now(UTC)
        body = {
            "exported_at": now.isoformat(),
            "stats": stats(recent, started, state.passed),
            "sessions": {
                sid: _memory_status(state, sid) for sid in sorted({r.session_id for r in recent})
            },
            "records": [r.model_dump(mode="json") for r in recent],
            "ingested": ingested_history(state, recent),
            "captures": state.captures.export(),
        }
        name = f"contextfold-dashboard-{now:%Y%m%d-%H%M%S}.json"
        return JSONResponse(body, headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @api.get("/api/ask")
    def ask_info() -> dict[str, Any]:
        return ask_service.info()

    @api.post("/api/ask")
    def ask(request: AskRequest) -> dict[str, Any]:
        """Answer ``question`` from the ingested corpus: the assembled context, the budget
        table (with ⚠ TRUNCATED rows), the sources with scores, and the answer when the server
        has an LLM configured (``llm.configured``)."""
        return ask_service.ask(request)

    routes = APIRouter()
    routes.include_router(api)
    routes.include_router(static)
    return routes


#: The characters of each message the ingested-history grid shows.
PREVIEW = 240


def ingested_history(state: ServerState, records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """The turns each new conversation brought (``extra.ingested`` of its first record), read
    from the store with their tags as they are now (tagged by the session's derive job)."""
    out: list[dict[str, Any]] = []
    store = state.memory.store
    brought = [
        r for r in records if r.kind == "proxy" and isinstance(r.extra.get("ingested"), dict)
    ]
    known = set(store.sessions()) if brought else set()
    for r in sorted(brought, key=lambda r: r.created_at):
        info = r.extra["ingested"]
        if r.session_id not in known:
            continue
        lo, hi = info["seqs"]
        turns: list[dict[str, Any]] = []
        for stored in store.turns(r.session_id, start=lo, end=hi):
            message = stored.message
            # Consecutive user messages (batched clients) fold into one turn.
            if message.role == "user" and not (turns and not turns[-1]["assistant"]):
                turns.append(
                    {"turn": len(turns) + 1, "seqs": [], "user": "", "assistant": "", "tags": []}
                )
            if not turns:
                continue
            turn = turns[-1]
            turn["seqs"].append(stored.seq)
            text = message.text()
            if message.role in ("user", "assistant"):
                key = message.role
                joined = (turn[key] + "\n" + text).strip()
                turn[key] = joined if len(joined) <= PREVIEW else joined[:PREVIEW] + "…"
            for tag in stored.tags:
                if tag not in turn["tags"]:
                    turn["tags"].append(tag)
        turns = turns[: info["turns"]]  # the request's own question is not history
        out.append(
            {
                "session_id": r.session_id,
                "record_id": r.id,
                "turns": turns,
                "tagged": all(t["tags"] for t in turns),
            }
        )
    return out


def _memory_status(state: ServerState, session_id: str) -> dict[str, Any] | None:
    """``memory.status`` for a session the store knows (``None`` otherwise: asking must not
    create it)."""
    if session_id not in state.memory.store.sessions():
        return None
    return state.memory.status(session_id=session_id).model_dump(mode="json")
