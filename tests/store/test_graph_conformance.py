"""The knowledge graph's conformance suite (``contextfold.store.conformance.graph``), run here
on SQLite and PostgreSQL, and the context API sharing one PostgreSQL graph between servers."""

from __future__ import annotations

from contextfold.store.conformance.graph import *  # noqa: F403
from contextfold.store.conformance.graph import POLICY


def test_two_servers_share_one_postgres_graph(postgres_url: str) -> None:
    """The context API over a ``postgresql://`` ``graph_path``: what one server loads, another
    serves, and graph context answers from it."""
    from fastapi.testclient import TestClient

    from contextfold.memory.engine import MemoryEngine
    from contextfold.server.app import create_app
    from contextfold.server.config import ContextApiSettings, ServerConfig

    def app() -> TestClient:
        settings = ContextApiSettings(graph_path=postgres_url, hybrid=False)
        served = create_app(
            ServerConfig(context_api=settings), memory=MemoryEngine(store=":memory:")
        )
        return TestClient(served, base_url="http://127.0.0.1:5757")

    body = {"tenant_id": "t", "id": "policy", "title": "Policy", "text": POLICY}
    with app() as one, app() as two:
        loaded = one.post("/api/documents", json={**body, "chunker": "markdown"})
        assert loaded.status_code == 201, loaded.text
        assert two.get("/api/documents/t/policy").json()["chunks"] == 3
        assert two.get("/api/nodes").json()["total"] == 3
        asked = two.post("/api/context", json={"query": "manager approves", "tenant_ids": ["t"]})
        assert asked.status_code == 200, asked.text
        assert [e["title"] for e in asked.json()["entry_points"]][:1] == ["Policy › Large (2/3)"]
        assert one.delete("/api/documents/t/policy").status_code == 204
        assert two.get("/api/nodes").json()["total"] == 0
