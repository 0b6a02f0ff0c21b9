"""``proxy.recall_scope: principal`` (issue 20: a coding agent's next session remembers the
last one): a new conversation continues, on a new branch, the latest conversation of the same
credential, through the real proxy and the real ``openai`` SDK. Another credential, and the
default scope, recall nothing of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from fake_llm import FakeLLMServer
from proxy_support import Served, closed_after_test, serve

FACT = "The staging database password hint is blue-heron-42."


TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


def _ask(served: Served, key: str, messages: list[dict[str, Any]]) -> str:
    """One request of an agent's main loop (it offers tools)."""
    api = closed_after_test(openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0))
    reply = api.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def _first_session(served: Served, key: str) -> None:
    history: list[dict[str, Any]] = []
    for text in (FACT, "Now write the migration script.", "Add a rollback step."):
        history.append({"role": "user", "content": text})
        history.append({"role": "assistant", "content": _ask(served, key, history)})
    served.drain()


@pytest.mark.parametrize(
    ("scope", "second_key", "recalled"),
    [
        ("principal", "sk-dev", True),
        ("principal", "sk-other", False),
        ("conversation", "sk-dev", False),
    ],
)
def test_a_new_session_recalls_the_last_one_only_with_principal_scope(
    fake_llm: FakeLLMServer, tmp_path: Path, scope: str, second_key: str, recalled: bool
) -> None:
    fake_llm.reply = "Done."
    config = ServerConfig(
        port=0, proxy=ProxySettings(upstream=fake_llm.url, markers=False, recall_scope=scope)
    )
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(config, engine) as served,
    ):
        _first_session(served, "sk-dev")
        question = [{"role": "user", "content": "What is the staging database password hint?"}]
        assert _ask(served, second_key, question) == "Done."
        upstream = fake_llm.requests[-1].body
        sent = "\n".join(str(m.get("content")) for m in upstream["messages"])
        assert ("blue-heron-42" in sent) is recalled
        served.drain()
        # the second conversation is a branch of its own, either way: the first one was
        # not continued in place (still 6 turns)
        sessions = engine.store.sessions()
        assert len(sessions) == 2
        assert sorted(engine.store.last_seq(s) for s in sessions) == (
            [6, 8] if recalled else [2, 6]
        )


def test_helper_calls_stay_apart_under_principal_scope(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """An agent's title call, warm-up or one-token probe beside its conversation gets no
    memory and is not stored, so it neither becomes the credential's latest conversation nor
    continues it; the next main request (with tools) still continues the first session."""
    fake_llm.reply = "Done."
    proxy = ProxySettings(upstream=fake_llm.url, markers=False, recall_scope="principal")
    tools = TOOLS
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(ServerConfig(port=0, proxy=proxy), engine) as served,
    ):
        _first_session(served, "sk-dev")
        api = closed_after_test(
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-dev", max_retries=0)
        )
        helpers: list[dict[str, Any]] = [
            {"messages": [{"role": "user", "content": "Write a title for: the password hint"}]},
            {"messages": [{"role": "user", "content": "Warmup"}], "tools": tools},
            {"messages": [{"role": "user", "content": "quota"}], "tools": tools, "max_tokens": 1},
        ]
        for extra in helpers:
            api.chat.completions.create(model="m", **extra)
            assert "blue-heron-42" not in fake_llm.requests[-1].raw.decode()
        served.drain()
        assert len(engine.store.sessions()) == 1  # none of them was stored
        question = [{"role": "user", "content": "What is the staging database password hint?"}]
        api.chat.completions.create(model="m", messages=question, tools=tools)  # type: ignore[arg-type]
        assert "blue-heron-42" in fake_llm.requests[-1].raw.decode()
