"""The full-text index of the PostgreSQL memory store, and its searches.

Writing: each row's terms with their positions go to ``turn_terms``/``segment_terms`` in the
transaction that stores the row, and the table-wide totals FTS5's bm25 needs (rows, tokens
over both indexed columns) are added to the session's shard of ``fts_totals`` in the same
transaction — so a search sees a row and the totals that count it together, or neither.

Searching (``ranked``): the session's rows holding any token of the query's phrases are read
with their positions; the phrase frequencies, the whole table's document frequencies and the
totals give each row FTS5's bm25 (``store/postgres/fts.py``); rows are ordered by score, then
by seq (turns) or first seq (segments), as the SQLite store's ``ORDER BY bm25(…), seq`` does.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextfold.store.postgres.fts import Indexed, Tokenizer, bm25, idf, phrase_hits
from contextfold.store.postgres.schema import FTS_SHARDS
from contextfold.store.text import query_terms

if TYPE_CHECKING:
    import psycopg

__all__ = ["SEGMENTS", "TURNS", "FtsIndex", "add_totals", "index_rows", "ranked"]


@dataclass(frozen=True)
class FtsIndex:
    """Where one indexed table keeps its terms: ``tbl`` names its ``fts_totals`` rows,
    ``terms`` its terms table, ``row`` the columns naming a row there, ``key`` the one that
    identifies a row within a session, and ``lengths`` the query reading (key, text tokens,
    order) of a session's rows by key."""

    tbl: str
    terms: str
    row: str
    key: str
    lengths: str


TURNS = FtsIndex(
    "turns",
    "turn_terms",
    "session_id, seq",
    "seq",
    "SELECT seq, text_tokens, seq FROM turns WHERE session_id = %s AND seq = ANY(%s)",
)
SEGMENTS = FtsIndex(
    "segments",
    "segment_terms",
    "segment_id",
    "segment_id",
    "SELECT id, text_tokens, first_seq FROM segments WHERE session_id = %s AND id = ANY(%s)",
)


def shard(session_id: str) -> int:
    """The ``fts_totals`` row a session's counts go to."""
    return zlib.crc32(session_id.encode("utf-8")) % FTS_SHARDS


def add_totals(
    conn: psycopg.Connection[Any], index: FtsIndex, session_id: str, rows: int, tokens: int
) -> None:
    """Add ``rows`` and ``tokens`` (negative to take away) to the table-wide totals."""
    if rows or tokens:
        conn.execute(
            "UPDATE fts_totals SET n_rows = n_rows + %s, n_tokens = n_tokens + %s"
            " WHERE tbl = %s AND shard = %s",
            (rows, tokens, index.tbl, shard(session_id)),
        )


def index_rows(
    conn: psycopg.Connection[Any],
    index: FtsIndex,
    session_id: str,
    keys: Sequence[int],
    rows: Sequence[Indexed],
    id_tokens: int,
) -> None:
    """Index new rows (``keys[i]`` is the row ``rows[i]`` was tokenized from)."""
    flat_keys: list[int] = []
    terms: list[str] = []
    positions: list[str] = []
    for key, row in zip(keys, rows, strict=True):
        for term, offsets in row.terms.items():
            flat_keys.append(key)
            terms.append(term)
            positions.append("{" + ",".join(map(str, offsets)) + "}")
    if terms:
        conn.execute(
            f"INSERT INTO {index.terms} (session_id, {index.key}, term, positions)"
            " SELECT %s, k, t, p::integer[] FROM unnest(%s::bigint[], %s::text[], %s::text[])"
            " AS u(k, t, p)",
            (session_id, flat_keys, terms, positions),
        )
    text_tokens = sum(row.text_tokens for row in rows)
    add_totals(conn, index, session_id, len(rows), text_tokens + len(rows) * id_tokens)


def ranked(
    conn: psycopg.Connection[Any],
    tokenizer: Tokenizer,
    index: FtsIndex,
    session_id: str,
    query: str,
    limit: int,
) -> list[tuple[int, float]]:
    """(key, score) of the session's rows matching any of the query's terms, best first."""
    terms = query_terms(query)
    if not terms or limit <= 0:
        return []
    phrases = [tokenizer.phrase(term) for term in terms]
    tokens = sorted({t for phrase in phrases for t in phrase})
    found: dict[int, dict[str, list[int]]] = {}
    for key, term, offsets in conn.execute(
        f"SELECT {index.key}, term, positions FROM {index.terms}"
        " WHERE session_id = %s AND term = ANY(%s)",
        (session_id, tokens),
    ):
        found.setdefault(int(key), {})[term] = offsets
    freqs = {key: [float(phrase_hits(terms_, p)) for p in phrases] for key, terms_ in found.items()}
    freqs = {key: f for key, f in freqs.items() if any(f)}
    if not freqs:
        return []
    n_rows, n_tokens = conn.execute(
        "SELECT COALESCE(SUM(n_rows), 0), COALESCE(SUM(n_tokens), 0) FROM fts_totals"
        " WHERE tbl = %s",
        (index.tbl,),
    ).fetchone() or (0, 0)
    avgdl = float(n_tokens) / float(n_rows)
    matching = [any(f[i] for f in freqs.values()) for i in range(len(phrases))]
    idfs = [
        idf(int(n_rows), _document_frequency(conn, index, phrase)) if hit else 0.0
        for phrase, hit in zip(phrases, matching, strict=True)
    ]
    id_tokens = conn.execute(
        "SELECT id_tokens FROM sessions WHERE id = %s", (session_id,)
    ).fetchone()
    extra = int(id_tokens[0]) if id_tokens else 0
    scored = [
        (order, int(key), bm25(freqs[int(key)], idfs, int(text_tokens) + extra, avgdl))
        for key, text_tokens, order in conn.execute(index.lengths, (session_id, list(freqs)))
    ]
    scored.sort(key=lambda r: (-r[2], r[0], r[1]))
    return [(key, score) for _, key, score in scored[:limit]]


def _document_frequency(
    conn: psycopg.Connection[Any], index: FtsIndex, phrase: Sequence[str]
) -> int:
    """How many rows of the whole table (every session) the phrase occurs in."""
    if len(phrase) == 1:
        row = conn.execute(
            f"SELECT COUNT(*) FROM {index.terms} WHERE term = %s", (phrase[0],)
        ).fetchone()
        return int(row[0]) if row else 0
    rows: dict[tuple[Any, ...], dict[str, list[int]]] = {}
    width = index.row.count(",") + 1
    for record in conn.execute(
        f"SELECT {index.row}, term, positions FROM {index.terms} WHERE term = ANY(%s)"
        f" AND ({index.row}) IN (SELECT {index.row} FROM {index.terms} WHERE term = %s)",
        (list(set(phrase)), phrase[0]),
    ):
        rows.setdefault(tuple(record[:width]), {})[record[width]] = record[width + 1]
    return sum(1 for terms in rows.values() if phrase_hits(terms, phrase))
