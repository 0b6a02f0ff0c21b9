"""What the dashboard tests share: the real app served by uvicorn on 127.0.0.1 in a thread,
a memory engine that loads no model, sample ``RequestRecord`` s, and a small ingested corpus."""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import DashboardSettings, ServerConfig
from contextfold.server.events import BudgetRow, InspectedMessage, RequestRecord
from proxy_support import closed_after_test

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "examples" / "policies"
CORPUS_FILES = ("ground_transport_policy.txt", "lodging.md", "faq.jsonl")
TOKEN = "test-token-0123456789abcdef"


class LiveServer:
    """``app`` served by uvicorn on a free 127.0.0.1 port in a daemon thread."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ws="none",
            http="h11",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()


def memory_engine(**config: Any) -> MemoryEngine:
    """An in-memory engine with the keyword tagger and no embedding model, closed when the
    test ends (with an ``llm`` config it holds an HTTP client whose pooled connection to the
    fake LLM would otherwise stay open until the garbage collector finalises it, warning
    inside whichever later test that happens in)."""
    return closed_after_test(MemoryEngine(MemoryConfig(**config), store=":memory:", embedder=None))


def memory_with_one_exchange(session_id: str = "sess-a") -> MemoryEngine:
    """``memory_engine()`` holding one stored exchange in ``session_id``."""
    memory = memory_engine()
    memory.on_turn_complete(
        [
            {"role": "user", "content": "Can I expense Uber rides on business travel?"},
            {"role": "assistant", "content": "Yes: UberX with the app e-receipt."},
        ],
        session_id=session_id,
    )
    return memory


def make_app(
    *,
    corpus: Path | None = None,
    host: str = "127.0.0.1",
    memory: MemoryEngine | None = None,
    **dashboard: Any,
) -> FastAPI:
    settings = DashboardSettings(corpus=None if corpus is None else str(corpus), **dashboard)
    config = ServerConfig(host=host, dashboard=settings)
    return create_app(config, memory=memory or memory_engine())


def ingest_corpus(db: Path) -> Path:
    """Ingest three policy files into ``db`` through ``contextfold ingest`` (real embedder)."""
    from typer.testing import CliRunner

    from contextfold.cli import app

    paths = [str(POLICIES / name) for name in CORPUS_FILES]
    result = CliRunner().invoke(app, ["ingest", *paths, "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db


def shared_corpus(tmp_path_factory: Any) -> Path:
    """One ingested corpus for the whole test session (ingesting embeds every chunk)."""
    db = Path(tmp_path_factory.getbasetemp()) / "dashboard-corpus" / "documents.db"
    return db if db.exists() else ingest_corpus(db)


def record(n: int, session: str = "sess-a", **fields: Any) -> RequestRecord:
    """A proxied request as the proxy publishes it before the reply: tags, tokens, messages,
    the injected context and a budget table whose ``memory`` row was truncated."""
    values: dict[str, Any] = {
        "id": f"req-{session}-{n}",
        "session_id": session,
        "turn": n,
        "format": "anthropic",
        "path": "/v1/messages",
        "model": "claude-sonnet-4",
        "created_at": datetime(2025, 1, 1, 12, 0, tzinfo=UTC) + timedelta(seconds=n),
        "stream": True,
        "status": 200,
        "inbound_tags": ("travel", "expenses"),
        "broad": n % 2 == 0,
        "temporal": n % 3 == 0,
        "tokens_in": 1000 + n,
        "tokens_forwarded": 700 + n,
        "memory_tokens": 120,
        "overhead_ms": 3.5,
        "upstream_ms": None,
        "dropped_turns": 2,
        "dropped": ("turn 1: topic 'weather' not relevant", "turn 2: topic 'weather' not relevant"),
        "messages": (
            InspectedMessage(role="system", blocks=("text",), text="You are a travel assistant."),
            InspectedMessage(role="user", blocks=("text",), text=f"Question number {n} about Uber"),
            InspectedMessage(
                role="assistant", blocks=("thinking", "tool_use"), text="lookup_policy(uber)"
            ),
            InspectedMessage(role="user", blocks=("tool_result",), text="Policy 4.2: UberX ok"),
        ),
        "context": f"<memory>\n[travel] Summary for turn {n}: rides need e-receipts.\n</memory>",
        "budget": (
            BudgetRow(section="system", budget=500, used=40, items=1),
            BudgetRow(section="memory", budget=120, used=120, items=3, truncated=True),
            BudgetRow(section="conversation", budget=4000, used=540, items=4),
        ),
    }
    values.update(fields)
    return RequestRecord(**values)


def completed(r: RequestRecord, tags: tuple[str, ...] = ("uber", "receipts")) -> RequestRecord:
    """The same record after the reply: response tags and upstream latency filled in."""
    return r.model_copy(update={"response_tags": tags, "upstream_ms": 812.0})
