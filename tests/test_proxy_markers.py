"""The proxy never breaks the client: a body nested too deeply is a clear 400, not a 500. The
real app under uvicorn, the fake provider behind it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from fake_llm import FakeLLMServer
from proxy_support import Served, serve


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[Served]:
    config = MemoryConfig.model_validate({})
    with (
        MemoryEngine(config, store=tmp_path / "memory.db", embedder=None) as memory,
        serve(ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url)), memory) as served,
    ):
        yield served


# --------------------------------------------------------------------------- deep nesting

DEEP = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", {"message", "type", "code"}),
        ("/v1/messages", {"message", "type"}),
        ("/v1beta/models/gemini-x:generateContent", {"code", "message", "status"}),
    ],
)
def test_json_nested_too_deeply_is_a_provider_shaped_400(
    proxy: Served, fake_llm: FakeLLMServer, path: str, shape: set[str]
) -> None:
    with httpx.Client(base_url=proxy.url) as client:
        response = client.post(path, content=DEEP, headers={"content-type": "application/json"})
        assert response.status_code == 400
        error = response.json()["error"]
        assert set(error) == shape and "nested too deeply" in error["message"]
        assert client.get("/healthz").status_code == 200  # the same connection still works
    assert fake_llm.requests == []
