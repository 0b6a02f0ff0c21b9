"""``POST /api/context`` and the endpoints that load its knowledge: documents, nodes, edges.

``/api/context`` answers seed 003's request with ``entry_points``, ``context``, ``entities``
and ``stats`` (``contextfold.retrieval.graph.graph_context``: BM25, plus dense search with
the memory engine's embedder when ``context_api.hybrid``), over the intersection of the
requested ``tenant_ids`` and the caller's tenants (``contextfold.server.tenants``); the
``X-Contextfold-Tenants`` response header lists the tenants actually searched.

Everything is stored in one SQLite file (``context_api.graph_path``, by default
``<home>/graph.db``) or, for a ``postgresql://`` URL there, one PostgreSQL database that
several servers share, so a restarted server keeps its knowledge. A node of a tenant the caller
does not own answers 404, exactly as a node that does not exist; writing to such a tenant by
name answers 403. Open (no keys, bound to loopback), the API answers only requests whose
``Host`` names a loopback host (``TenantAuth.admit_host``). The HTTP reference is
``docs/http-api.md``.
"""

# No ``from __future__ import annotations`` here: FastAPI must see the route annotations,
# some of which (``Who``) are local to ``router``, as objects.
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response, Security
from fastapi import Path as PathParam
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationError,
    model_validator,
)

from contextfold._bounded import clip
from contextfold.budget import graph_budget
from contextfold.errors import ConfigError, StoreError
from contextfold.memory.config import load_config
from contextfold.retrieval.graph import (
    GraphContextRequest,
    GraphContextResponse,
    graph_context,
    to_context_items,
)
from contextfold.server.auto_links import AutoLinkRequest, AutoLinkResult, auto_link
from contextfold.server.config import ID_PATTERN
from contextfold.server.events import BudgetRow, RequestRecord, preview
from contextfold.server.guards import ERROR_RESPONSES, ApiError, is_json
from contextfold.server.knowledge import (
    Chunking,
    DocumentConflict,
    DocumentInfo,
    DocumentSpec,
    KnowledgeStore,
)
from contextfold.server.proxy.limits import depth, too_deep
from contextfold.server.state import ServerState
from contextfold.server.tenants import Caller, TenantAuth
from contextfold.store import is_database_url, masked_location, store_url
from contextfold.store.graph_models import EdgeType, KnowledgeEdge, KnowledgeNode, NodeType
from contextfold.store.protocols import GraphStorage
from contextfold.store.sqlite import home_dir

__all__ = [
    "BulkEdges",
    "BulkNodes",
    "ContextRequest",
    "DocumentIn",
    "DocumentList",
    "EdgeIn",
    "EdgeList",
    "NodeIn",
    "NodeList",
    "TenantList",
    "router",
]

#: The largest node id the API takes: JavaScript's largest safe integer (SQLite's own limit,
#: 2**63 - 1, does not survive a trip through a float; ids are assigned from 1 upwards).
MAX_ID = 2**53 - 1
#: At most this many nodes or edges in one bulk request.
MAX_BULK = 1000
#: The deepest JSON body the API takes, whatever ``limits.max_json_depth`` says: pydantic
#: serialises at most 255 levels, and a response wraps a node's content in a few more, so a
#: node stored deeper could never be listed again.
MAX_API_DEPTH = 200


def _unicode(value: Any, where: str = "value") -> Any:
    """Reject strings that cannot be stored as UTF-8 (lone surrogates such as ``"\\ud800"``,
    which JSON escapes allow), anywhere inside ``value``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{where} contains {value[exc.start]!r} at index {exc.start}, a lone UTF-16 "
                "surrogate; send valid Unicode text"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _unicode(key, f"{where} key")
            _unicode(item, f"{where}.{key}" if isinstance(key, str) else where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _unicode(item, f"{where}[{index}]")
    return value


_REQUEST = ConfigDict(extra="forbid", frozen=True)


def _json_number(value: Any) -> Any:
    """JSON types, not pydantic's lax coercions: ``"10"`` and ``true`` are not numbers
    (``10.0`` still is an integer, as JSON Schema says)."""
    if isinstance(value, bool | str):
        raise ValueError(f"expected a JSON number, got {type(value).__name__}")
    return value


Int = Annotated[int, BeforeValidator(_json_number)]
Number = Annotated[float, BeforeValidator(_json_number)]
Bool = StrictBool


TenantId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
# (Field before the validator: after it, pydantic leaves the bounds out of the JSON schema)
NodeId = Annotated[int, Field(ge=1, le=MAX_ID), BeforeValidator(_json_number)]
Text = Annotated[str, AfterValidator(_unicode)]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_unicode)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_unicode)]


# -- request and response models -----------------------------------------------------------


class ContextRequest(GraphContextRequest):
    """Seed 003's request (``GraphContextRequest``) with the bounds a server needs."""

    query: Text = Field(default="", max_length=20_000)
    tenant_ids: list[TenantId] = Field(default_factory=list, max_length=100)
    entry_limit: Int = Field(default=10, gt=0, le=1000)
    expand: Bool = True
    max_depth: Int = Field(default=2, ge=0, le=10)
    context_limit: Int = Field(default=50, ge=0, le=10_000)
    include_entities: Bool = True
    include_schemas: Bool = False
    include_examples: Bool = False
    max_tokens: Int | None = Field(default=None, gt=0, le=10_000_000)
    token_model: Text = Field(default="gpt-4", min_length=1, max_length=200)

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "query": "How do I process a refund request?",
                    "tenant_ids": ["purchasing", "shared"],
                    "entry_types": ["faq", "playbook", "permission_rule"],
                    "entry_limit": 10,
                    "max_depth": 2,
                    "max_tokens": 8000,
                }
            ]
        }
    )


class NodeIn(BaseModel):
    """A node to store. Entity nodes keep ``entity_path`` (a string) and ``related_schemas``
    (a list of strings) in ``content``."""

    model_config = _REQUEST

    tenant_id: TenantId
    node_type: NodeType
    title: Text = Field(min_length=1, max_length=2000)
    summary: Text | None = Field(default=None, max_length=20_000)
    content: JsonObject = Field(default_factory=dict)
    tags: list[Tag] = Field(default_factory=list, max_length=100)

    @model_validator(mode="after")
    def _as_node(self) -> "NodeIn":
        try:
            KnowledgeNode(id=1, **self.model_dump())
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self


class BulkNodes(BaseModel):
    model_config = _REQUEST

    nodes: list[NodeIn] = Field(min_length=1, max_length=MAX_BULK)


class NodeList(BaseModel):
    """A page of nodes; ``total`` counts every match."""

    nodes: list[KnowledgeNode]
    total: int


class EdgeIn(BaseModel):
    """An edge between two nodes the caller can see; ``weight`` in (0, 1]."""

    model_config = _REQUEST

    source_id: NodeId
    target_id: NodeId
    edge_type: EdgeType = EdgeType.RELATED
    weight: Number = Field(default=1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _two_nodes(self) -> "EdgeIn":
        if self.source_id == self.target_id:
            raise ValueError(f"an edge needs two different nodes, got {self.source_id} twice")
        return self


class BulkEdges(BaseModel):
    model_config = _REQUEST

    edges: list[EdgeIn] = Field(min_length=1, max_length=MAX_BULK)


class EdgeList(BaseModel):
    edges: list[KnowledgeEdge]


class DocumentIn(BaseModel):
    """A document to chunk into nodes (see ``contextfold.server.knowledge``); ``id`` is
    generated when left out."""

    model_config = _REQUEST

    tenant_id: TenantId
    id: Annotated[str, StringConstraints(pattern=ID_PATTERN)] | None = None
    title: Text = Field(min_length=1, max_length=2000)
    text: Text = Field(min_length=1)
    node_type: NodeType = NodeType.CONCEPT
    tags: list[Tag] = Field(default_factory=list, max_length=100)
    chunker: Chunking = "text"
    chunk_size: Int = Field(default=256, ge=16, le=8192)
    overlap: Int = Field(default=0, ge=0, le=1024)
    link_chunks: Bool = True
    metadata: JsonObject = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sizes(self) -> "DocumentIn":
        if not self.text.strip():
            raise ValueError("text is blank; a document needs some text to chunk")
        if self.overlap >= self.chunk_size:
            raise ValueError(
                f"overlap ({self.overlap}) must be smaller than chunk_size ({self.chunk_size})"
            )
        return self


class DocumentList(BaseModel):
    documents: list[DocumentInfo]


class TenantInfo(BaseModel):
    id: str
    nodes: int
    documents: int


class TenantList(BaseModel):
    """The caller's tenants (``open``: no keys, every tenant is visible)."""

    open: bool
    tenants: list[TenantInfo]


TenantFilter = Annotated[
    list[TenantId],
    Query(
        default_factory=list,
        description="Only these tenants (repeat the parameter); default: all the caller's",
    ),
]

# -- the router ----------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: <API key>")


def _shallow(content: dict[str, Any]) -> dict[str, Any]:
    """``content``, or a note in its place when it nests deeper than the API can return (a
    node stored that deep by a library user, or before the API checked bodies' depth)."""
    if depth(content, MAX_API_DEPTH) <= MAX_API_DEPTH:
        return content
    return {
        "omitted": f"this content is JSON nested deeper than {MAX_API_DEPTH} levels, more than"
        " the API returns; replace it (PUT /api/nodes/{id}) or delete the node"
    }


def _safe_node(node: KnowledgeNode) -> KnowledgeNode:
    shallow = _shallow(node.content)
    return node if shallow is node.content else node.model_copy(update={"content": shallow})


def _safe_document(document: DocumentInfo) -> DocumentInfo:
    shallow = _shallow(document.metadata)
    if shallow is document.metadata:
        return document
    return document.model_copy(update={"metadata": shallow})


def _safe_context(result: GraphContextResponse) -> GraphContextResponse:
    entry_points = [
        e.model_copy(update={"content": _shallow(e.content)}) for e in result.entry_points
    ]
    context = [c.model_copy(update={"content": _shallow(c.content)}) for c in result.context]
    return result.model_copy(update={"entry_points": entry_points, "context": context})


def _not_found(kind: str, ident: object) -> ApiError:
    return ApiError(404, "not_found", f"no {kind} {ident} among the tenants this caller can see")


def graph_location(state: ServerState) -> str | Path:
    """Where the knowledge graph lives: ``context_api.graph_path`` when set; else, when memory
    is on PostgreSQL (``$CONTEXTFOLD_STORE_URL``, or ``store:`` in the memory config), that
    same database, so every server sharing the memory shares the graph too — unless
    ``<home>/graph.db`` exists already (a graph an earlier version kept there stays where it
    is, with a warning: moving it is the operator's call); else ``<home>/graph.db``."""
    if state.config.context_api.graph_path:
        return state.config.context_api.graph_path
    local = home_dir() / "graph.db"
    shared = _memory_database(state)
    if shared is None:
        return local
    if local.exists():
        logger.warning(
            "memory is on PostgreSQL (%s) but the knowledge graph stays in %s, which exists:"
            " servers sharing the memory do not share this graph; set context_api.graph_path"
            " to the PostgreSQL URL (after moving its nodes) or to this file to silence this",
            masked_location(shared),
            local,
        )
        return local
    return shared


def _memory_database(state: ServerState) -> str | None:
    """The PostgreSQL URL of the memory store, or ``None`` when memory is not on one."""
    cfg = state.memory.config
    if state.memory_error and state.config.memory_config:  # memory is a stand-in: its file
        with suppress(ConfigError):
            cfg = load_config(state.config.memory_config)
    configured = store_url(cfg.store or cfg.storage_path)
    if configured is not None and is_database_url(configured):
        return str(configured)
    opened = str(getattr(state.memory.store, "path", ""))  # an engine given its own store
    if is_database_url(opened) and "***" not in opened:  # (no password to unmask)
        return opened
    return None


logger = logging.getLogger(__name__)

#: How often a knowledge store whose PostgreSQL server was down at start is tried again (at
#: most once per this many seconds; the uses between answer 503 at once).
REOPEN_EVERY_S = 2.0


def _unreachable(url: str) -> str | None:
    """Why the PostgreSQL server at ``url`` refuses a connection now (a quick one, 3 s at
    most), else ``None``: checked before a store's pool, which waits 30 s to open."""
    try:
        import psycopg
    except ImportError:  # the store's own open says what to install
        return None
    from contextfold.store.postgres.pool import reason_of, remember, scrub

    remember(url)
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.OperationalError as exc:  # not there (a malformed URL is raised)
        return reason_of(exc, url)
    except psycopg.Error as exc:
        raise ConfigError(
            f"the knowledge store at {masked_location(url)}: {scrub(str(exc).strip())}"
        ) from None
    return None


class _KnowledgeOnDemand:
    """The knowledge store of a server whose PostgreSQL server could not be reached at start:
    the server starts without it (the proxy serves whatever this store does), each use tries
    to open it (at most every ``REOPEN_EVERY_S``; a quick connection first) and raises
    ``StoreUnavailable`` — a 503 — until it opens; then it is the store."""

    def __init__(self, url: str, reason: str) -> None:
        self._url, self._reason = url, reason
        self._store: KnowledgeStore | None = None
        self._lock = threading.Lock()
        self._tried = time.monotonic()
        self.graph = _GraphOnDemand(self)

    def opened(self) -> KnowledgeStore:
        from contextfold.store.postgres.pool import StoreUnavailable

        with self._lock:
            if self._store is None:
                now = time.monotonic()
                if now - self._tried >= REOPEN_EVERY_S:
                    self._tried = now
                    reason = _unreachable(self._url)
                    if reason is None:
                        try:
                            self._store = KnowledgeStore(self._url)
                        except StoreError as exc:
                            reason = str(exc)
                    if reason is not None:
                        self._reason = reason
                if self._store is None:
                    raise StoreUnavailable(masked_location(self._url), self._reason)
                logger.info("the knowledge store at %s is open", masked_location(self._url))
            return self._store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.opened(), name)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


class _GraphOnDemand:
    """``_KnowledgeOnDemand``'s graph: each use is the opened store's graph's."""

    def __init__(self, owner: _KnowledgeOnDemand) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.opened().graph, name)


def _open_knowledge(location: str | Path) -> Any:
    """The knowledge store at ``location``; on PostgreSQL, a ``_KnowledgeOnDemand`` when its
    server cannot be reached now (a server must start while its database is down)."""
    if not is_database_url(str(location)):
        return KnowledgeStore(location)
    reason = _unreachable(str(location))
    if reason is None:
        try:
            return KnowledgeStore(location)
        except StoreError as exc:
            reason = str(exc)
    logger.warning(
        "the knowledge store at %s is unavailable (%s): the context API answers 503 until"
        " it is back",
        masked_location(location),
        reason,
    )
    return _KnowledgeOnDemand(str(location), reason)


class KnowledgeRouter(APIRouter):
    """The context API's routes; ``store`` is the knowledge store they use (or, while its
    PostgreSQL server is down since the start, what opens it once it is back)."""

    store: Any


def router(state: ServerState) -> KnowledgeRouter:
    """The context API's routes, over the store at ``context_api.graph_path``."""
    settings = state.config.context_api
    auth = TenantAuth(settings.api_keys, host=state.config.host)
    store = _open_knowledge(graph_location(state))
    graph: GraphStorage = store.graph

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    def caller(
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
        api_key: Annotated[str | None, Security(_api_key)],
    ) -> Caller:
        return auth.authenticate(
            f"Bearer {bearer.credentials}" if bearer is not None else None, api_key
        )

    def admit_host(request: Request) -> None:
        auth.admit_host(request.headers.get("host"))

    Who = Annotated[Caller, Depends(caller)]

    configured_depth = state.config.limits.max_json_depth
    depth_limit = min(configured_depth, MAX_API_DEPTH)
    depth_setting = "limits.max_json_depth" + (
        f" {configured_depth}, capped at {MAX_API_DEPTH} on /api"
        if depth_limit < configured_depth
        else ""
    )

    async def json_body(request: Request, _: Who) -> None:
        """A POST or PUT body is JSON: one declared as anything else (curl's ``-d`` sends
        ``application/x-www-form-urlencoded``), or sent with no ``Content-Type``, is a 415
        naming what it was sent as; one nested deeper than ``limits.max_json_depth`` (at most
        ``MAX_API_DEPTH``) is a 400. Checked after the key and before the body's schema."""
        headers = request.headers
        content_type = headers.get("content-type")
        if request.method not in ("POST", "PUT"):
            return
        if is_json(content_type):
            if not await request.body():
                return
            try:
                parsed = await request.json()  # parsed already: FastAPI keeps it
            except (ValueError, RecursionError):
                return  # the route's own parsing reports it
            deep = too_deep(parsed, depth_limit, "this API", setting=depth_setting)
            if deep is not None:
                raise ApiError(400, "json_too_deep", deep)
            return
        if content_type is None:
            if headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers:
                return  # no body at all: the schema says what is missing
            sent = "no Content-Type"
        else:
            sent = f"Content-Type {clip(content_type.split(';', 1)[0].strip())!r}"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"request body has {sent}; this API reads JSON bodies: send Content-Type: "
            "application/json (curl: -H 'content-type: application/json')",
        )

    api = KnowledgeRouter(
        prefix="/api",
        responses=ERROR_RESPONSES,
        lifespan=lifespan,
        # The Host is checked before the key, the key before the content type, and all three
        # before the body's schema.
        dependencies=[Depends(admit_host), Depends(json_body)],
    )
    api.store = store

    def visible_node(who: Caller, node_id: int) -> KnowledgeNode:
        node = graph.get_node(node_id)
        if node is None or not who.owns(node.tenant_id):
            raise _not_found("node", node_id)
        return node

    def scope(who: Caller, tenant_id: list[str]) -> list[str] | None:
        """The tenants a listing covers: those asked for that the caller owns, or all of
        the caller's when none are named (None: every tenant, in the open mode)."""
        if tenant_id:
            return who.visible(tenant_id)
        return None if who.tenants is None else sorted(who.tenants)

    @api.post(
        "/context",
        response_model=GraphContextResponse,
        tags=["context"],
        summary="Knowledge-graph context for a query",
    )
    def context(body: ContextRequest, who: Who, response: Response) -> GraphContextResponse:
        """Entry points (BM25, and dense search when hybrid), graph expansion, entities and
        the 60/30/10 token budget, over the requested tenants the caller owns."""
        started = time.perf_counter()
        tenants = who.visible(body.tenant_ids)
        request = body.model_copy(update={"tenant_ids": tenants})
        embedder = state.memory.embedder if settings.hybrid else None
        result = graph_context(
            graph, request, embedder=embedder, relevance_floor=settings.relevance_floor
        )
        response.headers["X-Contextfold-Tenants"] = ",".join(tenants)
        _publish(state, who, request, result, (time.perf_counter() - started) * 1000)
        return _safe_context(result)

    @api.get("/tenants", response_model=TenantList, tags=["tenants"])
    def tenants(who: Who) -> TenantList:
        """The caller's tenants with their node and document counts."""
        nodes, documents = graph.tenant_counts(), store.document_counts()
        ids = sorted(who.tenants) if who.tenants is not None else sorted({*nodes, *documents})
        return TenantList(
            open=who.tenants is None,
            tenants=[
                TenantInfo(id=t, nodes=nodes.get(t, 0), documents=documents.get(t, 0)) for t in ids
            ],
        )

    # -- nodes ------------------------------------------------------------------------------

    @api.post("/nodes", status_code=201, response_model=KnowledgeNode, tags=["nodes"])
    def add_node(body: NodeIn, who: Who) -> KnowledgeNode:
        """Store a node; its id is assigned by the server."""
        who.require(body.tenant_id)
        return _safe_node(graph.add_nodes([body.model_dump()])[0])

    @api.post("/nodes/bulk", status_code=201, response_model=NodeList, tags=["nodes"])
    def add_nodes(body: BulkNodes, who: Who) -> NodeList:
        """Store up to 1,000 nodes in one transaction (all or none); ids in request order."""
        for node in body.nodes:
            who.require(node.tenant_id)
        stored = graph.add_nodes([n.model_dump() for n in body.nodes])
        return NodeList(nodes=[_safe_node(n) for n in stored], total=len(stored))

    @api.get("/nodes", response_model=NodeList, tags=["nodes"])
    def list_nodes(
        who: Who,
        tenant_id: TenantFilter,
        node_type: Annotated[list[NodeType] | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    ) -> NodeList:
        """The caller's nodes by id, optionally of some tenants and types, a page at a time."""
        found = graph.nodes(tenant_ids=scope(who, tenant_id), node_types=node_type)
        page = [_safe_node(n) for n in found[offset : offset + limit]]
        return NodeList(nodes=page, total=len(found))

    @api.get("/nodes/{node_id:int}", response_model=KnowledgeNode, tags=["nodes"])
    def get_node(node_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], who: Who) -> KnowledgeNode:
        return _safe_node(visible_node(who, node_id))

    @api.put("/nodes/{node_id:int}", response_model=KnowledgeNode, tags=["nodes"])
    def replace_node(
        node_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], body: NodeIn, who: Who
    ) -> KnowledgeNode:
        """Replace a node's fields (its edges stay); it may move to another owned tenant."""
        visible_node(who, node_id)
        who.require(body.tenant_id)
        return _safe_node(graph.add_nodes([{**body.model_dump(), "id": node_id}])[0])

    @api.delete("/nodes/{node_id:int}", status_code=204, tags=["nodes"])
    def delete_node(node_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], who: Who) -> Response:
        """Delete a node and every edge touching it."""
        if not graph.remove_node(node_id, tenant_ids=who.tenants):  # the check is the delete
            raise _not_found("node", node_id)
        return Response(status_code=204)

    # -- edges ------------------------------------------------------------------------------

    def check_edge(who: Caller, edge: EdgeIn) -> KnowledgeEdge:
        visible_node(who, edge.source_id)
        visible_node(who, edge.target_id)
        return KnowledgeEdge(**edge.model_dump())

    @api.post("/edges", status_code=201, response_model=KnowledgeEdge, tags=["edges"])
    def add_edge(body: EdgeIn, who: Who) -> KnowledgeEdge:
        """Store an edge (or replace its weight); undirected types come back smaller id
        first."""
        return graph.add_edges([check_edge(who, body)])[0]

    @api.post("/edges/bulk", status_code=201, response_model=EdgeList, tags=["edges"])
    def add_edges(body: BulkEdges, who: Who) -> EdgeList:
        """Store up to 1,000 edges in one transaction (all or none)."""
        return EdgeList(edges=graph.add_edges([check_edge(who, e) for e in body.edges]))

    @api.post("/edges/auto", response_model=AutoLinkResult, tags=["edges"])
    def add_auto_edges(body: AutoLinkRequest, who: Who) -> AutoLinkResult:
        """Add seed 003's automatic ``shared_tag`` and ``similar`` edges among the named
        tenants (each must be the caller's), or all the caller's (``server/auto_links.py``)."""
        for tenant in body.tenant_ids:
            who.require(tenant)
        return auto_link(graph, body, scope(who, body.tenant_ids), state.memory.embedder)

    @api.get("/edges", response_model=EdgeList, tags=["edges"])
    def list_edges(
        who: Who,
        tenant_id: TenantFilter,
        node_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    ) -> EdgeList:
        """Edges whose two ends are both among the caller's (requested) tenants, optionally
        only those touching ``node_id``."""
        found = graph.edges(tenant_ids=scope(who, tenant_id))
        if node_id is not None:
            found = [e for e in found if node_id in (e.source_id, e.target_id)]
        return EdgeList(edges=found)

    @api.delete("/edges", status_code=204, tags=["edges"])
    def delete_edge(
        who: Who,
        source_id: Annotated[int, Query(ge=1, le=MAX_ID)],
        target_id: Annotated[int, Query(ge=1, le=MAX_ID)],
        edge_type: Annotated[EdgeType, Query()] = EdgeType.RELATED,
    ) -> Response:
        """Delete one edge (either orientation for undirected types)."""
        visible_node(who, source_id)
        visible_node(who, target_id)
        if not graph.remove_edge(source_id, target_id, edge_type, tenant_ids=who.tenants):
            raise _not_found("edge", f"{source_id} -{edge_type.value}- {target_id}")
        return Response(status_code=204)

    # -- documents --------------------------------------------------------------------------

    @api.post("/documents", status_code=201, response_model=DocumentInfo, tags=["documents"])
    def add_document(body: DocumentIn, who: Who) -> DocumentInfo:
        """Chunk a document into nodes (consecutive chunks linked by ``related`` edges)."""
        who.require(body.tenant_id)
        try:
            return _safe_document(store.add_document(DocumentSpec(**body.model_dump())))
        except DocumentConflict as exc:
            raise ApiError(409, "conflict", str(exc)) from None

    @api.get("/documents", response_model=DocumentList, tags=["documents"])
    def list_documents(who: Who, tenant_id: TenantFilter) -> DocumentList:
        found = store.documents(scope(who, tenant_id))
        return DocumentList(documents=[_safe_document(d) for d in found])

    DocPath = Annotated[str, PathParam(pattern=ID_PATTERN)]

    @api.get(
        "/documents/{tenant_id}/{document_id}", response_model=DocumentInfo, tags=["documents"]
    )
    def get_document(tenant_id: DocPath, document_id: DocPath, who: Who) -> DocumentInfo:
        who.require(tenant_id)
        found = store.document(tenant_id, document_id)
        if found is None:
            raise ApiError(
                404, "not_found", f"tenant {tenant_id!r} has no document {document_id!r}"
            )
        return _safe_document(found)

    @api.delete("/documents/{tenant_id}/{document_id}", status_code=204, tags=["documents"])
    def delete_document(tenant_id: DocPath, document_id: DocPath, who: Who) -> Response:
        """Delete a document and its chunk nodes."""
        who.require(tenant_id)
        if not store.remove_document(tenant_id, document_id):
            raise ApiError(
                404, "not_found", f"tenant {tenant_id!r} has no document {document_id!r}"
            )
        return Response(status_code=204)

    return api


def _publish(
    state: ServerState,
    who: Caller,
    request: GraphContextRequest,
    result: GraphContextResponse,
    elapsed_ms: float,
) -> None:
    """One dashboard record per ``/api/context`` call (kind ``context``)."""
    used = result.stats.tokens_used
    shares: dict[str, int] = {}
    if request.max_tokens is not None:
        shares = {s.name: s.max or 0 for s in graph_budget(request.max_tokens).sections}
    rows = [
        ("entry_points", used.entry_points, len(result.entry_points)),
        ("expanded", used.context_nodes, len(result.context)),
        ("entities", used.entities, len(result.entities)),
    ]
    state.events.publish(
        RequestRecord(
            id=uuid.uuid4().hex,
            session_id=f"api:{who.name}",
            kind="context",
            format="context",
            path="/api/context",
            model=request.token_model,
            status=200,
            response_tags=(),  # nothing is tagged after a context call: the row is complete
            tokens_forwarded=result.stats.total_tokens,
            overhead_ms=elapsed_ms,
            context=preview("\n\n".join(item.content for item in to_context_items(result))),
            budget=tuple(
                BudgetRow(section=name, budget=shares.get(name, 0), used=tokens, items=items)
                for name, tokens, items in rows
            ),
            extra={
                "query": clip(request.query),
                "query_chars": len(request.query),
                "tenants": list(request.tenant_ids),
                "stats": result.stats.model_dump(),
            },
        )
    )
