"""``Runner``: one app served on several ports in one process (one uvicorn server per port).

The server's main port and each ``proxy.instances`` port get their own uvicorn server, all on
one event loop and all serving the same app — one ``ServerState``, one memory engine, one
store, one dashboard. The proxy picks each request's upstream from the port it arrived on.
The app's lifespan runs once around all servers, so pending memory writes are flushed after
the last server has stopped.

>>> from contextfold.server.config import InstanceSettings, ProxySettings, ServerConfig
>>> config = ServerConfig(port=5757, proxy=ProxySettings(instances=[
...     InstanceSettings(name="claude", port=5758, upstream="https://api.anthropic.com")]))
>>> bindings(config)
[('127.0.0.1', 5757), ('127.0.0.1', 5758)]
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from contextfold.server.config import ServerConfig

__all__ = ["Runner", "bindings"]


def bindings(config: ServerConfig) -> list[tuple[str, int]]:
    """(host, port) of every listener: the main port, then each proxy instance."""
    return [(config.host, config.port), *((config.host, i.port) for i in config.proxy.instances)]


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the ``Runner`` (it stops all servers at once)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Runner:
    """Serve ``app`` on every binding of ``config`` until ``stop()``."""

    def __init__(self, app: FastAPI, config: ServerConfig, *, log_level: str = "warning") -> None:
        self.app = app
        self.servers = [
            _Server(
                uvicorn.Config(
                    app,
                    host=host,
                    port=port,
                    lifespan="off",  # run once around all servers, below
                    log_level=log_level,
                    access_log=False,  # access lines would show Gemini's ?key= credentials
                    # LLM clients pool connections; closing idle ones after uvicorn's default
                    # 5 s races with a client reusing one (it sees a ReadError).
                    timeout_keep_alive=75,
                )
            )
            for host, port in bindings(config)
        ]

    @property
    def started(self) -> bool:
        return all(server.started for server in self.servers)

    def ports(self) -> list[int]:
        """The bound ports (useful with port 0), once started."""
        return [
            sock.getsockname()[1]
            for server in self.servers
            for listener in getattr(server, "servers", [])
            for sock in listener.sockets
        ]

    def stop(self) -> None:
        for server in self.servers:
            server.should_exit = True

    async def serve(self) -> None:
        async with self.app.router.lifespan_context(self.app):
            await asyncio.gather(*(server.serve() for server in self.servers))
