"""``contextfold.client`` (issue 17, point 6): every operation checked against the server's
OpenAPI spec (path, method, query parameters, request body, response schema), every ``/api``
operation of the spec covered, sync and async alike; then both clients drive a real server."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from contextfold.client import (
    OPERATIONS,
    APIError,
    AsyncClient,
    AutoLinkOptions,
    Client,
    KnowledgeEdge,
    NodeSpec,
    Requests,
    document,
)
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.graph import GraphContextRequest
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig
from contextfold.testing import HashEmbedder
from live_app import LiveServer

NODE = NodeSpec(tenant_id="support", node_type="faq", title="Refunds", tags=["billing"])
SAMPLES: dict[str, tuple[Any, ...]] = {
    "health": (),
    "context": ("refund", ["support"]),
    "tenants": (),
    "add_node": (NODE,),
    "add_nodes": ([NODE],),
    "list_nodes": (["support"], ["faq"], 10, 0),
    "get_node": (1,),
    "replace_node": (1, NODE),
    "delete_node": (1,),
    "add_edge": (KnowledgeEdge(source_id=1, target_id=2),),
    "add_edges": ([KnowledgeEdge(source_id=1, target_id=2)],),
    "auto_edges": (AutoLinkOptions(similar=True),),
    "list_edges": (["support"], 1),
    "delete_edge": (1, 2, "related"),
    "add_document": (document("support", "Policy", "Refunds take 14 days."),),
    "list_documents": (["support"],),
    "get_document": ("support", "policy"),
    "delete_document": ("support", "policy"),
}


def _app(home: Path, api_keys: dict[str, list[str]] | None = None) -> Any:
    settings = ContextApiSettings(
        graph_path=str(home / "graph.db"), hybrid=False, api_keys=api_keys or {}
    )
    memory = MemoryEngine(store=":memory:", embedder=HashEmbedder())
    return create_app(ServerConfig(context_api=settings), memory=memory)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return dict(_app(tmp_path_factory.mktemp("spec")).openapi())


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _template(spec: dict[str, Any], method: str, path: str) -> str:
    for template, ops in spec["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if method.lower() in ops and re.match(pattern, path):
            return str(template)
    raise AssertionError(f"{method} {path} is not in the OpenAPI spec")


def test_operations_are_those_of_the_spec(spec: dict[str, Any]) -> None:
    assert set(OPERATIONS) == set(SAMPLES)
    covered = set()
    requests = Requests()
    for name in OPERATIONS:
        request = getattr(requests, name)(*SAMPLES[name])
        template = _template(spec, request.method, request.path)
        covered.add((request.method.lower(), template))
        op = spec["paths"][template][request.method.lower()]

        declared = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
        sent = {key for key, _ in request.params}
        assert sent <= set(declared), (name, sent - set(declared))
        required = {n for n, p in declared.items() if p.get("required")}
        assert required <= sent, (name, required - sent)

        body = op.get("requestBody")
        if body is None:
            assert request.json is None, name
        else:
            schema = _resolve(spec, body["content"]["application/json"]["schema"])
            assert set(request.json) == set(schema["properties"]), name
            assert set(schema.get("required", [])) <= set(request.json), name
            for key, prop in schema["properties"].items():
                if "default" in prop and key not in ("nodes", "edges"):
                    if name == "auto_edges" and key == "similar":
                        continue  # the sample asks for similar edges
                    if name == "context" and key in ("query", "tenant_ids"):
                        continue
                    assert request.json[key] == prop["default"], (name, key)

        success = next(code for code in op["responses"] if code.startswith("2"))
        content = op["responses"][success].get("content", {})
        if request.model is None:
            assert success == "204", name
            continue
        schema = _resolve(spec, content["application/json"]["schema"])
        if "properties" not in schema:  # /healthz: an object of strings
            assert schema["additionalProperties"] == {"type": "string"}, name
            assert {f.annotation for f in request.model.model_fields.values()} == {str}
            continue
        assert set(request.model.model_fields) == set(schema["properties"]), name

    api = {
        (method, path)
        for path, ops in spec["paths"].items()
        if path.startswith("/api/") or path == "/healthz"
        for method in ops
    }
    assert covered == api, api - covered


def test_sync_and_async_clients_have_every_operation() -> None:
    for name in OPERATIONS:
        built = inspect.signature(getattr(Requests, name))
        sync = getattr(Client, name)
        async_ = getattr(AsyncClient, name)
        assert inspect.signature(sync).parameters == built.parameters, name
        assert inspect.signature(async_).parameters == built.parameters, name
        assert inspect.iscoroutinefunction(async_) and not inspect.iscoroutinefunction(sync)


def test_the_sync_client_against_a_real_server(tmp_path: Path) -> None:
    with LiveServer(_app(tmp_path)) as server, Client(server.url) as client:
        assert client.health().status == "ok"
        doc = client.add_document(
            document("support", "Refund policy", "Refunds take 14 days.", id="refunds")
        )
        assert doc.chunks == 1 and doc.id == "refunds"
        nodes = client.add_nodes(
            [
                NodeSpec(
                    tenant_id="support",
                    node_type="playbook",
                    title="Chargebacks",
                    tags=["billing"],
                ),
                NodeSpec(tenant_id="support", node_type="faq", title="Invoices", tags=["billing"]),
            ]
        ).nodes
        edge = client.add_edge(KnowledgeEdge(source_id=doc.node_ids[0], target_id=nodes[0].id))
        assert edge.edge_type == "related"
        linked = client.auto_edges()
        assert (linked.shared_tag, linked.similar) == (1, 0)

        answer = client.context("refunds", ["support"], max_depth=1)
        assert answer.entry_points[0].id == doc.node_ids[0]
        assert [c.id for c in answer.context] == [nodes[0].id]
        same = client.context(GraphContextRequest(query="refunds", tenant_ids=["support"]))
        assert same.entry_points[0].id == doc.node_ids[0]

        assert client.list_nodes(["support"], ["faq"]).total == 1
        assert client.get_node(nodes[1].id).title == "Invoices"
        renamed = NodeSpec(tenant_id="support", node_type="faq", title="Invoices and receipts")
        assert client.replace_node(nodes[1].id, renamed).title == "Invoices and receipts"
        assert len(client.list_edges(["support"], node_id=nodes[0].id).edges) == 2
        client.delete_edge(doc.node_ids[0], nodes[0].id)
        assert len(client.list_edges(["support"], node_id=nodes[0].id).edges) == 1
        client.delete_node(nodes[1].id)
        with pytest.raises(APIError) as missing:
            client.get_node(nodes[1].id)
        assert (missing.value.status, missing.value.type) == (404, "not_found")

        assert [t.id for t in client.tenants().tenants] == ["support"]
        assert [d.id for d in client.list_documents().documents] == ["refunds"]
        assert client.get_document("support", "refunds").node_ids == doc.node_ids
        client.delete_document("support", "refunds")
        with pytest.raises(APIError, match="no document 'refunds'"):
            client.get_document("support", "refunds")
        with pytest.raises(APIError) as bad:
            client.context("x", ["support"], max_depth=99)
        assert bad.value.status in (400, 422)


def test_the_async_client_and_api_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPPORT_KEY", "key-support")

    async def run(url: str) -> None:
        async with AsyncClient(url, api_key="key-support") as client:
            doc = await client.add_document(document("support", "Policy", "Refunds: 14 days."))
            answer = await client.context("refunds", ["support"])
            assert answer.entry_points[0].id == doc.node_ids[0]
            assert (await client.tenants()).open is False
            with pytest.raises(APIError) as forbidden:
                await client.add_node(
                    NodeSpec(tenant_id="sales", node_type="faq", title="Discounts")
                )
            assert forbidden.value.status == 403
        async with AsyncClient(url, api_key="wrong") as stranger:
            with pytest.raises(APIError) as refused:
                await stranger.tenants()
            assert refused.value.status == 401

    with LiveServer(_app(tmp_path, {"SUPPORT_KEY": ["support"]})) as server:
        asyncio.run(run(server.url))


def test_models_are_typed_values() -> None:
    assert isinstance(Requests().health().model, type) and issubclass(
        Requests().health().model or BaseModel, BaseModel
    )
    with pytest.raises(TypeError, match="not both"):
        Requests().context(GraphContextRequest(query="q"), ["t"])
