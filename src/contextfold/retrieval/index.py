"""``DocumentIndex``: documents in, ranked chunks out — BM25, dense, or both fused with RRF.

A document store (``contextfold.store.protocols.DocumentStorage``: SQLite, or PostgreSQL for a
``postgresql://`` URL) holds documents, chunks and vectors; the BM25 index (bm25s) and the
vector index are derived from it, in memory, and rebuilt whenever the store's corpus version
moves — so an index notices documents another process added or removed before it searches.
For a file-backed index the BM25 index is saved next to the database (``<db>.bm25/``) stamped
with the store's corpus id and version and loaded memory-mapped when the stamp matches, so
opening a large corpus does not re-index it (a database deleted and created again on the same
path has another corpus id: it never loads the old corpus's index, and its saves replace it).

One index may be shared between threads (the HTTP server does): writes hold the index's lock,
searches read an immutable BM25 snapshot and never wait for a rebuild another thread started,
and a hit whose document another writer removed meanwhile is left out. The saved BM25 index is
versioned: ``<db>.bm25/`` holds one folder per save and a ``CURRENT`` file naming the one to
load, replaced atomically (``os.replace``) under a file lock, so neither another process nor a
second ``DocumentIndex`` on the same file sees a half-written or half-swapped index; a saved
index that cannot be read or does not match the store is rebuilt from the store, which is the
source of truth.

>>> from contextfold.testing import HashEmbedder
>>> index = DocumentIndex(embedder=HashEmbedder())
>>> doc = index.add_document("Refunds are processed within 14 days of the request.")
>>> hit = index.search("how long do refunds take", k=1)[0]
>>> hit.match_source, hit.text[:7]
('hybrid', 'Refunds')
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from contextfold.errors import ConfigError, StoreError
from contextfold.items import ContextItem, QueryBundle, SourceType, valid_text
from contextfold.retrieval.base import Chunk, Chunker, Embedder, SearchHit, chunk_id, content_hash
from contextfold.retrieval.dense import NumpyVectorIndex, USearchVectorIndex, VectorIndex
from contextfold.retrieval.floor import RelevanceFloor, resolve_floor
from contextfold.retrieval.fusion import FusedHit, convex, mmr, rrf
from contextfold.retrieval.sparse import BM25Index, BM25Snapshot
from contextfold.store import is_database_url, open_document_store
from contextfold.store.document_models import DocumentRecord
from contextfold.store.document_models import now as _now

if TYPE_CHECKING:
    import numpy.typing as npt

    from contextfold.store.protocols import DocumentStorage
    from contextfold.tokens import TokenCounter

__all__ = ["AddResult", "DocumentIndex", "SearchMode", "document_id", "hits_to_items"]

SearchMode = Literal["bm25", "dense", "hybrid"]
_MODES = ("bm25", "dense", "hybrid")


def document_id(tenant: str, digest: str) -> str:
    """The id a document gets when none is given: from its tenant and its text's hash."""
    return content_hash(f"{tenant}\x1f{digest}")[:20]


@dataclass(frozen=True)
class AddResult:
    """What ``add_document`` did: the document id, whether it was new, its chunk ids.

    ``alias_of`` names the document this id became another id of (the same text was already
    stored under it): nothing new was indexed, and ``chunk_ids`` are the shared chunks."""

    doc_id: str
    added: bool
    chunk_ids: list[str] = field(default_factory=list)
    alias_of: str | None = None


@dataclass
class _Signals:
    rankings: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)  # BM25 score / the query's ceiling


FloorSetting = RelevanceFloor | Mapping[str, float] | bool | None


# Theoretical minimum score of each signal, for min-max normalisation (TM2C2).
_MINIMUMS = {"bm25": 0.0, "vector": -1.0}

# The saved BM25 index: ``<db>.bm25/CURRENT`` names the folder (``v-…``) of the current save.
_CURRENT = "CURRENT"
_SAVE_LOCK = ".lock"
_STAMP = "corpus_version.json"  # (also the whole stamp of the layout before versioned folders)
_LOAD_TRIES = 3

CLOSED = "the document index is closed; open a new DocumentIndex to use it again"

# What a metadata filter compares with: JSON scalars, or a list of them (matches any).
_FILTER_SCALARS = (str, int, float, bool, type(None))


def _unique() -> str:
    """A name no other save (another process, thread or instance) uses at the same time."""
    return f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex}"


@contextmanager
def _save_lock(folder: Path) -> Iterator[None]:
    """Hold the BM25 folder's save lock: one save or clear at a time across processes
    (``fcntl``) and across ``DocumentIndex`` instances and threads of one process (each
    takes the lock through its own open file)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / _SAVE_LOCK).open("a+b") as handle:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX: one process per index file
            with _PROCESS_SAVE_LOCK:
                yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_PROCESS_SAVE_LOCK = threading.Lock()


def _int_arg(name: str, value: object, what: str) -> None:
    """``ConfigError`` unless ``value`` is an int (a bool is not one here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be {what}, got {type(value).__name__} {value!r}")


def _metadata_arg(name: str, metadata: object) -> None:
    """``ConfigError`` unless ``metadata`` is None or a dict of str keys that JSON can store
    (the message names the key that is not)."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise ConfigError(
            f"{name} must be a dict (or None), got {type(metadata).__name__} {str(metadata)[:80]!r}"
        )
    for key in metadata:
        if not isinstance(key, str):
            raise ConfigError(f"{name} keys must be str, got {type(key).__name__} {key!r}")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        for key, value in metadata.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{name} must hold JSON values (str, int, float, bool, None, lists and "
                    f"dicts of them): key {key!r} holds {type(value).__name__} "
                    f"{str(value)[:80]!r}; store it as a str or a number"
                ) from None
        raise ConfigError(f"{name} must hold JSON values: {exc}") from None


def _query_args(query: object, k: object, tenants: object, filters: object) -> None:
    """The argument checks ``search`` and ``search_documents`` share (types only: cheap)."""
    if not isinstance(query, str | QueryBundle):
        raise ConfigError(
            f"query must be a str or a QueryBundle, got {type(query).__name__} {str(query)[:80]!r}"
        )
    _int_arg("k", k, "an int (how many results)")
    if (
        tenants is not None
        and not isinstance(tenants, str)
        and (not isinstance(tenants, Collection) or not all(isinstance(t, str) for t in tenants))
    ):
        raise ConfigError(
            f"tenants must be a tenant name (str), a list of them or None (every tenant), "
            f"got {type(tenants).__name__} {str(tenants)[:80]!r}"
        )
    if filters is not None and not isinstance(filters, Mapping):
        raise ConfigError(
            f"filters must be a dict of metadata name -> value (or None), got "
            f"{type(filters).__name__} {str(filters)[:80]!r}"
        )


def _filters_arg(filters: Mapping[str, Any]) -> None:
    """``ConfigError`` unless every filter is a str key with a JSON scalar value, or a list
    (tuple, set) of them."""
    for key, value in filters.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"filters keys must be metadata names (str), got {type(key).__name__} {key!r}"
            )
        values = value if isinstance(value, list | tuple | set | frozenset) else (value,)
        for v in values:
            if not isinstance(v, _FILTER_SCALARS):
                raise ConfigError(
                    f"filters[{key!r}] must be a str, int, float, bool or None, or a list of "
                    f"them, got {type(v).__name__} {str(v)[:80]!r}"
                )


def _tenant_list(tenants: str | Sequence[str] | None) -> Sequence[str] | None:
    """A tenant given as one string is that tenant, not its letters."""
    return [tenants] if isinstance(tenants, str) else tenants


@dataclass
class _Pending:
    record: DocumentRecord
    chunks: list[Chunk]


def hits_to_items(hits: Sequence[SearchHit], *, priority: int = 5) -> list[ContextItem]:
    """Search hits as retrieval ``ContextItem``s (score, ranks and match source in metadata)."""
    return [
        ContextItem(
            id=hit.id,
            content=hit.text,
            source=SourceType.RETRIEVAL,
            score=hit.score,
            priority=priority,
            metadata={
                **hit.metadata,
                "match_source": hit.match_source,
                "ranks": dict(hit.ranks),
                "scores": dict(hit.scores),
            },
        )
        for hit in hits
    ]


class _ReadWriteLock:
    """Many readers at once, or one writer (and while a writer waits, no new reader: a stream
    of searches never starves a write). The vector index is read by searches side by side
    (numpy's products release the GIL) and changed in place by writes.

    >>> lock = _ReadWriteLock()
    >>> with lock.reading(), lock.reading():  # readers share it
    ...     pass
    >>> with lock.writing():
    ...     pass
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting = 0  # writers waiting

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writing and not self._readers)
            finally:
                self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class DocumentIndex:
    """A searchable collection of chunked documents (the seed's ``FAISSMemory(path=...)``).

    ``path=None`` keeps everything in memory; a path is a SQLite file that persists (a folder,
    or a path without a suffix, holds ``documents.db`` and the saved BM25 index); a
    ``postgresql://`` URL keeps the documents in PostgreSQL, shared by every process that opens
    it (the BM25 index is then rebuilt in memory on open, not saved). The
    embedder defaults to the offline all-MiniLM-L6-v2 (loaded on first use); ``embedder=False``
    makes a BM25-only index. Filters (tenants, metadata) apply before ranking.

    Hybrid search fuses BM25 and dense scores. ``fusion="convex"`` (the default) sums
    theoretically min-max normalised scores, ``alpha`` for BM25 and ``1 − alpha`` for cosine;
    ``alpha=0.2`` was chosen on SciFact's *train* split and gives nDCG@10 0.735 on its test
    split against 0.715 for plain RRF. ``fusion="rrf"`` is Reciprocal Rank Fusion (``rrf_k``,
    per-signal ``weights``).

    ``relevance_floor`` drops hits whose evidence is too weak to be an answer (see
    ``contextfold.retrieval.floor``): ``True`` (the default) uses the floors calibrated on
    SciFact's train split, ``False`` keeps every hit (the behaviour before the floor), a
    ``RelevanceFloor`` or a mapping such as ``{"dense": 0.4}`` sets them.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        embedder: Embedder | Literal[False] | None = None,
        chunker: Chunker | None = None,
        bm25: BM25Index | None = None,
        vector_index: Literal["numpy", "usearch"] = "numpy",
        fusion: Literal["convex", "rrf"] = "convex",
        alpha: float = 0.2,
        rrf_k: int = 60,
        weights: Mapping[str, float] | None = None,
        fetch_k: int = 100,
        relevance_floor: FloorSetting = True,
    ) -> None:
        if fusion not in ("convex", "rrf"):
            raise ConfigError(f"fusion must be 'convex' or 'rrf', got {fusion!r}")
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(
                f"alpha (the BM25 share of convex fusion) must be in [0, 1], got {alpha}"
            )
        self.fusion, self.alpha = fusion, alpha
        resolve_floor(relevance_floor)  # fail early on a bad setting
        self._floor_setting = relevance_floor
        if path is not None and is_database_url(path):
            self.path: Path | None = None
            self.store: DocumentStorage = open_document_store(str(path))
        else:
            if path is not None and (Path(path).is_dir() or not Path(path).suffix):
                path = Path(path) / "documents.db"  # a folder, as the seed's FAISSMemory(path=)
            self.path = None if path is None else Path(path)
            self.store = open_document_store(":memory:" if self.path is None else self.path)
        self._embedder_arg = embedder
        self._embedder: Embedder | None = None
        self._chunker = chunker
        self.rrf_k, self.weights, self.fetch_k = rrf_k, dict(weights or {}), fetch_k
        self._vector_kind = vector_index
        self._lock = threading.RLock()  # writes and rebuilds; searches read snapshots
        self._vectors_lock = _ReadWriteLock()  # the vector index changes in place
        self._ahead: dict[str, npt.NDArray[np.float32]] = {}  # chunk text -> its vector
        self._bm25 = bm25 if bm25 is not None else BM25Index()
        self._bm25_params = {
            "k1": self._bm25.k1,
            "b": self._bm25.b,
            "method": self._bm25.method,
            "stemmer": self._bm25.stemmer,
            "stopwords": self._bm25.stopwords,
        }
        self._vectors: VectorIndex | None = None
        self._loaded = False
        self._synced = -1  # the store version the derived indexes reflect
        self._closed = False

    def close(self) -> None:
        """Close the document store (a PostgreSQL store gives its connections back). Every
        call after it raises ``StoreError`` ("the document index is closed"); closing again
        does nothing."""
        with self._lock:  # not under a write in flight
            if self._closed:
                return
            self._closed = True
            self.store.close()

    def __enter__(self) -> DocumentIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(CLOSED)

    # -- components ------------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder | None:
        if self._embedder_arg is False:
            return None
        if self._embedder is None:
            if self._embedder_arg is None:
                from contextfold.retrieval.embedders import default_embedder

                self._embedder = default_embedder()
            else:
                self._embedder = self._embedder_arg
        return self._embedder

    @property
    def chunker(self) -> Chunker:
        if self._chunker is None:
            from contextfold.retrieval.chunking import TextChunker

            self._chunker = TextChunker()
        return self._chunker

    @property
    def version(self) -> int:
        """Increases on every write; caches keyed by it are never stale."""
        self._check_open()
        return self.store.version

    def __len__(self) -> int:
        self._check_open()
        return self.store.count()[1]

    def _new_vector_index(self, dim: int) -> VectorIndex:
        if self._vector_kind == "usearch":
            return USearchVectorIndex(dim)
        return NumpyVectorIndex(dim)

    def _bm25_dir(self) -> Path | None:
        return None if self.path is None else self.path.with_name(self.path.name + ".bm25")

    def _ensure_loaded(self) -> None:
        """Bring the derived indexes in line with the store: on first use, and again whenever
        another writer (another process or ``DocumentIndex`` on the same file) changed it."""
        if self._loaded and self.store.version == self._synced:
            return
        with self._lock:
            if self._loaded and self.store.version == self._synced:
                return
            embedder = self.embedder
            if embedder is not None:
                missing = self.store.chunks_without_vectors(embedder.name)
                for start in range(0, len(missing), 256):  # e.g. ingested with --no-embed
                    part = missing[start : start + 256]
                    vectors = embedder.embed([text for _, text in part])
                    self.store.add_vectors([i for i, _ in part], vectors, embedder.name)
            # The version first, the rows after: a write landing in between makes the next
            # check rebuild again, never leaves the indexes behind a version they claim.
            # Built aside and swapped in at the end: a search on another thread meanwhile
            # reads the previous indexes whole, never an empty or half-built one.
            version = self.store.version
            bm25 = self._load_saved(version)
            if bm25 is None or len(bm25) == 0:
                bm25 = self._bm25.empty_copy()
                pairs = list(self.store.chunk_texts())
                if pairs:
                    ids, texts = zip(*pairs, strict=True)
                    bm25.add(list(ids), list(texts))
            index: VectorIndex | None = None
            if embedder is not None:
                ids_v, matrix = self.store.vectors(embedder.name)
                if ids_v:
                    index = self._new_vector_index(matrix.shape[1])
                    index.add(ids_v, matrix)
            with self._vectors_lock.writing():
                self._bm25, self._vectors = bm25, index
            self._synced = version
            self._loaded = True

    def _saved_pointer(self, folder: Path) -> dict[str, Any] | None:
        """What ``CURRENT`` says (the saved version, its params and folder), or None."""
        try:
            pointer = json.loads((folder / _CURRENT).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return pointer if isinstance(pointer, dict) else None

    def _load_saved(self, version: int) -> BM25Index | None:
        """The saved BM25 index when it was saved from this database (its ``corpus_id``) at
        ``version`` with this index's params; None when there is none, it is another
        database's (one deleted since, whose versions this one's repeat) or a save without
        a corpus id, another version, or it cannot be read (a save swapped it and removed
        the old folder meanwhile, a crash): the caller rebuilds from the store."""
        folder = self._bm25_dir()
        if folder is None or not folder.is_dir():
            return None
        for _ in range(_LOAD_TRIES):  # a save may swap CURRENT between reading it and loading
            pointer = self._saved_pointer(folder)
            if pointer is None:
                return None
            if not self._same_corpus(pointer) or pointer.get("version") != version:
                return None
            saved = folder / str(pointer.get("folder", ""))
            if saved == folder or saved.parent != folder:
                return None
            try:
                return BM25Index.load(saved, mmap=True)
            except (StoreError, OSError, ValueError, KeyError):
                continue
        return None

    def _wrote(self, before: int) -> None:
        """After our own write (which bumps the version once): still in sync only when the
        version moved by exactly that one — another writer's change, before or after ours,
        leaves ``_synced`` behind, so the next search rebuilds."""
        if self._synced == before and self.store.version == before + 1:
            self._synced = before + 1

    def _attach_texts(self) -> None:
        """Make the BM25 index extendable (a memory-mapped index loaded from disk has no
        texts). When the store moved on since it was loaded (another process wrote), its
        ids no longer match: rebuild it from the store's texts instead. ``_synced`` stays
        where it was, so the next search brings the vectors in line too."""
        if self._bm25.has_texts:
            return
        texts = dict(self.store.chunk_texts())
        try:
            self._bm25.set_texts(texts)
        except StoreError:
            fresh = self._bm25.empty_copy()
            if texts:
                fresh.add(list(texts), list(texts.values()))
            self._bm25 = fresh

    # -- writing ---------------------------------------------------------------------------

    def add(self, text: str, metadata: dict[str, Any] | None = None) -> str:
        """Store ``text`` as one chunk, unsplit (the seed's ``memory.add``); returns its id."""
        result = self.add_document(text, metadata, chunk=False)
        return result.chunk_ids[0] if result.chunk_ids else result.doc_id

    def add_document(
        self,
        text: str,
        metadata: dict[str, Any] | None = None,
        *,
        tenant: str = "default",
        source: str | None = None,
        doc_id: str | None = None,
        chunk: bool = True,
        chunker: Chunker | None = None,
    ) -> AddResult:
        """Chunk, embed and index one document. The same text in the same tenant is stored
        once: adding it again returns ``added=False``, under the existing id, or under
        ``doc_id`` when that is a new id, which then becomes an alias of the stored document:
        search reports both ids and removing one keeps the other."""
        _metadata_arg("metadata", metadata)
        return self.add_documents(
            [(text, metadata)],
            tenant=tenant,
            source=source,
            doc_ids=[doc_id],
            chunk=chunk,
            chunker=chunker,
        )[0]

    def add_documents(
        self,
        documents: Iterable[tuple[str, dict[str, Any] | None]],
        *,
        tenant: str = "default",
        source: str | None = None,
        doc_ids: Sequence[str | None] | None = None,
        chunk: bool = True,
        chunker: Chunker | None = None,
        batch_size: int = 256,
        progress: Callable[[int], None] | None = None,
    ) -> list[AddResult]:
        """Add many documents, embedding their chunks in batches across documents.

        ``progress(n)`` is called with the number of documents finished after each batch.
        Each batch (about ``batch_size`` chunks) is stored in one transaction, so an
        interruption keeps every batch finished before it and nothing of the one in flight.
        A document that is no ``(text, metadata)`` pair, or whose metadata JSON cannot hold,
        raises ``ConfigError`` before its batch is stored.
        """
        self._check_open()
        if isinstance(documents, str | bytes | Mapping) or not isinstance(documents, Iterable):
            raise ConfigError(
                f"documents must be a list of (text, metadata) pairs, got "
                f"{type(documents).__name__} {str(documents)[:80]!r}"
            )
        if not isinstance(tenant, str):
            raise ConfigError(f"tenant must be a str, got {type(tenant).__name__} {tenant!r}")
        if source is not None and not isinstance(source, str):
            raise ConfigError(
                f"source must be a str or None, got {type(source).__name__} {source!r}"
            )
        if doc_ids is not None and (
            isinstance(doc_ids, str | bytes) or not isinstance(doc_ids, Sequence)
        ):
            raise ConfigError(
                f"doc_ids must be a list of ids (str or None, one per document) or None, got "
                f"{type(doc_ids).__name__} {doc_ids!r}"
            )
        _int_arg("batch_size", batch_size, "an int >= 1 (chunks per transaction)")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size}")
        self._ensure_loaded()
        results: list[AddResult] = []
        pending: list[_Pending] = []
        aliases: list[tuple[str, str]] = []
        pending_chunks = 0
        seen: dict[str, tuple[str, list[str]]] = {}  # digest -> (storage id, its ids)
        for n, entry in enumerate(documents):
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise ConfigError(
                    f"documents[{n}] must be a (text, metadata) pair, got "
                    f"{type(entry).__name__} {str(entry)[:80]!r}"
                )
            text, metadata = entry
            if not isinstance(text, str):
                raise ConfigError(
                    f"the text of documents[{n}] must be a str, got {type(text).__name__}"
                )
            if not text.strip():
                raise ConfigError(f"document {n} is empty; nothing to index")
            _metadata_arg(f"the metadata of documents[{n}]", metadata)
            given = doc_ids[n] if doc_ids is not None and n < len(doc_ids) else None
            if given is not None and not isinstance(given, str):
                raise ConfigError(
                    f"doc_ids[{n}] must be a str or None, got {type(given).__name__} {given!r}"
                )
            named = source if source is not None else (metadata or {}).get("source")
            if named is not None and not isinstance(named, str):
                raise ConfigError(
                    f"the metadata 'source' of documents[{n}] must be a str (it is the "
                    f"document's source), got {type(named).__name__} {named!r}"
                )
            text = valid_text(text)  # (a lone surrogate cannot be hashed or stored)
            digest = content_hash(text)
            if digest not in seen:
                stored = self.store.find(tenant, digest)
                if stored is not None:
                    seen[digest] = (stored, self.store.ids_of([stored]).get(stored, []))
            if digest in seen:
                storage_id, names = seen[digest]
                if given is None or given in names:
                    results.append(AddResult(given or names[0], added=False))
                    continue
                aliases.append((given, storage_id))
                shared = next((p.chunks for p in pending if p.record.id == storage_id), None)
                chunk_ids = (
                    [c.id for c in shared]
                    if shared is not None
                    else self.store.chunk_ids(storage_id)
                )
                results.append(
                    AddResult(given, added=False, chunk_ids=chunk_ids, alias_of=names[0])
                )
                names.append(given)
                continue
            record = DocumentRecord(
                id=given or document_id(tenant, digest),
                tenant=tenant,
                content_hash=digest,
                source=named,
                text=text,
                metadata=dict(metadata or {}),
                created_at=_now(),
            )
            seen[digest] = (record.id, [record.id])
            chunks = self._chunks(record, chunker if chunk else None, split=chunk)
            pending.append(_Pending(record, chunks))
            results.append(AddResult(record.id, added=True, chunk_ids=[c.id for c in chunks]))
            pending_chunks += len(chunks)
            if pending_chunks >= batch_size:
                self._flush(pending, progress, aliases)
                pending, aliases, pending_chunks = [], [], 0
        self._flush(pending, progress, aliases)
        return results

    @contextmanager
    def embedded_ahead(
        self,
        texts: Sequence[str],
        *,
        tenant: str = "default",
        chunker: Chunker | None = None,
        batch_size: int = 256,
    ) -> Iterator[None]:
        """Embed the chunks of those ``texts`` not stored yet in ``tenant`` now, so that
        ``add_documents`` inside the block takes their vectors instead of embedding: the
        block can then hold a write transaction (``store.atomic()``) without holding the
        database's write lock while a large document embeds (minutes for a few thousand
        chunks, where another writer waits 5 s at most). Split with the ``chunker`` the block
        passes to ``add_documents``."""
        self._check_open()
        embedder = self.embedder
        if embedder is None:
            yield
            return
        self._ensure_loaded()
        chunks: list[str] = []
        for text in texts:
            text = valid_text(text)
            digest = content_hash(text)
            if not text.strip() or self.store.find(tenant, digest) is not None:
                continue
            record = DocumentRecord(
                id=document_id(tenant, digest),
                tenant=tenant,
                content_hash=digest,
                source=None,
                text=text,
                metadata={},
                created_at=_now(),
            )
            chunks += [c.text for c in self._chunks(record, chunker, split=True)]
        wanted = [c for c in dict.fromkeys(chunks) if c not in self._ahead]
        for start in range(0, len(wanted), batch_size):
            batch = wanted[start : start + batch_size]
            self._ahead.update(zip(batch, embedder.embed(batch), strict=True))
        try:
            yield
        finally:
            for chunk in wanted:
                self._ahead.pop(chunk, None)

    def _embed(self, embedder: Embedder, texts: list[str]) -> npt.NDArray[np.float32]:
        """The vectors of ``texts``: those ``embedded_ahead`` holds, the rest embedded now."""
        if not self._ahead:
            return embedder.embed(texts)
        # (read once: another thread's block may drop its vectors meanwhile)
        held = {t: v for t in dict.fromkeys(texts) if (v := self._ahead.get(t)) is not None}
        missing = [t for t in dict.fromkeys(texts) if t not in held]
        if missing:
            held.update(zip(missing, embedder.embed(missing), strict=True))
        return np.stack([held[t] for t in texts])

    def _chunks(
        self, record: DocumentRecord, chunker: Chunker | None, *, split: bool
    ) -> list[Chunk]:
        if split:
            chunks = (chunker or self.chunker).split(record.text, doc_id=record.id, metadata={})
        else:
            chunks = []
        if not chunks:
            text = record.text
            count = 0
            counter: TokenCounter | None = getattr(self._chunker, "counter", None)
            if counter is not None:
                count = counter.count(text)
            chunks = [
                Chunk(
                    id=chunk_id(record.id, 0, text),
                    doc_id=record.id,
                    index=0,
                    text=text,
                    start=0,
                    end=len(text),
                    token_count=count,
                    metadata={},
                )
            ]
        return chunks

    def _flush(
        self,
        pending: list[_Pending],
        progress: Callable[[int], None] | None,
        aliases: Sequence[tuple[str, str]] = (),
    ) -> None:
        if not pending and not aliases:
            return
        embedder = self.embedder
        texts = [c.text for p in pending for c in p.chunks]
        vectors = self._embed(embedder, texts) if embedder is not None else None
        with self._lock:
            self._attach_texts()
            batch = []
            offset = 0
            for p in pending:
                n = len(p.chunks)
                part = None if vectors is None else vectors[offset : offset + n]
                batch.append((p.record, p.chunks, part))
                offset += n
            before = self.store.version
            self.store.add_many(batch, model=embedder.name if embedder else None, aliases=aliases)
            self._wrote(before)
            for _, chunks, part in batch:
                self._bm25.add([c.id for c in chunks], [c.text for c in chunks])
                if part is not None:
                    with self._vectors_lock.writing():
                        if self._vectors is None:
                            self._vectors = self._new_vector_index(part.shape[1])
                        self._vectors.add([c.id for c in chunks], part)
        if progress is not None:
            progress(len(pending))

    def remove_document(self, doc_id: str) -> bool:
        """Delete the document id ``doc_id``; returns whether it existed. The chunks go with
        the document's last id: removing one of several ids of the same text keeps the rest
        searchable."""
        self._check_open()
        self._ensure_loaded()
        with self._lock:
            self._attach_texts()
            existed = self.store.resolve(doc_id) is not None
            before = self.store.version
            chunk_ids = self.store.remove(doc_id)
            self._wrote(before)
            self._bm25.remove(chunk_ids)
            with self._vectors_lock.writing():
                if self._vectors is not None:
                    self._vectors.remove(chunk_ids)
        return existed

    def clear(self) -> None:
        """Remove every document (the seed's ``clear()``)."""
        self._check_open()
        with self._lock:
            before = self.store.version
            self.store.clear()
            self._bm25.clear()
            with self._vectors_lock.writing():
                self._vectors = None
            self._synced = before
            self._loaded = True
            self._wrote(before)
            folder = self._bm25_dir()
            if folder is not None and folder.exists():
                with _save_lock(folder):
                    (folder / _CURRENT).unlink(missing_ok=True)
                    self._remove_saved(folder, keep=None)

    def save(self) -> None:
        """Persist the BM25 index next to the database (file-backed indexes only).

        Each save writes a new folder inside ``<db>.bm25/`` and then replaces the
        ``CURRENT`` file that names it (``os.replace``, atomic), under a lock that one save
        at a time holds across processes and instances; older folders are removed then. A
        reader (or this index, which may have the old files memory-mapped) never sees
        half-written or half-swapped files, and one that loses a race with the clean-up
        rebuilds from the store. A no-op when the saved index is this database's and already
        current or newer; another database's (one deleted since) is always replaced."""
        self._check_open()
        folder = self._bm25_dir()
        if folder is None:
            return
        self._ensure_loaded()
        with self._lock:  # the BM25 build and the version it reflects, taken together
            snapshot: BM25Snapshot = self._bm25.snapshot()
            version = self._synced
        if not self._saved_behind(self._saved_pointer(folder), version):
            return
        with _save_lock(folder):
            if not self._saved_behind(self._saved_pointer(folder), version):
                return  # another save wrote this version, or a newer one, meanwhile
            stamp = {
                "corpus": self.store.corpus_id,
                "version": version,
                "params": self._bm25_params,
            }
            name = f"v-{_unique()}"
            snapshot.save(folder / name)
            (folder / name / _STAMP).write_text(json.dumps(stamp), encoding="utf-8")
            pointer = folder / f"{_CURRENT}.{_unique()}.tmp"
            pointer.write_text(json.dumps({**stamp, "folder": name}), encoding="utf-8")
            pointer.replace(folder / _CURRENT)  # atomic (os.replace)
            self._remove_saved(folder, keep=name)

    def _saved_behind(self, pointer: dict[str, Any] | None, version: int) -> bool:
        """Whether a save at ``version`` would move the saved index forward: always when
        what ``CURRENT`` names is another database's (or has no corpus id) or was saved
        with other params, else when it is of an older version."""
        if pointer is None or not self._same_corpus(pointer):
            return True
        saved = pointer.get("version")
        return not isinstance(saved, int) or saved < version

    def _same_corpus(self, pointer: dict[str, Any]) -> bool:
        """Whether a saved index (its ``CURRENT``) was saved from this database, with this
        index's BM25 params."""
        return (
            pointer.get("corpus") == self.store.corpus_id
            and pointer.get("params") == self._bm25_params
        )

    @staticmethod
    def _remove_saved(folder: Path, *, keep: str | None) -> None:
        """Remove every saved version but ``keep`` (and files of the layout before versioned
        folders, and what a crashed save left); the caller holds the save lock. A reader
        that has a removed version memory-mapped keeps reading it (POSIX keeps the files
        until it unmaps them); one that was about to open it rebuilds from the store."""
        for entry in folder.iterdir():
            if entry.name in (_CURRENT, _SAVE_LOCK, keep):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    # -- reading ---------------------------------------------------------------------------

    def search(
        self,
        query: str | QueryBundle,
        k: int = 10,
        *,
        mode: SearchMode = "hybrid",
        tenants: str | Sequence[str] | None = None,
        filters: Mapping[str, Any] | None = None,
        weights: Mapping[str, float] | None = None,
        mmr_lambda: float | None = None,
        relevance_floor: FloorSetting = None,
    ) -> list[SearchHit]:
        """The ``k`` best chunks for ``query``.

        ``hybrid`` takes each signal's ``fetch_k`` best chunks and fuses the pool with the
        index's ``fusion`` (see the class docstring); a chunk both signals found is
        ``match_source="hybrid"``. ``weights`` (RRF fusion, e.g. ``{"bm25": 1.0, "vector":
        0.7}``) override the index's defaults; ``mmr_lambda`` re-ranks the fused list for
        diversity. ``tenants`` limits the search to those tenants' documents (a list of names,
        or one name as a string: ``tenants="acme"`` is the tenant ``acme``; None: every
        tenant). A ``QueryBundle`` with an ``embedding`` skips embedding the query. Hits
        below the relevance floor are left out (``relevance_floor`` overrides the index's for
        this call), so a query the corpus does not cover returns nothing.
        """
        self._check_open()
        _query_args(query, k, tenants, filters)
        if k <= 0:
            return []
        depth = max(k, self.fetch_k) if mode == "hybrid" or mmr_lambda is not None else k
        found = self._signals(query, mode, depth, tenants, filters)
        fused = self._above_floor(self._fuse(found, weights), found, mode, relevance_floor)
        if mmr_lambda is not None:
            fused = self._diversify(fused, k, mmr_lambda)
        fused = fused[:k]
        rows = self.store.chunks(hit.id for hit in fused)
        hits = []
        for hit in fused:
            row = rows.get(hit.id)
            if row is None:  # removed by another writer since the ranking: not an answer now
                continue
            signals = set(hit.ranks)
            source = "hybrid" if len(signals) > 1 else ("bm25" if "bm25" in signals else "vector")
            per_signal = {s: v[hit.id] for s, v in found.scores.items() if hit.id in v}
            if hit.id in found.shares:
                per_signal["bm25_share"] = found.shares[hit.id]
            if len(found.rankings) > 1:
                per_signal["hybrid"] = hit.score
            hits.append(
                SearchHit(
                    id=hit.id,
                    text=row["text"],
                    score=hit.score,
                    match_source=source,
                    ranks=dict(hit.ranks),
                    scores=per_signal,
                    metadata={
                        **row["metadata"],
                        "doc_id": row["doc_id"],
                        "doc_ids": list(row["doc_ids"]),
                        "chunk_index": row["index"],
                        "tenant": row["tenant"],
                        "source": row["source"],
                    },
                )
            )
        return hits

    def _signals(
        self,
        query: str | QueryBundle,
        mode: SearchMode,
        depth: int,
        tenants: str | Sequence[str] | None,
        filters: Mapping[str, Any] | None,
    ) -> _Signals:
        """Each signal's ranking ``depth`` deep, plus every pooled chunk's score under each
        signal (what score fusion needs)."""
        if mode not in _MODES:
            raise ConfigError(f"search mode must be one of {_MODES}, got {mode!r}")
        bundle = query if isinstance(query, QueryBundle) else QueryBundle(query_str=query)
        self._ensure_loaded()
        tenants = _tenant_list(tenants)
        filters = {**bundle.filters, **(filters or {})}
        _filters_arg(filters)
        allowed = (
            self.store.matching_chunks(tenants=tenants, filters=filters)
            if tenants is not None or filters
            else None
        )
        found = _Signals()
        bm25: BM25Snapshot | None = None
        bm25_scores = None
        if mode in ("bm25", "hybrid"):
            # One snapshot for every BM25 step: a rebuild on another thread cannot mix rows.
            bm25 = self._bm25.snapshot()
            bm25_scores = bm25.scores(bundle.query_str)
            found.rankings["bm25"] = bm25.search(
                bundle.query_str, depth, allowed=allowed, scores=bm25_scores
            )
        vector = None
        vectors = self._vectors  # (a rebuild may swap in another; this search keeps this one)
        if mode in ("dense", "hybrid"):
            vector = self._query_vector(bundle, required=mode == "dense")
            if vector is not None and vectors is not None:
                with self._vectors_lock.reading():  # a write changes it in place
                    found.rankings["vector"] = vectors.search(vector, depth, allowed=allowed)
        pool = list(dict.fromkeys(i for ranked in found.rankings.values() for i, _ in ranked))
        if bm25 is not None and bm25_scores is not None and "bm25" in found.rankings:
            found.scores["bm25"] = dict(zip(pool, bm25.score_of(bm25_scores, pool), strict=True))
            found.shares = bm25.shares(bundle.query_str, pool, scores=bm25_scores)
        if vector is not None and vectors is not None and "vector" in found.rankings:
            with self._vectors_lock.reading():
                sims = vectors.similarities(vector, pool)
            found.scores["vector"] = {
                i: s for i, s in zip(pool, sims, strict=True) if s is not None
            }
        return found

    @property
    def relevance_floor(self) -> RelevanceFloor | None:
        """The floor searches apply (None: off), resolved for this index's embedder."""
        return self._floor(None)

    def _floor(self, setting: FloorSetting) -> RelevanceFloor | None:
        chosen = self._floor_setting if setting is None else setting
        embedder = self.embedder
        return resolve_floor(chosen, embedder.name if embedder is not None else None)

    def _above_floor(
        self, hits: list[FusedHit], found: _Signals, mode: str, setting: FloorSetting
    ) -> list[FusedHit]:
        floor = self._floor(setting)
        if floor is None:
            return hits
        cosine = found.scores.get("vector", {})
        best = max(cosine.values(), default=None)
        return [
            h for h in hits if floor.keeps(mode, found.shares.get(h.id), cosine.get(h.id), best)
        ]

    def _fuse(self, found: _Signals, weights: Mapping[str, float] | None) -> list[FusedHit]:
        ranks = {s: {i: n for n, (i, _) in enumerate(r, 1)} for s, r in found.rankings.items()}
        if len(found.rankings) == 1:
            signal, ranked = next(iter(found.rankings.items()))
            return [FusedHit((i, score, {signal: n})) for n, (i, score) in enumerate(ranked, 1)]
        if self.fusion == "convex":
            return convex(
                found.scores,
                weights={"bm25": self.alpha, "vector": 1.0 - self.alpha},
                minimums=_MINIMUMS,
                ranks=ranks,
            )
        return rrf(
            {signal: [i for i, _ in ranked] for signal, ranked in found.rankings.items()},
            k=self.rrf_k,
            weights={**self.weights, **(weights or {})},
        )

    def search_documents(
        self,
        query: str | QueryBundle,
        k: int = 10,
        *,
        mode: SearchMode = "hybrid",
        depth: int | None = None,
        tenants: str | Sequence[str] | None = None,
        filters: Mapping[str, Any] | None = None,
        weights: Mapping[str, float] | None = None,
        relevance_floor: FloorSetting = None,
    ) -> list[tuple[str, float]]:
        """The ``k`` best documents as ``(doc id, score)``: a document scores as its best
        chunk (MaxP). Score fusion fuses chunks, then takes each document's best; RRF ranks
        documents per signal by their best chunk, then fuses the document rankings. This is
        the form document-level evaluation (SciFact, Cranfield) needs. Chunks below the
        relevance floor do not count, and ``tenants`` is a list or one name (as in
        ``search``)."""
        self._check_open()
        _query_args(query, k, tenants, filters)
        if depth is not None:
            _int_arg("depth", depth, "an int or None")
        if k <= 0:
            return []
        found = self._signals(query, mode, depth or max(4 * k, self.fetch_k), tenants, filters)
        chunk_ids = {cid for ranked in found.rankings.values() for cid, _ in ranked}
        # Every id of a chunk's document: one text stored under several ids answers as each.
        # A chunk another writer removed since the ranking has no row, and answers as nothing.
        stored = self.store.chunks(chunk_ids)
        doc_of = {cid: stored[cid]["doc_ids"] if cid in stored else [] for cid in chunk_ids}
        if len(found.rankings) > 1 and self.fusion == "rrf":
            floor = self._floor(relevance_floor)
            cosine = found.scores.get("vector", {})
            nearest = max(cosine.values(), default=None)
            doc_rankings = {
                signal: list(
                    dict.fromkeys(
                        doc_id
                        for cid, _ in ranked
                        if floor is None
                        or floor.keeps(mode, found.shares.get(cid), cosine.get(cid), nearest)
                        for doc_id in doc_of[cid]
                    )
                )
                for signal, ranked in found.rankings.items()
            }
            fused = rrf(doc_rankings, k=self.rrf_k, weights={**self.weights, **(weights or {})})
            return [(hit.id, hit.score) for hit in fused[:k]]
        best: dict[str, float] = {}
        for hit in self._above_floor(self._fuse(found, weights), found, mode, relevance_floor):
            for doc_id in doc_of[hit.id]:
                best.setdefault(doc_id, hit.score)
        return list(best.items())[:k]

    def _query_vector(self, bundle: QueryBundle, *, required: bool) -> np.ndarray | None:
        if bundle.embedding is not None:
            return np.asarray(bundle.embedding, dtype=np.float32)
        embedder = self.embedder
        if embedder is None:
            if required:
                raise ConfigError("dense search needs an embedder; this index has none")
            return None
        vector: np.ndarray = embedder.embed([bundle.query_str])[0]
        return vector

    def _diversify(self, fused: list[Any], k: int, lambda_: float) -> list[Any]:
        vectors = self._vectors
        if not isinstance(vectors, NumpyVectorIndex) or not fused:
            return fused
        cache = {}
        with self._vectors_lock.reading():
            for hit in fused:
                try:
                    cache[hit.id] = vectors.vector(hit.id)
                except KeyError:
                    continue
        relevance = {h.id: h.score / fused[0].score for h in fused}
        order = mmr(
            [h.id for h in fused],
            relevance,
            lambda a, b: float(cache[a] @ cache[b]) if a in cache and b in cache else 0.0,
            k=k,
            lambda_=lambda_,
        )
        by_id = {h.id: h for h in fused}
        return [by_id[i] for i in order]

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        """The ``Retriever`` protocol: hybrid search as retrieval ``ContextItem``s, so an index
        plugs straight into ``retriever_step``."""
        return hits_to_items(self.search(query, top_k))
