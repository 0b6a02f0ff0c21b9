"""A client for the Gemini API's ``generateContent``, over httpx.

``POST {base_url}/{api_version}/models/{model}:generateContent`` with ``base_url`` the API host
(``https://generativelanguage.googleapis.com``) and ``api_version`` ``v1beta``. OpenAI-style
messages are translated: ``system`` messages become ``systemInstruction``, ``assistant`` turns
take Gemini's role ``model``, and generation settings (``temperature``, ``max_tokens``, ...)
go into ``generationConfig`` under Gemini's names. Retries, error mapping and secret masking
come from ``contextfold.llm.http``.
"""

from __future__ import annotations

import json
import random
import time
import urllib.parse
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

__all__ = ["GEMINI_BASE_URL", "GeminiClient"]

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com"

#: Portable parameter names and their ``generationConfig`` field.
GENERATION_CONFIG_FIELDS = {
    "temperature": "temperature",
    "max_tokens": "maxOutputTokens",
    "top_p": "topP",
    "top_k": "topK",
    "stop": "stopSequences",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
    "candidate_count": "candidateCount",
}


def _usage(raw: Any) -> Usage:
    # Thinking models report their thoughts apart (thoughtsTokenCount); they are billed as
    # output, so they count as completion tokens here.
    if not isinstance(raw, Mapping):
        return Usage()
    return Usage(
        prompt_tokens=int_field(raw.get("promptTokenCount")),
        completion_tokens=int_field(raw.get("candidatesTokenCount"))
        + int_field(raw.get("thoughtsTokenCount")),
    )


def _model_path(model: str) -> str:
    """``gemini-2.0-flash`` and ``models/gemini-2.0-flash`` both give ``models/...``;
    ``tunedModels/...`` stays as it is."""
    if not model.startswith(("models/", "tunedModels/")):
        model = f"models/{model}"
    return urllib.parse.quote(model, safe="/-._~")


def _blocked_message(model: str, body: Mapping[str, Any]) -> str:
    feedback = body.get("promptFeedback")
    if isinstance(feedback, Mapping) and feedback.get("blockReason"):
        why = f"the prompt was blocked (promptFeedback.blockReason={feedback['blockReason']})"
        return (
            f"Gemini returned no candidates for {model!r}: {why}; rephrase the prompt or "
            "adjust safetySettings"
        )
    shown = json.dumps(feedback)[:300] if feedback is not None else "absent"
    return f"Gemini returned no candidates for {model!r} (promptFeedback: {shown})"


class GeminiClient(HttpChatClient):
    """Chat through the Gemini API; satisfies ``ChatClient``.

    ``api_key`` is sent as ``x-goog-api-key`` (never in the URL) and never appears in messages
    or ``repr``. Failures raise ``LLMError`` with the HTTP status and Google's own message;
    408/429/5xx are retried with backoff and jitter. A reply without candidates (a blocked
    prompt) raises ``LLMError`` naming ``promptFeedback``. Every call adds to ``usage``.

    >>> client = GeminiClient("AIza...")
    >>> client  # the key stays out of repr
    GeminiClient('https://generativelanguage.googleapis.com')
    >>> client.chat([{"role": "user", "content": "Hi"}], "gemini-2.0-flash",
    ...             temperature=0, max_tokens=64).text  # doctest: +SKIP
    'Hello!'
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str = GEMINI_BASE_URL,
        *,
        api_version: str = "v1beta",
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
        all_headers = dict(headers or {})
        if api_key:
            all_headers["x-goog-api-key"] = api_key
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
        self.api_version = api_version.strip("/")

    def _not_found_hint(self) -> str | None:
        if self.base_url.rsplit("/", 1)[-1].startswith("v1"):
            return (
                "base_url is the API host without a version, e.g. "
                f"https://generativelanguage.googleapis.com; api_version= sets the version "
                f"(got base_url {self.base_url})"
            )
        return None

    def chat(self, messages: Sequence[Mapping[str, Any]], model: str, **params: Any) -> ChatResult:
        """One reply from ``model``. ``temperature``, ``max_tokens`` (``maxOutputTokens``),
        ``top_p``, ``top_k``, ``stop``, ``seed``, ``presence_penalty``,
        ``frequency_penalty`` and ``candidate_count`` go into ``generationConfig``, merged over
        a ``generation_config`` dict if given; other ``params`` (``safetySettings``,
        ``tools``, ...) go into the request body as they are."""
        refuse_stream(params)
        system, turns = split_messages(messages, "Gemini")
        config: dict[str, Any] = dict(params.pop("generation_config", None) or {})
        for name, field in GENERATION_CONFIG_FIELDS.items():
            value = params.pop(name, None)
            if value is not None:
                config[field] = [value] if name == "stop" and isinstance(value, str) else value
        payload: dict[str, Any] = {
            "contents": [
                {"role": "model" if role == "assistant" else "user", "parts": [{"text": text}]}
                for role, text in turns
            ]
        }
        if system:
            payload["systemInstruction"] = {"parts": [{"text": system}]}
        if config:
            payload["generationConfig"] = config
        payload.update(params)
        path = _model_path(model)
        body = self._post(f"{self.api_version}/{path}:generateContent", payload)
        usage = _usage(body.get("usageMetadata"))
        answered_by = str(body.get("modelVersion") or path.removeprefix("models/"))
        self.usage.record(answered_by, usage)
        candidates = body.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            raise LLMError(_blocked_message(model, body))
        candidate = candidates[0] if isinstance(candidates[0], Mapping) else {}
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, Mapping) else None
        text = "".join(
            part["text"]
            for part in (parts if isinstance(parts, list) else [])
            if isinstance(part, Mapping)
            and isinstance(part.get("text"), str)
            and not part.get("thought")  # thought summaries are not the answer
        )
        finish = candidate.get("finishReason")
        return ChatResult(
            text=text,
            model=answered_by,
            usage=usage,
            finish_reason=str(finish) if finish is not None else None,
            raw=body,
        )
