"""Warm start (issue 20, point 6): the work a first request would otherwise pay for (loading
the embedding model and the token encoding, FastAPI building its included routers) is done
before the server answers at all."""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi.testclient import TestClient

from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.testing import HashEmbedder
from fake_llm import FakeLLMServer
from proxy_support import serve


class _Recording(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> Any:
        with self.lock:
            self.texts += list(texts)
        return super().embed(texts)


def _config(fake: FakeLLMServer) -> ServerConfig:
    return ServerConfig(port=0, proxy=ProxySettings(upstream=fake.url))


def test_the_embedder_is_loaded_before_the_server_answers(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    embedder = _Recording()
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=embedder) as engine,
        serve(_config(fake_llm), engine),
    ):
        # No request yet: the model was used once, at start-up.
        assert embedder.texts == ["warm up"]


def test_the_first_request_builds_no_routes(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI builds an included router's routes when the first request reaches them (100 to
    500 ms measured on the first proxied request); the proxy does it at start-up."""
    built: list[str] = []
    original = fastapi.routing._EffectiveRouteContext.from_api_route

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(
        fastapi.routing._EffectiveRouteContext, "from_api_route", staticmethod(counting)
    )
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(_config(fake_llm), engine) as served,
    ):
        at_start = len(built)
        assert at_start > 0  # the warm-up built them
        body = {"model": "m", "messages": [{"role": "user", "content": "Hello there."}]}
        response = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 200
        assert httpx.get(f"{served.url}/healthz", timeout=30).status_code == 200
        assert len(built) == at_start  # ... and no request built any again


@pytest.mark.parametrize("freeze", [True, False])
def test_start_up_objects_are_frozen_before_the_server_answers_when_asked(
    fake_llm: FakeLLMServer, tmp_path: Path, freeze: bool
) -> None:
    """``contextfold serve`` / ``proxy`` set ``freeze_gc``: what start-up loaded leaves the
    collector's generations once the models are warm and before any request (a full collection
    then would stall the first requests); an app embedded in another process freezes nothing."""
    gc.unfreeze()
    try:
        with MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine:
            app = create_app(_config(fake_llm), memory=engine)
            app.state.contextfold.freeze_gc = freeze
            with TestClient(app):
                assert (gc.get_freeze_count() > 0) is freeze
    finally:
        gc.unfreeze()
