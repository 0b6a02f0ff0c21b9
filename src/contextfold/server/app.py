"""``create_app``: the FastAPI application of ``contextfold serve`` and ``contextfold proxy``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextfold.server.config import ServerConfig
from contextfold.server.state import ServerState

if TYPE_CHECKING:
    from fastapi import FastAPI

    from contextfold.memory.engine import MemoryEngine

__all__ = ["create_app"]


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

    from contextfold.server import context_api, dashboard, guards, proxy

    if state is None:
        config = config or ServerConfig()
        if memory is None:
            from contextfold.memory.engine import MemoryEngine

            memory = (
                MemoryEngine(config_path=config.memory_config)
                if config.memory_config
                else (MemoryEngine())
            )
        state = ServerState(config=config, memory=memory)
    app = FastAPI(title="contextfold", version=_version())
    app.state.contextfold = state
    guards.install(app, state.config.limits)  # body size, UTF-8, one JSON error shape

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(context_api.router(state))
    app.include_router(dashboard.router(state))
    proxy_routes = proxy.router(state)
    app.state.proxy = proxy_routes.proxy  # its writer thread: tests and runners drain it
    app.include_router(proxy_routes)  # last: its routes match provider paths broadly
    return app


def _version() -> str:
    from importlib.metadata import version

    return version("contextfold")
