"""JSON over HTTP with retries: the one transport every LLM and embeddings client shares.

``JsonHttpClient.post_json(path, payload)`` sends ``payload`` to ``{base_url}{path}`` and returns
the decoded JSON reply. It retries what is worth retrying — HTTP 408, 429 and 5xx, and
connection-level failures (refused, reset, timeouts) — with exponential backoff and full jitter
(``RetryPolicy``), honouring a ``Retry-After`` header when the server sends one. Any other 4xx
fails at once. Every failure is an ``LLMError`` whose message names the endpoint, the HTTP
status and the endpoint's own error message; ``status`` carries the HTTP status.

Secrets never reach a message or a log line: the endpoint is shown without its query string,
and the values of credential headers (``Authorization``, ``x-api-key``, ...) are masked if an
endpoint echoes them back.

The pieces a streaming client needs (``RetryPolicy.delay``, ``is_retryable_status``,
``error_from_response``) are public so that provider clients can build on them.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from contextfold.errors import ConfigError, LLMError

__all__ = [
    "AsyncJsonHttpClient",
    "JsonHttpClient",
    "RetryPolicy",
    "error_from_response",
    "is_retryable_status",
]

logger = logging.getLogger(__name__)

#: Header names (lower case) whose values are credentials and must never be shown.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})

_MAX_BODY_IN_MESSAGE = 500


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to wait between attempts.

    Attempt ``n`` (0-based) waits a uniformly random time in ``[0, min(max_delay,
    base_delay * 2**n)]`` ("full jitter"). A ``Retry-After`` header replaces that wait, capped
    at ``max_retry_after`` seconds. ``max_retries=3`` means at most four requests in all.
    """

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ConfigError(
                f"retry delays must be >= 0, got base_delay={self.base_delay}, "
                f"max_delay={self.max_delay}, max_retry_after={self.max_retry_after}"
            )

    def backoff_cap(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (0-based), before jitter."""
        return min(self.max_delay, self.base_delay * 2.0**attempt)

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt``; ``retry_after`` wins when given."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        return rng.uniform(0.0, self.backoff_cap(attempt))


def is_retryable_status(status: int) -> bool:
    """408 (timeout), 429 (rate limit) and every 5xx are worth another try."""
    return status in (408, 429) or 500 <= status <= 599


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _secrets(headers: Mapping[str, str]) -> list[str]:
    found: list[str] = []
    for key, value in headers.items():
        if key.lower() in SECRET_HEADERS and value:
            found.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                found.append(token)
    return sorted(found, key=len, reverse=True)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _endpoint(url: httpx.URL | str) -> str:
    """The URL without query string or credentials (Gemini-style ``?key=`` stays hidden)."""
    parsed = httpx.URL(str(url))
    return str(parsed.copy_with(query=None, fragment=None, username=None, password=None))


def _endpoint_message(response: httpx.Response) -> str:
    """The endpoint's own error message: OpenAI, Anthropic and Gemini all nest it in
    ``{"error": {"message": ...}}``; other servers use ``error``, ``message`` or ``detail``."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for key in ("error", "message", "detail"):
            value = body.get(key)
            if isinstance(value, str):
                return value
            if value is not None:
                return json.dumps(value)[:_MAX_BODY_IN_MESSAGE]
    text = response.text.strip()
    if len(text) > _MAX_BODY_IN_MESSAGE:
        text = text[:_MAX_BODY_IN_MESSAGE] + "..."
    return text or "(empty body)"


def error_from_response(
    response: httpx.Response, *, secrets: list[str] | None = None, attempts: int = 1
) -> LLMError:
    """An ``LLMError`` for a failed response: status, endpoint and the endpoint's message."""
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    reason = response.reason_phrase or "error"
    message = (
        f"HTTP {response.status_code} {reason} from {_endpoint(response.request.url)}{tries}: "
        f"{_endpoint_message(response)}"
    )
    return LLMError(_redact(message, secrets or []), status=response.status_code)


def _decode(response: httpx.Response, secrets: list[str]) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        snippet = response.text[:200]
        raise LLMError(
            _redact(
                f"{_endpoint(response.request.url)} answered HTTP {response.status_code} with "
                f"a body that is not JSON: {snippet!r}",
                secrets,
            ),
            status=response.status_code,
        ) from exc


@dataclass(slots=True)
class _Attempts:
    """The retry bookkeeping both clients share (pure: no I/O, no sleeping)."""

    policy: RetryPolicy
    rng: random.Random
    secrets: list[str]
    attempt: int = 0

    def after_response(self, response: httpx.Response) -> float | None:
        """None when ``response`` is final; otherwise the seconds to wait before retrying.
        Raises the ``LLMError`` when it failed for good."""
        status = response.status_code
        if status < 300:
            return None
        if not is_retryable_status(status) or self.attempt >= self.policy.max_retries:
            raise error_from_response(response, secrets=self.secrets, attempts=self.attempt + 1)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return self._next(f"HTTP {status}", response.request.url, retry_after)

    def after_transport_error(self, exc: httpx.TransportError, url: str) -> float:
        if self.attempt >= self.policy.max_retries:
            raise LLMError(
                _redact(
                    f"could not reach {_endpoint(url)} after {self.attempt + 1} attempts: "
                    f"{type(exc).__name__}: {exc}",
                    self.secrets,
                )
            ) from exc
        return self._next(type(exc).__name__, url, None)

    def _next(self, why: str, url: httpx.URL | str, retry_after: float | None) -> float:
        wait = self.policy.delay(self.attempt, self.rng, retry_after)
        self.attempt += 1
        logger.info(
            "%s from %s; retry %d/%d in %.2fs",
            why,
            _endpoint(url),
            self.attempt,
            self.policy.max_retries,
            wait,
        )
        return wait


class _Base:
    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None,
        timeout: float,
        retry: RetryPolicy | None,
        rng: random.Random | None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must start with http:// or https://, got {base_url!r}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self._headers = dict(headers or {})
        self._secrets = _secrets(self._headers)
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        # Headers are left out on purpose: they hold the API key.
        return f"{type(self).__name__}({self.base_url!r}, max_retries={self.retry.max_retries})"

    def _url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def _attempts(self) -> _Attempts:
        return _Attempts(self.retry, self._rng, self._secrets)


class JsonHttpClient(_Base):
    """POSTs JSON and returns JSON, retrying 408/429/5xx and connection errors.

    Guarantees: returns only the decoded body of a 2xx response; raises ``LLMError`` (with
    ``status`` when there was a response) otherwise, never an ``httpx`` exception; never shows
    credential header values. ``sleep`` is injectable so tests do not wait; ``transport`` (an
    ``httpx.BaseTransport``) lets tests mock the network. The underlying ``httpx.Client`` is
    created on first use and released by ``close()`` or the ``with`` block.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, headers=headers, timeout=timeout, retry=retry, rng=rng)
        self._sleep = sleep
        self._transport = transport
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                headers=self._headers, timeout=self.timeout, transport=self._transport
            )
        return self._client

    def post_json(self, path: str, payload: Mapping[str, Any]) -> Any:
        """POST ``payload`` to ``{base_url}/{path}``; the decoded JSON reply."""
        url = self._url(path)
        attempts = self._attempts()
        while True:
            try:
                response = self.client.post(url, json=payload)
            except httpx.TransportError as exc:
                self._sleep(attempts.after_transport_error(exc, url))
                continue
            wait = attempts.after_response(response)
            if wait is None:
                return _decode(response, self._secrets)
            self._sleep(wait)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> JsonHttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncJsonHttpClient(_Base):
    """The async twin of ``JsonHttpClient``: same retries, same errors, ``await post_json``."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, headers=headers, timeout=timeout, retry=retry, rng=rng)
        self._sleep = sleep
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                headers=self._headers, timeout=self.timeout, transport=self._transport
            )
        return self._client

    async def post_json(self, path: str, payload: Mapping[str, Any]) -> Any:
        """POST ``payload`` to ``{base_url}/{path}``; the decoded JSON reply."""
        url = self._url(path)
        attempts = self._attempts()
        while True:
            try:
                response = await self.client.post(url, json=payload)
            except httpx.TransportError as exc:
                await self._sleep(attempts.after_transport_error(exc, url))
                continue
            wait = attempts.after_response(response)
            if wait is None:
                return _decode(response, self._secrets)
            await self._sleep(wait)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> AsyncJsonHttpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
