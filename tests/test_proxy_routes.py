"""Every provider route gets memory or is counted as passed through (issue 17, point 2): Gemini
under ``/v1/models/…`` as well as ``/v1beta``, Azure OpenAI's deployment and v1 paths, with the
real ``google-genai`` and ``openai`` SDKs against the real app under uvicorn; and the routes
passed through without memory counted in the dashboard's stats and the log."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest
from google import genai
from google.genai import types

from contextfold.memory.engine import MemoryEngine
from fake_llm import FakeLLMServer
from fake_responses import ResponsesFake
from proxy_support import Served, closed_after_test

FACT = "My locker combination is 4417."
QUESTION = "What is my locker combination?"


def stored_texts(engine: MemoryEngine) -> list[str]:
    return [
        t.message.text()
        for sid in engine.store.sessions()
        for t in engine.store.turns(sid)
        if t.message.role == "user"
    ]


def last_record(served: Served) -> dict[str, object]:
    served.drain()
    records = httpx.get(f"{served.url}/dashboard/api/records").json()
    assert records, "no record"
    return dict(records[0])


@pytest.mark.parametrize("api_version", ["v1", "v1beta"])
def test_google_genai_sdk_gets_memory_on_both_api_versions(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, api_version: str
) -> None:
    client = genai.Client(
        api_key="g-key",
        http_options=types.HttpOptions(base_url=proxy.url, api_version=api_version),
    )
    fake_llm.reply = "Noted."
    chat = client.chats.create(model="gemini-x")
    assert chat.send_message(FACT).text == "Noted."
    assert fake_llm.requests[-1].path.startswith(f"/{api_version}/models/gemini-x:")
    assert FACT in stored_texts(engine)  # the exchange went through memory, not around it
    record = last_record(proxy)
    assert record["format"] == "gemini" and record["model"] == "gemini-x"
    # A new conversation of the same key: the fact comes back from memory only when the
    # request is read (the client's own history no longer holds it).
    for n in range(6):
        chat.send_message(f"Unrelated chatter number {n} about the weather.")
    fresh = client.chats.create(model="gemini-x", history=chat.get_history()[-4:])
    fake_llm.reply = "It is 4417."
    assert fresh.send_message(QUESTION).text == "It is 4417."
    sent = str(fake_llm.requests[-1].body)
    assert "4417" in sent  # recalled into the request the upstream saw
    assert proxy.app.state.contextfold.passed.snapshot()["total"] == 0


def test_azure_openai_sdk_deployment_path_gets_memory(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    client = closed_after_test(
        openai.AzureOpenAI(
            azure_endpoint=proxy.url, api_key="az-key", api_version="2024-10-21", max_retries=0
        )
    )
    fake_llm.reply = "Noted."
    reply = client.chat.completions.create(
        model="my-deployment", messages=[{"role": "user", "content": FACT}]
    )
    assert reply.choices[0].message.content == "Noted."
    request = fake_llm.requests[-1]
    assert request.path.startswith("/openai/deployments/my-deployment/chat/completions")
    assert "api-version=2024-10-21" in request.path
    assert request.headers["api-key"] == "az-key"
    assert FACT in stored_texts(engine)
    record = last_record(proxy)
    assert record["format"] == "openai" and record["model"] == "my-deployment"


def test_azure_body_without_model_takes_the_deployment_name(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Fine."
    response = httpx.post(
        f"{proxy.url}/openai/deployments/dep-7/chat/completions?api-version=2024-10-21",
        json={"messages": [{"role": "user", "content": "hello"}]},
        headers={"api-key": "az-key"},
    )
    assert response.status_code == 200
    assert last_record(proxy)["model"] == "dep-7"


def test_azure_v1_paths_chat_and_responses_get_memory(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    responses_fake = ResponsesFake(fake_llm)
    fake_llm.route("POST", r"/openai/v1/responses", responses_fake._handle)
    client = closed_after_test(
        openai.OpenAI(base_url=f"{proxy.url}/openai/v1", api_key="az-key", max_retries=0)
    )
    fake_llm.reply = "Noted."
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": FACT}])
    assert chat.choices[0].message.content == "Noted."
    fake_llm.reply = "Stored."
    answer = client.responses.create(model="m", input="My parking spot is B12.")
    assert answer.output_text == "Stored."
    assert fake_llm.requests[-1].path == "/openai/v1/responses"
    assert {FACT, "My parking spot is B12."} <= set(stored_texts(engine))
    assert proxy.app.state.contextfold.passed.snapshot()["total"] == 0


def test_routes_passed_through_are_counted_and_logged_once(
    proxy: Served, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = closed_after_test(
        openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
    )
    caplog.set_level(logging.INFO, logger="contextfold.server.proxy")
    for _ in range(3):
        with pytest.raises(openai.NotFoundError):  # the fake has no model list: its 404 comes back
            client.models.list()
    httpx.get(f"{proxy.url}/v1/files/file-abc/content", headers={"authorization": "Bearer k"})
    httpx.post(f"{proxy.url}/v1beta/models/gemini-x:countTokens", json={"contents": []})
    stats = httpx.get(f"{proxy.url}/dashboard/api/stats").json()
    assert stats["passed_through"] == {
        "total": 5,
        "routes": {
            "GET /v1/models": 3,
            "GET /v1/files/…": 1,
            "POST /v1beta/models/…": 1,
        },
    }
    logged = [r.getMessage() for r in caplog.records if "passed through" in r.getMessage()]
    assert len(logged) == 3 and "GET /v1/models" in logged[0]
    # A conversation route is not counted.
    fake_llm.reply = "Hi."
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert httpx.get(f"{proxy.url}/dashboard/api/stats").json()["passed_through"]["total"] == 5


def test_pass_through_routes_are_bounded() -> None:
    from contextfold.server.events import PassThroughCounts

    counts = PassThroughCounts(routes=2)
    assert counts.count("GET", "/v1/a") and counts.count("GET", "/v1/b")
    assert counts.count("GET", "/v1/c")  # the first beyond the limit opens "other"
    assert not counts.count("GET", "/v1/d")
    assert counts.snapshot() == {"total": 4, "routes": {"other": 2, "GET /v1/a": 1, "GET /v1/b": 1}}
