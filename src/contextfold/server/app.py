"""``create_app``: the FastAPI application of ``contextfold serve`` and ``contextfold proxy``."""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING

from contextfold.server.config import ServerConfig
from contextfold.server.state import ServerState

if TYPE_CHECKING:
    from fastapi import FastAPI

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

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, str]:
        """``ok``; or ``degraded`` with the reason when memory could not be opened (the
        proxy then forwards every request unmodified)."""
        if state.memory_error:
            return {"status": "degraded", "memory": f"down: {state.memory_error}"}
        return {"status": "ok", "memory": "ok"}

    app.include_router(api_docs.router(app.openapi_url or "/openapi.json", app.title))
    app.include_router(context_api.router(state))
    app.include_router(dashboard.router(state))
    proxy_routes = proxy.router(state)
    app.state.proxy = proxy_routes.proxy  # its writer thread: tests and runners drain it
    app.include_router(proxy_routes)  # last: its routes match provider paths broadly
    return app


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
