"""The retrying JSON transport and the OpenAI-compatible client, against the fake server."""

from __future__ import annotations

import random

import httpx
import pytest

from contextfold.errors import ConfigError, EmbeddingError, LLMError
from contextfold.llm import (
    AsyncJsonHttpClient,
    JsonHttpClient,
    OpenAICompatibleClient,
    RetryPolicy,
    UsageTracker,
)
from contextfold.llm.http import parse_retry_after
from fake_llm import FakeLLMServer, fake_vector

SECRET = "sk-test-very-secret-key"


class Sleeps(list[float]):
    """An injected ``sleep`` that records instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _client(server: FakeLLMServer, sleeps: Sleeps, **kwargs: object) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(
        server.base_url, api_key=SECRET, sleep=sleeps, rng=random.Random(0), **kwargs
    )


def test_chat_returns_text_usage_and_sends_the_openai_body(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = lambda body: f"echo: {body['messages'][-1]['content']}"
    with _client(fake_llm, Sleeps()) as client:
        result = client.chat([{"role": "user", "content": "hi there"}], "m1", temperature=0)
    assert result.text == "echo: hi there"
    assert result.model == "m1"
    assert result.finish_reason == "stop"
    assert result.usage.completion_tokens == 3 and result.usage.prompt_tokens > 0
    (request,) = fake_llm.requests
    assert request.path == "/v1/chat/completions"
    assert request.body == {
        "model": "m1",
        "messages": [{"role": "user", "content": "hi there"}],
        "temperature": 0,
    }
    assert request.headers["authorization"] == f"Bearer {SECRET}"


def test_usage_tracker_adds_up_calls_per_model(fake_llm: FakeLLMServer) -> None:
    tracker = UsageTracker()
    with _client(fake_llm, Sleeps(), usage=tracker) as client:
        first = client.chat([{"role": "user", "content": "one"}], "a")
        second = client.chat([{"role": "user", "content": "two words"}], "b")
        client.embeddings(["x y z"], "e")
    assert tracker.calls == 3
    assert tracker.total_prompt_tokens == first.usage.prompt_tokens + second.usage.prompt_tokens + 3
    assert tracker.total_completion_tokens == 2 * len(["Hello", "from", "the", "fake", "LLM."])
    assert set(tracker.by_model) == {"a", "b", "e"}
    assert tracker.cost(prompt_per_million=0, completion_per_million=1e6) == pytest.approx(10)


def test_429_twice_then_success_sleeps_with_jittered_backoff(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(429, times=2)
    sleeps = Sleeps()
    with _client(fake_llm, sleeps) as client:
        result = client.chat([{"role": "user", "content": "hi"}], "m")
    assert result.text == "Hello from the fake LLM."
    assert len(fake_llm.requests) == 3
    assert len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0
    rng = random.Random(0)  # full jitter: uniform(0, min(8, 0.5 * 2**n)) with the same seed
    assert sleeps == [rng.uniform(0, 0.5), rng.uniform(0, 1.0)]


def test_backoff_cap_doubles_up_to_max_delay() -> None:
    policy = RetryPolicy(max_retries=8, base_delay=0.5, max_delay=8.0)
    assert [policy.backoff_cap(n) for n in range(7)] == [0.5, 1, 2, 4, 8, 8, 8]
    rng = random.Random(1)
    delays = [policy.delay(n, rng) for n in range(200)]
    assert all(0 <= d <= 8 for d in delays)
    assert max(delays) > 4  # the jitter really spans the range
    assert policy.delay(0, rng, retry_after=3) == 3
    assert policy.delay(0, rng, retry_after=3600) == policy.max_retry_after


def test_retry_after_header_is_honoured(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(503, headers={"Retry-After": "2"})
    sleeps = Sleeps()
    with _client(fake_llm, sleeps) as client:
        client.chat([{"role": "user", "content": "hi"}], "m")
    assert sleeps == [2.0]
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert parse_retry_after("soon") is None


def test_persistent_5xx_gives_up_after_max_retries(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(500, times=10)
    sleeps = Sleeps()
    with _client(fake_llm, sleeps, max_retries=2) as client, pytest.raises(LLMError) as info:
        client.chat([{"role": "user", "content": "hi"}], "m")
    assert info.value.status == 500
    assert "after 3 attempts" in str(info.value)
    assert "scripted failure 500" in str(info.value)
    assert len(fake_llm.requests) == 3 and len(sleeps) == 2


def test_400_fails_at_once_with_status_and_endpoint_message(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(400, body={"error": {"message": f"bad key {SECRET} or model"}})
    sleeps = Sleeps()
    with _client(fake_llm, sleeps) as client, pytest.raises(LLMError) as info:
        client.chat([{"role": "user", "content": "hi"}], "m")
    message = str(info.value)
    assert info.value.status == 400
    assert "HTTP 400" in message and "/v1/chat/completions" in message
    assert "bad key *** or model" in message
    assert SECRET not in message and SECRET not in repr(client)
    assert sleeps == [] and len(fake_llm.requests) == 1


def test_401_is_not_retried(fake_llm: FakeLLMServer) -> None:
    fake_llm.api_key = "sk-the-right-one"
    sleeps = Sleeps()
    with _client(fake_llm, sleeps) as client, pytest.raises(LLMError) as info:
        client.chat([{"role": "user", "content": "hi"}], "m")
    assert info.value.status == 401 and "Incorrect API key" in str(info.value)
    assert sleeps == [] and len(fake_llm.requests) == 1


def test_connection_drop_is_retried(fake_llm: FakeLLMServer) -> None:
    fake_llm.disconnect_next()
    sleeps = Sleeps()
    with _client(fake_llm, sleeps) as client:
        assert client.chat([{"role": "user", "content": "hi"}], "m").text
    assert len(sleeps) == 1 and len(fake_llm.requests) == 2


def test_unreachable_endpoint_raises_llm_error_after_retries() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    sleeps = Sleeps()
    client = JsonHttpClient(
        "http://127.0.0.1:9/v1?key=" + SECRET,
        transport=httpx.MockTransport(refuse),
        sleep=sleeps,
    )
    with client, pytest.raises(LLMError) as info:
        client.post_json("embeddings", {})
    assert info.value.status is None
    assert "after 4 attempts" in str(info.value) and "ConnectError" in str(info.value)
    assert SECRET not in str(info.value)
    assert len(sleeps) == 3


def test_wrong_base_url_404_hints_at_the_v1_root(fake_llm: FakeLLMServer) -> None:
    with OpenAICompatibleClient(fake_llm.url) as client, pytest.raises(LLMError) as info:
        client.chat([{"role": "user", "content": "hi"}], "m")
    assert info.value.status == 404
    assert "base_url must be the API root including the version" in str(info.value)


def test_non_json_reply_is_an_llm_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>"))
    client = JsonHttpClient("http://x.test", transport=transport)
    with client, pytest.raises(LLMError, match="not JSON"):
        client.post_json("chat/completions", {})


def test_streaming_is_refused_until_supported(fake_llm: FakeLLMServer) -> None:
    with _client(fake_llm, Sleeps()) as client, pytest.raises(ConfigError, match="stream"):
        client.chat([{"role": "user", "content": "hi"}], "m", stream=True)
    assert fake_llm.requests == []


def test_embeddings_are_ordered_by_index(fake_llm: FakeLLMServer) -> None:
    fake_llm.reverse_embeddings = True
    with _client(fake_llm, Sleeps()) as client:
        vectors = client.embeddings(["a", "b", "c"], "e")
    assert vectors == [fake_vector(t, 32) for t in "abc"]  # exact: floats survive JSON
    assert fake_llm.requests[0].body == {"model": "e", "input": ["a", "b", "c"]}


def test_embeddings_count_mismatch_is_an_embedding_error() -> None:
    reply = {"data": [{"index": 0, "embedding": [1.0, 0.0]}]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=reply))
    client = OpenAICompatibleClient("http://x.test/v1", transport=transport)
    with client, pytest.raises(EmbeddingError, match="1 vectors for 2 texts"):
        client.embeddings(["a", "b"], "e")


async def test_async_client_retries_like_the_sync_one() -> None:
    replies = iter([httpx.Response(502), httpx.Response(200, json={"ok": True})])
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client = AsyncJsonHttpClient(
        "http://x.test", transport=httpx.MockTransport(lambda r: next(replies)), sleep=sleep
    )
    async with client:
        assert await client.post_json("x", {}) == {"ok": True}
    assert len(sleeps) == 1
