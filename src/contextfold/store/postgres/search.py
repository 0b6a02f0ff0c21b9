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
    identifies a row within a session, and ``order`` the column ties are broken by (turns:
    the seq; segments: the first seq, kept with the terms)."""

    tbl: str
    terms: str
    row: str
    key: str
    order: str


TURNS = FtsIndex("turns", "turn_terms", "session_id, seq", "seq", "seq")
SEGMENTS = FtsIndex("segments", "segment_terms", "segment_id", "segment_id", "first_seq")


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
    orders: Sequence[int] | None = None,
) -> None:
    """Index new rows (``keys[i]`` is the row ``rows[i]`` was tokenized from; ``orders[i]``
    its tie-break, when that is not its key: a segment's first seq)."""
    ties = orders if orders is not None else keys
    columns: tuple[list[Any], ...] = ([], [], [], [], [])
    for key, row, tie in zip(keys, rows, ties, strict=True):
        for term, offsets in row.terms.items():
            for column, value in zip(
                columns,
                (key, term, "{" + ",".join(map(str, offsets)) + "}", row.text_tokens, tie),
                strict=True,
            ):
                column.append(value)
    if columns[0]:
        order = "" if index.order == index.key else f", {index.order}"
        conn.execute(
            f"INSERT INTO {index.terms} (session_id, {index.key}, term, positions, text_tokens"
            f"{order}) SELECT %s, k, t, p::integer[], n{', o' if order else ''}"
            " FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::int[], %s::int[])"
            " AS u(k, t, p, n, o)",
            (session_id, *columns),
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
    common_limit: int | None = None,
) -> list[tuple[int, float]]:
    """(key, score) of the session's rows matching any of the query's terms, best first.
    With ``common_limit``, a term in more than that many of the session's rows is left out
    (counted up to the limit, as the SQLite store does); a query of only such terms finds
    nothing."""
    terms = query_terms(query)
    if not terms or limit <= 0:
        return []
    phrases = [tokenizer.phrase(term) for term in terms]
    if common_limit is not None:
        phrases = [
            p
            for p in phrases
            if _session_rows(conn, index, session_id, p, common_limit) <= common_limit
        ]
        if not phrases:
            return []
    tokens = sorted({t for phrase in phrases for t in phrase})
    singles = sorted({phrase[0] for phrase in phrases if len(phrase) == 1})
    # One round trip: the session's matching rows, and the statistics of the whole table.
    with conn.pipeline():
        matches = conn.execute(
            f"SELECT {index.key}, term, positions, text_tokens, {index.order}"
            f" FROM {index.terms} WHERE session_id = %s AND term = ANY(%s)",
            (session_id, tokens),
        )
        stats = conn.execute(
            "SELECT (SELECT COALESCE(SUM(n_rows), 0) FROM fts_totals WHERE tbl = %s),"
            " (SELECT COALESCE(SUM(n_tokens), 0) FROM fts_totals WHERE tbl = %s),"
            " (SELECT id_tokens FROM sessions WHERE id = %s),"
            f" ARRAY(SELECT (SELECT COUNT(*) FROM {index.terms} x WHERE x.term = u.t)"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, o) ORDER BY u.o)",
            (index.tbl, index.tbl, session_id, singles),
        )
    found: dict[int, dict[str, list[int]]] = {}
    lengths: dict[int, tuple[int, int]] = {}
    for key, term, offsets, text_tokens, order in matches.fetchall():
        found.setdefault(int(key), {})[term] = offsets
        lengths[int(key)] = (int(text_tokens), int(order))
    freqs = {key: [float(phrase_hits(terms_, p)) for p in phrases] for key, terms_ in found.items()}
    freqs = {key: f for key, f in freqs.items() if any(f)}
    totals = stats.fetchone()
    if not freqs or totals is None:
        return []
    n_rows, n_tokens, id_tokens, counts = totals
    avgdl = float(n_tokens) / float(n_rows)
    document_frequency = dict(zip(singles, counts, strict=True))
    idfs = [
        idf(
            int(n_rows),
            document_frequency[phrase[0]]
            if len(phrase) == 1
            else _document_frequency(conn, index, phrase),
        )
        if any(f[i] for f in freqs.values())
        else 0.0
        for i, phrase in enumerate(phrases)
    ]
    extra = int(id_tokens or 0)
    scored = [
        (lengths[key][1], key, bm25(f, idfs, lengths[key][0] + extra, avgdl))
        for key, f in freqs.items()
    ]
    scored.sort(key=lambda r: (-r[2], r[0], r[1]))
    return [(key, score) for _, key, score in scored[:limit]]


def _document_frequency(
    conn: psycopg.Connection[Any], index: FtsIndex, phrase: Sequence[str]
) -> int:
    """How many rows of the whole table (every session) a phrase of several tokens occurs
    in: the rows holding its first token, their positions checked in Python."""
    rows: dict[tuple[Any, ...], dict[str, list[int]]] = {}
    width = index.row.count(",") + 1
    for record in conn.execute(
        f"SELECT {index.row}, term, positions FROM {index.terms} WHERE term = ANY(%s)"
        f" AND ({index.row}) IN (SELECT {index.row} FROM {index.terms} WHERE term = %s)",
        (list(set(phrase)), phrase[0]),
    ):
        rows.setdefault(tuple(record[:width]), {})[record[width]] = record[width + 1]
    return sum(1 for terms in rows.values() if phrase_hits(terms, phrase))


def _session_rows(
    conn: psycopg.Connection[Any],
    index: FtsIndex,
    session_id: str,
    phrase: Sequence[str],
    limit: int,
) -> int:
    """How many of the session's rows hold ``phrase``, counted up to ``limit + 1``: one
    token's rows through the primary key (a read bounded by the limit); a phrase of several
    tokens checks the positions of the rows holding its first token."""
    if not phrase:
        return 0
    if len(phrase) == 1:
        row = conn.execute(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM {index.terms} WHERE session_id = %s"
            " AND term = %s LIMIT %s) AS hits",
            (session_id, phrase[0], limit + 1),
        ).fetchone()
        return int(row[0]) if row else 0
    rows: dict[int, dict[str, list[int]]] = {}
    for key, term, positions in conn.execute(
        f"SELECT {index.key}, term, positions FROM {index.terms} WHERE session_id = %s"
        f" AND term = ANY(%s) AND {index.key} IN (SELECT {index.key} FROM {index.terms}"
        " WHERE session_id = %s AND term = %s)",
        (session_id, list(set(phrase)), session_id, phrase[0]),
    ):
        rows.setdefault(int(key), {})[term] = positions
    return min(limit + 1, sum(1 for terms in rows.values() if phrase_hits(terms, phrase)))
