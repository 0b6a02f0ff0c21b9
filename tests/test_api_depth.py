"""JSON nesting on the knowledge API: a body nested deeper than ``limits.max_json_depth`` is
a 400 naming the limit and stores nothing; a node stored that deep some other way never breaks
a listing or a context call; and a 500 leaves the client's keep-alive connection usable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, LimitSettings, ServerConfig
from contextfold.server.knowledge import KnowledgeStore
from live_app import LiveServer

LOCAL = "http://127.0.0.1:5757"


def _deep(levels: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(levels - 1):
        value = {"a": value}
    return {"a": value}


def _raw_node(levels: int, tenant: str = "acme") -> bytes:
    """A node whose ``content`` nests ``levels`` objects deep, as raw JSON (no recursion)."""
    inner = '{"a":' * levels + "1" + "}" * levels
    head = f'{{"tenant_id":"{tenant}","node_type":"faq","title":"deep refunds","content":'
    return (head + inner + "}").encode()


def _app(home: Path, **limits: Any) -> FastAPI:
    config = ServerConfig(
        context_api=ContextApiSettings(graph_path=str(home / "graph.db")),
        limits=LimitSettings(**limits),
    )
    return create_app(config, memory=MemoryEngine(store=":memory:", embedder=None))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(_app(tmp_path), base_url=LOCAL) as test_client:
        shallow = {"tenant_id": "acme", "node_type": "faq", "title": "Refunds", "summary": "x"}
        assert test_client.post("/api/nodes", json=shallow).status_code == 201
        yield test_client


JSON = {"content-type": "application/json"}


def _refused(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "json_too_deep"
    assert f"deeper than {limit} levels" in error["message"]
    assert "limits.max_json_depth" in error["message"]


@pytest.mark.parametrize("levels", [101, 300, 800])
def test_a_node_nested_deeper_than_the_limit_is_refused_and_not_stored(
    client: TestClient, levels: int
) -> None:
    _refused(client.post("/api/nodes", content=_raw_node(levels), headers=JSON), 100)
    listing = client.get("/api/nodes")
    assert listing.status_code == 200
    assert [n["title"] for n in listing.json()["nodes"]] == ["Refunds"]  # nothing stored
    context = client.post("/api/context", json={"query": "deep refunds", "tenant_ids": ["acme"]})
    assert context.status_code == 200


def test_a_body_at_the_limit_is_accepted(client: TestClient) -> None:
    # the body is one level more than its content: content 99 deep is a body 100 deep
    response = client.post("/api/nodes", content=_raw_node(99), headers=JSON)
    assert response.status_code == 201, response.text
    assert client.get("/api/nodes").status_code == 200


def test_every_api_body_is_held_to_the_limit(client: TestClient) -> None:
    node = {"tenant_id": "acme", "node_type": "faq", "title": "t", "content": _deep(150)}
    _refused(
        client.post("/api/nodes/bulk", content=json.dumps({"nodes": [node]}), headers=JSON), 100
    )
    _refused(client.put("/api/nodes/1", content=json.dumps(node), headers=JSON), 100)
    document = {"tenant_id": "acme", "title": "d", "text": "refunds", "metadata": _deep(150)}
    _refused(client.post("/api/documents", content=json.dumps(document), headers=JSON), 100)
    query = {"query": "x", "entry_types": [], "bogus": _deep(150)}
    _refused(client.post("/api/context", content=json.dumps(query), headers=JSON), 100)
    assert client.get("/api/nodes").json()["total"] == 1
    assert client.get("/api/documents").json() == {"documents": []}


def test_the_configured_limit_applies(tmp_path: Path) -> None:
    with TestClient(_app(tmp_path, max_json_depth=20), base_url=LOCAL) as client:
        _refused(client.post("/api/nodes", content=_raw_node(25), headers=JSON), 20)
        assert client.post("/api/nodes", content=_raw_node(15), headers=JSON).status_code == 201


def test_a_higher_limit_is_still_capped_at_what_the_api_can_return(tmp_path: Path) -> None:
    with TestClient(_app(tmp_path, max_json_depth=600), base_url=LOCAL) as client:
        response = client.post("/api/nodes", content=_raw_node(300), headers=JSON)
        assert response.status_code == 400, response.text
        assert "limits.max_json_depth" in response.json()["error"]["message"]
        assert client.get("/api/nodes").json()["total"] == 0


def test_a_node_stored_too_deep_elsewhere_never_breaks_a_listing(tmp_path: Path) -> None:
    with KnowledgeStore(tmp_path / "graph.db") as store:  # written by a library user
        deep, plain = store.graph.add_nodes(
            [
                {
                    "tenant_id": "acme",
                    "node_type": "faq",
                    "title": "deep refunds",
                    "content": _deep(300),
                },
                {
                    "tenant_id": "acme",
                    "node_type": "faq",
                    "title": "plain refunds",
                    "content": {"answer": "press refund"},
                },
            ]
        )
    with TestClient(_app(tmp_path), base_url=LOCAL) as client:
        listing = client.get("/api/nodes")
        assert listing.status_code == 200, listing.text
        nodes = {n["title"]: n for n in listing.json()["nodes"]}
        assert nodes["plain refunds"]["content"] == {"answer": "press refund"}
        assert "nested deeper" in json.dumps(nodes["deep refunds"]["content"])
        one = client.get(f"/api/nodes/{deep.id}")
        assert one.status_code == 200, one.text
        context = client.post(
            "/api/context", json={"query": "deep refunds", "tenant_ids": ["acme"]}
        )
        assert context.status_code == 200, context.text
        assert client.get(f"/api/nodes/{plain.id}").json()["content"] == {"answer": "press refund"}


def test_a_500_leaves_the_keep_alive_connection_usable(tmp_path: Path) -> None:
    app = _app(tmp_path)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals")

    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        response = client.get("/boom")
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "internal_error"
        # the same connection serves the next request (no reset without Connection: close)
        assert client.get("/healthz").status_code == 200
        assert client.get("/boom").status_code == 500
        assert client.get("/healthz").status_code == 200
