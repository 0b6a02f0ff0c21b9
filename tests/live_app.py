"""Serve an ASGI app with uvicorn on 127.0.0.1 in a background thread, so tests can talk to
it over a real socket (``with LiveServer(app) as server: httpx.get(server.url + "/")``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class LiveServer:
    """uvicorn on a free port of 127.0.0.1, lifespan included; stopped on exit."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", ws="none"
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
