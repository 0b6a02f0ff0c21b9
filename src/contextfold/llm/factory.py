"""``make_chat_client``: one call from a provider name (as in a config file) to a ``ChatClient``.

Where the API key comes from, in order: ``api_key``; the environment variable named by
``api_key_env`` (it must be set); or, only when ``base_url`` is left at the provider's own
host, the provider's conventional variable (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
``GEMINI_API_KEY``). A conventional variable is never sent to a ``base_url`` you chose, so a
key for one service does not leak to another server. Ollama needs no key.
"""

from __future__ import annotations

import os
from typing import Any, Literal, get_args

from contextfold.errors import ConfigError
from contextfold.llm.anthropic import ANTHROPIC_BASE_URL, AnthropicClient
from contextfold.llm.base import ChatClient
from contextfold.llm.gemini import GEMINI_BASE_URL, GeminiClient
from contextfold.llm.openai_compat import OpenAICompatibleClient

__all__ = ["DEFAULT_BASE_URLS", "PROVIDERS", "Provider", "make_chat_client"]

Provider = Literal["openai", "ollama", "anthropic", "gemini"]
PROVIDERS: tuple[str, ...] = get_args(Provider)

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "ollama": "http://127.0.0.1:11434/v1",
    "anthropic": ANTHROPIC_BASE_URL,
    "gemini": GEMINI_BASE_URL,
}

#: The variable each provider's own SDK reads; None: the provider needs no key.
DEFAULT_KEY_ENV: dict[str, str | None] = {
    "openai": "OPENAI_API_KEY",
    "ollama": None,
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
}


def _api_key(
    provider: str, base_url: str | None, api_key: str | None, api_key_env: str | None
) -> str | None:
    if api_key:
        return api_key
    if api_key_env:
        value = os.environ.get(api_key_env, "").strip()
        if not value:
            raise ConfigError(
                f"{provider}: api_key_env names {api_key_env}, but that environment variable "
                "is not set or is empty; export it or pass api_key="
            )
        return value
    conventional = DEFAULT_KEY_ENV[provider]
    if conventional is None or base_url is not None:
        return None  # a local or self-chosen server: no key unless one was given
    value = os.environ.get(conventional, "").strip()
    if not value:
        raise ConfigError(
            f"{provider} needs an API key: set {conventional}, or pass api_key= or "
            "api_key_env= naming the variable that holds it"
        )
    return value


def make_chat_client(
    provider: Provider,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    api_key_env: str | None = None,
    timeout: float | None = None,
) -> ChatClient:
    """A chat client for ``provider``: ``"openai"``, ``"ollama"``, ``"anthropic"`` or
    ``"gemini"``. ``base_url`` defaults to the provider's own (``DEFAULT_BASE_URLS``); the key
    rules are in this module's docstring. Raises ``ConfigError`` for an unknown provider or
    a missing key.

    >>> client = make_chat_client("ollama")
    >>> client.base_url
    'http://127.0.0.1:11434/v1'
    """
    name = str(provider).strip().lower()
    if name not in PROVIDERS:
        raise ConfigError(
            f"unknown LLM provider {provider!r}; choose one of {', '.join(PROVIDERS)} "
            "(vLLM, LM Studio and other OpenAI-compatible servers: 'openai' with base_url)"
        )
    key = _api_key(name, base_url, api_key, api_key_env)
    url = base_url or DEFAULT_BASE_URLS[name]
    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if name == "anthropic":
        return AnthropicClient(key, url, **options)
    if name == "gemini":
        return GeminiClient(key, url, **options)
    return OpenAICompatibleClient(url, api_key=key, **options)
