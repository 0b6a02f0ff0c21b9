"""A typed Python client for contextfold's HTTP API (``contextfold serve``), sync and async,
on httpx: typed requests in, pydantic models out, so a caller never writes request dicts.

``Client`` and ``AsyncClient`` have the same methods (the async ones are coroutines). Every
error answer raises ``APIError`` with the HTTP status, the error type and the server's
message. ``tests/test_client.py`` checks every method's path, parameters, request body and
response model against the server's OpenAPI spec, so the client cannot drift from it.

>>> from contextfold.client import Client, NodeSpec
>>> client = Client("http://127.0.0.1:5757", api_key=None)
>>> node = NodeSpec(tenant_id="support", node_type="faq", title="Refunds")
>>> request = client.requests.add_node(node)
>>> request.method, request.path, request.json["title"]
('POST', '/api/nodes', 'Refunds')
>>> client.close()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from contextfold.errors import ContextfoldError
from contextfold.retrieval.graph import GraphContextRequest, GraphContextResponse
from contextfold.server.knowledge import Chunking, DocumentInfo, DocumentSpec
from contextfold.store.graph_models import EdgeType, KnowledgeEdge, KnowledgeNode, NodeType

__all__ = [
    "APIError",
    "AsyncClient",
    "AutoLinkOptions",
    "AutoLinkResult",
    "Client",
    "DocumentInfo",
    "DocumentList",
    "DocumentSpec",
    "EdgeList",
    "GraphContextRequest",
    "GraphContextResponse",
    "Health",
    "KnowledgeEdge",
    "KnowledgeNode",
    "NodeList",
    "NodeSpec",
    "TenantInfo",
    "TenantList",
    "document",
]

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:5757"


class APIError(ContextfoldError):
    """An error answer: ``status`` (HTTP), ``type`` (``not_found``, ``forbidden`` …) and the
    server's ``message``."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(f"HTTP {status} {type}: {message}")
        self.status, self.type, self.message = status, type, message


# -- the API's models (those the server defines beside its routes) --------------------------

_REQUEST = ConfigDict(extra="forbid", frozen=True)


class NodeSpec(BaseModel):
    """A node to store (``POST /api/nodes``, ``PUT /api/nodes/{id}``)."""

    model_config = _REQUEST
    tenant_id: str
    node_type: NodeType
    title: str
    summary: str | None = None
    content: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)


class AutoLinkOptions(BaseModel):
    """Which automatic edges ``POST /api/edges/auto`` adds, among which tenants."""

    model_config = _REQUEST
    tenant_ids: list[str] = Field(default_factory=list)
    shared_tag: bool = True
    min_shared: int = 1
    shared_tag_weight: float = 0.5
    similar: bool = False
    threshold: float = 0.8
    top_k: int = 5
    similar_weight: float | None = None


class AutoLinkResult(BaseModel):
    shared_tag: int
    similar: int
    tenant_ids: list[str] | None


class NodeList(BaseModel):
    nodes: list[KnowledgeNode]
    total: int


class EdgeList(BaseModel):
    edges: list[KnowledgeEdge]


class DocumentList(BaseModel):
    documents: list[DocumentInfo]


class TenantInfo(BaseModel):
    id: str
    nodes: int
    documents: int


class TenantList(BaseModel):
    open: bool
    tenants: list[TenantInfo]


class Health(BaseModel):
    status: str
    memory: str


# -- requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request(Generic[T]):
    """One HTTP call: what is sent, and how its answer is read."""

    method: Literal["GET", "POST", "PUT", "DELETE"]
    path: str
    parse: Callable[[httpx.Response], T]
    params: list[tuple[str, str | int]] = field(default_factory=list)
    json: Any = None
    #: The model the answer is read into (None: no body, a 204).
    model: type[BaseModel] | None = None


M = TypeVar("M", bound=BaseModel)


def _call(
    method: Literal["GET", "POST", "PUT", "DELETE"],
    path: str,
    model: type[M],
    *,
    params: list[tuple[str, str | int]] | None = None,
    json: Any = None,
) -> Request[M]:
    def parse(response: httpx.Response) -> M:
        return model.model_validate(response.json())

    return Request(method, path, parse, params or [], json, model)


def _nothing(response: httpx.Response) -> None:
    return None


def _body(model: BaseModel) -> Any:
    return model.model_dump(mode="json", exclude_unset=False)


def _tenants(tenant_ids: Sequence[str]) -> list[tuple[str, str | int]]:
    if isinstance(tenant_ids, str):
        tenant_ids = [tenant_ids]
    return [("tenant_id", t) for t in tenant_ids]


class Requests:
    """The requests of the API's operations, built without sending them (what both
    clients send)."""

    def health(self) -> Request[Health]:
        return _call("GET", "/healthz", Health)

    def context(
        self, query: str | GraphContextRequest, tenant_ids: Sequence[str] = (), **options: Any
    ) -> Request[GraphContextResponse]:
        if isinstance(query, GraphContextRequest):
            if tenant_ids or options:
                raise TypeError("give a GraphContextRequest or a query with options, not both")
            request = query
        else:
            request = GraphContextRequest(query=query, tenant_ids=list(tenant_ids), **options)
        return _call("POST", "/api/context", GraphContextResponse, json=_body(request))

    def tenants(self) -> Request[TenantList]:
        return _call("GET", "/api/tenants", TenantList)

    def add_node(self, node: NodeSpec) -> Request[KnowledgeNode]:
        return _call("POST", "/api/nodes", KnowledgeNode, json=_body(node))

    def add_nodes(self, nodes: Sequence[NodeSpec]) -> Request[NodeList]:
        body = {"nodes": [_body(n) for n in nodes]}
        return _call("POST", "/api/nodes/bulk", NodeList, json=body)

    def list_nodes(
        self,
        tenant_ids: Sequence[str] = (),
        node_types: Sequence[NodeType | str] = (),
        limit: int = 100,
        offset: int = 0,
    ) -> Request[NodeList]:
        params = _tenants(tenant_ids)
        params += [("node_type", NodeType(t).value) for t in node_types]
        params += [("limit", limit), ("offset", offset)]
        return _call("GET", "/api/nodes", NodeList, params=params)

    def get_node(self, node_id: int) -> Request[KnowledgeNode]:
        return _call("GET", f"/api/nodes/{int(node_id)}", KnowledgeNode)

    def replace_node(self, node_id: int, node: NodeSpec) -> Request[KnowledgeNode]:
        return _call("PUT", f"/api/nodes/{int(node_id)}", KnowledgeNode, json=_body(node))

    def delete_node(self, node_id: int) -> Request[None]:
        return Request("DELETE", f"/api/nodes/{int(node_id)}", _nothing)

    def add_edge(self, edge: KnowledgeEdge) -> Request[KnowledgeEdge]:
        return _call("POST", "/api/edges", KnowledgeEdge, json=_body(edge))

    def add_edges(self, edges: Sequence[KnowledgeEdge]) -> Request[EdgeList]:
        body = {"edges": [_body(e) for e in edges]}
        return _call("POST", "/api/edges/bulk", EdgeList, json=body)

    def auto_edges(self, options: AutoLinkOptions | None = None) -> Request[AutoLinkResult]:
        body = _body(options if options is not None else AutoLinkOptions())
        return _call("POST", "/api/edges/auto", AutoLinkResult, json=body)

    def list_edges(
        self, tenant_ids: Sequence[str] = (), node_id: int | None = None
    ) -> Request[EdgeList]:
        params = _tenants(tenant_ids)
        if node_id is not None:
            params.append(("node_id", int(node_id)))
        return _call("GET", "/api/edges", EdgeList, params=params)

    def delete_edge(
        self, source_id: int, target_id: int, edge_type: EdgeType | str = EdgeType.RELATED
    ) -> Request[None]:
        params: list[tuple[str, str | int]] = [
            ("source_id", int(source_id)),
            ("target_id", int(target_id)),
            ("edge_type", EdgeType(edge_type).value),
        ]
        return Request("DELETE", "/api/edges", _nothing, params=params)

    def add_document(self, document: DocumentSpec) -> Request[DocumentInfo]:
        return _call("POST", "/api/documents", DocumentInfo, json=_body(document))

    def list_documents(self, tenant_ids: Sequence[str] = ()) -> Request[DocumentList]:
        return _call("GET", "/api/documents", DocumentList, params=_tenants(tenant_ids))

    def get_document(self, tenant_id: str, document_id: str) -> Request[DocumentInfo]:
        path = f"/api/documents/{_segment(tenant_id)}/{_segment(document_id)}"
        return _call("GET", path, DocumentInfo)

    def delete_document(self, tenant_id: str, document_id: str) -> Request[None]:
        path = f"/api/documents/{_segment(tenant_id)}/{_segment(document_id)}"
        return Request("DELETE", path, _nothing)


def _segment(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


#: The operations both clients have, by method name.
OPERATIONS = tuple(
    name for name in vars(Requests) if not name.startswith("_") and callable(vars(Requests)[name])
)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "http_error", response.text[:500]
    raise APIError(response.status_code, kind, message)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def document(
    tenant_id: str,
    title: str,
    text: str,
    *,
    id: str | None = None,
    node_type: NodeType | str = NodeType.CONCEPT,
    tags: Sequence[str] = (),
    chunker: Chunking = "text",
    chunk_size: int = 256,
    overlap: int = 0,
    link_chunks: bool = True,
    metadata: dict[str, Any] | None = None,
) -> DocumentSpec:
    """A ``DocumentSpec`` with keyword arguments (the defaults are the server's)."""
    return DocumentSpec(
        tenant_id=tenant_id,
        id=id,
        title=title,
        text=text,
        node_type=NodeType(node_type),
        tags=list(tags),
        chunker=chunker,
        chunk_size=chunk_size,
        overlap=overlap,
        link_chunks=link_chunks,
        metadata=dict(metadata or {}),
    )


class _Base:
    def __init__(self, base_url: str, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.requests = Requests()


class Client(_Base):
    """The sync client: ``Client(base_url, api_key=...)``; use it as a context manager or
    ``close()`` it. ``http_client`` replaces the ``httpx.Client`` it makes."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self.http = http_client or httpx.Client(
            base_url=self.base_url, headers=_headers(api_key), timeout=timeout
        )

    def send(self, request: Request[T]) -> T:
        response = self.http.request(
            request.method, request.path, params=tuple(request.params) or None, json=request.json
        )
        _raise_for(response)
        return request.parse(response)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def health(self) -> Health:
        return self.send(self.requests.health())

    def context(
        self, query: str | GraphContextRequest, tenant_ids: Sequence[str] = (), **options: Any
    ) -> GraphContextResponse:
        """``POST /api/context``: a ``GraphContextRequest``, or a query, its tenants and any
        of the request's fields (``entry_limit``, ``max_depth``, ``max_tokens`` …)."""
        return self.send(self.requests.context(query, tenant_ids, **options))

    def tenants(self) -> TenantList:
        return self.send(self.requests.tenants())

    def add_node(self, node: NodeSpec) -> KnowledgeNode:
        return self.send(self.requests.add_node(node))

    def add_nodes(self, nodes: Sequence[NodeSpec]) -> NodeList:
        return self.send(self.requests.add_nodes(nodes))

    def list_nodes(
        self,
        tenant_ids: Sequence[str] = (),
        node_types: Sequence[NodeType | str] = (),
        limit: int = 100,
        offset: int = 0,
    ) -> NodeList:
        return self.send(self.requests.list_nodes(tenant_ids, node_types, limit, offset))

    def get_node(self, node_id: int) -> KnowledgeNode:
        return self.send(self.requests.get_node(node_id))

    def replace_node(self, node_id: int, node: NodeSpec) -> KnowledgeNode:
        return self.send(self.requests.replace_node(node_id, node))

    def delete_node(self, node_id: int) -> None:
        self.send(self.requests.delete_node(node_id))

    def add_edge(self, edge: KnowledgeEdge) -> KnowledgeEdge:
        return self.send(self.requests.add_edge(edge))

    def add_edges(self, edges: Sequence[KnowledgeEdge]) -> EdgeList:
        return self.send(self.requests.add_edges(edges))

    def auto_edges(self, options: AutoLinkOptions | None = None) -> AutoLinkResult:
        return self.send(self.requests.auto_edges(options))

    def list_edges(self, tenant_ids: Sequence[str] = (), node_id: int | None = None) -> EdgeList:
        return self.send(self.requests.list_edges(tenant_ids, node_id))

    def delete_edge(
        self, source_id: int, target_id: int, edge_type: EdgeType | str = EdgeType.RELATED
    ) -> None:
        self.send(self.requests.delete_edge(source_id, target_id, edge_type))

    def add_document(self, document: DocumentSpec) -> DocumentInfo:
        return self.send(self.requests.add_document(document))

    def list_documents(self, tenant_ids: Sequence[str] = ()) -> DocumentList:
        return self.send(self.requests.list_documents(tenant_ids))

    def get_document(self, tenant_id: str, document_id: str) -> DocumentInfo:
        return self.send(self.requests.get_document(tenant_id, document_id))

    def delete_document(self, tenant_id: str, document_id: str) -> None:
        self.send(self.requests.delete_document(tenant_id, document_id))


class AsyncClient(_Base):
    """The async client: the same methods as ``Client``, as coroutines; ``async with`` it or
    ``await aclose()``."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self.http = http_client or httpx.AsyncClient(
            base_url=self.base_url, headers=_headers(api_key), timeout=timeout
        )

    async def send(self, request: Request[T]) -> T:
        response = await self.http.request(
            request.method, request.path, params=tuple(request.params) or None, json=request.json
        )
        _raise_for(response)
        return request.parse(response)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def health(self) -> Health:
        return await self.send(self.requests.health())

    async def context(
        self, query: str | GraphContextRequest, tenant_ids: Sequence[str] = (), **options: Any
    ) -> GraphContextResponse:
        return await self.send(self.requests.context(query, tenant_ids, **options))

    async def tenants(self) -> TenantList:
        return await self.send(self.requests.tenants())

    async def add_node(self, node: NodeSpec) -> KnowledgeNode:
        return await self.send(self.requests.add_node(node))

    async def add_nodes(self, nodes: Sequence[NodeSpec]) -> NodeList:
        return await self.send(self.requests.add_nodes(nodes))

    async def list_nodes(
        self,
        tenant_ids: Sequence[str] = (),
        node_types: Sequence[NodeType | str] = (),
        limit: int = 100,
        offset: int = 0,
    ) -> NodeList:
        return await self.send(self.requests.list_nodes(tenant_ids, node_types, limit, offset))

    async def get_node(self, node_id: int) -> KnowledgeNode:
        return await self.send(self.requests.get_node(node_id))

    async def replace_node(self, node_id: int, node: NodeSpec) -> KnowledgeNode:
        return await self.send(self.requests.replace_node(node_id, node))

    async def delete_node(self, node_id: int) -> None:
        await self.send(self.requests.delete_node(node_id))

    async def add_edge(self, edge: KnowledgeEdge) -> KnowledgeEdge:
        return await self.send(self.requests.add_edge(edge))

    async def add_edges(self, edges: Sequence[KnowledgeEdge]) -> EdgeList:
        return await self.send(self.requests.add_edges(edges))

    async def auto_edges(self, options: AutoLinkOptions | None = None) -> AutoLinkResult:
        return await self.send(self.requests.auto_edges(options))

    async def list_edges(
        self, tenant_ids: Sequence[str] = (), node_id: int | None = None
    ) -> EdgeList:
        return await self.send(self.requests.list_edges(tenant_ids, node_id))

    async def delete_edge(
        self, source_id: int, target_id: int, edge_type: EdgeType | str = EdgeType.RELATED
    ) -> None:
        await self.send(self.requests.delete_edge(source_id, target_id, edge_type))

    async def add_document(self, document: DocumentSpec) -> DocumentInfo:
        return await self.send(self.requests.add_document(document))

    async def list_documents(self, tenant_ids: Sequence[str] = ()) -> DocumentList:
        return await self.send(self.requests.list_documents(tenant_ids))

    async def get_document(self, tenant_id: str, document_id: str) -> DocumentInfo:
        return await self.send(self.requests.get_document(tenant_id, document_id))

    async def delete_document(self, tenant_id: str, document_id: str) -> None:
        await self.send(self.requests.delete_document(tenant_id, document_id))
