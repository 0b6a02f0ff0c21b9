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

    @app.get("/healthz", tags=["meta"], response_model=dict[str, str])
    def healthz() -> Any:
        """``ok``; ``degraded`` with the reason when memory could not be opened at start (the
        proxy then forwards every request unmodified; still a 200); ``unavailable``, a 503,
        while the PostgreSQL server of the memory store or of the knowledge graph
        (``knowledge``) cannot be reached."""
        from contextfold.store.postgres.pool import StoreUnavailable, unavailable

        if state.memory_error:
            return {"status": "degraded", "memory": f"down: {state.memory_error}"}
        health = {"status": "ok", "memory": "ok", "knowledge": "ok"}
        for part, store in (("memory", state.memory.store), ("knowledge", knowledge.store.graph)):
            try:
                reason = unavailable(store)
            except StoreUnavailable as exc:  # a store not opened yet: its server was down
                reason = exc.reason
            if reason is not None:
                health["status"] = "unavailable"
                health[part] = f"unavailable: {reason}"
        if health["status"] != "ok":
            return JSONResponse(health, status_code=503)
        return health

    app.include_router(api_docs.router(app.openapi_url or "/openapi.json", app.title))
    app.include_router(knowledge)
    app.include_router(dashboard.router(state))
    proxy_routes = proxy.router(state)
    app.state.proxy = proxy_routes.proxy  # its writer thread: tests and runners drain it
    app.include_router(proxy_routes)  # last: its routes match provider paths broadly
    return app


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

    def lost(request: Request, exc: Exception) -> Any:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
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
