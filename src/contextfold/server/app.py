"""``create_app``: the FastAPI application of ``contextfold serve`` and ``contextfold proxy``."""

from __future__ import annotations

import inspect
import logging
import sqlite3
from typing import TYPE_CHECKING, Any

from contextfold._bounded import clip
from contextfold.server.config import ServerConfig
from contextfold.server.state import ServerState

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from contextfold.memory.engine import MemoryEngine

__all__ = ["create_app"]

logger = logging.getLogger("contextfold.server")


def create_app(
    config: ServerConfig | None = None,
    *,
    memory: MemoryEngine | None = None,
    state: ServerState | None = None,
) -> FastAPI:
    """The server app. ``memory`` defaults to a ``MemoryEngine`` built from
    ``config.memory_config``; pass ``state`` to share one engine between several apps (one
    per proxy instance). Every error is JSON ``{"error": {"type", "message"}}`` and bodies
    over ``config.limits.max_body_bytes`` get a 413 (``contextfold.server.guards``)."""
    from fastapi import FastAPI
    from starlette.responses import JSONResponse

    from contextfold.server import api_docs, context_api, dashboard, guards, proxy

    memory_error: str | None = None
    if state is None:
        config = config if config is not None else ServerConfig()
        if memory is None:
            memory, memory_error = _open_memory(config)
        state = ServerState(config=config, memory=memory, memory_error=memory_error)
    # The dashboard's records live in the store, shared by every worker process on it.
    state.events.attach(state.memory.store)
    # /docs is served from the package's own Swagger UI files (api_docs), not FastAPI's CDN
    # page; ReDoc, CDN-only too, is off.
    app = FastAPI(title="contextfold", version=_version(), docs_url=None, redoc_url=None)
    app.state.contextfold = state
    guards.install(app, state.config.limits)  # body size, UTF-8, one JSON error shape
    app.add_middleware(_AnswerCrashes, owner=app)  # (after install: outside its guards)

    _answer_unavailable_stores(app)
    knowledge = context_api.router(state)

    probe = _StoreProbe(state, knowledge)

    @app.get("/healthz", tags=["meta"], response_model=dict[str, str])
    def healthz(strict: bool = False) -> Any:
        """``ok``; ``degraded`` (still a 200: the proxy forwards every request, memory
        skipped) when memory could not be opened at start (``memory``: ``down: …``) or when the
        PostgreSQL server of the memory store or of the knowledge graph cannot be reached now
        (``memory`` / ``knowledge``: ``unavailable``; the reason is in the server's log, never
        here). ``?strict=true`` answers 503 instead of a 200 ``degraded``: a readiness check for
        a deployment that would rather route around a host whose stores are down. ``spooled``
        (only when there are any): how many exchanges wait in this host's spool for the memory
        store to take them; ``spool_given_up``: how many it stopped retrying (see docs/proxy.md).
        """
        if state.memory_error:
            health = {"status": "degraded", "memory": f"down: {state.memory_error}"}
        else:
            health = probe.health()
        waiting, given_up = app.state.proxy.spooled()
        if waiting:
            health["spooled"] = str(waiting)
        if given_up:
            health["spool_given_up"] = str(given_up)
        if strict and health["status"] != "ok":
            return JSONResponse(health, status_code=503)
        return health

    app.include_router(api_docs.router(app.openapi_url or "/openapi.json", app.title))
    app.include_router(knowledge)
    app.include_router(dashboard.router(state))
    proxy_routes = proxy.router(state)
    app.state.proxy = proxy_routes.proxy  # its writer thread: tests and runners drain it
    app.include_router(proxy_routes)  # last: its routes match provider paths broadly
    return app


class _StoreProbe:
    """Whether the PostgreSQL servers of the memory store and of the knowledge graph can be
    reached, asked at most once per ``EVERY_S`` (a health check a load balancer sends every
    second must not open connections every second) with short timeouts (1 s); a store that
    cannot be reached is logged with its reason, which the health answer leaves out."""

    EVERY_S = 2.0

    def __init__(self, state: ServerState, knowledge: Any) -> None:
        import threading

        self.state, self.knowledge = state, knowledge
        self._lock = threading.Lock()
        self._at = -self.EVERY_S
        self._health: dict[str, str] = {}

    def health(self) -> dict[str, str]:
        import time

        from contextfold.store.postgres.pool import StoreUnavailable, unavailable

        with self._lock:
            if time.monotonic() - self._at < self.EVERY_S:
                return dict(self._health)
            health = {"status": "ok", "memory": "ok", "knowledge": "ok"}
            memory, graph = self.state.memory.store, self.knowledge.store.graph
            for part, store in (("memory", memory), ("knowledge", graph)):
                try:
                    reason = unavailable(store, timeout=1.0)
                except StoreUnavailable as exc:  # a store not opened yet: its server was down
                    reason = exc.reason
                if reason is not None:
                    health["status"] = "degraded"
                    health[part] = "unavailable"
                    logger.warning("the %s store is unavailable: %s", part, reason)
            self._health, self._at = health, time.monotonic()
            return dict(health)


def _answer_unavailable_stores(app: FastAPI) -> None:
    """A PostgreSQL store that cannot be reached is a 503 naming it (``store_unavailable``),
    not a 500: ``StoreUnavailable`` from the knowledge store; a lost connection or an
    exhausted pool of the memory store (``psycopg``'s ``OperationalError``,
    ``PoolTimeout``)."""
    from starlette.exceptions import HTTPException

    from contextfold.server.guards import ApiError
    from contextfold.store.postgres.pool import StoreUnavailable

    def answer(request: Request, message: str) -> Any:
        error = ApiError(
            503,
            "store_unavailable",
            f"{message}; retry once it is back (GET /healthz says when)",
            headers={"Retry-After": "5"},
        )
        return app.exception_handlers[HTTPException](request, error)

    def unavailable(request: Request, exc: Exception) -> Any:
        return answer(request, str(exc))

    app.add_exception_handler(StoreUnavailable, unavailable)
    try:
        import psycopg
        from psycopg_pool import PoolTimeout
    except ImportError:  # pragma: no cover - without contextfold[postgres]
        return

    from contextfold.store.postgres.pool import scrub

    def lost(request: Request, exc: Exception) -> Any:
        text = scrub(str(exc).strip())
        reason = text.splitlines()[-1] if text else ""
        logger.warning("a PostgreSQL store is unavailable: %s: %s", type(exc).__name__, reason)
        return answer(
            request, f"a PostgreSQL store is unavailable ({type(exc).__name__}: {clip(reason)})"
        )

    app.add_exception_handler(psycopg.OperationalError, lost)
    app.add_exception_handler(PoolTimeout, lost)


def _open_memory(config: ServerConfig) -> tuple[MemoryEngine, str | None]:
    """The memory engine of ``config``; when its store cannot be opened (missing directory
    rights, locked, corrupt) an empty in-memory stand-in and the reason, so the server still
    starts and the proxy forwards every request unmodified."""
    from contextfold.errors import ConfigError, StoreError
    from contextfold.memory.engine import MemoryEngine

    try:
        if config.memory_config:
            return MemoryEngine(config_path=config.memory_config), None
        return MemoryEngine(), None
    except ConfigError:
        raise  # a wrong config is the operator's to fix before the server starts
    except (StoreError, OSError, sqlite3.DatabaseError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        logger.error("memory is down, requests are forwarded without it: %s", reason)
        return MemoryEngine(store=":memory:", embedder=None), reason


def _version() -> str:
    from importlib.metadata import version

    return version("contextfold")


class _AnswerCrashes:
    """ASGI middleware just inside Starlette's ``ServerErrorMiddleware``: an unexpected
    exception raised before the response started is answered by the app's ``Exception``
    handler (``guards``: a JSON 500, logged) and goes no further. Starlette's own middleware
    re-raises it after answering, and uvicorn then drops the keep-alive connection without a
    ``Connection: close``, so a client's next request on it failed with a reset. Once the
    response has started, nothing can be answered: the exception goes on as before."""

    def __init__(self, app: ASGIApp, owner: FastAPI) -> None:
        self.app = app
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as exc:
            handler = self.owner.exception_handlers.get(Exception)
            if started or handler is None:
                raise
            from starlette.requests import Request

            response: Any = handler(Request(scope), exc)
            if inspect.isawaitable(response):
                response = await response
            await response(scope, receive, send)
