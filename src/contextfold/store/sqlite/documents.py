"""The document store: documents, their chunks and chunk vectors in SQLite.

It is the source of truth for a retrieval index (``contextfold.retrieval.index``): the BM25 and
vector indexes are derived from it and can always be rebuilt from it. Documents are
content-addressed per tenant, so ingesting the same text twice stores it once; every id it was
ingested under stays an id of it (``document_ids``: the first id and its aliases share the
chunks), so each one can be searched, resolved and removed on its own. ``atomic()`` joins
several writes into one transaction (``contextfold ingest`` replaces a re-ingested file's
earlier version with it: the new documents and the old ones' removal commit together).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError
from contextfold.retrieval.base import Chunk
from contextfold.store.document_models import DocumentRecord
from contextfold.store.document_models import now as _now
from contextfold.store.sqlite import MigrationRegistry, connect, select_in, transaction

__all__ = ["MIGRATIONS", "DocumentRecord", "DocumentStore"]

MIGRATIONS = MigrationRegistry("documents")


@MIGRATIONS.migration
def m001_create_documents(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE documents ("
        " id TEXT PRIMARY KEY, tenant TEXT NOT NULL, content_hash TEXT NOT NULL,"
        " source TEXT, text TEXT NOT NULL, metadata TEXT NOT NULL DEFAULT '{}',"
        " created_at TEXT NOT NULL, UNIQUE (tenant, content_hash))"
    )
    conn.execute(
        "CREATE TABLE chunks ("
        " id TEXT PRIMARY KEY,"
        " doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,"
        " idx INTEGER NOT NULL, text TEXT NOT NULL, start INTEGER NOT NULL, end_ INTEGER NOT NULL,"
        " token_count INTEGER NOT NULL, metadata TEXT NOT NULL DEFAULT '{}')"
    )
    conn.execute("CREATE INDEX chunks_by_doc ON chunks (doc_id, idx)")
    conn.execute(
        "CREATE TABLE chunk_vectors ("
        " chunk_id TEXT NOT NULL REFERENCES chunks(id) ON DELETE CASCADE,"
        " model TEXT NOT NULL, dim INTEGER NOT NULL, vector BLOB NOT NULL,"
        " PRIMARY KEY (chunk_id, model))"
    )
    conn.execute("CREATE TABLE corpus_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO corpus_meta (key, value) VALUES ('version', '0')")


@MIGRATIONS.migration
def m002_document_ids(conn: sqlite3.Connection) -> None:
    """Every id a document answers to: the one it was stored under and any alias (the same
    text ingested again under another id). A stored document lives while it has an id."""
    conn.execute(
        "CREATE TABLE document_ids ("
        " id TEXT PRIMARY KEY,"
        " doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,"
        " created_at TEXT NOT NULL)"
    )
    conn.execute("CREATE INDEX document_ids_by_doc ON document_ids (doc_id)")
    conn.execute(
        "INSERT INTO document_ids (id, doc_id, created_at) SELECT id, id, created_at FROM documents"
    )


class DocumentStore:
    """Documents, chunks and vectors in one SQLite file (or ``":memory:"``).

    ``version`` increases on every write, so caches keyed by it never serve stale results;
    ``corpus_id`` tells this database from another one created later on the same path.
    """

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self._conn = connect(self.path)
        MIGRATIONS.apply(self._conn)
        self._corpus_id = self._ensure_corpus_id()

    def close(self) -> None:
        self._conn.close()

    def _ensure_corpus_id(self) -> str:
        """The database's corpus id, made (a random one, written only while absent) by the
        first store object that opens it; every later one reads the same."""
        query = "SELECT value FROM corpus_meta WHERE key = 'corpus_id'"
        row = self._conn.execute(query).fetchone()
        if row is None:  # written once: a plain open of an existing database writes nothing
            with transaction(self._conn) as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO corpus_meta (key, value) VALUES ('corpus_id', ?)",
                    (uuid.uuid4().hex,),
                )
                row = conn.execute(query).fetchone()
        return str(row[0])

    @property
    def corpus_id(self) -> str:
        """A random id made with the database, kept for its life: another database created
        later on the same path (its ``version`` starting again at 0) has another one."""
        return self._corpus_id

    @property
    def version(self) -> int:
        row = self._conn.execute("SELECT value FROM corpus_meta WHERE key = 'version'").fetchone()
        return int(row[0])

    def _bump(self) -> None:
        self._conn.execute(
            "UPDATE corpus_meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'version'"
        )

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction around every write made inside (``add_many``, ``remove``,
        ``add_vectors``, …): all of them commit together at the end, or none does if anything
        inside raises. Nested, it joins the transaction already open."""
        with transaction(self._conn):
            yield

    def find(self, tenant: str, content_hash: str) -> str | None:
        """The storage id of the document with this content in this tenant, if stored (see
        ``ids_of`` for the ids it answers to)."""
        row = self._conn.execute(
            "SELECT id FROM documents WHERE tenant = ? AND content_hash = ?",
            (tenant, content_hash),
        ).fetchone()
        return None if row is None else str(row[0])

    def resolve(self, doc_id: str) -> str | None:
        """The storage id of the document that ``doc_id`` (its own id or an alias) names."""
        row = self._conn.execute(
            "SELECT doc_id FROM document_ids WHERE id = ?", (doc_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def ids_of(self, storage_ids: Iterable[str]) -> dict[str, list[str]]:
        """Every id each stored document answers to, oldest first."""
        wanted = list(dict.fromkeys(storage_ids))
        found: dict[str, list[str]] = {}
        query = "SELECT id, doc_id FROM document_ids WHERE doc_id IN ({}) ORDER BY rowid"
        for row in select_in(self._conn, query, wanted):
            found.setdefault(row[1], []).append(row[0])
        return found

    def chunk_ids(self, storage_id: str) -> list[str]:
        """The ids of a stored document's chunks, in order."""
        rows = self._conn.execute(
            "SELECT id FROM chunks WHERE doc_id = ? ORDER BY idx", (storage_id,)
        )
        return [r[0] for r in rows]

    def add(
        self,
        document: DocumentRecord,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32] | None = None,
        *,
        model: str | None = None,
    ) -> None:
        """Store a document with its chunks (and their vectors, row *i* for chunk *i*) in one
        transaction: afterwards all of it is stored, or none of it."""
        self.add_many([(document, chunks, vectors)], model=model)

    def add_many(
        self,
        batch: Sequence[tuple[DocumentRecord, Sequence[Chunk], npt.NDArray[np.float32] | None]],
        *,
        model: str | None = None,
        aliases: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Store several documents in one transaction (all or none): far fewer commits than
        one ``add`` per document when ingesting a corpus. ``aliases`` are ``(id, storage id)``
        pairs: more ids for documents stored before or in this batch."""
        for document, chunks, vectors in batch:
            if vectors is not None and (model is None or len(vectors) != len(chunks)):
                raise ConfigError(
                    f"{len(chunks)} chunks of document {document.id} need as many vectors and "
                    f"a model name, got {len(vectors)} vectors, model={model!r}"
                )
        with transaction(self._conn) as conn:
            for document, chunks, vectors in batch:
                self._insert(conn, document, chunks, vectors, model)
            conn.executemany(
                "INSERT INTO document_ids (id, doc_id, created_at) VALUES (?, ?, ?)",
                [(alias, storage_id, _now()) for alias, storage_id in aliases],
            )
            self._bump()

    @staticmethod
    def _insert(
        conn: sqlite3.Connection,
        document: DocumentRecord,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32] | None,
        model: str | None,
    ) -> None:
        conn.execute(
            "INSERT INTO documents (id, tenant, content_hash, source, text, metadata,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                document.id,
                document.tenant,
                document.content_hash,
                document.source,
                document.text,
                json.dumps(document.metadata),
                document.created_at,
            ),
        )
        conn.execute(
            "INSERT INTO document_ids (id, doc_id, created_at) VALUES (?, ?, ?)",
            (document.id, document.id, document.created_at),
        )
        conn.executemany(
            "INSERT INTO chunks (id, doc_id, idx, text, start, end_, token_count, metadata)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    c.id,
                    document.id,
                    c.index,
                    c.text,
                    c.start,
                    c.end,
                    c.token_count,
                    json.dumps(c.metadata),
                )
                for c in chunks
            ],
        )
        if vectors is not None:
            conn.executemany(
                "INSERT INTO chunk_vectors (chunk_id, model, dim, vector) VALUES (?, ?, ?, ?)",
                [
                    (c.id, model, vectors.shape[1], np.asarray(v, np.float32).tobytes())
                    for c, v in zip(chunks, vectors, strict=True)
                ],
            )

    def remove(self, doc_id: str) -> list[str]:
        """Remove the id ``doc_id`` (the document's own or an alias). The document itself (its
        chunks and vectors cascade) goes with its last id; returns the chunk ids removed, none
        while other ids still name the document."""
        with transaction(self._conn) as conn:
            storage_id = self.resolve(doc_id)
            conn.execute("DELETE FROM document_ids WHERE id = ?", (doc_id,))
            ids: list[str] = []
            left = conn.execute(
                "SELECT COUNT(*) FROM document_ids WHERE doc_id = ?", (storage_id,)
            ).fetchone()[0]
            if storage_id is not None and not left:
                ids = self.chunk_ids(storage_id)
                conn.execute("DELETE FROM documents WHERE id = ?", (storage_id,))
            self._bump()
        return ids

    def clear(self) -> None:
        with transaction(self._conn) as conn:
            conn.execute("DELETE FROM documents")
            self._bump()

    def count(self) -> tuple[int, int]:
        """``(document ids, chunks)``: a document stored once under several ids counts once per
        id."""
        docs = self._conn.execute("SELECT COUNT(*) FROM document_ids").fetchone()[0]
        chunks = self._conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        return int(docs), int(chunks)

    def documents(self, tenant: str | None = None) -> list[DocumentRecord]:
        """One record per document id (an alias shows its document's text and metadata)."""
        sql = (
            "SELECT d.*, i.id AS public_id FROM document_ids i JOIN documents d ON d.id = i.doc_id"
            + (" WHERE d.tenant = ?" if tenant else "")
        )
        rows = self._conn.execute(
            sql + " ORDER BY d.created_at, d.id, i.rowid", (tenant,) if tenant else ()
        )
        out = []
        for row in rows:
            fields = dict(row)
            fields.update(id=fields.pop("public_id"), metadata=json.loads(row["metadata"]))
            out.append(DocumentRecord(**fields))
        return out

    def chunk_texts(self) -> Iterator[tuple[str, str]]:
        """Every ``(chunk id, text)`` in insertion order."""
        for row in self._conn.execute("SELECT id, text FROM chunks ORDER BY rowid"):
            yield row[0], row[1]

    def vectors(self, model: str) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Every stored vector of ``model``: ``(chunk ids, matrix)`` in insertion order."""
        rows = self._conn.execute(
            "SELECT chunk_id, dim, vector FROM chunk_vectors WHERE model = ? ORDER BY rowid",
            (model,),
        ).fetchall()
        if not rows:
            return [], np.zeros((0, 0), dtype=np.float32)
        matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32)
        return [r[0] for r in rows], matrix.reshape(len(rows), int(rows[0][1])).copy()

    def chunks_without_vectors(self, model: str) -> list[tuple[str, str]]:
        """``(chunk id, text)`` of every chunk that has no vector from ``model`` yet."""
        rows = self._conn.execute(
            "SELECT c.id, c.text FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM chunk_vectors v"
            " WHERE v.chunk_id = c.id AND v.model = ?) ORDER BY c.rowid",
            (model,),
        )
        return [(r[0], r[1]) for r in rows]

    def add_vectors(self, ids: Sequence[str], vectors: npt.NDArray[np.float32], model: str) -> None:
        """Store vectors for existing chunks (one transaction; bumps the version)."""
        with transaction(self._conn) as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO chunk_vectors (chunk_id, model, dim, vector)"
                " VALUES (?, ?, ?, ?)",
                [
                    (i, model, vectors.shape[1], np.asarray(v, np.float32).tobytes())
                    for i, v in zip(ids, vectors, strict=True)
                ],
            )
            self._bump()

    def chunks(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Chunk rows joined with their document (tenant, source, document metadata) by id;
        ``doc_ids`` lists every id the document answers to and ``doc_id`` is the first."""
        wanted = list(dict.fromkeys(ids))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            rows = self._conn.execute(
                "SELECT c.id, c.doc_id, c.idx, c.text, c.start, c.end_, c.token_count,"
                " c.metadata, d.tenant, d.source, d.metadata AS doc_metadata"
                f" FROM chunks c JOIN documents d ON d.id = c.doc_id"
                f" WHERE c.id IN ({','.join('?' * len(part))})",
                part,
            )
            for row in rows:
                found[row["id"]] = {
                    "doc_id": row["doc_id"],
                    "index": row["idx"],
                    "text": row["text"],
                    "start": row["start"],
                    "end": row["end_"],
                    "token_count": row["token_count"],
                    "tenant": row["tenant"],
                    "source": row["source"],
                    "metadata": {**json.loads(row["doc_metadata"]), **json.loads(row["metadata"])},
                }
        names = self.ids_of(row["doc_id"] for row in found.values())
        for row in found.values():
            row["doc_ids"] = names.get(row["doc_id"], [row["doc_id"]])
            row["doc_id"] = row["doc_ids"][0]
        return found

    def matching_chunks(
        self, *, tenants: Sequence[str] | None = None, filters: Mapping[str, Any] | None = None
    ) -> set[str]:
        """Ids of the chunks whose document is in ``tenants`` and whose metadata (chunk over
        document) equals every ``filters`` value (a list value matches any of its items)."""
        clauses: list[str] = []
        params: list[Any] = []
        if tenants is not None:
            clauses.append(f"d.tenant IN ({','.join('?' * len(tenants))})")
            params.extend(tenants)
        for key, value in (filters or {}).items():
            if not key.replace("_", "").replace(".", "").isalnum():
                raise ConfigError(f"filter keys are plain names, got {key!r}")
            path = f"$.{key}"
            expr = (
                f"COALESCE(json_extract(c.metadata, '{path}'), json_extract(d.metadata, '{path}'))"
            )
            values = value if isinstance(value, list | tuple | set) else [value]
            clauses.append(f"{expr} IN ({','.join('?' * len(values))})")
            params.extend(values)
        where = " AND ".join(clauses) or "1"
        rows = self._conn.execute(
            f"SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE {where}", params
        )
        return {r[0] for r in rows}
