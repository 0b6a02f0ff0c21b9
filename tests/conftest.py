"""Shared fixtures. Hypothesis runs 1,000 examples per property in CI (``CI=true``) and 100
locally; ``HYPOTHESIS_PROFILE`` picks another registered profile."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from contextfold.tokens import TiktokenCounter
from fake_llm import FakeLLMServer
from proxy_support import close_sdk_clients

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
