"""With memory on PostgreSQL (``CONTEXTFOLD_STORE_URL``, or ``store:`` in the memory config)
and no ``context_api.graph_path``, the knowledge graph lives in that same database: every
server on it sees the same nodes (not a ``graph.db`` of each host's own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig

LOCAL = "http://127.0.0.1:5757"
NODE = {"tenant_id": "acme", "node_type": "faq", "title": "Refunds", "summary": "refund guide"}


def _host(home: Path, config: ServerConfig, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("CONTEXTFOLD_HOME", str(home))  # each host its own home folder
    return TestClient(create_app(config), base_url=LOCAL)


def test_two_hosts_on_one_store_url_share_the_graph(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTFOLD_STORE_URL", postgres_url)
    (tmp_path / "memory.yaml").write_text("recall:\n  embedder: none\n")
    config = ServerConfig(memory_config=str(tmp_path / "memory.yaml"))
    a = _host(tmp_path / "a", config, monkeypatch)
    b = _host(tmp_path / "b", config, monkeypatch)
    with a, b:
        created = a.post("/api/nodes", json=NODE)
        assert created.status_code == 201, created.text
        node_id = created.json()["id"]
        assert b.get(f"/api/nodes/{node_id}").status_code == 200
        assert [n["title"] for n in b.get("/api/nodes").json()["nodes"]] == ["Refunds"]
        answer = b.post("/api/context", json={"query": "refund", "tenant_ids": ["acme"]})
        assert [e["id"] for e in answer.json()["entry_points"]] == [node_id]
    assert not (tmp_path / "a" / "graph.db").exists()
    assert not (tmp_path / "b" / "graph.db").exists()


def test_the_store_in_the_memory_config_is_followed_too(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXTFOLD_STORE_URL", raising=False)
    (tmp_path / "memory.yaml").write_text(f"store: {postgres_url}\nrecall:\n  embedder: none\n")
    config = ServerConfig(memory_config=str(tmp_path / "memory.yaml"))
    with _host(tmp_path / "a", config, monkeypatch) as a:
        assert a.post("/api/nodes", json=NODE).status_code == 201
    with _host(tmp_path / "b", config, monkeypatch) as b:
        assert b.get("/api/nodes").json()["total"] == 1


def test_a_local_memory_store_keeps_the_local_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXTFOLD_STORE_URL", raising=False)
    (tmp_path / "memory.yaml").write_text("recall:\n  embedder: none\n")
    config = ServerConfig(memory_config=str(tmp_path / "memory.yaml"))
    with _host(tmp_path / "a", config, monkeypatch) as a:
        assert a.post("/api/nodes", json=NODE).status_code == 201
    assert (tmp_path / "a" / "graph.db").exists()


def test_an_explicit_graph_path_wins(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTFOLD_STORE_URL", postgres_url)
    (tmp_path / "memory.yaml").write_text("recall:\n  embedder: none\n")
    config = ServerConfig(
        memory_config=str(tmp_path / "memory.yaml"),
        context_api=ContextApiSettings(graph_path=str(tmp_path / "mine.db")),
    )
    with _host(tmp_path / "a", config, monkeypatch) as a:
        assert a.post("/api/nodes", json=NODE).status_code == 201
    assert (tmp_path / "mine.db").exists()


def test_a_graph_kept_in_the_home_folder_stays_there_with_a_warning(
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A host upgraded with its nodes in ``<home>/graph.db`` keeps serving them (an empty
    graph in PostgreSQL would hide every one), and the log says how to share the graph."""
    monkeypatch.delenv("CONTEXTFOLD_STORE_URL", raising=False)
    (tmp_path / "memory.yaml").write_text("recall:\n  embedder: none\n")
    with _host(
        tmp_path / "a", ServerConfig(memory_config=str(tmp_path / "memory.yaml")), monkeypatch
    ) as before:
        assert before.post("/api/nodes", json=NODE).status_code == 201  # the local graph
    monkeypatch.setenv("CONTEXTFOLD_STORE_URL", postgres_url)  # memory moved to PostgreSQL
    config = ServerConfig(memory_config=str(tmp_path / "memory.yaml"))
    with _host(tmp_path / "a", config, monkeypatch) as after:
        assert after.get("/api/nodes").json()["total"] == 1
    assert "stays in" in caplog.text and "context_api.graph_path" in caplog.text
