"""A client for Anthropic's Messages API (``POST {base_url}/v1/messages``), over httpx.

``base_url`` is the API host **without** a version, ``https://api.anthropic.com`` (the
official SDKs use the same convention). OpenAI-style messages are translated: every
``system`` message goes into the top-level ``system`` field (joined with blank lines),
``user``/``assistant`` turns go into ``messages`` in order. Retries, error mapping and secret
masking come from ``contextfold.llm.http``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from contextfold.errors import LLMError
from contextfold.llm.base import (
    ChatResult,
    HttpChatClient,
    Usage,
    UsageTracker,
    check_api_key,
    int_field,
    refuse_stream,
    split_messages,
)
from contextfold.llm.http import RetryPolicy

__all__ = ["ANTHROPIC_BASE_URL", "AnthropicClient"]

ANTHROPIC_BASE_URL = "https://api.anthropic.com"


def _usage(raw: Any) -> Usage:
    # input_tokens excludes prompt-cache reads and writes (cache_read_input_tokens,
    # cache_creation_input_tokens), which Anthropic bills at other rates.
    if not isinstance(raw, Mapping):
        return Usage()
    return Usage(
        prompt_tokens=int_field(raw.get("input_tokens")),
        completion_tokens=int_field(raw.get("output_tokens")),
    )


class AnthropicClient(HttpChatClient):
    """Chat through Anthropic's Messages API; satisfies ``ChatClient``.

    ``api_key`` is sent as ``x-api-key`` (with ``anthropic-version``) and never appears in
    messages or ``repr``. Failures raise ``LLMError`` with the HTTP status and Anthropic's own
    message; 408/429/5xx (529 "overloaded" included) are retried with backoff and jitter.
    Every call adds to ``usage``. Use it as a context manager, or call ``close()``.

    >>> client = AnthropicClient("sk-ant-...")
    >>> client  # the key stays out of repr
    AnthropicClient('https://api.anthropic.com')
    >>> client.chat([{"role": "system", "content": "Be brief."},
    ...              {"role": "user", "content": "Hi"}], "claude-sonnet-4-5").text  # doctest: +SKIP
    'Hello!'
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str = ANTHROPIC_BASE_URL,
        *,
        anthropic_version: str = "2023-06-01",
        timeout: float = 60.0,
        max_retries: int = 3,
        headers: Mapping[str, str] | None = None,
        usage: UsageTracker | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        check_api_key(api_key)
        all_headers = {"anthropic-version": anthropic_version, **(headers or {})}
        if api_key:
            all_headers["x-api-key"] = api_key
        super().__init__(
            base_url,
            headers=all_headers,
            timeout=timeout,
            max_retries=max_retries,
            usage=usage,
            retry=retry,
            sleep=sleep,
            rng=rng,
            transport=transport,
        )

    def _not_found_hint(self) -> str | None:
        if self.base_url.endswith("/v1"):
            return (
                "base_url is the API host without /v1, e.g. https://api.anthropic.com "
                f"(got {self.base_url})"
            )
        return None

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        model: str,
        *,
        max_tokens: int = 1024,
        **params: Any,
    ) -> ChatResult:
        """One message from ``model``. ``max_tokens`` (required by Anthropic) caps the reply;
        ``stop`` (a string or list) becomes ``stop_sequences``; other ``params``
        (``temperature``, ``top_p``, ``metadata``, ...) go into the request body as they are."""
        refuse_stream(params)
        system, turns = split_messages(messages, "Anthropic")
        payload: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": role, "content": text} for role, text in turns],
        }
        if system:
            payload["system"] = system
        stop = params.pop("stop", None)
        if stop is not None:
            payload["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        payload.update(params)
        body = self._post("v1/messages", payload)
        content = body.get("content")
        if not isinstance(content, list):
            raise LLMError(
                f"{self.base_url}/v1/messages answered without a content list: {str(body)[:300]}"
            )
        text = "".join(
            block["text"]
            for block in content
            if isinstance(block, Mapping)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        )
        usage = _usage(body.get("usage"))
        answered_by = str(body.get("model") or model)
        self.usage.record(answered_by, usage)
        stop_reason = body.get("stop_reason")
        return ChatResult(
            text=text,
            model=answered_by,
            usage=usage,
            finish_reason=str(stop_reason) if stop_reason is not None else None,
            raw=body,
        )
