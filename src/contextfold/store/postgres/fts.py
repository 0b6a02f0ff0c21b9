"""Full-text ranking for the PostgreSQL store, identical to the SQLite store's FTS5 ``bm25()``.

A recall must give the same answer whichever backend holds the conversation, so this module
does not approximate FTS5 with PostgreSQL's own text search (other stemmer, other ranking):

- **Tokens.** Text is tokenized by FTS5 itself (``Tokenizer``): an in-memory SQLite FTS5
  table with the same ``porter unicode61`` tokenizer and an ``fts5vocab(…, 'instance')`` view
  give each token's stemmed term and position. The store keeps, per row, each term with its
  positions (``turn_terms``/``segment_terms``) and the row's token count.
- **Phrases.** Each query term is a quoted FTS5 phrase; one term may tokenize into several
  tokens (``foo_bar`` → ``foo bar``), which match at consecutive positions (``phrase_hits``).
- **Score.** FTS5's bm25 (``fts5_aux.c``), computed in the same order of floating-point
  operations so the scores agree to the bit: k1 1.2, b 0.75; N the rows of the whole table
  (every session), IDF ln((N − n + 0.5)/(n + 0.5)) with n the rows matching the phrase (1e-6
  when not positive); a row's length D and the average length count the tokens of *both*
  indexed columns (the text and the session id, weighted 0 in the query).

>>> tok = Tokenizer()
>>> tok.phrase("foo_bar"), tok.phrase("Running")
(('foo', 'bar'), ('run',))
>>> phrase_hits({"foo": [0, 4], "bar": [1, 3]}, ("foo", "bar"))
1
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["K1", "B", "Indexed", "Tokenizer", "bm25", "idf", "phrase_hits"]

K1 = 1.2
B = 0.75
#: Query terms whose tokens ``Tokenizer.phrase`` remembers (forgotten all at once past it).
_PHRASES = 20_000


@dataclass(frozen=True)
class Indexed:
    """One row as FTS5 indexes it: the text's terms with their token positions, the text's
    token count, and the session id's token count (the second indexed column)."""

    terms: dict[str, list[int]]
    text_tokens: int
    session_tokens: int


class Tokenizer:
    """FTS5's own ``porter unicode61`` tokenizer, reached through an in-memory SQLite table
    (one connection per thread: a SQLite connection is not shared across threads here)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._phrases: dict[str, tuple[str, ...]] = {}

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            # Contentless: the index is all that is read, and 'delete-all' empties it at
            # once (deleting rows one by one leaves tombstones every later read goes through).
            conn.execute(
                "CREATE VIRTUAL TABLE doc USING fts5(body, sid, content='',"
                " tokenize='porter unicode61')"
            )
            conn.execute("CREATE VIRTUAL TABLE doc_terms USING fts5vocab(doc, 'instance')")
            self._local.conn = conn
        return conn

    def rows(self, texts: Sequence[str], session_id: str) -> list[Indexed]:
        """How FTS5 indexes each of ``texts`` stored with ``session_id``."""
        if not texts:
            return []
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "INSERT INTO doc (rowid, body, sid) VALUES (?, ?, ?)",
                [(i + 1, text, session_id) for i, text in enumerate(texts)],
            )
            found = [Indexed({}, 0, 0) for _ in texts]
            counts = [[0, 0] for _ in texts]
            for term, doc, col, offset in conn.execute(
                "SELECT term, doc, col, offset FROM doc_terms"
            ):
                i = doc - 1
                if col == "body":
                    found[i].terms.setdefault(term, []).append(offset)
                    counts[i][0] += 1
                else:
                    counts[i][1] += 1
            conn.execute("INSERT INTO doc (doc) VALUES ('delete-all')")
        finally:
            conn.execute("COMMIT")
        return [
            Indexed({t: sorted(p) for t, p in row.terms.items()}, n_text, n_sid)
            for row, (n_text, n_sid) in zip(found, counts, strict=True)
        ]

    def phrase(self, term: str) -> tuple[str, ...]:
        """The tokens of one quoted query term, in order (remembered: a conversation's
        queries repeat their words)."""
        found = self._phrases.get(term)
        if found is None:
            (row,) = self.rows([term], "")
            ordered = sorted((pos, t) for t, positions in row.terms.items() for pos in positions)
            found = tuple(t for _, t in ordered)
            if len(self._phrases) >= _PHRASES:
                self._phrases.clear()
            self._phrases[term] = found
        return found

    def session_tokens(self, session_id: str) -> int:
        """How many tokens the session id adds to each of its rows."""
        return self.rows([""], session_id)[0].session_tokens


def phrase_hits(terms: Mapping[str, Sequence[int]], phrase: Sequence[str]) -> int:
    """How many times ``phrase`` occurs in a row (its tokens at consecutive positions)."""
    if not phrase:
        return 0
    first = terms.get(phrase[0])
    if not first:
        return 0
    if len(phrase) == 1:
        return len(first)
    rest = [set(terms.get(t, ())) for t in phrase[1:]]
    return sum(1 for p in first if all(p + k + 1 in s for k, s in enumerate(rest)))


def idf(rows: int, hits: int) -> float:
    """FTS5's IDF of a phrase matching ``hits`` of ``rows`` rows."""
    value = math.log((rows - hits + 0.5) / (hits + 0.5))
    return value if value > 0.0 else 1e-6


def bm25(freqs: Sequence[float], idfs: Sequence[float], length: int, avgdl: float) -> float:
    """FTS5's bm25 of one row, negated back to "higher is better" (SQLite's ``-bm25()``)."""
    score = 0.0
    d = float(length)
    for f, weight in zip(freqs, idfs, strict=True):
        score += weight * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * d / avgdl)))
    return -(-1.0 * score)
