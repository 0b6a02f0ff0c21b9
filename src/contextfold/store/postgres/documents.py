"""The document store in PostgreSQL: documents, chunks and chunk vectors that many processes
and hosts share (``contextfold.store.protocols.DocumentStorage``).

The schema mirrors the SQLite store's (``contextfold.store.sqlite.documents``) table for
table; an identity column ``seq`` stands in for SQLite's ``rowid`` wherever the interface
promises insertion order. Vectors are float32 ``bytea`` — pgvector is not assumed (it is
not installable everywhere this runs, and the index ranks vectors in memory anyway) — and
come back as numpy matrices exactly as from SQLite. Metadata is JSON text, so it reads back
key for key as written; filters cast it to ``jsonb`` (so a JSON ``true`` matches ``True`` only,
where SQLite's ``json_extract`` also lets it match ``1``). No full-text index: BM25 lives in the
``DocumentIndex``'s memory, rebuilt when the corpus ``version`` moves.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError
from contextfold.retrieval.base import Chunk
from contextfold.store.document_models import DocumentRecord
from contextfold.store.document_models import now as _now
from contextfold.store.postgres.pool import PgMigrationRegistry, Pooled, masked

__all__ = ["MIGRATIONS", "PostgresDocumentStore"]

MIGRATIONS = PgMigrationRegistry("documents")


@MIGRATIONS.migration
def m001_create_documents(conn: Any) -> None:
    conn.execute(
        "CREATE TABLE documents ("
        " id TEXT PRIMARY KEY, tenant TEXT NOT NULL, content_hash TEXT NOT NULL,"
        " source TEXT, text TEXT NOT NULL, metadata TEXT NOT NULL DEFAULT '{}',"
        " created_at TEXT NOT NULL, UNIQUE (tenant, content_hash))"
    )
    conn.execute(
        "CREATE TABLE document_ids ("
        " seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, id TEXT PRIMARY KEY,"
        " doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,"
        " created_at TEXT NOT NULL)"
    )
    conn.execute("CREATE INDEX document_ids_by_doc ON document_ids (doc_id, seq)")
    conn.execute(
        "CREATE TABLE chunks ("
        " seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, id TEXT PRIMARY KEY,"
        " doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,"
        " idx INTEGER NOT NULL, text TEXT NOT NULL, start_ INTEGER NOT NULL,"
        " end_ INTEGER NOT NULL, token_count INTEGER NOT NULL,"
        " metadata TEXT NOT NULL DEFAULT '{}')"
    )
    conn.execute("CREATE INDEX chunks_by_doc ON chunks (doc_id, idx)")
    conn.execute(
        "CREATE TABLE chunk_vectors ("
        " seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,"
        " chunk_id TEXT NOT NULL REFERENCES chunks(id) ON DELETE CASCADE,"
        " model TEXT NOT NULL, dim INTEGER NOT NULL, vector BYTEA NOT NULL,"
        " PRIMARY KEY (chunk_id, model))"
    )
    conn.execute("CREATE INDEX chunk_vectors_by_model ON chunk_vectors (model, seq)")
    conn.execute("CREATE TABLE corpus_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
    conn.execute("INSERT INTO corpus_meta (key, value) VALUES ('version', 0)")


def _check_key(key: str) -> list[str]:
    if not key or not key.replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"filter keys are plain names, got {key!r}")
    return key.split(".")


class PostgresDocumentStore:
    """Documents, chunks and vectors in a PostgreSQL database (``url``: ``postgresql://…``).

    ``version`` increases on every write by any process, so a ``DocumentIndex`` reading it
    before a search rebuilds its in-memory indexes exactly when the corpus moved;
    ``corpus_id`` tells this database from another one created later at the same URL.
    """

    def __init__(self, url: str, *, max_connections: int = 4) -> None:
        self.path = masked(url)
        self._db = Pooled(url, max_size=max_connections)
        try:
            with self._db.connection() as conn:
                MIGRATIONS.apply(conn)
            self._corpus_id = self._ensure_corpus_id()
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction around every write made inside on this thread (``add_many``,
        ``remove``, ``add_vectors``, …, and the reads, which see them): all commit at the
        end, or none does if anything inside raises. Nested, it joins the open one."""
        with self._db.transaction():
            yield

    def _all(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Any]:
        with self._db.connection() as conn:
            return conn.execute(sql, params).fetchall()

    @property
    def version(self) -> int:
        return int(self._all("SELECT value FROM corpus_meta WHERE key = 'version'")[0][0])

    def _ensure_corpus_id(self) -> str:
        """The database's corpus id (``corpus_meta`` holds integers: a random positive
        63-bit one), made by the first store object that opens it, read by every later one."""
        query = "SELECT value FROM corpus_meta WHERE key = 'corpus_id'"
        rows = self._all(query)
        if not rows:  # written once: a plain open of an existing database writes nothing
            with self._db.transaction() as conn:
                conn.execute(
                    "INSERT INTO corpus_meta (key, value) VALUES ('corpus_id', %s)"
                    " ON CONFLICT (key) DO NOTHING",
                    (secrets.randbits(63) or 1,),
                )
                rows = conn.execute(query).fetchall()
        return f"{int(rows[0][0]):016x}"

    @property
    def corpus_id(self) -> str:
        """A random id made with the database, kept for its life: another database created
        later at the same URL (its ``version`` starting again at 0) has another one."""
        return self._corpus_id

    @staticmethod
    def _bump(conn: Any) -> None:
        conn.execute("UPDATE corpus_meta SET value = value + 1 WHERE key = 'version'")

    def find(self, tenant: str, content_hash: str) -> str | None:
        rows = self._all(
            "SELECT id FROM documents WHERE tenant = %s AND content_hash = %s",
            (tenant, content_hash),
        )
        return str(rows[0][0]) if rows else None

    def resolve(self, doc_id: str) -> str | None:
        rows = self._all("SELECT doc_id FROM document_ids WHERE id = %s", (doc_id,))
        return str(rows[0][0]) if rows else None

    def ids_of(self, storage_ids: Iterable[str]) -> dict[str, list[str]]:
        wanted = list(dict.fromkeys(storage_ids))
        found: dict[str, list[str]] = {}
        if not wanted:
            return found
        rows = self._all(
            "SELECT id, doc_id FROM document_ids WHERE doc_id = ANY(%s) ORDER BY seq", (wanted,)
        )
        for row in rows:
            found.setdefault(row[1], []).append(row[0])
        return found

    def chunk_ids(self, storage_id: str) -> list[str]:
        rows = self._all("SELECT id FROM chunks WHERE doc_id = %s ORDER BY idx", (storage_id,))
        return [r[0] for r in rows]

    def add(
        self,
        document: DocumentRecord,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32] | None = None,
        *,
        model: str | None = None,
    ) -> None:
        self.add_many([(document, chunks, vectors)], model=model)

    def add_many(
        self,
        batch: Sequence[tuple[DocumentRecord, Sequence[Chunk], npt.NDArray[np.float32] | None]],
        *,
        model: str | None = None,
        aliases: Sequence[tuple[str, str]] = (),
    ) -> None:
        for document, chunks, vectors in batch:
            if vectors is not None and (model is None or len(vectors) != len(chunks)):
                raise ConfigError(
                    f"{len(chunks)} chunks of document {document.id} need as many vectors and "
                    f"a model name, got {len(vectors)} vectors, model={model!r}"
                )
        documents: list[tuple[Any, ...]] = []
        names: list[tuple[str, str, str]] = []
        chunk_rows: list[tuple[Any, ...]] = []
        vector_rows: list[tuple[Any, ...]] = []
        for document, chunks, vectors in batch:
            documents.append(
                (
                    document.id,
                    document.tenant,
                    document.content_hash,
                    document.source,
                    document.text,
                    json.dumps(document.metadata),
                    document.created_at,
                )
            )
            names.append((document.id, document.id, document.created_at))
            chunk_rows.extend(
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
            )
            if vectors is not None:
                vector_rows.extend(
                    (c.id, model, vectors.shape[1], np.asarray(v, np.float32).tobytes())
                    for c, v in zip(chunks, vectors, strict=True)
                )
        names.extend((alias, storage_id, _now()) for alias, storage_id in aliases)
        with self._db.transaction() as conn, conn.cursor() as cur:
            # Rows go in the order SQLite inserts them, so ``seq`` orders ids, chunks and
            # vectors exactly as SQLite's rowid does.
            if documents:
                cur.executemany(
                    "INSERT INTO documents (id, tenant, content_hash, source, text, metadata,"
                    " created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    documents,
                )
            if names:
                cur.executemany(
                    "INSERT INTO document_ids (id, doc_id, created_at) VALUES (%s, %s, %s)",
                    names,
                )
            if chunk_rows:
                cur.executemany(
                    "INSERT INTO chunks (id, doc_id, idx, text, start_, end_, token_count,"
                    " metadata) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    chunk_rows,
                )
            if vector_rows:
                cur.executemany(
                    "INSERT INTO chunk_vectors (chunk_id, model, dim, vector)"
                    " VALUES (%s, %s, %s, %s)",
                    vector_rows,
                )
            self._bump(conn)

    def remove(self, doc_id: str) -> list[str]:
        with self._db.transaction() as conn:
            row = conn.execute(
                "DELETE FROM document_ids WHERE id = %s RETURNING doc_id", (doc_id,)
            ).fetchone()
            ids: list[str] = []
            if row is not None:
                storage_id = row[0]
                # Lock the document so a concurrent alias of it waits for this decision.
                conn.execute("SELECT 1 FROM documents WHERE id = %s FOR UPDATE", (storage_id,))
                left = conn.execute(
                    "SELECT count(*) FROM document_ids WHERE doc_id = %s", (storage_id,)
                ).fetchone()
                if left is not None and not left[0]:
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "SELECT id FROM chunks WHERE doc_id = %s ORDER BY idx", (storage_id,)
                        )
                    ]
                    conn.execute("DELETE FROM documents WHERE id = %s", (storage_id,))
            self._bump(conn)
        return ids

    def clear(self) -> None:
        with self._db.transaction() as conn:
            conn.execute("DELETE FROM documents")
            self._bump(conn)

    def count(self) -> tuple[int, int]:
        row = self._all(
            "SELECT (SELECT count(*) FROM document_ids), (SELECT count(*) FROM chunks)"
        )[0]
        return int(row[0]), int(row[1])

    def documents(self, tenant: str | None = None) -> list[DocumentRecord]:
        sql = (
            "SELECT i.id, d.tenant, d.content_hash, d.source, d.text, d.metadata, d.created_at"
            " FROM document_ids i JOIN documents d ON d.id = i.doc_id"
            + (" WHERE d.tenant = %s" if tenant else "")
            + ' ORDER BY d.created_at COLLATE "C", d.id COLLATE "C", i.seq'
        )
        return [
            DocumentRecord(
                id=r[0],
                tenant=r[1],
                content_hash=r[2],
                source=r[3],
                text=r[4],
                metadata=json.loads(r[5]),
                created_at=r[6],
            )
            for r in self._all(sql, (tenant,) if tenant else ())
        ]

    def chunk_texts(self) -> Iterator[tuple[str, str]]:
        for row in self._all("SELECT id, text FROM chunks ORDER BY seq"):
            yield row[0], row[1]

    def vectors(self, model: str) -> tuple[list[str], npt.NDArray[np.float32]]:
        rows = self._all(
            "SELECT chunk_id, dim, vector FROM chunk_vectors WHERE model = %s ORDER BY seq",
            (model,),
        )
        if not rows:
            return [], np.zeros((0, 0), dtype=np.float32)
        matrix = np.frombuffer(b"".join(bytes(r[2]) for r in rows), dtype=np.float32)
        return [r[0] for r in rows], matrix.reshape(len(rows), int(rows[0][1])).copy()

    def chunks_without_vectors(self, model: str) -> list[tuple[str, str]]:
        rows = self._all(
            "SELECT c.id, c.text FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM chunk_vectors v"
            " WHERE v.chunk_id = c.id AND v.model = %s) ORDER BY c.seq",
            (model,),
        )
        return [(r[0], r[1]) for r in rows]

    def add_vectors(self, ids: Sequence[str], vectors: npt.NDArray[np.float32], model: str) -> None:
        latest: dict[str, bytes] = {}
        for i, v in zip(ids, vectors, strict=True):
            latest.pop(i, None)  # a repeated id: the last vector, at its place (as SQLite)
            latest[i] = np.asarray(v, np.float32).tobytes()
        dim = int(vectors.shape[1]) if len(ids) else 0
        with self._db.transaction() as conn, conn.cursor() as cur:
            if latest:
                cur.execute(
                    "DELETE FROM chunk_vectors WHERE model = %s AND chunk_id = ANY(%s)",
                    (model, list(latest)),
                )
                cur.executemany(
                    "INSERT INTO chunk_vectors (chunk_id, model, dim, vector)"
                    " VALUES (%s, %s, %s, %s)",
                    [(i, model, dim, v) for i, v in latest.items()],
                )
            self._bump(conn)

    def chunks(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        wanted = list(dict.fromkeys(ids))
        found: dict[str, dict[str, Any]] = {}
        if wanted:
            rows = self._all(
                "SELECT c.id, c.doc_id, c.idx, c.text, c.start_, c.end_, c.token_count,"
                " c.metadata, d.tenant, d.source, d.metadata"
                " FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id = ANY(%s)",
                (wanted,),
            )
            for r in rows:
                found[r[0]] = {
                    "doc_id": r[1],
                    "index": r[2],
                    "text": r[3],
                    "start": r[4],
                    "end": r[5],
                    "token_count": r[6],
                    "tenant": r[8],
                    "source": r[9],
                    "metadata": {**json.loads(r[10]), **json.loads(r[7])},
                }
        names = self.ids_of(row["doc_id"] for row in found.values())
        for row in found.values():
            row["doc_ids"] = names.get(row["doc_id"], [row["doc_id"]])
            row["doc_id"] = row["doc_ids"][0]
        return found

    def matching_chunks(
        self, *, tenants: Sequence[str] | None = None, filters: Mapping[str, Any] | None = None
    ) -> set[str]:
        clauses: list[str] = []
        params: list[Any] = []
        if tenants is not None:
            clauses.append("d.tenant = ANY(%s)")
            params.append(list(tenants))
        for key, value in (filters or {}).items():
            path = _check_key(key)
            values = value if isinstance(value, list | tuple | set) else [value]
            # SQLite's json_extract gives SQL NULL for a JSON null: fall back the same way.
            clauses.append(
                "COALESCE(NULLIF(c.metadata::jsonb #> %s, 'null'),"
                " NULLIF(d.metadata::jsonb #> %s, 'null')) = ANY(%s::text[]::jsonb[])"
            )
            params.extend([path, path, [json.dumps(v) for v in values]])
        where = " AND ".join(clauses) or "TRUE"
        rows = self._all(
            f"SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE {where}",
            params,
        )
        return {r[0] for r in rows}
