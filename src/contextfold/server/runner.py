"""``Runner``: one app served on several ports in one process (one uvicorn server per port).

The server's main port and each ``proxy.instances`` port get their own uvicorn server, all on
one event loop and all serving the same app — one ``ServerState``, one memory engine, one
store, one dashboard. The proxy picks each request's upstream from the port it arrived on.
The app's lifespan runs once around all servers, so pending memory writes are flushed after
the last server has stopped.

``stop()`` stops every server gracefully and within bounds: the servers stop accepting, the
dashboard's event streams end at once (``EventBus.close``), requests in flight may finish for
``ServerConfig.shutdown_timeout`` seconds, and whatever is still running then is cancelled: a
request still waiting for its upstream gets a 503 ``server_stopping``, a reply already
streaming is cut off (the client sees the connection close mid-reply, not a clean end).

>>> from contextfold.server.config import InstanceSettings, ProxySettings, ServerConfig
>>> config = ServerConfig(port=5757, proxy=ProxySettings(instances=[
...     InstanceSettings(name="claude", port=5758, upstream="https://api.anthropic.com")]))
>>> bindings(config)
[('127.0.0.1', 5757), ('127.0.0.1', 5758)]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI

from contextfold.server.config import ServerConfig
from contextfold.server.guards import error_response

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

__all__ = ["Runner", "bindings"]

log = logging.getLogger(__name__)

#: How long ``serve()`` lets the requests cancelled at the end of the grace period clean up
#: before the pending memory writes are flushed.
_CANCELLED_GRACE = 1.0


def bindings(config: ServerConfig) -> list[tuple[str, int]]:
    """(host, port) of every listener: the main port, then each proxy instance."""
    return [(config.host, config.port), *((config.host, i.port) for i in config.proxy.instances)]


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the ``Runner`` (it stops all servers at once)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _CutOff:
    """ASGI wrapper: a request cancelled because the stop's grace period ran out answers 503
    ``server_stopping`` when it has not begun its reply (uvicorn would answer 500 and log a
    traceback), and ends quietly when it has (uvicorn then closes the connection)."""

    def __init__(self, app: FastAPI, runner: Runner) -> None:
        self.app = app
        self.runner = runner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except asyncio.CancelledError:
            if scope["type"] != "http" or not self.runner.stopping:
                raise
            timeout = self.runner.shutdown_timeout
            log.warning(
                "%s %s still running %s s after the stop began: %s",
                scope.get("method"),
                scope.get("path"),
                timeout,
                "its reply is cut off mid-stream" if started else "answered 503",
            )
            if not started:
                response = error_response(
                    503,
                    "server_stopping",
                    f"the server stopped before this request finished (it waited "
                    f"{timeout} s, its shutdown_timeout); send it again once it is back",
                )
                await response(scope, receive, send)


class Runner:
    """Serve ``app`` on every binding of ``config`` until ``stop()``."""

    def __init__(
        self,
        app: FastAPI,
        config: ServerConfig,
        *,
        log_level: str = "warning",
        sockets: list[socket.socket] | None = None,
    ) -> None:
        """``sockets``: listeners already bound, one per binding in ``bindings(config)``
        order (a worker process of ``contextfold serve --workers``; they are shared with the
        other workers), instead of binding the ports here."""
        if sockets is not None and len(sockets) != len(bindings(config)):
            raise ValueError(f"{len(bindings(config))} bindings need as many sockets")
        self.sockets = sockets
        self.app = app
        self.servers = [
            _Server(
                uvicorn.Config(
                    _CutOff(app, self),
                    interface="asgi3",
                    host=host,
                    port=port,
                    lifespan="off",  # run once around all servers, below
                    log_level=log_level,
                    access_log=False,  # access lines would show Gemini's ?key= credentials
                    # LLM clients pool connections; closing idle ones after uvicorn's default
                    # 5 s races with a client reusing one (it sees a ReadError).
                    timeout_keep_alive=75,
                    # Without a bound, one connection that never ends (a stuck upstream, a
                    # client that never reads) would hold the stop up forever.
                    timeout_graceful_shutdown=config.shutdown_timeout,
                )
            )
            for host, port in bindings(config)
        ]
        self.shutdown_timeout = config.shutdown_timeout
        self.stopping = False

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

    def open_connections(self) -> int:
        """Client connections open now on every port (idle keep-alive ones included)."""
        return sum(len(server.server_state.connections) for server in self.servers)

    def stop(self) -> None:
        """Stop every server as the module docstring says; ``serve()`` returns once they
        have stopped and the pending memory writes are done. Safe from any thread."""
        self.stopping = True
        self.app.state.contextfold.events.close()
        for server in self.servers:
            server.should_exit = True

    async def serve(self) -> None:
        async with self.app.router.lifespan_context(self.app):
            if self.sockets is None:
                await asyncio.gather(*(server.serve() for server in self.servers))
            else:
                await asyncio.gather(
                    *(
                        server.serve(sockets=[sock])
                        for server, sock in zip(self.servers, self.sockets, strict=True)
                    )
                )
            # uvicorn cancels what outlives the grace period without waiting; let those
            # requests finish cancelling (and close their streams, storing a cut reply) before
            # the lifespan's exit stops the job workers.
            cut_off = [task for server in self.servers for task in server.server_state.tasks]
            if cut_off:
                await asyncio.wait(cut_off, timeout=_CANCELLED_GRACE)
