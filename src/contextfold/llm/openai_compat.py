"""A client for OpenAI-compatible endpoints: OpenAI itself, Ollama, vLLM, LM Studio.

They all speak one wire format: ``POST {base_url}/chat/completions`` and
``POST {base_url}/embeddings``. **``base_url`` is the API root, version included** —
``https://api.openai.com/v1``, ``http://localhost:11434/v1`` (Ollama),
``http://localhost:8000/v1`` (vLLM) — and endpoint paths are appended to it as they are.

Every call is retried on 408/429/5xx and connection errors (see ``contextfold.llm.http``), and
its token usage is added to a ``UsageTracker``. ``ChatResult``, ``Usage`` and
``UsageTracker`` live in ``contextfold.llm.base`` and are re-exported here.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from contextfold.errors import EmbeddingError, LLMError
from contextfold.llm.base import (
    ChatResult,
    HttpChatClient,
    Usage,
    UsageTracker,
    int_field,
    refuse_stream,
)
from contextfold.llm.http import RetryPolicy

__all__ = ["ChatResult", "OpenAICompatibleClient", "Usage", "UsageTracker"]


def _usage(body: Mapping[str, Any]) -> Usage:
    raw = body.get("usage")
    if not isinstance(raw, Mapping):
        return Usage()
    return Usage(
        prompt_tokens=int_field(raw.get("prompt_tokens")),
        completion_tokens=int_field(raw.get("completion_tokens")),
    )


def _message_text(content: Any) -> str:
    """``content`` is a string, null (tool calls only) or, on some servers, a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


class OpenAICompatibleClient(HttpChatClient):
    """Chat completions and embeddings from any OpenAI-compatible endpoint, over httpx.

    ``base_url`` is the API root with its version (``http://localhost:11434/v1``). ``api_key``
    is sent as ``Authorization: Bearer ...`` and never appears in messages or ``repr``.
    Failures raise ``LLMError`` with the HTTP status and the endpoint's own message; a
    response of the wrong shape raises ``LLMError`` too. Use it as a context manager (or call
    ``close()``) to release connections.

    ``chat`` returns a ``ChatResult``; ``embeddings`` returns one vector per input text, in
    input order (the reply's ``index`` decides, not its order). Both add to ``usage``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        headers: Mapping[str, str] | None = None,
        usage: UsageTracker | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        all_headers = dict(headers or {})
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
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
        return (
            "base_url must be the API root including the version, "
            f"e.g. http://localhost:11434/v1 (got {self.base_url})"
        )

    def chat(self, messages: Sequence[Mapping[str, Any]], model: str, **params: Any) -> ChatResult:
        """One chat completion; ``params`` (``temperature``, ``max_tokens``, ``tools``, ...)
        go into the request body as they are."""
        refuse_stream(params)
        body = self._post(
            "chat/completions", {"model": model, "messages": list(messages), **params}
        )
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise LLMError(
                f"{self.base_url}/chat/completions answered without choices: {str(body)[:300]}"
            )
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            message = {}
        usage = _usage(body)
        answered_by = str(body.get("model") or model)
        self.usage.record(answered_by, usage)
        finish = choice.get("finish_reason")
        return ChatResult(
            text=_message_text(message.get("content")),
            model=answered_by,
            usage=usage,
            finish_reason=str(finish) if finish is not None else None,
            raw=body,
        )

    def embeddings(self, texts: Sequence[str], model: str, **params: Any) -> list[list[float]]:
        """One vector per text, in input order, from a single request (batch upstream).

        Raises ``EmbeddingError`` when the reply has the wrong number of vectors, indices
        that do not cover the input, or vectors of different lengths."""
        if not texts:
            return []
        body = self._post("embeddings", {"model": model, "input": list(texts), **params})
        data = body.get("data")
        if not isinstance(data, list):
            raise LLMError(f"{self.base_url}/embeddings answered without a data list")
        if len(data) != len(texts):
            raise EmbeddingError(
                f"{self.base_url}/embeddings returned {len(data)} vectors for {len(texts)} "
                f"texts (model {model!r})"
            )
        vectors: list[list[float] | None] = [None] * len(texts)
        for position, item in enumerate(data):
            index = item.get("index", position) if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if (
                not isinstance(index, int)
                or not 0 <= index < len(texts)
                or vectors[index] is not None
            ):
                raise EmbeddingError(
                    f"{self.base_url}/embeddings returned a bad or repeated index {index!r} "
                    f"for {len(texts)} texts"
                )
            if not isinstance(vector, list) or not vector:
                raise EmbeddingError(
                    f"{self.base_url}/embeddings returned no float list for index {index} "
                    "(ask for encoding_format='float')"
                )
            vectors[index] = vector
        dims = {len(v) for v in vectors if v is not None}
        if len(dims) != 1:
            raise EmbeddingError(
                f"{self.base_url}/embeddings returned vectors of different lengths "
                f"{sorted(dims)} (model {model!r})"
            )
        self.usage.record(str(body.get("model") or model), _usage(body))
        return [v for v in vectors if v is not None]
