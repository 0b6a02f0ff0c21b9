"""``POST /api/context`` and the knowledge endpoints: seed 003's shape, tenant isolation by API
key, documents chunked into linked nodes, node and edge CRUD, persistence across restarts,
hybrid search through the memory engine's embedder, and the dashboard record."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from contextfold.errors import ConfigError
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.embedders import FunctionEmbedder
from contextfold.retrieval.graph import GraphContextRequest, KnowledgeGraph, graph_context
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig
from contextfold.server.knowledge import KnowledgeStore
from live_app import LiveServer

SUPPORT = {"Authorization": "Bearer key-support"}
SALES = {"X-API-Key": "key-sales"}
KEYED = {"SUPPORT_KEY": ["support", "shared"], "SALES_KEY": ["sales", "shared"]}

SEED_REQUEST = {
    "query": "How do I process a refund request?",
    "tenant_ids": ["purchasing", "shared"],
    "entry_types": ["faq", "playbook", "permission_rule"],
    "entry_limit": 10,
    "expand": True,
    "max_depth": 2,
    "context_limit": 50,
    "include_entities": True,
    "include_schemas": False,
    "include_examples": False,
    "max_tokens": 8000,
    "token_model": "gpt-4",
}


def _app(
    home: Path,
    *,
    api_keys: dict[str, list[str]] | None = None,
    host: str = "127.0.0.1",
    embedder: Any = None,
    hybrid: bool = True,
) -> FastAPI:
    settings = ContextApiSettings(
        api_keys=api_keys or {}, graph_path=str(home / "graph.db"), hybrid=hybrid
    )
    config = ServerConfig(host=host, context_api=settings)
    return create_app(config, memory=MemoryEngine(store=":memory:", embedder=embedder))


def _client(app: FastAPI, **kwargs: Any) -> TestClient:
    """A test client addressing the server as ``127.0.0.1:5757``, a loopback name, as a local
    agent does (the open API answers only such ``Host`` names)."""
    return TestClient(app, base_url="http://127.0.0.1:5757", **kwargs)


@pytest.fixture
def open_client(tmp_path: Path) -> Iterator[TestClient]:
    with _client(_app(tmp_path)) as client:
        yield client


@pytest.fixture
def keyed_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("SUPPORT_KEY", "key-support")
    monkeypatch.setenv("SALES_KEY", "key-sales")
    with _client(_app(tmp_path, api_keys=KEYED)) as client:
        yield client


def _node(client: TestClient, tenant: str, title: str, headers: Any = None, **fields: Any) -> int:
    body = {"tenant_id": tenant, "node_type": "faq", "title": title, **fields}
    response = client.post("/api/nodes", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _edge(client: TestClient, a: int, b: int, headers: Any = None, **fields: Any) -> None:
    body = {"source_id": a, "target_id": b, **fields}
    assert client.post("/api/edges", json=body, headers=headers).status_code == 201


def _seed_graph(client: TestClient) -> tuple[int, int, int]:
    faq = _node(
        client,
        "purchasing",
        "How to process refunds",
        summary="Step-by-step refund processing guide",
        content={"question": "How do I refund?", "answer": "Open the order, press refund."},
        tags=["refunds", "customer-service"],
    )
    flow = _node(  # matches no query word: reached by expansion only
        client,
        "shared",
        "Approval Workflow",
        node_type="playbook",
        summary="Manager sign-off for amounts over $100",
        content={"steps": ["check the order", "ask the manager"]},
        tags=["workflow", "approvals"],
    )
    entity = _node(
        client,
        "purchasing",
        "Refund Request",
        node_type="entity",
        content={"entity_path": "orders.refund_requests", "related_schemas": ["orders"]},
    )
    _edge(client, faq, flow)
    _edge(client, flow, entity, edge_type="parent", weight=0.8)
    return faq, flow, entity


# -- /api/context ---------------------------------------------------------------------------


def test_context_answers_seed_003s_request_in_seed_003s_shape(
    open_client: TestClient, tmp_path: Path
) -> None:
    faq, flow, entity = _seed_graph(open_client)
    response = open_client.post("/api/context", json=SEED_REQUEST)
    assert response.status_code == 200, response.text
    assert response.headers["x-contextfold-tenants"] == "purchasing,shared"
    body = response.json()
    assert set(body) == {"entry_points", "context", "entities", "stats"}
    entry, near, found = body["entry_points"][0], body["context"][0], body["entities"][0]
    shared = {"id", "node_type", "title", "summary", "content", "tags", "score"}
    assert set(entry) == shared | {"match_source"}
    assert set(near) == shared | {"distance", "path", "edge_type"}
    assert set(found) == {"id", "title", "entity_path", "related_schemas"}
    assert (entry["id"], entry["match_source"]) == (faq, "bm25")
    assert (near["id"], near["path"], near["distance"]) == (flow, [faq, flow], 1)
    assert (near["score"], near["edge_type"]) == (0.5, "related")
    assert (found["id"], found["entity_path"]) == (entity, "orders.refund_requests")
    stats = body["stats"]
    assert set(stats["tokens_used"]) == {"entry_points", "context_nodes", "entities"}
    assert stats["total_tokens"] == sum(stats["tokens_used"].values()) > 0
    # The endpoint is graph_context over the stored graph, nothing else.
    with KnowledgeGraph(tmp_path / "graph.db") as graph:
        direct = graph_context(graph, GraphContextRequest(**SEED_REQUEST))
    assert body == direct.model_dump(mode="json")


def test_hybrid_search_uses_the_memory_engines_embedder(tmp_path: Path) -> None:
    def concepts(text: str) -> Sequence[float]:
        lowered = text.lower()
        money = float(any(w in lowered for w in ("refund", "money")))
        return [money, 0.0 if money else 1.0]

    embedder = FunctionEmbedder(concepts, name="concepts", dim=2)
    with _client(_app(tmp_path, embedder=embedder)) as client:
        _node(client, "t", "Refund policy")
        _node(client, "t", "Money back and refund rules")
        _node(client, "t", "Shipping times")
        ask = {"query": "money back", "tenant_ids": ["t"]}
        sources = {
            e["title"]: e["match_source"]
            for e in client.post("/api/context", json=ask).json()["entry_points"]
        }
    assert sources == {"Money back and refund rules": "hybrid", "Refund policy": "vector"}
    with _client(_app(tmp_path, embedder=embedder, hybrid=False)) as client:
        entries = client.post("/api/context", json=ask).json()["entry_points"]
    assert [e["match_source"] for e in entries] == ["bm25"]


def test_each_context_call_is_published_for_the_dashboard(
    keyed_client: TestClient,
) -> None:
    _node(keyed_client, "support", "Refund steps", SUPPORT)
    ask = {"query": "refund", "tenant_ids": ["support", "sales"], "max_tokens": 1000}
    assert keyed_client.post("/api/context", json=ask, headers=SUPPORT).status_code == 200
    state = keyed_client.app.state.contextfold  # type: ignore[attr-defined]
    (record,) = state.events.recent()
    assert (record.kind, record.session_id, record.path) == (
        "context",
        "api:SUPPORT_KEY",
        "/api/context",
    )
    assert record.extra["tenants"] == ["support"] and record.extra["query"] == "refund"
    assert record.response_tags == ()  # complete: nothing is tagged after a context call
    assert record.context == "Refund steps"  # the text the agent receives
    rows = {row.section: (row.budget, row.items) for row in record.budget}
    assert rows == {"entry_points": (600, 1), "expanded": (300, 0), "entities": (100, 0)}


# -- tenants and keys ---------------------------------------------------------------------


def test_a_key_never_sees_another_tenants_nodes_even_when_it_asks(
    keyed_client: TestClient,
) -> None:
    mine = _node(keyed_client, "support", "Refund steps for support", SUPPORT)
    theirs = _node(keyed_client, "sales", "Refund discounts for sales", SALES)
    ask = {"query": "refund", "tenant_ids": ["support", "sales"]}
    response = keyed_client.post("/api/context", json=ask, headers=SUPPORT)
    assert [e["id"] for e in response.json()["entry_points"]] == [mine]
    assert response.headers["x-contextfold-tenants"] == "support"
    for path in (f"/api/nodes/{theirs}", "/api/nodes/999999"):
        missing = keyed_client.get(path, headers=SUPPORT)
        assert missing.status_code == 404
        assert missing.json()["error"]["message"].endswith("among the tenants this caller can see")
    listed = keyed_client.get("/api/nodes", params={"tenant_id": "sales"}, headers=SUPPORT)
    assert listed.json() == {"nodes": [], "total": 0}
    everything = keyed_client.get("/api/nodes", headers=SUPPORT).json()["nodes"]
    assert [n["id"] for n in everything] == [mine]
    assert keyed_client.delete(f"/api/nodes/{theirs}", headers=SUPPORT).status_code == 404
    replaced = {"tenant_id": "support", "node_type": "faq", "title": "hijacked"}
    put = keyed_client.put(f"/api/nodes/{theirs}", json=replaced, headers=SUPPORT)
    assert put.status_code == 404
    assert keyed_client.get(f"/api/nodes/{theirs}", headers=SALES).json()["title"] == (
        "Refund discounts for sales"
    )
    edge = {"source_id": mine, "target_id": theirs}
    assert keyed_client.post("/api/edges", json=edge, headers=SUPPORT).status_code == 404


def test_expansion_never_crosses_into_a_tenant_the_key_does_not_own(
    keyed_client: TestClient,
) -> None:
    shared = _node(keyed_client, "shared", "Refund policy", SUPPORT)
    private = _node(keyed_client, "support", "Internal refund escalation", SUPPORT)
    _edge(keyed_client, shared, private, SUPPORT)  # support owns both ends
    ask = {"query": "refund policy", "tenant_ids": ["shared", "support"]}
    sales = keyed_client.post("/api/context", json=ask, headers=SALES).json()
    assert [e["id"] for e in sales["entry_points"]] == [shared]
    assert sales["context"] == [] and sales["stats"]["nodes_searched"] == 1
    assert keyed_client.get("/api/edges", headers=SALES).json() == {"edges": []}
    support = keyed_client.post("/api/context", json={**ask, "entry_limit": 1}, headers=SUPPORT)
    assert [c["id"] for c in support.json()["context"]] == [private]


def test_writes_to_a_tenant_the_key_does_not_own_get_403_and_store_nothing(
    keyed_client: TestClient,
) -> None:
    foreign = {"tenant_id": "sales", "node_type": "faq", "title": "planted"}
    response = keyed_client.post("/api/nodes", json=foreign, headers=SUPPORT)
    assert response.status_code == 403
    message = response.json()["error"]["message"]
    assert "SUPPORT_KEY" in message and "'sales'" in message and "key-support" not in message
    mixed = {"nodes": [{**foreign, "tenant_id": "support"}, foreign]}
    assert keyed_client.post("/api/nodes/bulk", json=mixed, headers=SUPPORT).status_code == 403
    document = {"tenant_id": "sales", "title": "Planted", "text": "planted text"}
    assert keyed_client.post("/api/documents", json=document, headers=SUPPORT).status_code == 403
    assert keyed_client.get("/api/documents/sales/x", headers=SUPPORT).status_code == 403
    mine = _node(keyed_client, "support", "mine", SUPPORT)
    move = keyed_client.put(f"/api/nodes/{mine}", json=foreign, headers=SUPPORT)
    assert move.status_code == 403
    assert keyed_client.get("/api/nodes", headers=SALES).json()["total"] == 0


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing API key"),
        ({"Authorization": "Bearer nope"}, "unknown API key"),
        ({"X-API-Key": "nope"}, "unknown API key"),
        ({"Authorization": "Basic a2V5LXN1cHBvcnQ="}, "missing API key"),
    ],
)
def test_a_missing_or_unknown_key_gets_401(
    keyed_client: TestClient, headers: dict[str, str], reason: str
) -> None:
    response = keyed_client.post("/api/context", json={"query": "x"}, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["message"].startswith(reason)
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_both_header_forms_carry_a_key(keyed_client: TestClient) -> None:
    tenants = keyed_client.get("/api/tenants", headers=SALES).json()
    assert tenants["open"] is False
    assert [t["id"] for t in tenants["tenants"]] == ["sales", "shared"]
    assert keyed_client.get("/api/tenants", headers=SUPPORT).status_code == 200


def test_without_keys_loopback_is_open_and_any_other_host_is_closed(tmp_path: Path) -> None:
    with _client(_app(tmp_path)) as client:
        _node(client, "anyone", "Refunds")
        assert client.get("/api/tenants").json() == {
            "open": True,
            "tenants": [{"id": "anyone", "nodes": 1, "documents": 0}],
        }
    with _client(_app(tmp_path, host="0.0.0.0")) as client:
        response = client.get("/api/tenants")
        assert client.get("/healthz").status_code == 200  # the rest of the server still runs
    assert response.status_code == 401
    assert "no API keys are configured" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("host", "answered"),
    [
        ("127.0.0.1:5757", True),
        ("localhost:5757", True),
        ("[::1]:5757", True),
        ("localhost", True),
        ("rebound.example", False),
        ("rebound.example:5757", False),
        ("127.0.0.1.nip.io:5757", False),
        ("0.0.0.0:5757", False),
    ],
)
def test_the_open_api_answers_only_loopback_host_names(
    open_client: TestClient, host: str, answered: bool
) -> None:
    node = {"tenant_id": "t", "node_type": "faq", "title": "planted"}
    listed = open_client.get("/api/tenants", headers={"Host": host})
    stored = open_client.post("/api/nodes", json=node, headers={"Host": host})
    if answered:
        assert (listed.status_code, stored.status_code) == (200, 201)
    else:  # a web page that re-bound its own name to 127.0.0.1 (DNS rebinding)
        for response in (listed, stored):
            assert response.status_code == 403
            error = response.json()["error"]
            assert error["type"] == "forbidden" and "not a loopback name" in error["message"]
    assert open_client.get("/api/nodes").json()["total"] == int(answered)


@pytest.mark.parametrize("bound", ["127.0.0.1", "0.0.0.0"])
def test_with_api_keys_the_host_name_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    monkeypatch.setenv("SUPPORT_KEY", "key-support")
    monkeypatch.setenv("SALES_KEY", "key-sales")
    app = _app(tmp_path, api_keys=KEYED, host=bound)
    with TestClient(app, base_url="http://ctx.example.com") as client:  # behind a proxy
        assert client.get("/api/tenants", headers=SUPPORT).status_code == 200
        assert client.get("/api/tenants").status_code == 401  # the key is what protects it


def test_a_rebound_host_name_is_refused_over_a_real_socket(tmp_path: Path) -> None:
    with LiveServer(_app(tmp_path)) as server:
        ok = httpx.get(f"{server.url}/api/tenants")
        rebound = httpx.get(f"{server.url}/api/tenants", headers={"Host": "rebound.example"})
    assert ok.status_code == 200
    assert rebound.status_code == 403 and rebound.json()["error"]["type"] == "forbidden"


def test_an_unset_key_variable_stops_the_server_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUPPORT_KEY", raising=False)
    with pytest.raises(ConfigError, match="not set: SUPPORT_KEY"):
        _app(tmp_path, api_keys={"SUPPORT_KEY": ["support"]})


def test_the_config_refuses_a_key_where_a_variable_name_belongs() -> None:
    for build in (
        lambda: ContextApiSettings(api_keys={"sk-live-123456": ["support"]}),
        lambda: ServerConfig.model_validate({"context_api": {"api_keys": {"sk-live-123456": []}}}),
    ):
        with pytest.raises(ValidationError, match="keys never belong in a config file") as caught:
            build()
        assert "sk-live" not in str(caught.value)


# -- documents, nodes, edges -------------------------------------------------------------------

POLICY = """# Refunds

Refunds are paid within 14 days of the request.

## Large refunds

A manager approves every refund over $100 before it is paid.
"""


def test_a_document_is_chunked_into_linked_nodes_and_deleted_with_them(
    open_client: TestClient,
) -> None:
    body = {"tenant_id": "t", "id": "policy", "title": "Policy", "text": POLICY}
    created = open_client.post("/api/documents", json={**body, "chunker": "markdown"})
    assert created.status_code == 201, created.text
    document = created.json()
    first, second = document["node_ids"]
    nodes = [open_client.get(f"/api/nodes/{i}").json() for i in (first, second)]
    assert [n["title"] for n in nodes] == [
        "Policy › Refunds (1/2)",
        "Policy › Refunds › Large refunds (2/2)",
    ]
    assert nodes[1]["content"]["document_id"] == "policy"
    assert nodes[1]["content"]["text"].startswith("## Large refunds")
    assert open_client.get("/api/edges").json()["edges"] == [
        {"source_id": first, "target_id": second, "edge_type": "related", "weight": 1.0}
    ]
    answer = open_client.post(
        "/api/context", json={"query": "manager approves", "tenant_ids": ["t"], "entry_limit": 1}
    ).json()
    assert [e["id"] for e in answer["entry_points"]] == [second]
    assert [c["id"] for c in answer["context"]] == [first]  # the neighbouring chunk
    assert open_client.delete(f"/api/nodes/{second}").status_code == 204  # one chunk alone
    shrunk = open_client.get("/api/documents/t/policy").json()
    assert (shrunk["node_ids"], shrunk["chunks"]) == ([first], 1)
    again = open_client.post("/api/documents", json=body)
    assert again.status_code == 409 and "DELETE it first" in again.json()["error"]["message"]
    assert open_client.delete("/api/documents/t/policy").status_code == 204
    assert open_client.get(f"/api/nodes/{first}").status_code == 404
    assert open_client.get("/api/edges").json() == {"edges": []}
    assert open_client.get("/api/documents/t/policy").status_code == 404
    assert open_client.delete("/api/documents/t/policy").status_code == 404


def test_deleting_a_document_never_deletes_another_tenants_node(
    keyed_client: TestClient,
) -> None:
    body = {"tenant_id": "support", "id": "policy", "title": "Policy", "text": POLICY}
    created = keyed_client.post(
        "/api/documents", json={**body, "chunker": "markdown"}, headers=SUPPORT
    )
    first, last = created.json()["node_ids"]
    assert keyed_client.delete(f"/api/nodes/{last}", headers=SUPPORT).status_code == 204
    theirs = _node(keyed_client, "sales", "Sales playbook", SALES)
    assert theirs not in (first, last)  # a freed id is never handed out again
    assert keyed_client.delete("/api/documents/support/policy", headers=SUPPORT).status_code == 204
    assert keyed_client.get(f"/api/nodes/{theirs}", headers=SALES).status_code == 200
    assert keyed_client.get(f"/api/nodes/{first}", headers=SUPPORT).status_code == 404


def test_a_document_delete_removes_only_the_nodes_still_its_own(
    open_client: TestClient,
) -> None:
    text = "# One\n\nFirst.\n\n# Two\n\nSecond.\n\n# Three\n\nThird.\n"
    body = {"tenant_id": "t", "id": "policy", "title": "Policy", "text": text}
    one, two, three = open_client.post(
        "/api/documents", json={**body, "chunker": "markdown"}
    ).json()["node_ids"]
    chunk = {"node_type": "concept", "title": "c", "content": {"document_id": "policy"}}
    moved = {**chunk, "tenant_id": "u"}  # still naming the document, in another tenant
    assert open_client.put(f"/api/nodes/{one}", json=moved).status_code == 200
    repurposed = {**chunk, "tenant_id": "t", "content": {"answer": "no longer a chunk"}}
    assert open_client.put(f"/api/nodes/{two}", json=repurposed).status_code == 200
    assert open_client.get("/api/documents/t/policy").json()["node_ids"] == [three]
    assert open_client.delete("/api/documents/t/policy").status_code == 204
    statuses = [open_client.get(f"/api/nodes/{i}").status_code for i in (one, two, three)]
    assert statuses == [200, 200, 404]


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (("delete", "/api/nodes/{private}", None), 404),
        (("delete", "/api/edges", {"source_id": "{private}", "target_id": "{other}"}), 404),
        (("delete", "/api/edges", {"source_id": "{shared}", "target_id": "{private}"}), 404),
        (("delete", "/api/documents/support/policy", None), 403),
    ],
)
def test_a_key_cannot_delete_what_another_tenant_owns(
    keyed_client: TestClient, request_: tuple[str, str, dict[str, str] | None], status: int
) -> None:
    doc = {"tenant_id": "support", "id": "policy", "title": "Policy", "text": POLICY}
    assert keyed_client.post("/api/documents", json=doc, headers=SUPPORT).status_code == 201
    ids = {
        "private": _node(keyed_client, "support", "private", SUPPORT),
        "other": _node(keyed_client, "support", "other", SUPPORT),
        "shared": _node(keyed_client, "shared", "shared", SUPPORT),
    }
    _edge(keyed_client, ids["private"], ids["other"], SUPPORT)
    _edge(keyed_client, ids["shared"], ids["private"], SUPPORT)
    before = [keyed_client.get(p, headers=SUPPORT).json() for p in ("/api/nodes", "/api/edges")]
    method, path, params = request_
    query = {k: v.format(**ids) for k, v in (params or {}).items()}
    response = keyed_client.request(method, path.format(**ids), params=query, headers=SALES)
    assert response.status_code == status
    assert response.json()["error"]["type"] == {403: "forbidden", 404: "not_found"}[status]
    after = [keyed_client.get(p, headers=SUPPORT).json() for p in ("/api/nodes", "/api/edges")]
    assert after == before
    assert keyed_client.get("/api/documents/support/policy", headers=SUPPORT).status_code == 200


@pytest.mark.parametrize(
    "failing", [(KnowledgeGraph, "add_edges"), (KnowledgeStore, "_register")], ids=repr
)
def test_a_document_load_that_fails_midway_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: tuple[type, str]
) -> None:
    seen_meanwhile: list[int] = []

    def fail(*args: Any, **kwargs: Any) -> None:
        with KnowledgeGraph(tmp_path / "graph.db") as other:  # another connection looks in
            seen_meanwhile.append(len(other.nodes()))
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(*failing, fail)
    body = {"tenant_id": "t", "id": "policy", "title": "Policy", "text": POLICY}
    with _client(_app(tmp_path), raise_server_exceptions=False) as client:
        response = client.post("/api/documents", json={**body, "chunker": "markdown"})
        assert response.status_code == 500
        assert client.get("/api/nodes").json()["total"] == 0
        assert client.get("/api/documents").json() == {"documents": []}
    assert seen_meanwhile == [0]  # never a half-loaded document, not even for a moment


KILLED_MIDWAY = """
import os, signal, sys
from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig
from contextfold.server.knowledge import KnowledgeStore
from contextfold.store.sqlite.graph import KnowledgeGraph
from fastapi.testclient import TestClient

KnowledgeGraph.add_edges = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
settings = ContextApiSettings(graph_path=sys.argv[1], hybrid=False)
app = create_app(ServerConfig(context_api=settings), memory=MemoryEngine(store=":memory:"))
with TestClient(app, base_url="http://127.0.0.1:5757") as client:
    text = "\\n\\n".join(f"Paragraph {n}: refunds take {n} days." for n in range(400))
    client.post("/api/documents", json={"tenant_id": "t", "title": "Big", "text": text})
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_server_killed_while_loading_a_document_leaves_no_orphan_nodes(tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    run = subprocess.run(
        [sys.executable, "-c", KILLED_MIDWAY, str(path)], capture_output=True, timeout=120
    )
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    with KnowledgeStore(path) as store:  # what a restarted server finds
        assert store.graph.nodes() == []
        assert store.documents() == []


def test_nodes_can_be_replaced_listed_and_deleted(open_client: TestClient) -> None:
    ids = [
        _node(open_client, "t", f"node {n}", node_type=kind)
        for n, kind in enumerate(["faq", "faq", "playbook"])
    ]
    _edge(open_client, ids[0], ids[1])
    replaced = {"tenant_id": "t", "node_type": "concept", "title": "renamed", "tags": ["x"]}
    put = open_client.put(f"/api/nodes/{ids[0]}", json=replaced)
    assert put.json() == {**replaced, "id": ids[0], "summary": None, "content": {}}
    assert len(open_client.get("/api/edges", params={"node_id": ids[0]}).json()["edges"]) == 1
    page = open_client.get("/api/nodes", params={"limit": 1, "offset": 1}).json()
    assert ([n["id"] for n in page["nodes"]], page["total"]) == ([ids[1]], 3)
    faqs = open_client.get("/api/nodes", params={"node_type": "faq"}).json()
    assert [n["id"] for n in faqs["nodes"]] == [ids[1]]
    assert open_client.delete(f"/api/nodes/{ids[1]}").status_code == 204
    assert open_client.get("/api/edges").json() == {"edges": []}
    assert open_client.delete(f"/api/nodes/{ids[1]}").status_code == 404


def test_bulk_nodes_are_stored_all_or_none(open_client: TestClient) -> None:
    good = {"tenant_id": "t", "node_type": "faq", "title": "fine"}
    bad = {"tenant_id": "t", "node_type": "entity", "title": "E", "content": {"entity_path": 5}}
    refused = open_client.post("/api/nodes/bulk", json={"nodes": [good, bad]})
    assert refused.status_code == 422
    assert "entity_path must be a string" in refused.json()["error"]["message"]
    assert open_client.get("/api/nodes").json()["total"] == 0
    stored = open_client.post("/api/nodes/bulk", json={"nodes": [good, good]}).json()
    assert [n["id"] for n in stored["nodes"]] == [1, 2]


def test_edges_are_normalised_replaced_and_deleted(open_client: TestClient) -> None:
    a, b = _node(open_client, "t", "a"), _node(open_client, "t", "b")
    _edge(open_client, b, a, weight=0.5)
    _edge(open_client, a, b, weight=0.9)  # the same undirected edge: its weight is replaced
    assert open_client.get("/api/edges").json()["edges"] == [
        {"source_id": a, "target_id": b, "edge_type": "related", "weight": 0.9}
    ]
    assert open_client.post("/api/edges", json={"source_id": a, "target_id": a}).status_code == 422
    assert open_client.post("/api/edges", json={"source_id": a, "target_id": 77}).status_code == 404
    gone = {"source_id": b, "target_id": a, "edge_type": "related"}
    assert open_client.delete("/api/edges", params=gone).status_code == 204
    assert open_client.delete("/api/edges", params=gone).status_code == 404


def test_knowledge_survives_a_restart(tmp_path: Path) -> None:
    ask = {**SEED_REQUEST, "tenant_ids": ["purchasing", "shared", "t"]}
    with _client(_app(tmp_path)) as client:
        _seed_graph(client)
        doc = {"tenant_id": "t", "id": "policy", "title": "Policy", "text": POLICY}
        assert client.post("/api/documents", json=doc).status_code == 201
        before = client.post("/api/context", json=ask).json()
        documents = client.get("/api/documents").json()
    with _client(_app(tmp_path)) as client:  # a new server over the same home
        assert client.post("/api/context", json=ask).json() == before
        assert client.get("/api/documents").json() == documents
        assert client.get("/api/nodes").json()["total"] == 3 + len(
            documents["documents"][0]["node_ids"]
        )


def test_the_context_api_over_a_real_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPPORT_KEY", "key-support")
    monkeypatch.setenv("SALES_KEY", "key-sales")
    with (
        LiveServer(_app(tmp_path, api_keys=KEYED)) as server,
        httpx.Client(base_url=server.url, headers=SUPPORT) as http,
    ):
        node = {"tenant_id": "support", "node_type": "faq", "title": "Refund steps"}
        assert http.post("/api/nodes", json=node).status_code == 201
        answer = http.post("/api/context", json={"query": "refund", "tenant_ids": ["support"]})
        assert [e["title"] for e in answer.json()["entry_points"]] == ["Refund steps"]
        anonymous = httpx.post(f"{server.url}/api/context", json={"query": "refund"})
        assert anonymous.status_code == 401


# -- content type ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/context", '{"query": "refund", "tenant_ids": ["support"]}'),
        ("/api/nodes", '{"tenant_id": "support", "node_type": "faq", "title": "Refunds"}'),
    ],
)
def test_a_json_body_sent_as_another_content_type_gets_415_naming_it(
    tmp_path: Path, path: str, body: str
) -> None:
    """curl's ``-d`` sends ``application/x-www-form-urlencoded`` unless told otherwise: the
    answer names the type and what to send, not a schema error about a dictionary."""
    with (
        LiveServer(_app(tmp_path)) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        for content_type, named in [
            (
                "application/x-www-form-urlencoded",
                "Content-Type 'application/x-www-form-urlencoded'",
            ),
            ("text/plain; charset=utf-8", "Content-Type 'text/plain'"),
            (None, "no Content-Type"),
        ]:
            headers = {"content-type": content_type} if content_type else {}
            response = http.post(path, content=body, headers=headers)
            assert response.status_code == 415, response.text
            assert response.headers["content-type"] == "application/json"
            error = response.json()["error"]
            assert error["type"] == "unsupported_media_type"
            assert error["message"].startswith(f"request body has {named}; ")
            assert "send Content-Type: application/json" in error["message"]
        assert http.get("/api/nodes").json()["total"] == 0  # nothing was stored
        for content_type in ("application/json", "application/json; charset=utf-8"):
            response = http.post(path, content=body, headers={"content-type": content_type})
            assert response.status_code in (200, 201), (content_type, response.text)


def test_the_key_is_checked_before_the_content_type_and_an_empty_body_is_a_schema_error(
    keyed_client: TestClient,
) -> None:
    body = '{"query": "refund"}'
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert keyed_client.post("/api/context", content=body, headers=form).status_code == 401
    response = keyed_client.post("/api/context", content=body, headers={**form, **SUPPORT})
    assert response.status_code == 415
    empty = keyed_client.post("/api/context", headers=SUPPORT)  # no body, no Content-Type
    assert empty.status_code == 422
    assert empty.json()["error"]["message"] == "body: Field required"


def test_the_415_is_in_the_openapi_spec(open_client: TestClient) -> None:
    spec = open_client.get("/openapi.json").json()
    for path, method in [("/api/context", "post"), ("/api/nodes/{node_id}", "put")]:
        error = spec["paths"][path][method]["responses"]["415"]["content"]
        assert error["application/json"]["schema"]["$ref"] == "#/components/schemas/ErrorResponse"
