"""How ``MemoryStore`` turns a user's free text into an FTS5 ``MATCH`` expression
(``_fts_query``) from the shared ``query_terms``, and how it ranks a session's turns by it
(``search_turn_seqs``) with work that does not grow with the session.

What a ranked search reads. FTS5's ``bm25()`` counts, for its IDF, every row of each phrase
of the query (``xQueryPhrase`` over the whole table, once per query), and the ``session_id :
"<id>"`` phrase that narrows the match to a session is such a phrase: it matches every turn of
the session, so at 100k turns that count alone cost about 9 ms a query. The phrase adds
nothing to a score (its column is weighted 0: its term is 0.0, added last), and the join on
``turns.session_id`` keeps only the session's rows either way, so leaving it out changes no
hit and no score; what it changes is which rows are scored and looked up in ``turns``: with
it, the session's rows that match; without it, every session's. So the phrase is left out
when the store holds only this session, or when the query's words are few enough in the whole
store (each counted up to ``common_limit``) that looking their rows up costs less than
counting the session's rows (``PHRASE_ROWS_PER_LOOKUP`` rows of the phrase against one
looked-up row, measured at 100k turns: about 0.09 µs against 6.6 µs). A hit's session and
seq are read from the narrow index ``turns_fts_lookup`` (id, session_id, seq; migration
``m014``), not from its row of ``turns``, which at 100k turns is rarely in the page cache:
the ranked query went from 3.4 to 2.6 ms there.

``common_limit`` is checked the same way: a word's rows in the whole store are counted first
in the index alone (no lookup in ``turns``: about 0.1 ms a word); only a word on more than the
limit there, in a store holding other sessions too, has its session's rows counted through
the join (each row looked up, up to the limit).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator, Sequence

import numpy as np

from contextfold.store.text import query_terms

__all__ = ["snapshot"]

_WORDS = re.compile(r"\w")


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


#: Rows of the session phrase counted by ``bm25()`` that cost what one row of another session
#: scored and looked up in ``turns`` does (``search_turn_seqs``; 6.6 µs against 0.09 µs).
PHRASE_ROWS_PER_LOOKUP = 64


def _fts_query(
    query: str,
    column: str,
    session_id: str,
    terms: list[str] | None = None,
    *,
    session_phrase: bool = True,
) -> str | None:
    """An FTS5 query: any of the query's words in ``column``, stop words (and the grammar of a
    question: ``QUESTION_STOPWORDS``) removed, each quoted (so no character of the user's text
    is FTS5 syntax), within the session's rows; ``None`` when no word is left. A query of
    nothing but such words keeps them. The session phrase narrows the search inside the index;
    callers still compare ``session_id`` exactly (a phrase also matches inside a longer id).
    ``terms`` replaces the query's own words (``query_terms(query)``) when given;
    ``session_phrase=False`` leaves the session phrase out (the callers' exact comparison
    alone keeps the session's rows)."""
    terms = query_terms(query) if terms is None else terms
    if not terms:
        return None
    match = f"{column} : (" + " OR ".join(_quoted(term) for term in terms) + ")"
    if session_phrase and _WORDS.search(session_id):
        match += f" AND session_id : {_quoted(session_id)}"
    return match


def _only_session(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether every stored turn is the session's (two index look-ups)."""
    low, high = conn.execute(
        "SELECT (SELECT MIN(session_id) FROM turns), (SELECT MAX(session_id) FROM turns)"
    ).fetchone()
    return bool(low == high == session_id)


def _store_rows(conn: sqlite3.Connection, term: str, limit: int) -> int:
    """How many turns of the whole store hold ``term``, counted up to ``limit + 1`` in the
    index alone."""
    match = _fts_query(term, "content_text", "", [term], session_phrase=False)
    row = conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM turns_fts WHERE turns_fts MATCH ? LIMIT ?)",
        (match, limit + 1),
    ).fetchone()
    return int(row[0])


def _session_rows(conn: sqlite3.Connection, session_id: str, term: str, limit: int) -> int:
    """How many of the session's turns hold ``term``, counted up to ``limit + 1`` (each row
    looked up in ``turns_fts_lookup``)."""
    match = _fts_query(term, "content_text", session_id, [term])
    row = conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM turns_fts CROSS JOIN turns t"
        " INDEXED BY turns_fts_lookup ON t.id = turns_fts.rowid"
        " WHERE turns_fts MATCH ? AND t.session_id = ? LIMIT ?)",
        (match, session_id, limit + 1),
    ).fetchone()
    return int(row[0])


def search_turn_seqs(
    conn: sqlite3.Connection,
    session_id: str,
    query: str,
    limit: int,
    common_limit: int | None,
    session_turns: int,
) -> list[tuple[int, float]]:
    """(seq, ``-bm25()``) of the session's turns matching the query's words, best first, ties
    by seq; with ``common_limit``, the words on more than that many of the session's turns
    left out (see the module docstring for what is read; ``session_turns``: how many turns
    the session holds)."""
    terms = query_terms(query)
    if not terms:
        return []
    alone = _only_session(conn, session_id)
    store_rows, counted = 0, True  # the kept words' rows in the whole store; all counted?
    if common_limit is not None:
        kept = []
        for term in terms:
            found = _store_rows(conn, term, common_limit)
            if found > common_limit:
                if alone or _session_rows(conn, session_id, term, common_limit) > common_limit:
                    continue
                counted = False  # common elsewhere: its rows past the limit were not counted
            kept.append(term)
            store_rows += found
        terms = kept
        if not terms:
            return []
    few = common_limit is not None and counted
    few = few and store_rows * PHRASE_ROWS_PER_LOOKUP <= session_turns
    match = _fts_query(query, "content_text", session_id, terms, session_phrase=not (alone or few))
    rows = conn.execute(
        "SELECT t.seq, -bm25(turns_fts, 1, 0) FROM turns_fts JOIN turns t"
        " INDEXED BY turns_fts_lookup ON t.id = turns_fts.rowid"
        " WHERE turns_fts MATCH ? AND t.session_id = ?"
        " ORDER BY bm25(turns_fts, 1, 0), t.seq LIMIT ?",
        (match, session_id, limit),
    )
    return [(int(r[0]), float(r[1])) for r in rows]


def search_turn_seqs_many(
    conn: sqlite3.Connection,
    session_id: str,
    queries: Sequence[str],
    limit: int,
    common_limit: int,
    session_turns: int,
) -> list[list[tuple[int, float]]]:
    """``search_turn_seqs`` of each of ``queries`` (a message and its parts, which share most
    words), each distinct word's rows counted and scored once. FTS5's ``bm25()`` of an OR
    query is a sum over its phrases, in their order, of a term that depends only on the
    phrase (its IDF), the row's length and the average length, and a word not in a row adds
    0.0: so a query's score of a turn is the sum of its words' one-word scores, in the
    query's order, bit for bit what the OR query returns (the conformance suite checks the
    two agree; a SQLite built to fuse that sum's multiply and add, as some arm64 compilers
    may, could differ in the last bit, which the suite would catch). Each word is on at most
    ``common_limit`` of the session's turns, so the rows read stay bounded."""
    per_query = [query_terms(query) for query in queries]
    words = list(dict.fromkeys(t for terms in per_query for t in terms))
    with snapshot(conn):
        scored = _word_scores(conn, session_id, words, common_limit, session_turns)
    out: list[list[tuple[int, float]]] = []
    for terms in per_query:
        mine = [scored[t] for t in terms if t in scored]
        if not mine:
            out.append([])
            continue
        seqs, where = np.unique(np.concatenate([s for s, _ in mine]), return_inverse=True)
        # Summed in the query's word order, from 0.0, as bm25() sums its phrases.
        total = np.bincount(
            where, weights=np.concatenate([v for _, v in mine]), minlength=len(seqs)
        )
        order = np.lexsort((seqs, -total))[:limit]
        out.append(list(zip(seqs[order].tolist(), total[order].tolist(), strict=True)))
    return out


@contextlib.contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """One read snapshot for the statements inside (each statement alone would be its own):
    a query's words scored against two states of the store would add up to neither's bm25.
    Inside a transaction already, that one is the snapshot."""
    began = not conn.in_transaction
    if began:
        conn.execute("BEGIN")
    try:
        yield
    finally:
        if began:
            conn.execute("COMMIT")


def _word_scores(
    conn: sqlite3.Connection,
    session_id: str,
    words: Sequence[str],
    common_limit: int,
    session_turns: int,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each word's (seqs, one-word bm25 scores) in the session, for the words on at most
    ``common_limit`` of the session's turns (as ``search_turn_seqs`` keeps them)."""
    alone = _only_session(conn, session_id)
    scored: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for term in words:
        found, counted = _store_rows(conn, term, common_limit), True
        if found > common_limit:
            if alone or _session_rows(conn, session_id, term, common_limit) > common_limit:
                continue
            counted = False
        few = counted and found * PHRASE_ROWS_PER_LOOKUP <= session_turns
        match = _fts_query(
            term, "content_text", session_id, [term], session_phrase=not (alone or few)
        )
        rows = conn.execute(
            "SELECT t.seq, -bm25(turns_fts, 1, 0) FROM turns_fts JOIN turns t"
            " INDEXED BY turns_fts_lookup ON t.id = turns_fts.rowid"
            " WHERE turns_fts MATCH ? AND t.session_id = ?",
            (match, session_id),
        ).fetchall()
        scored[term] = (
            np.fromiter((r[0] for r in rows), np.int64, len(rows)),
            np.fromiter((r[1] for r in rows), np.float64, len(rows)),
        )
    return scored
