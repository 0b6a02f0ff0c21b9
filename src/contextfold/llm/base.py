"""What every chat client shares: the ``ChatClient`` protocol, the values a call returns
(``ChatResult``, ``Usage``), usage accounting (``UsageTracker``) and pricing (``ModelPrice``,
``cost_usd``).

Messages are OpenAI-style dicts, ``{"role": "system" | "user" | "assistant", "content": str}``,
whatever the provider: each client translates them to its own wire format.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from contextfold.errors import ConfigError, LLMError
from contextfold.llm.http import JsonHttpClient, RetryPolicy

__all__ = [
    "ChatClient",
    "ChatResult",
    "ModelPrice",
    "Usage",
    "UsageTracker",
    "cost_usd",
]


class Usage(BaseModel):
    """Tokens one call (or a sum of calls) consumed, as the endpoint reported them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class ChatResult(BaseModel):
    """One chat completion: the reply ``text`` ("" when the model only called tools or was
    filtered), the ``model`` that answered, its ``usage``, the provider's own
    ``finish_reason`` (``"stop"``, ``"end_turn"``, ``"STOP"``, ...) and the ``raw`` JSON reply."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    text: str
    model: str
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    raw: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class ChatClient(Protocol):
    """Anything that answers a chat: ``OpenAICompatibleClient``, ``AnthropicClient``,
    ``GeminiClient``, or your own (a fake in tests, a router, a cache).

    ``messages`` are OpenAI-style ``{"role": ..., "content": str}`` dicts with roles
    ``system``, ``user`` and ``assistant``. An implementation must not mutate ``messages``,
    must return the reply text (``""`` rather than ``None``), and must raise ``LLMError``
    (never a transport library's exception) when the endpoint fails. ``params`` are
    generation settings; ``temperature`` and ``max_tokens`` mean the same thing everywhere.
    """

    def chat(
        self, messages: Sequence[Mapping[str, Any]], model: str, **params: Any
    ) -> ChatResult: ...


class UsageTracker:
    """Adds up token usage across calls; thread-safe.

    >>> tracker = UsageTracker()
    >>> tracker.record("m", Usage(prompt_tokens=1000, completion_tokens=200))
    >>> tracker.calls, tracker.total_prompt_tokens, tracker.total_completion_tokens
    (1, 1000, 200)
    >>> round(tracker.cost(prompt_per_million=2.5, completion_per_million=10.0), 6)
    0.0045
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = 0
        self.total_prompt_tokens = 0
        self.total_completion_tokens = 0
        self.by_model: dict[str, Usage] = {}

    def __repr__(self) -> str:
        return (
            f"UsageTracker(calls={self.calls}, prompt={self.total_prompt_tokens}, "
            f"completion={self.total_completion_tokens})"
        )

    @property
    def total_tokens(self) -> int:
        return self.total_prompt_tokens + self.total_completion_tokens

    @property
    def total(self) -> Usage:
        """Everything so far as one ``Usage`` (feed it to ``cost_usd``)."""
        return Usage(
            prompt_tokens=self.total_prompt_tokens, completion_tokens=self.total_completion_tokens
        )

    def record(self, model: str, usage: Usage) -> None:
        """Count one call to ``model``."""
        with self._lock:
            self.calls += 1
            self.total_prompt_tokens += usage.prompt_tokens
            self.total_completion_tokens += usage.completion_tokens
            self.by_model[model] = self.by_model.get(model, Usage()) + usage

    def cost(self, *, prompt_per_million: float, completion_per_million: float) -> float:
        """The price of the tokens so far, given prices per million prompt/completion tokens."""
        return (
            self.total_prompt_tokens * prompt_per_million
            + self.total_completion_tokens * completion_per_million
        ) / 1_000_000

    def reset(self) -> None:
        with self._lock:
            self.calls = self.total_prompt_tokens = self.total_completion_tokens = 0
            self.by_model = {}


class ModelPrice(BaseModel):
    """A model's price in USD per million prompt and completion tokens.

    contextfold ships no price table (prices change; yours may be discounted): configure the
    numbers from your provider's pricing page.

    >>> price = ModelPrice(prompt_per_million=3.0, completion_per_million=15.0)
    >>> cost_usd(Usage(prompt_tokens=2_000, completion_tokens=500), price)
    0.0135
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    prompt_per_million: float
    completion_per_million: float

    @model_validator(mode="after")
    def _check(self) -> ModelPrice:
        if self.prompt_per_million < 0 or self.completion_per_million < 0:
            raise ConfigError(
                f"prices must be >= 0 USD per million tokens; got prompt "
                f"{self.prompt_per_million} and completion {self.completion_per_million}"
            )
        return self


def cost_usd(usage: Usage, price: ModelPrice | None) -> float:
    """What ``usage`` cost at ``price``; 0.0 when the price is unknown (``None``)."""
    if price is None:
        return 0.0
    return (
        usage.prompt_tokens * price.prompt_per_million
        + usage.completion_tokens * price.completion_per_million
    ) / 1_000_000


# -- shared by the provider clients (internal) ---------------------------------------------------


def int_field(value: Any) -> int:
    """``value`` if it is a real int (not a bool), else 0: usage fields may be missing."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _content_text(content: Any, index: int, provider: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type", "text") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ConfigError(
                    f"message {index} has a {kind!r} content part; the {provider} client "
                    "sends text only (pass the provider's own payload through its API instead)"
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ConfigError(
        f"message {index} content must be a string or a list of text parts, "
        f"got {type(content).__name__}"
    )


def split_messages(
    messages: Sequence[Mapping[str, Any]], provider: str
) -> tuple[str | None, list[tuple[str, str]]]:
    """OpenAI-style messages as ``(system text or None, [(role, text), ...])``.

    System (and OpenAI's newer ``developer``) messages are joined with blank lines, wherever
    they stand; the rest keep their order. Raises ``ConfigError`` for other roles (tool
    results need the provider's own format) and when no user/assistant message is left.
    """
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        text = _content_text(message.get("content"), index, provider)
        if role in ("system", "developer"):
            system.append(text)
        elif role in ("user", "assistant"):
            turns.append((str(role), text))
        else:
            raise ConfigError(
                f"message {index} has role {role!r}; the {provider} client accepts "
                "'system', 'user' and 'assistant'"
            )
    if not turns:
        raise ConfigError(
            f"the {provider} client needs at least one user or assistant message, "
            f"got {len(messages)} message(s) and none of them user/assistant"
        )
    return ("\n\n".join(system) if system else None), turns


class HttpChatClient:
    """The plumbing the provider clients share: a retrying ``JsonHttpClient``, a
    ``UsageTracker``, ``close()`` and the ``with`` block. Subclasses build the request and
    parse the reply; ``_not_found_hint`` may explain a 404."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
        max_retries: int,
        usage: UsageTracker | None,
        retry: RetryPolicy | None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None,
        transport: httpx.BaseTransport | None,
    ) -> None:
        self.http = JsonHttpClient(
            base_url,
            headers={"Content-Type": "application/json", **headers},
            timeout=timeout,
            retry=retry if retry is not None else RetryPolicy(max_retries=max_retries),
            sleep=sleep,
            rng=rng,
            transport=transport,
        )
        self.usage = usage if usage is not None else UsageTracker()

    @property
    def base_url(self) -> str:
        return self.http.base_url

    def __repr__(self) -> str:
        # Headers stay out: they hold the API key.
        return f"{type(self).__name__}({self.base_url!r})"

    def _not_found_hint(self) -> str | None:
        return None

    def _post(self, path: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        try:
            body = self.http.post_json(path, payload)
        except LLMError as exc:
            hint = self._not_found_hint() if exc.status == 404 else None
            if hint:
                raise LLMError(f"{exc}; {hint}", status=404) from exc
            raise
        if not isinstance(body, dict):
            raise LLMError(
                f"{self.base_url}/{path.lstrip('/')} answered with JSON "
                f"{type(body).__name__}, expected an object"
            )
        return body

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def refuse_stream(params: Mapping[str, Any]) -> None:
    if params.get("stream"):
        raise ConfigError("chat() does not stream yet; leave stream unset")


def check_api_key(api_key: str | None) -> None:
    """Catch ``Client("https://...")``: the first positional argument is the key, not a URL."""
    if api_key is not None and api_key.startswith(("http://", "https://")):
        raise ConfigError(
            "api_key looks like a URL; pass the endpoint as base_url=... (the first "
            "positional argument is the API key)"
        )
