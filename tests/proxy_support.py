"""Running the server for proxy tests and the proxy benchmark: the real app under real uvicorn
on 127.0.0.1, in a background thread, on free ports."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from contextfold.formats.anthropic import parse_anthropic_messages
from contextfold.formats.openai import count_openai_message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ServerConfig
from contextfold.server.runner import Runner
from contextfold.tokens import OVERHEADS, TokenCounter, count_messages

_SDK_CLIENTS: list[Any] = []
_T = TypeVar("_T")


def closed_after_test(client: _T) -> _T:
    """``client`` (an SDK client, or anything holding one: a ``MemoryEngine`` with an LLM),
    closed when the test ends (``conftest``): left to the garbage collector, its pooled
    sockets can be finalised before the client and warn (``ResourceWarning``) inside
    whichever later test the collection happens to run."""
    _SDK_CLIENTS.append(client)
    return client


def close_sdk_clients() -> None:
    while _SDK_CLIENTS:
        _SDK_CLIENTS.pop().close()


def tokens_sent(body: dict[str, Any], fmt: str, counter: TokenCounter) -> int:
    """The prompt tokens of a forwarded body, as its provider counts them (estimated for
    Anthropic: ``OVERHEADS``), the tools' JSON included."""
    tools = counter.count(json.dumps(body["tools"])) if body.get("tools") else 0
    if fmt == "openai":
        messages = sum(count_openai_message(m, counter) for m in body["messages"])
    else:
        parsed = parse_anthropic_messages(body["messages"], body.get("system"))
        messages = count_messages(parsed, counter, "anthropic")
    return OVERHEADS[fmt].per_request + messages + tools


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_engine(tmp_path: Path, **config: Any) -> MemoryEngine:
    """A file-backed engine (``memory.db`` under ``tmp_path``) with memory config ``config``,
    keyword tags and no embedding model."""
    return MemoryEngine(
        MemoryConfig.model_validate(config), store=tmp_path / "memory.db", embedder=None
    )


@dataclass
class Served:
    app: Any
    runner: Runner
    ports: list[int]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    @property
    def proxy(self) -> Any:
        return self.app.state.proxy

    @property
    def events(self) -> Any:
        return self.app.state.contextfold.events

    def drain(self) -> None:
        """Wait until every record is published and every derive job is done."""
        assert self.proxy.drain(30.0), "the proxy's records and jobs did not finish"


@contextmanager
def serve(config: ServerConfig, memory: MemoryEngine) -> Iterator[Served]:
    """The app for ``config`` and ``memory``, served until the block ends. Unless the config
    sets one, the memory deadline is 10 s: a test of what memory does must not fail open
    because the shared machine was slow (the deadline's own tests set theirs)."""
    if "memory_deadline_ms" not in config.proxy.model_fields_set:
        proxy = config.proxy.model_copy(update={"memory_deadline_ms": 10_000.0})
        config = config.model_copy(update={"proxy": proxy})
    app = create_app(config, memory=memory)
    runner = Runner(app, config)
    thread = threading.Thread(target=asyncio.run, args=(runner.serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not runner.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield Served(app, runner, runner.ports())
    finally:
        runner.stop()
        thread.join(30)
