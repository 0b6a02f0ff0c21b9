"""The storage interfaces: what the engine, retrieval, graph and server code may ask of a store.

Every backend (``store/sqlite/``: the embedded default; ``store/postgres/``: many processes
and hosts sharing one database) implements these Protocols, and the conformance suite beside
them (``store/conformance/``) runs unchanged against each. The invariants below are the
contract: a backend that breaks one fails the suite.

``MemoryStorage`` is the core the hot paths use together (sessions, raw turns, tags, vectors,
search, compaction, branches and the derive's writes); the rest of the memory store is its
facets (``store/facets.py``), attributes of the store: ``store.records``, ``store.vocab``,
``store.jobs``, ``store.costs``, ``store.paging`` and ``store.transfer``.

**Memory store invariants** (``MemoryStorage``):

- *Raw turns are append-only.* A turn is never updated; seqs run 1, 2, 3 … per session with
  no gap; ``content_hash`` is the SHA-256 of the message's canonical JSON. Only
  ``delete_session`` removes turns (all of one session's, with everything derived).
- *Atomic writes.* ``append_turns``, ``commit_exchange`` (turns + their ``derive`` job),
  ``compact`` (segments + watermark) and ``set_tags_many`` are each one transaction: after a
  crash a reader sees all of it or none of it. ``batch()`` makes several writes one.
- *Ids are never reused.* Session ids are unique for the store's life; segment and job ids
  only grow. ``commit_exchange(expect_last=n)`` raises ``BranchMoved`` instead of appending
  when another writer moved the session past ``n`` (optimistic concurrency across processes).
- *Incarnations and generations.* A session gets its incarnation (``born``) when it is
  created (``create_session``, ``fork``, ``load_session``): an integer from a store-wide
  counter that only grows, across every process sharing the store and whatever their clocks,
  so a session deleted and created again under its id has a new, larger one. Its
  ``generation`` is drawn again from the same counter by every write that changes its derived
  state in place (tags, segments, watermark, tag summaries); appends draw nothing. A process
  that keeps what it read of a session (turn keys, vectors, topic hints) compares these
  (``session_version``, ``turn_texts_with_incarnation``) to tell a rewrite from turns
  appended.
- *Scoping.* A session belongs to one principal (the keyed hash of the credential that wrote
  it, ``''`` for the library's own). Lookups by content (``turns_with_key``,
  ``latest_session``) never cross principals.
- *Branch ancestry.* ``fork(session, upto)`` makes a session whose turns are its parent's
  ``1..upto`` with their tags, vectors and wholly-contained segments, and nothing the parent
  said later; ``SessionRecord.parent_id``/``fork_seq`` record where it came from.
- *Work items.* Jobs are claimed by one worker at a time across every process sharing the
  store (``jobs.claim_job``): a running job whose lease has passed, or whose owner is gone, is
  claimed again; at most one job of a kind is pending per session.
- *Generations.* ``session_version`` is ``(born, generation)``, numbers drawn from one
  store-wide increasing counter: ``born`` when the session row is made (``create_session``,
  ``fork``, ``load_session``: a session deleted and written again under the same id gets a new
  one), ``generation`` then and again on every write that changes the session's derived state
  in place — its turn tags (``tag_turn``, ``set_turn_tags``, ``set_tags_many``), segments and
  watermark (``compact``), tag summaries. Appends (turns, vectors) draw nothing. A process
  caching anything of a session keys it by these, so another process's writes never leave it
  stale.
- *Request records* (the dashboard's, ``records.put_records``): upserted by id, each write drawing a
  new store-wide ``change``; the newest ``keep`` by first write, and at most ``max_bytes`` of
  bodies, are kept.
- *Ranking is the backend's to keep identical.* ``search_turns``/``search_segments`` score
  with the same BM25 (FTS5's: k1 1.2, b 0.75, the whole table's statistics) over the same
  terms (``store.text.query_terms``; Porter-stemmed ``unicode61`` tokens), so a recall gives
  the same answer whichever backend holds the conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from contextfold.items import Message
from contextfold.store.facets import (
    CostStorage,
    JobStorage,
    PagingStorage,
    RecordStorage,
    TransferStorage,
    VocabularyStorage,
)
from contextfold.store.models import (
    NewSegment,
    PendingDerive,
    SessionRecord,
    StoredSegment,
    StoredTurn,
    TurnRow,
)
from contextfold.tokens import TokenCounter

__all__ = [
    "CostStorage",
    "JobStorage",
    "MemoryStorage",
    "PagingStorage",
    "RecordStorage",
    "TransferStorage",
    "VocabularyStorage",
]


@runtime_checkable
class MemoryStorage(Protocol):
    """Conversation memory: sessions, raw turns and everything derived from them."""

    #: Where the store lives, as given (a file path, ``":memory:"`` or a database URL with
    #: its password masked).
    path: str
    #: Counts each turn's text once, when it is appended.
    counter: TokenCounter

    # -- facets (``store/facets.py``) ------------------------------------------------------------

    @property
    def records(self) -> RecordStorage:
        """The dashboard's request records and the Responses API's response links."""
        ...

    @property
    def vocab(self) -> VocabularyStorage:
        """Tag aliases, tag splits and related-tag counts."""
        ...

    @property
    def jobs(self) -> JobStorage:
        """The queue of derived work (``commit_exchange`` queues a session's ``derive``)."""
        ...

    @property
    def costs(self) -> CostStorage:
        """The log of LLM calls with their cost."""
        ...

    @property
    def paging(self) -> PagingStorage:
        """Tag summaries and the working set."""
        ...

    @property
    def transfer(self) -> TransferStorage:
        """Whole sessions dumped and loaded as they were."""
        ...

    def close(self) -> None: ...

    def batch(self) -> AbstractContextManager[Any]:
        """One transaction around several writes of this thread: all of them or none."""
        ...

    # -- sessions ------------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        principal: str = "",
    ) -> str:
        """A new session (a random id when none is given); ``ConfigError`` when the id exists."""
        ...

    def session(self, session_id: str) -> SessionRecord:
        """The stored session; ``ConfigError`` when there is none."""
        ...

    def sessions(self) -> list[str]: ...

    def delete_session(self, session_id: str) -> bool:
        """Delete the session and everything stored for it (its cost rows stay, detached)."""
        ...

    def principal_of(self, session_id: str) -> str | None: ...

    def session_version(self, session_id: str) -> tuple[int, int] | None:
        """``(born, generation)`` of the session (see the module docstring), ``None`` when
        there is none: one indexed read, for the caches of every process to check. Read
        inside ``batch()`` it holds until the batch ends: no other writer changes the session
        in between (``MemoryEngine`` updates its cached vocabulary by it; SQLite's
        ``BEGIN IMMEDIATE`` gives that, a server database locks the session's row)."""
        ...

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        """(session, last seq) of the principal's conversation that stored a turn last."""
        ...

    # -- raw turns -----------------------------------------------------------------------------

    def last_seq(self, session_id: str) -> int: ...

    def append_turns(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[int]:
        """Append turns in one transaction; their seqs, consecutive after the last one."""
        ...

    def commit_exchange(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        partial: Sequence[bool] | None = None,
        expect_last: int | None = None,
        timestamps: Sequence[datetime] | None = None,
    ) -> list[int]:
        """Append ``messages`` and queue the session's ``derive`` job in one transaction
        (``timestamps``, one per message, default to now); ``BranchMoved`` when
        ``expect_last`` is given and the session's last seq differs."""
        ...

    def turns(
        self, session_id: str, start: int | None = None, end: int | None = None
    ) -> list[StoredTurn]: ...

    def turn_rows(self, session_id: str, seqs: Sequence[int]) -> dict[int, TurnRow]: ...

    def turn_times(self, session_id: str, seqs: Sequence[int]) -> dict[int, datetime]: ...

    def turn_token_counts(self, session_id: str, seqs: Sequence[int]) -> dict[int, int]: ...

    def turn_token_counts_after(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, int]]]:
        """The session's incarnation (``born``; ``None`` when there is no such session) and
        (seq, token count) of its turns after seq ``after``, in order, in one snapshot: what a
        cache of the session's token counts appends (turns never change while the session
        lives, so cached counts stay true until ``born`` changes)."""
        ...

    def turn_texts_after(self, session_id: str, after: int) -> list[tuple[int, str, str, str]]:
        """(seq, role, text, content hash) of the turns after ``after``, in order."""
        ...

    def turn_texts_with_incarnation(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, str, str, str]]]:
        """The session's incarnation and ``turn_texts_after(session_id, after)``, read in one
        snapshot (one query where the backend can): ``(None, [])`` when there is no such
        session. ``TurnKeys`` calls it on every request, with ``after`` its last known seq: a
        changed incarnation means the session was deleted and created again since."""
        ...

    def turn_openings_with_incarnation(
        self, session_id: str, after: int, chars: int
    ) -> tuple[int | None, list[tuple[int, str]]]:
        """The session's incarnation and (seq, the first ``chars`` characters of its text) of
        its turns after ``after``, in order, in one snapshot: ``(None, [])`` when there is no
        such session. The recall's author prior reads who opens each turn from it."""
        ...

    def turn_openings(self, session_id: str, seqs: Sequence[int], chars: int) -> dict[int, str]:
        """The first ``chars`` characters of each given turn's text (seqs not stored are left
        out): a recall's candidates' authors, while the session's are not kept yet."""
        ...

    def turn_hash(self, session_id: str, seq: int) -> str | None: ...

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        """seq -> match key of the turns with ``lo <= seq <= hi``; correct when another
        process has appended, or deleted and rewritten the session, since the last call."""
        ...

    def turns_with_key(
        self, principal: str, key: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[tuple[str, int]]:
        """(session, seq) of the principal's turns with match key ``key``, newest first."""
        ...

    def active_tokens(self, session_id: str) -> int:
        """Tokens of the session's turns at or above its compaction watermark."""
        ...

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str:
        """A new branch holding the turns ``1..upto`` of ``session_id``; its id. ``ConfigError``
        (nothing written) when the session or the turn is missing ("unknown session", "no
        turn"), or when ``session_id_new`` exists already ("already exists", as
        ``create_session``)."""
        ...

    # -- tags ----------------------------------------------------------------------------------

    def tag_turn(self, session_id: str, seq: int, tag: str, weight: float = 1.0) -> None: ...

    def set_turn_tags(
        self,
        session_id: str,
        seq: int,
        tags: Mapping[str, float],
        related: Sequence[str] = (),
    ) -> None: ...

    def set_tags_many(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
    ) -> None: ...

    def tag_counts(
        self, session_id: str, *, before: int | None = None, since: int | None = None
    ) -> dict[str, int]: ...

    def topic_counts(self, session_id: str) -> tuple[int, dict[str, int]]:
        """The compaction watermark and, read with it, ``tag_counts(before=watermark)`` for
        the tags some segment carries: from counts kept on write, one row per tag (not per
        tagged turn or segment)."""
        ...

    def turns_tagged(
        self, session_id: str, tags: Sequence[str]
    ) -> dict[int, list[tuple[str, bool]]]: ...

    def tag_overlap_scores(
        self, session_id: str, weights: Mapping[str, tuple[float, float]]
    ) -> dict[int, float]: ...

    def tag_overlap_top(
        self, session_id: str, weights: Mapping[str, tuple[float, float]], limit: int
    ) -> tuple[list[tuple[int, float]], float]: ...

    def tag_last_seen(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, datetime]: ...

    # -- vectors -------------------------------------------------------------------------------

    def turns_without_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> list[tuple[int, str]]: ...

    def last_vector_seq(self, session_id: str, model: str) -> int: ...

    def add_turn_vectors(
        self, session_id: str, model: str, seqs: Sequence[int], vectors: npt.NDArray[Any]
    ) -> None: ...

    def turn_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> tuple[list[int], npt.NDArray[np.float32]]: ...

    # -- full text -----------------------------------------------------------------------------

    def search_turns(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredTurn, float]]:
        """Turns matching any of ``query_terms(query)``, best first (higher score is better;
        ties by seq)."""
        ...

    def search_turn_seqs(
        self, session_id: str, query: str, limit: int = 10, *, common_limit: int | None = None
    ) -> list[tuple[int, float]]:
        """(seq, bm25 score) of the session's turns matching any query word, best first.
        ``common_limit``: a word in more than that many of the session's turns is left out
        (counted no further than the limit); a query of only such words finds nothing."""
        ...

    def search_turn_seqs_many(
        self,
        session_id: str,
        queries: Sequence[str],
        limit: int = 10,
        *,
        common_limit: int | None = None,
    ) -> list[list[tuple[int, float]]]:
        """``search_turn_seqs`` of each of ``queries``, in order, exactly (a message and its
        parts: a backend may read each word once)."""
        ...

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]: ...

    # -- compaction ----------------------------------------------------------------------------

    def compact(
        self,
        session_id: str,
        segments: Sequence[NewSegment],
        watermark: int,
        *,
        _before_commit: Callable[[], None] | None = None,
    ) -> list[int]:
        """Store ``segments`` and move the watermark in one transaction; raw turns untouched."""
        ...

    def segments(
        self, session_id: str, *, tag: str | None = None, full_text: bool = True
    ) -> list[StoredSegment]:
        """The session's segments, earliest first: only those carrying ``tag`` when given;
        with ``full_text=False`` each one's ``full_text`` is ``""``, not read (its
        ``full_tokens`` stay)."""
        ...

    # -- derive --------------------------------------------------------------------------------

    def mark_derived(self, session_id: str, seq: int) -> None: ...

    def begin_derive(
        self,
        session_id: str,
        *,
        context: int = 0,
        append: Sequence[Message] = (),
        timestamps: Sequence[datetime] | None = None,
    ) -> PendingDerive:
        """Start a derive done in line, in one transaction (one round trip where the backend
        has them): append the new turns ``append`` (as ``append_turns``, at most
        ``WRITE_CHUNK`` of them; ``timestamps``, one per message, default to now), drop the
        session's pending ``derive`` job (this derive covers every turn stored so far; a turn
        stored from here on queues a new one) and read the session's record, its live tokens
        (``active_tokens``) and its turns after ``derived_seq - context`` (the turns to
        derive, after the last ``context`` derived ones: the tagger's context). A crash
        before the derive's ``write_derived`` leaves those turns stored and not derived, for
        the session's next derive. ``ConfigError`` ("unknown session"), nothing written, when
        there is no session."""
        ...

    def write_derived(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
        derived_seq: int,
    ) -> tuple[int, int]:
        """``set_tags_many(session_id, tagged)`` and ``mark_derived(session_id, derived_seq)``
        in one transaction (one round trip where the backend has them); the session's
        generation just before the write and just after it, both read under the write's
        lock, so no other writer comes in between: what was derived from the session at the
        first (its tag counts) plus ``tagged`` is what the session holds at the second.
        ``ConfigError``, nothing written, when the session ("unknown session") or one of the
        turns ("no turn") is missing."""
        ...


# -- documents and the knowledge graph ---------------------------------------------------------

if TYPE_CHECKING:
    from contextfold.retrieval.base import Chunk, Embedder
    from contextfold.store.document_models import CatalogueEntry, DocumentRecord
    from contextfold.store.graph_models import (
        EdgeType,
        GraphView,
        KnowledgeEdge,
        KnowledgeNode,
        NodeType,
    )

__all__ += ["CatalogueStorage", "DocumentStorage", "GraphStorage"]


@runtime_checkable
class DocumentStorage(Protocol):
    """Documents, their chunks and chunk vectors: the source of truth of a ``DocumentIndex``.

    **Invariants** (the conformance suite ``store/conformance/documents.py`` checks
    each, on every backend):

    - *Derived and rebuildable.* The BM25 and vector indexes a ``DocumentIndex`` keeps in
      memory are derived from what is stored here and can always be rebuilt from it; nothing
      in them is stored only there.
    - *Corpus version.* ``version`` increases on every committed write (``add``, ``add_many``,
      ``remove``, ``clear``, ``add_vectors``) and on nothing else, and every store object on
      the same location reads the same number: a reader in another process compares it with
      the version its indexes reflect and rebuilds when it moved. A write that fails leaves it
      as it was.
    - *Corpus id.* ``corpus_id`` is a random id made with the database (not with the store
      object): every store object on it, now or after reopening, reads the same, and another
      database — one created later at the same location after the first was deleted, whose
      ``version`` starts again at 0 — has another. What is derived from a corpus and kept
      outside it (a ``DocumentIndex``'s saved BM25 folder) is stamped with both.
    - *Atomic writes.* ``add_many`` (documents, chunks, vectors and aliases), ``remove`` and
      ``add_vectors`` are each one transaction: all of it is stored, or none of it. A
      duplicate id fails the whole write with the backend's integrity error
      (``sqlite3.IntegrityError``, ``psycopg.IntegrityError``). ``atomic()`` makes every
      write inside it one transaction (re-ingesting a file: its new version and the removal
      of the old commit together); nested, it joins the open one; reads inside see its
      writes.
    - *Content addressing per tenant.* A tenant stores a text once (``find`` by content hash);
      every id it was stored or aliased under names it (``resolve``, ``ids_of``, oldest
      first) and an id names one document only. The document and its chunks and vectors go
      with its last id.
    - *Tenant scoping.* ``matching_chunks(tenants=…)`` and ``documents(tenant)`` never return
      another tenant's rows.
    - *Ids are never reused* by the store: document and chunk ids are the caller's
      (content-derived), and a removed id may only come back naming the same content.
    - *Order.* ``chunk_texts``, ``vectors``, ``chunks_without_vectors`` and ``ids_of`` list in
      insertion order (a re-stored vector moves to the end); ``documents`` by creation time,
      then id (byte order), then alias order — identical on every backend, so a rebuilt index
      ranks ties the same way.
    - *Vectors* come back as float32 numpy matrices, row *i* for id *i*, as they went in.
    """

    #: Where the store lives (a file path, ``":memory:"``, or a database URL with its
    #: password masked).
    path: str

    @property
    def version(self) -> int:
        """The corpus version: bumped by every committed write, shared by every process."""
        ...

    @property
    def corpus_id(self) -> str:
        """The database's random id, made with it and kept for its life (see above)."""
        ...

    def close(self) -> None: ...

    def atomic(self) -> AbstractContextManager[None]:
        """One transaction around every write made inside, on this thread: all commit at
        the end, or none does if anything inside raises."""
        ...

    def find(self, tenant: str, content_hash: str) -> str | None:
        """The storage id of the tenant's document with this content, if stored."""
        ...

    def resolve(self, doc_id: str) -> str | None:
        """The storage id of the document ``doc_id`` (its own id or an alias) names."""
        ...

    def ids_of(self, storage_ids: Iterable[str]) -> dict[str, list[str]]:
        """Every id each stored document answers to, oldest first."""
        ...

    def chunk_ids(self, storage_id: str) -> list[str]:
        """The ids of a stored document's chunks, in order."""
        ...

    def add(
        self,
        document: DocumentRecord,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32] | None = None,
        *,
        model: str | None = None,
    ) -> None:
        """Store one document with its chunks (and vectors, row *i* for chunk *i*)."""
        ...

    def add_many(
        self,
        batch: Sequence[tuple[DocumentRecord, Sequence[Chunk], npt.NDArray[np.float32] | None]],
        *,
        model: str | None = None,
        aliases: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Store several documents and ``(alias, storage id)`` pairs in one transaction;
        ``ConfigError`` (before anything is written) when vectors and chunks disagree."""
        ...

    def remove(self, doc_id: str) -> list[str]:
        """Remove the id ``doc_id``; the document goes with its last id. The chunk ids
        removed (none while other ids still name the document)."""
        ...

    def clear(self) -> None: ...

    def count(self) -> tuple[int, int]:
        """``(document ids, chunks)``."""
        ...

    def documents(self, tenant: str | None = None) -> list[DocumentRecord]:
        """One record per document id (an alias shows its document's text and metadata)."""
        ...

    def chunk_texts(self) -> Iterator[tuple[str, str]]:
        """Every ``(chunk id, text)`` in insertion order."""
        ...

    def vectors(self, model: str) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Every stored vector of ``model``: ``(chunk ids, matrix)`` in insertion order."""
        ...

    def chunks_without_vectors(self, model: str) -> list[tuple[str, str]]:
        """``(chunk id, text)`` of every chunk with no vector from ``model`` yet."""
        ...

    def add_vectors(self, ids: Sequence[str], vectors: npt.NDArray[np.float32], model: str) -> None:
        """Store (or replace) vectors of existing chunks in one transaction."""
        ...

    def chunks(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Chunk rows by id, joined with their document: ``doc_id`` (its first id),
        ``doc_ids``, ``index``, ``text``, ``start``, ``end``, ``token_count``, ``tenant``,
        ``source`` and ``metadata`` (chunk metadata over document metadata)."""
        ...

    def matching_chunks(
        self, *, tenants: Sequence[str] | None = None, filters: Mapping[str, Any] | None = None
    ) -> set[str]:
        """Ids of the chunks of ``tenants``' documents whose metadata (chunk over document)
        equals every ``filters`` value (a list matches any of its items; keys are plain
        names, dotted for nested ones, else ``ConfigError``)."""
        ...


@runtime_checkable
class GraphStorage(Protocol):
    """The knowledge graph: typed nodes and weighted, typed edges, per tenant.

    **Invariants** (checked by ``store/conformance/graph.py`` on every backend):

    - *Node ids are never reused.* The store assigns ids in increasing order; a deleted
      node's id — even the highest — is never assigned again, after a reopen too, so an id a
      client or a document still holds can never come to name someone else's node. A node
      added with an explicit id replaces that node's fields and keeps its edges; the next
      assigned id is above every id ever stored.
    - *Atomic writes.* ``add_nodes``, ``add_edges``, ``remove_nodes``, ``remove_edge`` and the
      auto-linkers are each one transaction; ``transaction()`` makes several one (the
      graph's own writes join it). An edge naming a missing node fails the whole write
      (``ConfigError``).
    - *Edges.* An undirected edge (``related``, ``shared_tag``, ``similar``) is stored once,
      smaller id first; re-adding an edge replaces its weight; auto-linking keeps existing
      edges; removing a node removes every edge touching it.
    - *Tenant scoping.* ``view(tenants)`` holds only those tenants' nodes and the edges with
      both ends among them; removals given ``tenant_ids`` never touch another tenant's rows
      (the check and the delete are one statement).
    - *Views are never stale.* ``view`` is cached, and the cache is dropped on any write by
      this object or by any other object or process sharing the location.
    - *Order.* ``nodes`` and ``get_nodes`` by id; ``edges`` by (source, target, edge type in
      ``EdgeType`` declaration order); neighbours in a view as ``GraphView`` says.
    - *Derived.* Node embeddings (``embed_nodes``) and search indexes are kept in memory,
      derived from the stored nodes and rebuilt from them.
    """

    #: Where the graph lives (a file path, ``":memory:"`` or a database URL, password masked).
    path: str

    def close(self) -> None: ...

    def transaction(self) -> AbstractContextManager[Any]:
        """One transaction over several writes of this thread: all of them or none."""
        ...

    def add_node(
        self,
        tenant_id: str,
        node_type: NodeType | str,
        title: str,
        *,
        summary: str | None = None,
        content: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        node_id: int | None = None,
    ) -> KnowledgeNode: ...

    def add_nodes(
        self, nodes: Iterable[KnowledgeNode | Mapping[str, Any]]
    ) -> list[KnowledgeNode]: ...

    def add_edge(
        self,
        source_id: int,
        target_id: int,
        edge_type: EdgeType | str = ...,
        weight: float = 1.0,
    ) -> KnowledgeEdge: ...

    def add_edges(self, edges: Iterable[KnowledgeEdge]) -> list[KnowledgeEdge]: ...

    def remove_node(self, node_id: int, *, tenant_ids: Iterable[str] | None = None) -> bool: ...

    def remove_nodes(
        self, node_ids: Iterable[int], *, tenant_ids: Iterable[str] | None = None
    ) -> int: ...

    def remove_edge(
        self,
        source_id: int,
        target_id: int,
        edge_type: EdgeType | str = ...,
        *,
        tenant_ids: Iterable[str] | None = None,
    ) -> bool: ...

    def auto_link_shared_tags(
        self,
        min_shared: int = 1,
        weight: float = 0.5,
        *,
        tenant_ids: Iterable[str] | None = None,
    ) -> int: ...

    def auto_link_similar(
        self,
        embedder: Embedder,
        threshold: float = 0.8,
        top_k: int = 5,
        weight: float | None = None,
        *,
        tenant_ids: Iterable[str] | None = None,
    ) -> int: ...

    def get_node(self, node_id: int) -> KnowledgeNode | None: ...

    def get_nodes(self, node_ids: Iterable[int]) -> list[KnowledgeNode]: ...

    def existing(self, node_ids: Iterable[int]) -> set[int]: ...

    def tenant_counts(self) -> dict[str, int]: ...

    def nodes(
        self,
        *,
        tenant_ids: Iterable[str] | None = None,
        node_types: Iterable[NodeType | str] | None = None,
    ) -> list[KnowledgeNode]: ...

    def edges(self, *, tenant_ids: Iterable[str] | None = None) -> list[KnowledgeEdge]: ...

    def view(self, tenant_ids: Iterable[str]) -> GraphView: ...

    def embed_nodes(
        self, embedder: Embedder, nodes: Sequence[KnowledgeNode]
    ) -> npt.NDArray[np.float32]: ...


@runtime_checkable
class CatalogueStorage(Protocol):
    """The context API's document catalogue: which graph nodes each loaded document became,
    under ``(tenant_id, document_id)``. It lives with its ``graph`` (same file or database)
    and its writes join ``graph.transaction()``, so a document's nodes, edges and entry
    commit together or not at all.

    **Invariants** (``store/conformance/graph.py``): one entry per
    ``(tenant_id, document_id)`` (a second insert fails with the backend's integrity error);
    ``entries`` and ``counts`` never return another tenant's rows when tenants are given,
    and list by tenant then document id in byte order; ``node_ids`` are stored as given —
    which of them are still the document's chunks is the caller's to check against the
    graph (node ids are never reused, so a stale id can never name another tenant's node).
    """

    @property
    def graph(self) -> GraphStorage:
        """The knowledge graph the catalogue lives with."""
        ...

    def close(self) -> None:
        """Close the catalogue and its graph."""
        ...

    def get(self, tenant_id: str, document_id: str) -> CatalogueEntry | None: ...

    def entries(self, tenant_ids: Iterable[str] | None = None) -> list[CatalogueEntry]: ...

    def insert(self, entry: CatalogueEntry) -> None: ...

    def delete(self, tenant_id: str, document_id: str) -> bool: ...

    def counts(self) -> dict[str, int]: ...
