"""Shared fixtures. Hypothesis runs 1,000 examples per property in CI (``CI=true``) and 100
locally; ``HYPOTHESIS_PROFILE`` picks another registered profile."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.tokens import TiktokenCounter
from fake_llm import FakeLLMServer
from postgres_support import PostgresServer
from proxy_support import Served, close_sdk_clients, make_engine, serve

settings.register_profile(
    "ci",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


@pytest.fixture(autouse=True)
def _isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests never touch a real ``.contextfold`` home."""
    monkeypatch.setenv("CONTEXTFOLD_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    """SDK clients a test made through ``proxy_support.closed_after_test`` are closed when it
    ends."""
    yield
    close_sdk_clients()


@pytest.fixture(scope="session")
def o200k() -> TiktokenCounter:
    return TiktokenCounter("o200k_base")


@pytest.fixture(scope="session")
def cl100k() -> TiktokenCounter:
    return TiktokenCounter("cl100k_base")


@pytest.fixture
def fake_llm() -> Iterator[FakeLLMServer]:
    """A fake OpenAI-compatible server on 127.0.0.1 (see ``tests/fake_llm.py``)."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[MemoryEngine]:
    """A file-backed memory engine with the default config, keyword tags and no embedding
    model (``proxy_support.make_engine``); a test module may define its own."""
    with make_engine(tmp_path) as memory:
        yield memory


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    """The real app under uvicorn, its proxy in front of ``fake_llm`` with the default
    settings, memory in ``engine``; a test module may define its own."""
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    with serve(config, engine) as served:
        yield served


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the whole test session (``tests/postgres_support.py``)."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty PostgreSQL database of this test's own."""
    return postgres_server.new_database()
