"""The upstream side of a request: the URL it goes to, the headers that go with it, the
aiohttp client that sends it, and the provider-shaped errors the proxy answers itself.

Hop-by-hop headers are dropped both ways (``Expect`` too: the proxy has read the body before
it asks upstream, and an upstream that never answers ``100-continue`` would hang the request;
``accept-encoding`` is set to ``identity``, so a reply can be read and marked); a repeated
response header's values are joined by commas (RFC 9110 §5.3). Credentials go upstream as the
client sent them and are never logged; an error naming the upstream names its host and port
only.

**Paths.** The forwarded path is built from the decoded route (``forward_path``): a path with
a dot-segment (``..``, ``.``, also as ``%2e``), an encoded slash or backslash (``%2f``,
``%5c``), a control character (``%00``, CR, LF …), a space or a backslash is refused with a
400 before anything is sent upstream, so a request can never reach outside the upstream
base URL's prefix (a gateway that normalises ``/tenant-a/v1/../../admin`` would serve
``/admin``). What is left is percent-encoded again the one canonical way.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from fastapi.responses import Response
from multidict import CIMultiDictProxy
from yarl import URL

from contextfold.server.proxy.session import SESSION_HEADER

__all__ = [
    "CONNECT_TIMEOUT",
    "UPSTREAM_ERRORS",
    "StreamCut",
    "Upstream",
    "error_response",
    "forward_headers",
    "forward_path",
    "request_error",
    "response_headers",
    "upstream_host",
    "upstream_url",
]

_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
        "expect",
        SESSION_HEADER,
    }
)


def error_response(fmt: str, status: int, message: str, kind: str) -> Response:
    """An error in the shape of the provider ``fmt`` (all three nest ``error.message``)."""
    body: dict[str, Any]
    if fmt == "anthropic":
        body = {"type": "error", "error": {"type": kind, "message": message}}
    elif fmt == "gemini":
        names = {
            400: "INVALID_ARGUMENT",
            404: "NOT_FOUND",
            413: "INVALID_ARGUMENT",
            502: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED",
        }
        body = {"error": {"code": status, "message": message, "status": names.get(status, kind)}}
    else:
        body = {"error": {"message": message, "type": kind, "code": None}}
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def request_error(fmt: str, status: int, message: str) -> Response:
    """An error in the client's request, found by the proxy itself, in the shape of the
    provider ``fmt`` (Anthropic names a 413 ``request_too_large``)."""
    kind = "request_too_large" if fmt == "anthropic" and status == 413 else "invalid_request_error"
    return error_response(fmt, status, message, kind)


_ENCODED_SEPARATOR = re.compile(rb"%(?:2f|5c)", re.IGNORECASE)
_BAD_CHARACTER = re.compile(r"[\x00-\x20\x7f\\]")
#: What stays unescaped in a forwarded path (RFC 3986 pchar and "/").
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def forward_path(raw_path: bytes, path: str) -> str:
    """The path to forward for a request whose target was ``raw_path`` (as sent) and is
    ``path`` decoded; raises ``ValueError`` naming what is wrong with it (see the module
    docs)."""
    if _ENCODED_SEPARATOR.search(raw_path):
        raise ValueError("the request path has an encoded slash or backslash (%2F, %5C)")
    bad = _BAD_CHARACTER.search(path)
    if bad is not None:
        raise ValueError(
            f"the request path has a control character, a space or a backslash "
            f"({bad.group()!r} at offset {bad.start()})"
        )
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ValueError("the request path has a dot-segment (. or ..)")
    return quote(path, safe=_PATH_SAFE)


def upstream_host(url: str) -> str:
    """``host:port`` of ``url``, never its credentials: what an error may say."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}" if parts.port else host


def upstream_url(base: str, path: str, query: str) -> str:
    """``base`` joined with the request ``path`` (a base ending in the path's first segment,
    such as ``…/v1``, does not repeat it) and ``query``."""
    base = base.rstrip("/")
    first = "/" + path.lstrip("/").split("/", 1)[0]
    if urlsplit(base).path.endswith(first):
        path = path[len(first) :]
    return base + path + (f"?{query}" if query else "")


def forward_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out = {k: v for k, v in headers if k.lower() not in _HOP}
    out["accept-encoding"] = "identity"
    return out


#: The largest body sent upstream in one write (aiohttp's own threshold).
_IN_ONE_WRITE = 1024 * 1024

#: What the upstream client raises for a connection refused, reset or timed out.
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)
#: Seconds an upstream may take to accept a connection.
CONNECT_TIMEOUT = 10.0


class StreamCut(Exception):
    """Raised out of a response body whose upstream stream broke off: the server then closes
    the client's connection without ending the body (a client never takes a truncated reply
    for a whole one). Logged once, as a warning, where it happens; the error handlers and
    the server's log leave it out (``guards``)."""


def response_headers(response: aiohttp.ClientResponse, token: str | None) -> dict[str, str]:
    out = merged(response.headers)
    if token:
        out[SESSION_HEADER] = token
    return out


def merged(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    """The end-to-end headers, a repeated one's values joined by commas (RFC 9110 §5.3)."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        if key.lower() not in _HOP:
            out[key] = f"{out[key]}, {value}" if key in out else value
    return out


class Upstream:
    """One aiohttp client per event loop (a server may run several), sending requests as
    the client made them."""

    def __init__(self, read_timeout: float) -> None:
        self.read_timeout = read_timeout
        self._clients: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def client(self) -> aiohttp.ClientSession:
        """This event loop's upstream client (aiohttp: per request it costs a third of the CPU
        of httpx's async client, and the proxy's added latency is the bar it is measured by)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=CONNECT_TIMEOUT, sock_read=self.read_timeout
                ),
                # The client's own headers go upstream as they came; add none of ours.
                skip_auto_headers=("User-Agent", "Content-Type"),
                trust_env=False,
            )
            self._clients[loop] = client
        return client

    async def send(
        self, method: str, url: str, headers: dict[str, str], content: bytes
    ) -> aiohttp.ClientResponse:
        """Send upstream; the response's body is still to be read (``read`` / ``content``)
        and the caller releases it. Raises one of ``UPSTREAM_ERRORS``."""
        # aiohttp sends a large ``bytes`` body in one write (and warns that it may hold the
        # event loop); from a file object it sends it in pieces, with its Content-Length.
        data: bytes | io.BytesIO = content if len(content) <= _IN_ONE_WRITE else io.BytesIO(content)
        return await self.client().request(
            method,
            URL(url, encoded=True),  # forwarded as given: no re-quoting of path or ?key=
            headers=headers,
            data=data,
            allow_redirects=False,
        )

    async def aclose(self) -> None:
        """Close this event loop's client."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()
