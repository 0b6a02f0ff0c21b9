"""Fuzzing the proxy's routes (they are the providers' APIs, so not in the OpenAPI spec that
``test_openapi_schemathesis`` covers): hypothesis-generated bodies (valid and malformed
messages, odd roles and blocks, deep nesting) and request targets (dot-segments, escapes,
control characters) through the real app and the fake provider. Whatever comes in, the proxy
answers below 500 and says why in the provider's error shape; a path it refuses never
reaches the upstream."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import LimitSettings, ProxySettings, ServerConfig
from fake_llm import FakeLLMServer
from proxy_support import Served, serve

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, FakeLLMServer]]:
    home: Path = tmp_path_factory.mktemp("fuzz")
    with FakeLLMServer() as fake, MemoryEngine(store=home / "m.db", embedder=None) as memory:
        limits = LimitSettings(max_messages=40, max_message_bytes=4096, max_json_depth=24)
        config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake.url), limits=limits)
        with serve(config, memory) as served:
            yield served, fake


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
_roles = st.sampled_from(
    ["user", "assistant", "system", "tool", "developer", "model", "", "x" * 300]
)
_blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "tool_use", "tool_result", "bogus"])},
    optional={"text": st.text(max_size=40), "id": st.text(max_size=5), "input": _json},
)
_message = st.fixed_dictionaries(
    {"role": _roles},
    optional={
        "content": st.one_of(st.text(max_size=60), st.lists(_blocks, max_size=3), _json),
        "tool_calls": _json,
        "parts": st.lists(st.dictionaries(st.sampled_from(["text", "functionCall"]), _json)),
    },
)
_bodies = st.fixed_dictionaries(
    {"model": st.text(max_size=10)},
    optional={
        "messages": st.one_of(st.lists(_message, max_size=45), _json),
        "contents": st.one_of(st.lists(_message, max_size=5), _json),
        "system": _json,
        "stream": st.booleans(),
        "max_tokens": st.integers(-5, 50),
        "tools": _json,
    },
)
_routes = st.sampled_from(
    ["/v1/chat/completions", "/v1/messages", "/v1beta/models/g:generateContent"]
)


@FUZZ
@given(route=_routes, body=_bodies)
def test_any_json_body_gets_an_answer_below_500(
    fuzzed: tuple[Served, FakeLLMServer], route: str, body: dict[str, Any]
) -> None:
    served, _ = fuzzed
    response = httpx.post(f"{served.url}{route}", json=body, timeout=60)
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        assert "message" in response.json()["error"]


_segments = st.lists(
    st.sampled_from(
        [
            "models",
            "..",
            ".",
            "%2e%2e",
            "%2E.",
            "a%2fb",
            "a%2Fb",
            "%5c",
            "%00",
            "%20",
            "%0d%0a",
            "x%25y",
            "gpt-4o:latest",
            "%C3%A9",
            "%ff",
            "",
            "models/m:generateContent",
        ]
    ),
    min_size=1,
    max_size=5,
)


@FUZZ
@given(prefix=st.sampled_from(["/v1", "/v1beta"]), segments=_segments)
def test_any_request_target_is_refused_or_forwarded_under_the_prefix(
    fuzzed: tuple[Served, FakeLLMServer], prefix: str, segments: list[str]
) -> None:
    served, fake = fuzzed
    target = prefix + "/" + "/".join(segments)
    before = len(fake.requests)
    with socket.create_connection(("127.0.0.1", served.ports[0]), timeout=60) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    assert status < 500 or status == 502, reply[:300]
    for request in fake.requests[before:]:
        path = request.path.split("?", 1)[0]
        assert ".." not in path.split("/") and "%2f" not in path.lower(), path
    if status == 400:
        assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["message"]
