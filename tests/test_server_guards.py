"""The server's bad-input guards: body size (declared, chunked, Expect: 100-continue), UTF-8,
malformed JSON, unknown paths and methods, unexpected errors — each a clear JSON 4xx/5xx in the
one error shape, over a real socket where the transport matters."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import LimitSettings, ProxySettings, ServerConfig
from contextfold.server.guards import DRAIN_BYTES, BodyGuard
from fake_llm import FakeLLMServer
from live_app import LiveServer
from proxy_support import Served, closed_after_test, serve

MB = 1024 * 1024
#: A loopback name: the open context API answers no other ``Host`` (DNS rebinding).
LOCAL = "http://127.0.0.1:5757"


def _app(**limits: Any) -> FastAPI:
    config = ServerConfig(limits=LimitSettings(**limits))
    return create_app(config, memory=MemoryEngine(store=":memory:", embedder=None))


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(_app(), base_url=LOCAL) as test_client:
        yield test_client


@pytest.fixture
def live() -> Iterator[LiveServer]:
    with LiveServer(_app()) as server:
        yield server


def _error(response: httpx.Response, status: int, type_: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == type_
    return str(error["message"])


# -- body size ----------------------------------------------------------------------------


def test_a_10_mb_body_gets_413_over_a_real_socket(live: LiveServer) -> None:
    response = httpx.post(
        f"{live.url}/api/context",
        content=b"x" * (10 * MB),
        headers={"content-type": "application/json"},
    )
    message = _error(response, 413, "body_too_large")
    assert "10,485,760 bytes" in message and "8,388,608" in message


def test_a_chunked_body_over_the_limit_gets_413_over_a_real_socket(live: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"x" * MB

    response = httpx.post(
        f"{live.url}/api/context", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert "more than 8,388,608 bytes" in _error(response, 413, "body_too_large")


def test_expect_100_continue_gets_413_before_the_body_is_sent(live: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/context HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10485760\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:80]


def test_the_body_limit_is_configurable() -> None:
    with TestClient(_app(max_body_bytes=2048), base_url=LOCAL) as client:
        small = {"query": "x" * 1900, "tenant_ids": ["t"]}
        assert client.post("/api/context", json=small).status_code == 200
        big = {"query": "x" * 3000, "tenant_ids": ["t"]}
        message = _error(client.post("/api/context", json=big), 413, "body_too_large")
        assert "at most 2,048" in message


class _Sink:
    """An ASGI app that reads the whole body and counts what it got."""

    def __init__(self) -> None:
        self.called = False
        self.received = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        while True:
            message = await receive()
            self.received += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _drive(
    app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]
) -> tuple[int, int, bytes]:
    """Run one request through ``app``; returns (status, chunks pulled, body)."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        if pulled > len(chunks):
            return {"type": "http.disconnect"}
        return {
            "type": "http.request",
            "body": chunks[pulled - 1],
            "more_body": pulled < len(chunks),
        }

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], pulled, body


def test_a_declared_oversized_body_never_reaches_the_app() -> None:
    sink = _Sink()
    status, _, body = _drive(
        BodyGuard(sink, max_body_bytes=4096),
        [(b"content-length", b"10000")],
        [b"x" * 5000, b"x" * 5000],
    )
    assert status == 413 and b"10,000 bytes" in body
    assert not sink.called


def test_a_chunked_body_is_cut_at_the_limit_and_the_rest_drained_not_kept() -> None:
    sink = _Sink()  # reads the body without handling errors: the guard answers for it
    status, pulled, body = _drive(BodyGuard(sink, max_body_bytes=4096), [], [b"x" * 1000] * 10)
    assert status == 413 and b"more than 4,096 bytes" in body
    assert sink.received <= 4096  # the app never held more than the limit
    assert pulled == 10  # the rest was read and thrown away, so the client sees the 413


def test_draining_stops_after_drain_bytes() -> None:
    sink = _Sink()
    huge = [b""] * 3  # the declared size is beyond the drain cap: answer at once, read nothing
    status, pulled, _ = _drive(
        BodyGuard(sink, max_body_bytes=4096),
        [(b"content-length", str(DRAIN_BYTES + 10 * MB).encode())],
        huge,
    )
    assert status == 413 and pulled == 0


# -- UTF-8 and JSON ------------------------------------------------------------------------


def test_invalid_utf8_gets_400_with_its_offset(client: TestClient) -> None:
    body = b'{"query": "caf\xc3\xa9 \xff"}'
    response = client.post(
        "/api/context", content=body, headers={"content-type": "application/json"}
    )
    message = _error(response, 400, "invalid_utf8")
    assert "0xff at offset 17" in message


def test_utf8_is_checked_across_chunk_boundaries() -> None:
    headers = [(b"content-type", b"application/json")]
    split_ok = [b'{"q": "caf\xc3', b'\xa9"}']  # é split over two chunks: valid
    assert _drive(BodyGuard(_Sink(), max_body_bytes=4096), headers, split_ok)[0] == 200
    truncated = [b'{"q": "caf\xc3', b""]  # the sequence never completes
    status, _, body = _drive(BodyGuard(_Sink(), max_body_bytes=4096), headers, truncated)
    assert status == 400 and b"0xc3 at offset 10" in body


def test_a_non_json_body_is_not_utf8_checked() -> None:
    headers = [(b"content-type", b"application/octet-stream")]
    assert _drive(BodyGuard(_Sink(), max_body_bytes=4096), headers, [b"\xff\xfe"])[0] == 200


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"query": "x",', "at byte 14"),
        (b"{'query': 'x'}", "at byte 1"),
        (b'{"query": "x"} trailing', "at byte 15"),
    ],
)
def test_malformed_json_gets_400_with_the_position(
    client: TestClient, body: bytes, where: str
) -> None:
    response = client.post(
        "/api/context", content=body, headers={"content-type": "application/json"}
    )
    assert where in _error(response, 400, "invalid_json")


def test_json_nested_too_deeply_gets_400(client: TestClient) -> None:
    response = client.post(
        "/api/context", content=b"[" * 100_000, headers={"content-type": "application/json"}
    )
    assert "RecursionError" in _error(response, 400, "bad_request")


def test_json_nested_too_deeply_gets_400_over_a_real_socket(live: LiveServer) -> None:
    deep = b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with httpx.Client(base_url=live.url) as client:
        response = client.post(
            "/api/context", content=deep, headers={"content-type": "application/json"}
        )
        assert "RecursionError" in _error(response, 400, "bad_request")
        assert client.get("/healthz").status_code == 200  # the connection still serves


def test_a_body_that_misses_the_schema_gets_422_with_details(client: TestClient) -> None:
    response = client.post("/api/context", json={"query": 5, "entry_limit": 0, "bogus": 1})
    message = _error(response, 422, "invalid_request")
    details = response.json()["error"]["details"]
    assert {tuple(d["loc"]) for d in details} == {
        ("body", "query"),
        ("body", "entry_limit"),
        ("body", "bogus"),
    }
    assert "(and 2 more; see details)" in message


# -- paths, methods, crashes ---------------------------------------------------------------


def test_an_unknown_path_gets_a_json_404(client: TestClient) -> None:
    message = _error(client.get("/no/such/thing"), 404, "not_found")
    assert message.startswith("no endpoint at GET /no/such/thing")


def test_a_wrong_method_gets_405_listing_every_allowed_method(client: TestClient) -> None:
    response = client.patch("/api/nodes/1")
    assert "PATCH is not allowed" in _error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "DELETE, GET, PUT"


def test_an_unexpected_error_gets_a_json_500_without_its_text() -> None:
    app = _app()

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals")

    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as client:
        response = client.get("/boom")
    message = _error(response, 500, "internal_error")
    assert "RuntimeError" in message and "secret internals" not in message


def test_the_openapi_spec_and_docs_are_served(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/api/context", "/api/nodes", "/api/edges", "/api/documents"} <= set(spec["paths"])
    error = spec["paths"]["/api/context"]["post"]["responses"]["413"]["content"]
    assert error["application/json"]["schema"]["$ref"] == "#/components/schemas/ErrorResponse"
    assert "swagger-ui" in client.get("/docs").text


def test_docs_load_only_the_servers_own_swagger_files(client: TestClient) -> None:
    """/docs works offline: every script, stylesheet and icon it names is a path on this
    server (no CDN, no online validator) and is served; nothing else under /docs/static is."""
    page = client.get("/docs")
    assert page.status_code == 200
    html = page.text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", html)
    urls_ = [a or b for a, b in urls]
    assert sorted(urls_) == [
        "/docs/static/favicon-32x32.png",
        "/docs/static/swagger-ui-bundle.js",
        "/docs/static/swagger-ui.css",
        "/openapi.json",
    ]
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    assert '"validatorUrl": null' in html
    types = {}
    for url in urls_:
        response = client.get(url)
        assert response.status_code == 200, url
        types[url] = response.headers["content-type"].split(";")[0]
    assert types["/docs/static/swagger-ui-bundle.js"] == "text/javascript"
    assert types["/docs/static/swagger-ui.css"] == "text/css"
    assert "SwaggerUIBundle" in client.get("/docs/static/swagger-ui-bundle.js").text
    assert client.get("/docs/static/README.md").status_code == 404
    assert client.get("/docs/static/..%2Fdashboard.html").status_code == 404
    assert client.get("/redoc").status_code == 404  # ReDoc is CDN-only: off


# -- the proxy's routes: the provider's error shape ------------------------------------------


@pytest.fixture
def guarded_proxy(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    """The proxy in front of the fake provider, with a 64 KiB body limit."""
    config = ServerConfig(
        port=0,
        proxy=ProxySettings(upstream=fake_llm.url),
        limits=LimitSettings(max_body_bytes=64 * 1024),
    )
    with serve(config, engine) as served:
        yield served


def _chunked(size: int) -> Iterator[bytes]:
    yield b'{"model": "m", "messages": [{"role": "user", "content": "'
    for _ in range(size // 4096):
        yield b"x" * 4096
    yield b'"}]}'


def test_the_body_limit_answers_anthropic_clients_in_anthropics_shape(
    guarded_proxy: Served, fake_llm: FakeLLMServer
) -> None:
    client = closed_after_test(
        anthropic.Anthropic(base_url=guarded_proxy.url, api_key="k", max_retries=0)
    )
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(
            model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "a" * 100_000}]
        )
    assert refused.value.status_code == 413
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
    assert "limits.max_body_bytes" in body["error"]["message"]
    assert "at most 65,536" in refused.value.message  # the SDK shows the message
    chunked = httpx.post(
        f"{guarded_proxy.url}/v1/messages",
        content=_chunked(100_000),
        headers={"content-type": "application/json"},
    )
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    assert chunked.status_code == 413
    assert chunked.json() == {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "request body is more than 65,536 bytes; this server accepts at most "
            "65,536 (limits.max_body_bytes)",
        },
    }
    assert fake_llm.requests == []


def test_the_body_limit_answers_openai_and_gemini_clients_in_their_shapes(
    guarded_proxy: Served, fake_llm: FakeLLMServer
) -> None:
    client = closed_after_test(
        openai.OpenAI(base_url=f"{guarded_proxy.url}/v1", api_key="k", max_retries=0)
    )
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a" * 100_000}]
        )
    assert refused.value.status_code == 413
    assert refused.value.type == "invalid_request_error"
    assert "limits.max_body_bytes" in refused.value.message
    for path in ("/v1/chat/completions", "/openai/deployments/d/chat/completions"):
        chunked = httpx.post(
            f"{guarded_proxy.url}{path}",
            content=_chunked(100_000),
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 413
        assert chunked.json()["error"]["type"] == "invalid_request_error"
        assert chunked.json()["error"]["code"] is None
    for path in ("/v1beta/models/g:generateContent", "/v1/models/g:streamGenerateContent"):
        gemini = httpx.post(
            f"{guarded_proxy.url}{path}",
            json={"contents": [{"role": "user", "parts": [{"text": "a" * 100_000}]}]},
        )
        assert gemini.status_code == 413
        error = gemini.json()["error"]
        assert (error["code"], error["status"]) == (413, "INVALID_ARGUMENT")
        assert "limits.max_body_bytes" in error["message"]
    assert fake_llm.requests == []


def test_bad_bytes_and_paths_on_the_proxys_routes_get_the_providers_shape(
    guarded_proxy: Served, fake_llm: FakeLLMServer
) -> None:
    bad = httpx.post(
        f"{guarded_proxy.url}/v1/messages",
        content=b'{"model": "m", "messages": [{"role": "user", "content": "caf\xff"}]}',
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert "not valid UTF-8" in bad.json()["error"]["message"]
    response = httpx.post(f"{guarded_proxy.url}/v1/chat/completions%00", json={})
    assert response.request.url.raw_path == b"/v1/chat/completions%00"
    error = response.json()["error"]
    assert response.status_code == 400
    assert (error["type"], error["code"]) == ("invalid_request_error", None)
    assert "control character" in error["message"]
    assert fake_llm.requests == []


def test_the_servers_own_routes_keep_the_one_error_shape(guarded_proxy: Served) -> None:
    response = httpx.post(
        f"{guarded_proxy.url}/api/context",
        content=_chunked(100_000),
        headers={"content-type": "application/json"},
    )
    assert "more than 65,536 bytes" in _error(response, 413, "body_too_large")
