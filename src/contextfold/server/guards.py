"""Bad-input guards every route shares, and the one shape every error takes.

Every error the server itself produces is JSON of one shape (the shape OpenAI's API uses, so
SDK clients pointed at the proxy show the message)::

    {"error": {"type": "body_too_large", "message": "request body is ... bytes; ..."}}

``type`` is a stable machine-readable slug, ``message`` says what happened with the numbers
and what to do; validation errors add ``details`` (one ``{loc, msg, type}`` per problem).
Errors an upstream LLM API returns through the proxy are passed on untouched.

On the proxy's routes (``/v1/…``, ``/v1beta/…``, ``/openai/…``: the providers' own APIs) the
guards' errors — body size, UTF-8, paths — take the shape of the provider the path belongs to
instead (``proxy.forward.error_response``, as the proxy's own errors do), so an SDK client
reads them as its provider's: Anthropic's ``{"type": "error", "error": {"type":
"request_too_large", …}}`` for a 413, Gemini's ``{"error": {"code", "message", "status"}}``,
OpenAI's ``{"error": {"message", "type": "invalid_request_error", "code": null}}``.

The guards (``install`` adds them to an app):

- **Body size.** A declared ``Content-Length`` above ``LimitSettings.max_body_bytes`` is
  answered 413 before the body is read; a chunked body is counted as it streams in and cut
  off at the limit. Either way at most the limit is ever held in memory. Up to
  ``DRAIN_BYTES`` of the rest is read and discarded first, so the client, still sending,
  sees the 413 instead of a reset connection (not when it sent ``Expect: 100-continue``:
  then it is waiting, and the body was never sent).
- **Paths.** A path with a control character (``%00``, CR, LF …) is answered 400
  ``invalid_path`` whatever the route (the proxy's routes check more: ``proxy.forward``).
- **UTF-8.** A JSON body (``application/json`` or ``*+json``) that is not valid UTF-8 is
  answered 400 ``invalid_utf8`` with the byte offset, checked incrementally as it streams in
  (a compressed one, with a ``Content-Encoding``, once the proxy has decoded it).
- **Malformed JSON** → 400 ``invalid_json`` with the position; a body that does not match the
  route's model → 422 ``invalid_request`` with ``details``.
- **Unknown path** → 404 ``not_found``; wrong method → 405 ``method_not_allowed``.
- **Anything unexpected** → 500 ``internal_error`` (logged with its traceback, never echoed).

No error message and no log line quotes more than 200 characters of anything a client sent
(``contextfold._bounded.clip``): an exception's text may quote a value, and a 7 MB value must
not grow the log by 7 MB.

>>> ErrorResponse(error=ErrorDetail(type="not_found", message="no node 7")).model_dump(
...     exclude_none=True)
{'error': {'type': 'not_found', 'message': 'no node 7'}}
"""

from __future__ import annotations

import codecs
import logging
import re
import traceback
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from contextfold._bounded import clip

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from contextfold.server.config import LimitSettings

__all__ = [
    "DRAIN_BYTES",
    "ERROR_RESPONSES",
    "ApiError",
    "BodyGuard",
    "ErrorDetail",
    "ErrorResponse",
    "error_response",
    "install",
    "is_json",
]

logger = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: How much of an oversized body is read and thrown away before the 413 is sent.
DRAIN_BYTES = 64 * 1024 * 1024

_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
}


class ErrorDetail(BaseModel):
    """What went wrong: a stable ``type`` slug and a message for people."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    """The body of every error response: ``{"error": {"type": ..., "message": ...}}``."""

    model_config = ConfigDict(frozen=True)

    error: ErrorDetail


def _described(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


#: The error responses of the JSON API, for a router's ``responses=`` (OpenAPI).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _described("Malformed JSON or a body that is not UTF-8"),
    401: _described("Missing or unknown API key"),
    403: _described(
        "The key does not own the tenant, or (open API on loopback) Host is not a loopback name"
    ),
    404: _described("No such resource (or not one of the caller's tenants)"),
    409: _described("The resource already exists"),
    413: _described("The request body is larger than limits.max_body_bytes"),
    415: _described("A request body whose Content-Type is not JSON (send application/json)"),
    422: _described("The body or parameters do not match the schema"),
}


class ApiError(HTTPException):
    """An HTTP error with a ``type`` slug and a message, rendered in the one error shape.

    >>> error = ApiError(404, "not_found", "no node 7")
    >>> error.type, error.detail
    ('not_found', 'no node 7')
    """

    def __init__(
        self,
        status_code: int,
        type_: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status_code, detail=message, headers=headers)
        self.type = type_


def error_response(
    status_code: int,
    type_: str,
    message: str,
    *,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A ``JSONResponse`` in the one error shape."""
    error = ErrorDetail(type=type_, message=message, details=details)
    return JSONResponse(
        ErrorResponse(error=error).model_dump(mode="json", exclude_none=True),
        status_code=status_code,
        headers=headers,
    )


# -- the body guard ----------------------------------------------------------------------


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names JSON: ``application/json`` or ``application/*+json``,
    any parameters aside.

    >>> is_json("application/json; charset=utf-8"), is_json("application/x-www-form-urlencoded")
    (True, False)
    """
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and "+json" in media)


async def _drain(receive: Receive, limit: int) -> None:
    """Read and discard the rest of a request body, at most ``limit`` bytes."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


#: The proxy's routes: the providers' APIs, whose clients read errors in their provider's shape.
_PROVIDER_PREFIXES = ("/v1/", "/v1beta/", "/openai/")


def _guard_error(
    path: str, status: int, type_: str, message: str, *, headers: dict[str, str] | None = None
) -> Response:
    """A guard's error for a request to ``path``: in the provider's shape on the proxy's
    routes (see the module docs), in the one error shape elsewhere."""
    if not path.startswith(_PROVIDER_PREFIXES):
        return error_response(status, type_, message, headers=headers)
    from contextfold.server.proxy.forward import request_error
    from contextfold.server.proxy.routes import format_of

    response = request_error(format_of(path), status, message)
    response.headers.update(headers or {})
    return response


def _too_large(size: str, limit: int) -> ApiError:
    return ApiError(
        413,
        "body_too_large",
        f"request body is {size} bytes; this server accepts at most {limit:,} "
        "(limits.max_body_bytes)",
    )


class BodyGuard:
    """ASGI middleware: the body-size limit and the UTF-8 check of JSON bodies (see the
    module docs). Errors are raised from ``receive`` as ``ApiError``s, so the route that is
    reading the body answers them in the one error shape."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bad = _CONTROL.search(scope.get("path", ""))
        if bad is not None:
            message = (
                f"the request path has a control character ({bad.group()!r} at offset "
                f"{bad.start()}); no route takes one"
            )
            response = _guard_error(scope.get("path", ""), 400, "invalid_path", message)
            await response(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.max_body_bytes
        declared = _content_length(headers)
        if declared is not None and declared > limit:
            waiting = "100-continue" in headers.get("expect", "").lower()
            if not waiting and declared - limit <= DRAIN_BYTES:
                await _drain(receive, DRAIN_BYTES + limit)
            error = _too_large(f"{declared:,}", limit)
            response = _guard_error(
                scope.get("path", ""),
                413,
                error.type,
                error.detail,
                headers={"connection": "close"},
            )
            await response(scope, receive, send)
            return

        # A compressed body (``Content-Encoding``) is checked once decoded (the proxy's
        # ``encoding``), not as the bytes that arrive.
        coded = headers.get("content-encoding", "").strip().lower() not in ("", "identity")
        decoder = (
            codecs.getincrementaldecoder("utf-8")()
            if is_json(headers.get("content-type")) and not coded
            else None
        )
        received = 0
        started = False

        async def guarded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk: bytes = message.get("body", b"")
            more = bool(message.get("more_body", False))
            received += len(chunk)
            if received > limit:
                if more:
                    await _drain(receive, DRAIN_BYTES)
                raise _too_large(f"more than {limit:,}", limit)
            if decoder is not None:
                pending = len(decoder.getstate()[0])
                try:
                    decoder.decode(chunk, final=not more)
                except UnicodeDecodeError as exc:
                    if more:
                        await _drain(receive, DRAIN_BYTES)
                    offset = received - len(chunk) - pending + exc.start
                    raise ApiError(
                        400,
                        "invalid_utf8",
                        f"request body is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} "
                        f"at offset {offset:,}: {exc.reason}); JSON bodies must be UTF-8",
                    ) from None
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, watched_send)
        except ApiError as exc:  # raised where no route handles it (e.g. a background read)
            if started:
                raise
            response = _guard_error(scope.get("path", ""), exc.status_code, exc.type, exc.detail)
            await response(scope, receive, send)


def _content_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


# -- exception handlers --------------------------------------------------------------------


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if isinstance(exc, ApiError):  # on the proxy's routes, only the guards raise these
        path = request.url.path
        return _guard_error(path, exc.status_code, exc.type, exc.detail, headers=headers)
    type_ = _TYPES.get(exc.status_code, f"http_{exc.status_code}")
    message = str(exc.detail)
    if message == "There was an error parsing the body" and exc.__cause__ is not None:
        cause = exc.__cause__  # FastAPI's wrapper hides why (e.g. JSON nested too deeply)
        message = f"cannot parse the request body: {type(cause).__name__}: {clip(str(cause))}"
    where = f"{request.method} {clip(request.url.path)}"
    if exc.status_code == 404 and message == "Not Found":
        message = f"no endpoint at {where}; the API is described at /docs and /openapi.json"
    elif exc.status_code == 405 and message == "Method Not Allowed":
        allowed = _allowed_methods(request) or headers.get("Allow") or headers.get("allow")
        if allowed:
            headers = {k: v for k, v in headers.items() if k.lower() != "allow"}
            headers["Allow"] = allowed
        message = f"{request.method} is not allowed on {clip(request.url.path)}" + (
            f"; allowed: {allowed}" if allowed else ""
        )
    return error_response(exc.status_code, type_, message, headers=headers)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette's own ``Allow`` names only the
    first route that matched the path, and FastAPI makes one route per method)."""
    from starlette.routing import Match

    def leaves(routes: Iterable[Any]) -> Iterator[Any]:
        for route in routes:
            nested = getattr(route, "effective_candidates", None)  # FastAPI's included routers
            if callable(nested):
                yield from leaves(nested())
            else:
                yield route

    methods: set[str] = set()
    probe = {**request.scope, "method": "\0"}
    for route in leaves(request.app.routes):
        if getattr(route, "matches", None) is None:
            continue
        match, _ = route.matches(probe)
        if match is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def _loc(loc: Any) -> list[str | int]:
    return [part if isinstance(part, int) else str(part) for part in loc]


def _validation_error(request: Request, exc: Exception) -> Response:
    from fastapi.exceptions import RequestValidationError

    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    for error in errors:
        if error.get("type") == "json_invalid":
            loc = error.get("loc", ())
            where = f" at byte {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            reason = (error.get("ctx") or {}).get("error", "JSON decode error")
            return error_response(400, "invalid_json", f"malformed JSON{where}: {reason}")
    details = [
        {
            "loc": _loc(e.get("loc", ())),
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]
    if details:
        first = details[0]
        message = f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
        if len(details) > 1:
            message += f" (and {len(details) - 1} more; see details)"
    else:
        message = "the request does not match the schema"
    return error_response(422, "invalid_request", message, details=details)


def _cut(exc: BaseException | None) -> bool:
    from contextfold.server.proxy.forward import StreamCut

    return isinstance(exc, StreamCut)


class _QuietCuts(logging.Filter):
    """Leaves out of the server's log the ``StreamCut`` a body raises to cut a client's
    stream: an expected event, logged once as a warning where it happens."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _cut(record.exc_info[1]))


_QUIET_CUTS = _QuietCuts()


def _internal_error(request: Request, exc: Exception) -> Response:
    if _cut(exc):  # the response had started: this answer is never sent (see ``_QuietCuts``)
        return JSONResponse(None, status_code=502)
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error(
        "unhandled error in %s %s: %s: %s\nTraceback (most recent call last):\n%s",
        request.method,
        clip(request.url.path),
        type(exc).__name__,
        clip(str(exc)),
        frames.rstrip(),
    )
    return error_response(
        500,
        "internal_error",
        f"internal error ({type(exc).__name__}) while handling {request.method} "
        f"{clip(request.url.path)}; the server log has the details",
    )


def install(app: FastAPI, limits: LimitSettings) -> None:
    """Add the body guard and the error handlers to ``app``."""
    from fastapi.exceptions import RequestValidationError

    app.add_middleware(BodyGuard, max_body_bytes=limits.max_body_bytes)
    logging.getLogger("uvicorn.error").addFilter(_QUIET_CUTS)  # (once: the same filter)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
