"""``POST /api/edges/auto`` (issue 17, point 5): seed 003's automatic ``shared_tag`` and
``similar`` edges through the HTTP API, within the caller's tenants, idempotent, and followed
by ``/api/context`` expansion."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig
from contextfold.testing import HashEmbedder

KEYED = {"SUPPORT_KEY": ["support"], "SALES_KEY": ["sales"]}
SUPPORT = {"Authorization": "Bearer key-support"}
SALES = {"Authorization": "Bearer key-sales"}

NODES = [
    {"tenant_id": "support", "node_type": "faq", "title": "How to process refunds",
     "tags": ["refunds", "billing"]},
    {"tenant_id": "support", "node_type": "playbook", "title": "Card chargeback handling",
     "tags": ["Billing"]},
    {"tenant_id": "support", "node_type": "concept", "title": "Shipping zones",
     "tags": ["shipping"]},
    {"tenant_id": "support", "node_type": "concept", "title": "Warehouse opening hours",
     "summary": "Monday to Friday, 8 to 17", "tags": []},
    {"tenant_id": "support", "node_type": "concept", "title": "Warehouse opening hours",
     "summary": "Monday to Friday, 8 to 17", "tags": []},
    {"tenant_id": "sales", "node_type": "faq", "title": "Discount approval",
     "tags": ["billing"]},
    {"tenant_id": "sales", "node_type": "faq", "title": "Volume pricing", "tags": ["billing"]},
]  # fmt: skip


def _client(
    home: Path, *, embedder: Any = None, api_keys: dict[str, list[str]] | None = None
) -> TestClient:
    settings = ContextApiSettings(
        graph_path=str(home / "graph.db"), hybrid=False, api_keys=api_keys or {}
    )
    app = create_app(
        ServerConfig(context_api=settings),
        memory=MemoryEngine(store=":memory:", embedder=embedder),
    )
    return TestClient(app, base_url="http://127.0.0.1:5757")


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[tuple[TestClient, list[dict[str, Any]]]]:
    with _client(tmp_path, embedder=HashEmbedder()) as client:
        stored = client.post("/api/nodes/bulk", json={"nodes": NODES})
        assert stored.status_code == 201, stored.text
        yield client, stored.json()["nodes"]


def _edges(client: TestClient, kind: str, **headers: str) -> set[tuple[int, int]]:
    edges = client.get("/api/edges", headers=headers).json()["edges"]
    return {(e["source_id"], e["target_id"]) for e in edges if e["edge_type"] == kind}


def _sharing(nodes: list[dict[str, Any]], tenants: set[str]) -> set[tuple[int, int]]:
    """Every same-tenant pair sharing a tag (case-insensitively): the oracle."""
    return {
        (min(a["id"], b["id"]), max(a["id"], b["id"]))
        for a, b in combinations(nodes, 2)
        if a["tenant_id"] == b["tenant_id"]
        and a["tenant_id"] in tenants
        and {t.casefold() for t in a["tags"]} & {t.casefold() for t in b["tags"]}
    }


def test_shared_tag_edges_over_http(loaded: tuple[TestClient, list[dict[str, Any]]]) -> None:
    client, nodes = loaded
    answer = client.post("/api/edges/auto", json={})
    assert answer.status_code == 200, answer.text
    expected = _sharing(nodes, {"support", "sales"})
    assert answer.json() == {"shared_tag": len(expected), "similar": 0, "tenant_ids": None}
    assert _edges(client, "shared_tag") == expected
    assert len(expected) == 2  # refunds–chargeback (Billing), discount–pricing; not across

    again = client.post("/api/edges/auto", json={}).json()
    assert again["shared_tag"] == 0  # idempotent
    assert _edges(client, "shared_tag") == expected

    # Expansion follows the new edge: a query on refunds reaches the chargeback playbook.
    context = client.post(
        "/api/context", json={"query": "process refunds", "tenant_ids": ["support"]}
    ).json()
    assert [n["title"] for n in context["context"]] == ["Card chargeback handling"]


def test_similar_edges_over_http(loaded: tuple[TestClient, list[dict[str, Any]]]) -> None:
    client, nodes = loaded
    answer = client.post(
        "/api/edges/auto",
        json={"tenant_ids": ["support"], "shared_tag": False, "similar": True, "threshold": 0.99},
    )
    assert answer.status_code == 200, answer.text
    twins = (nodes[3]["id"], nodes[4]["id"])  # the same title and summary
    assert answer.json() == {"shared_tag": 0, "similar": 1, "tenant_ids": ["support"]}
    assert _edges(client, "similar") == {twins}
    edge = next(e for e in client.get("/api/edges").json()["edges"] if e["edge_type"] == "similar")
    assert edge["weight"] == pytest.approx(1.0)  # the similarity itself


def test_auto_edges_stay_within_the_callers_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPPORT_KEY", "key-support")
    monkeypatch.setenv("SALES_KEY", "key-sales")
    with _client(tmp_path, api_keys=KEYED) as client:
        for who in (SUPPORT, SALES):
            mine = [
                n for n in NODES if n["tenant_id"] in (["support"] if who is SUPPORT else ["sales"])
            ]
            assert (
                client.post("/api/nodes/bulk", json={"nodes": mine}, headers=who).status_code == 201
            )
        refused = client.post("/api/edges/auto", json={"tenant_ids": ["sales"]}, headers=SUPPORT)
        assert refused.status_code == 403
        assert "does not own tenant 'sales'" in refused.json()["error"]["message"]

        done = client.post("/api/edges/auto", json={}, headers=SUPPORT).json()
        assert done["tenant_ids"] == ["support"] and done["shared_tag"] == 1
        assert _edges(client, "shared_tag", **SALES) == set()  # sales untouched
        assert len(_edges(client, "shared_tag", **SUPPORT)) == 1


def test_similar_edges_need_an_embedder(tmp_path: Path) -> None:
    with _client(tmp_path, embedder=None) as client:
        client.post("/api/nodes/bulk", json={"nodes": NODES})
        answer = client.post("/api/edges/auto", json={"similar": True})
        assert answer.status_code == 409
        assert "embedder" in answer.json()["error"]["message"]
        assert _edges(client, "shared_tag") == set()  # nothing half-done
        bad = client.post("/api/edges/auto", json={"threshold": 0})
        assert bad.status_code in (400, 422)
        assert "threshold" in bad.text
