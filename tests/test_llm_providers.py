"""Anthropic and Gemini clients, the ChatClient protocol, pricing and the factory — through the
real HTTP path against the fake provider server."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from contextfold.errors import ConfigError, LLMError
from contextfold.llm import (
    PROVIDERS,
    AnthropicClient,
    ChatClient,
    ChatResult,
    GeminiClient,
    ModelPrice,
    OpenAICompatibleClient,
    Usage,
    UsageTracker,
    base,
    cost_usd,
    make_chat_client,
    openai_compat,
)
from fake_llm import FakeLLMServer, RecordedRequest, Reply

SECRET = "sk-provider-very-secret-key"
HI = [{"role": "user", "content": "hi"}]


class Sleeps(list[float]):
    """An injected ``sleep`` that records instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _anthropic(server: FakeLLMServer, sleeps: Sleeps | None = None, **kw: Any) -> AnthropicClient:
    return AnthropicClient(
        SECRET, server.url, sleep=sleeps if sleeps is not None else Sleeps(), **kw
    )


def _gemini(server: FakeLLMServer, sleeps: Sleeps | None = None, **kw: Any) -> GeminiClient:
    return GeminiClient(SECRET, server.url, sleep=sleeps if sleeps is not None else Sleeps(), **kw)


Maker = Callable[..., AnthropicClient | GeminiClient]
# (client maker, model, the path its chat call hits)
PROVIDER_CASES = [
    pytest.param(_anthropic, "claude-x", "/v1/messages", id="anthropic"),
    pytest.param(_gemini, "gemini-x", "/v1beta/models/gemini-x:generateContent", id="gemini"),
]


# -- Anthropic -------------------------------------------------------------------------------


def test_anthropic_request_maps_system_and_sends_its_headers(fake_llm: FakeLLMServer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "text", "text": "how "}, {"text": "are you"}]},
    ]
    original = [dict(m) for m in messages]
    with _anthropic(fake_llm) as client:
        client.chat(messages, "claude-x", temperature=0.2, stop="END")
    (request,) = fake_llm.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == SECRET
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body == {
        "model": "claude-x",
        "max_tokens": 1024,
        "system": "Be brief.\n\nAnswer in French.",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "how are you"},
        ],
        "stop_sequences": ["END"],
        "temperature": 0.2,
    }
    assert messages == original  # the caller's list is not mutated


def test_anthropic_reply_text_usage_and_stop_reason(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = lambda body: f"echo {body['messages'][-1]['content']} ({body['max_tokens']})"
    with _anthropic(fake_llm) as client:
        result = client.chat([{"role": "system", "content": "s"}, *HI], "claude-x", max_tokens=50)
    assert result.text == "echo hi (50)"
    assert result.model == "claude-x" and result.finish_reason == "end_turn"
    body = fake_llm.requests[0].body
    words = len(json.dumps([body["system"], body["messages"]]).split())
    assert result.usage == Usage(prompt_tokens=words, completion_tokens=3)
    assert client.usage.calls == 1 and client.usage.by_model == {"claude-x": result.usage}
    assert result.raw["type"] == "message"


def test_anthropic_joins_only_text_blocks(fake_llm: FakeLLMServer) -> None:
    def handler(request: RecordedRequest, _: re.Match[str]) -> Reply:
        content = [
            {"type": "thinking", "thinking": "hmm", "signature": "x"},
            {"type": "text", "text": "Let me check. "},
            {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x"}},
            {"type": "text", "text": "Done."},
        ]
        usage = {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 100}
        reply = {"model": "claude-x-2025", "content": content, "stop_reason": "tool_use"}
        return Reply(200, {**reply, "usage": usage})

    fake_llm.route("POST", r"/v1/messages", handler)
    with _anthropic(fake_llm) as client:
        result = client.chat(HI, "claude-x")
    assert result.text == "Let me check. Done."
    assert result.finish_reason == "tool_use"
    assert result.model == "claude-x-2025"  # the model that answered, not the alias asked for
    assert result.usage == Usage(prompt_tokens=12, completion_tokens=7)


# -- Gemini ----------------------------------------------------------------------------------


def test_gemini_request_maps_roles_system_and_generation_config(fake_llm: FakeLLMServer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    safety = [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]
    with _gemini(fake_llm) as client:
        client.chat(
            messages,
            "gemini-x",
            temperature=0,
            max_tokens=64,
            top_p=0.9,
            stop="END",
            generation_config={"responseMimeType": "text/plain", "temperature": 1.0},
            safetySettings=safety,
        )
    (request,) = fake_llm.requests
    assert request.path == "/v1beta/models/gemini-x:generateContent"  # no ?key= in the URL
    assert request.headers["x-goog-api-key"] == SECRET
    assert request.body == {
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": "hello"}]},
            {"role": "user", "parts": [{"text": "again"}]},
        ],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "responseMimeType": "text/plain",
            "temperature": 0,  # the portable name wins over generation_config
            "maxOutputTokens": 64,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
        "safetySettings": safety,
    }


def test_gemini_reply_text_usage_and_finish_reason(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = lambda body: "echo " + body["contents"][-1]["parts"][0]["text"]
    with _gemini(fake_llm) as client:
        result = client.chat(HI, "models/gemini-x")  # the models/ prefix is accepted
    assert fake_llm.paths() == ["/v1beta/models/gemini-x:generateContent"]
    assert "generationConfig" not in fake_llm.requests[0].body  # nothing to configure
    assert result.text == "echo hi"
    assert result.finish_reason == "STOP" and result.model == "gemini-x"
    metadata = result.raw["usageMetadata"]
    assert result.usage == Usage(prompt_tokens=metadata["promptTokenCount"], completion_tokens=2)
    assert result.usage.prompt_tokens > 0 and client.usage.calls == 1


def test_gemini_joins_parts_skips_thoughts_and_bills_thinking(fake_llm: FakeLLMServer) -> None:
    def handler(request: RecordedRequest, _: re.Match[str]) -> Reply:
        parts = [{"text": "thinking...", "thought": True}, {"text": "Hello, "}, {"text": "you."}]
        candidate = {"content": {"role": "model", "parts": parts}, "finishReason": "MAX_TOKENS"}
        usage = {"promptTokenCount": 9, "candidatesTokenCount": 3, "thoughtsTokenCount": 40}
        return Reply(200, {"candidates": [candidate], "usageMetadata": usage})

    fake_llm.route("POST", r"/v1beta/models/[^:]+:generateContent", handler)
    with _gemini(fake_llm) as client:
        result = client.chat(HI, "gemini-x")
    assert result.text == "Hello, you."
    assert result.finish_reason == "MAX_TOKENS"
    assert result.usage == Usage(prompt_tokens=9, completion_tokens=43)


def test_gemini_blocked_prompt_is_an_llm_error_naming_prompt_feedback(
    fake_llm: FakeLLMServer,
) -> None:
    fake_llm.block_reason = "SAFETY"
    with _gemini(fake_llm) as client, pytest.raises(LLMError) as info:
        client.chat(HI, "gemini-x")
    message = str(info.value)
    assert "no candidates" in message and "promptFeedback.blockReason=SAFETY" in message
    assert "'gemini-x'" in message and info.value.status is None
    assert client.usage.calls == 1  # the endpoint counted the prompt; so do we


def test_gemini_empty_reply_without_feedback_says_so(fake_llm: FakeLLMServer) -> None:
    fake_llm.route("POST", r"/v1beta/.*", lambda request, match: Reply(200, {"candidates": []}))
    with _gemini(fake_llm) as client, pytest.raises(LLMError, match="promptFeedback: absent"):
        client.chat(HI, "gemini-x")


# -- what both clients share -----------------------------------------------------------------


@pytest.mark.parametrize(("make", "model", "path"), PROVIDER_CASES)
def test_429_then_success_retries_with_backoff(
    fake_llm: FakeLLMServer, make: Maker, model: str, path: str
) -> None:
    fake_llm.fail_next(429, times=2, path=path)
    sleeps = Sleeps()
    with make(fake_llm, sleeps, rng=random.Random(0)) as client:
        result = client.chat(HI, model)
    assert result.text == "Hello from the fake LLM."
    assert fake_llm.paths() == [path] * 3
    rng = random.Random(0)
    assert sleeps == [rng.uniform(0, 0.5), rng.uniform(0, 1.0)]
    assert client.usage.calls == 1  # failed attempts are not counted


@pytest.mark.parametrize(("make", "model", "path"), PROVIDER_CASES)
def test_4xx_fails_at_once_with_status_and_no_key_in_message(
    fake_llm: FakeLLMServer, make: Maker, model: str, path: str
) -> None:
    from fake_llm import error_body

    fake_llm.fail_next(400, body=error_body(path, 400, f"invalid key {SECRET} for model"))
    sleeps = Sleeps()
    with make(fake_llm, sleeps) as client, pytest.raises(LLMError) as info:
        client.chat(HI, model)
    message = str(info.value)
    assert info.value.status == 400
    assert "HTTP 400" in message and path in message
    assert "invalid key *** for model" in message
    assert SECRET not in message and SECRET not in repr(client)
    assert sleeps == [] and len(fake_llm.requests) == 1


@pytest.mark.parametrize(("make", "model", "path"), PROVIDER_CASES)
def test_each_provider_sends_its_own_credential(
    fake_llm: FakeLLMServer, make: Maker, model: str, path: str
) -> None:
    fake_llm.api_key = SECRET
    with make(fake_llm) as client:
        assert client.chat(HI, model).text
    fake_llm.api_key = "another-key"
    with make(fake_llm) as client, pytest.raises(LLMError) as info:
        client.chat(HI, model)
    assert info.value.status == 401 and "Incorrect API key" in str(info.value)


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([{"role": "system", "content": "only rules"}], "at least one user or assistant"),
        ([*HI, {"role": "tool", "content": "42"}], "message 1 has role 'tool'"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "'image_url' content part",
        ),
        ([{"role": "user", "content": 42}], "string or a list of text parts"),
    ],
)
@pytest.mark.parametrize(("make", "model", "path"), PROVIDER_CASES)
def test_messages_the_clients_cannot_translate_fail_before_sending(
    fake_llm: FakeLLMServer,
    make: Maker,
    model: str,
    path: str,
    messages: list[dict[str, Any]],
    error: str,
) -> None:
    with make(fake_llm) as client, pytest.raises(ConfigError, match=re.escape(error)):
        client.chat(messages, model)
    with make(fake_llm) as client, pytest.raises(ConfigError, match="stream"):
        client.chat(HI, model, stream=True)
    assert fake_llm.requests == []


@pytest.mark.parametrize(
    ("make", "needle"), [(AnthropicClient, "without /v1"), (GeminiClient, "api_version=")]
)
def test_a_versioned_base_url_404_gets_a_hint(
    fake_llm: FakeLLMServer, make: type[AnthropicClient | GeminiClient], needle: str
) -> None:
    with make(SECRET, fake_llm.base_url) as client, pytest.raises(LLMError) as info:
        client.chat(HI, "m")
    assert info.value.status == 404 and needle in str(info.value)


def test_a_url_as_the_first_argument_is_caught() -> None:
    with pytest.raises(ConfigError, match="pass the endpoint as base_url"):
        AnthropicClient("https://api.anthropic.com")
    with pytest.raises(ConfigError, match="pass the endpoint as base_url"):
        GeminiClient("http://127.0.0.1:8080")


def test_every_client_is_a_chat_client(fake_llm: FakeLLMServer) -> None:
    clients = [
        OpenAICompatibleClient(fake_llm.base_url),
        AnthropicClient(SECRET, fake_llm.url),
        GeminiClient(SECRET, fake_llm.url),
    ]
    for client in clients:
        assert isinstance(client, ChatClient)
        assert isinstance(client.chat(HI, "m"), ChatResult)
        client.close()
    assert not isinstance(object(), ChatClient)
    assert [r.path.split("/")[1] for r in fake_llm.requests] == ["v1", "v1", "v1beta"]


def test_shared_tracker_and_cost(fake_llm: FakeLLMServer) -> None:
    tracker = UsageTracker()
    with _anthropic(fake_llm, usage=tracker) as a, _gemini(fake_llm, usage=tracker) as g:
        first = a.chat(HI, "claude-x")
        second = g.chat(HI, "gemini-x")
    assert tracker.calls == 2
    assert tracker.total == first.usage + second.usage
    assert set(tracker.by_model) == {"claude-x", "gemini-x"}
    price = ModelPrice(prompt_per_million=3.0, completion_per_million=15.0)
    expected = (tracker.total_prompt_tokens * 3.0 + tracker.total_completion_tokens * 15.0) / 1e6
    assert cost_usd(tracker.total, price) == pytest.approx(expected) and expected > 0
    assert cost_usd(tracker.total, None) == 0.0


def test_cost_usd_arithmetic_and_price_validation() -> None:
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=250_000)
    assert cost_usd(usage, ModelPrice(prompt_per_million=2.5, completion_per_million=10)) == 5.0
    assert cost_usd(Usage(), ModelPrice(prompt_per_million=1, completion_per_million=1)) == 0.0
    with pytest.raises(ConfigError, match="prices must be >= 0"):
        ModelPrice(prompt_per_million=-1, completion_per_million=1)


def test_moved_names_keep_their_old_import_path() -> None:
    assert openai_compat.ChatResult is base.ChatResult
    assert openai_compat.Usage is base.Usage
    assert openai_compat.UsageTracker is base.UsageTracker


# -- the factory -----------------------------------------------------------------------------

KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY")


@contextmanager
def _closing(client: ChatClient) -> Iterator[ChatClient]:
    """The factory promises a ``ChatClient``; every built-in one also has ``close()``."""
    assert isinstance(client, OpenAICompatibleClient | AnthropicClient | GeminiClient)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in KEY_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("provider", "cls", "url", "env"),
    [
        ("openai", OpenAICompatibleClient, "https://api.openai.com/v1", "OPENAI_API_KEY"),
        ("ollama", OpenAICompatibleClient, "http://127.0.0.1:11434/v1", None),
        ("anthropic", AnthropicClient, "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
        ("gemini", GeminiClient, "https://generativelanguage.googleapis.com", "GEMINI_API_KEY"),
    ],
)
def test_factory_defaults(
    no_keys: pytest.MonkeyPatch, provider: Any, cls: type, url: str, env: str | None
) -> None:
    if env is not None:
        with pytest.raises(ConfigError, match=f"set {env}"):
            make_chat_client(provider)
        no_keys.setenv(env, "k-123")
    client = make_chat_client(provider, timeout=5)
    assert type(client) is cls and isinstance(client, ChatClient)
    assert isinstance(client, OpenAICompatibleClient | AnthropicClient | GeminiClient)
    assert client.base_url == url
    assert client.http.timeout == 5


@pytest.mark.parametrize(
    ("provider", "header", "value"),
    [
        ("openai", "authorization", "Bearer k-env"),
        ("ollama", "authorization", "Bearer k-env"),
        ("anthropic", "x-api-key", "k-env"),
        ("gemini", "x-goog-api-key", "k-env"),
    ],
)
def test_factory_reads_the_named_env_var_and_talks_to_the_fake(
    fake_llm: FakeLLMServer, no_keys: pytest.MonkeyPatch, provider: Any, header: str, value: str
) -> None:
    no_keys.setenv("MY_LLM_KEY", "k-env")
    url = fake_llm.base_url if provider in ("openai", "ollama") else fake_llm.url
    client = make_chat_client(provider, base_url=url, api_key_env="MY_LLM_KEY")
    with _closing(client):
        assert client.chat(HI, "m").text == "Hello from the fake LLM."
    assert fake_llm.requests[0].headers[header] == value


def test_factory_names_a_missing_env_var(no_keys: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="api_key_env names MY_MISSING_KEY"):
        make_chat_client("anthropic", api_key_env="MY_MISSING_KEY")
    no_keys.setenv("MY_MISSING_KEY", "   ")
    with pytest.raises(ConfigError, match=r"MY_MISSING_KEY.*not set or is empty"):
        make_chat_client("gemini", api_key_env="MY_MISSING_KEY")


def test_factory_never_sends_a_conventional_key_to_a_chosen_server(
    fake_llm: FakeLLMServer, no_keys: pytest.MonkeyPatch
) -> None:
    no_keys.setenv("OPENAI_API_KEY", "sk-real-openai-key")
    with _closing(make_chat_client("openai", base_url=fake_llm.base_url)) as client:
        client.chat(HI, "m")
    assert "authorization" not in fake_llm.requests[0].headers
    given = make_chat_client("openai", base_url=fake_llm.base_url, api_key="sk-given")
    with _closing(given) as client:
        client.chat(HI, "m")
    assert fake_llm.requests[1].headers["authorization"] == "Bearer sk-given"


def test_factory_rejects_an_unknown_provider_listing_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        make_chat_client("cohere")  # type: ignore[arg-type]
    assert "'cohere'" in str(info.value)
    assert all(name in str(info.value) for name in PROVIDERS)
    assert PROVIDERS == ("openai", "ollama", "anthropic", "gemini")
