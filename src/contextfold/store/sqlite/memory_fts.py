"""How ``MemoryStore`` turns a user's free text into an FTS5 ``MATCH`` expression
(``_fts_query``) from the shared ``query_terms``."""

from __future__ import annotations

import re

from contextfold.store.text import query_terms

__all__: list[str] = []

_WORDS = re.compile(r"\w")


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _fts_query(
    query: str, column: str, session_id: str, terms: list[str] | None = None
) -> str | None:
    """An FTS5 query: any of the query's words in ``column``, stop words (and the grammar of a
    question: ``QUESTION_STOPWORDS``) removed, each quoted (so no character of the user's text
    is FTS5 syntax), within the session's rows; ``None`` when no word is left. A query of
    nothing but such words keeps them. The session phrase narrows the search inside the index;
    callers still compare ``session_id`` exactly (a phrase also matches inside a longer id).
    ``terms`` replaces the query's own words (``query_terms(query)``) when given."""
    terms = query_terms(query) if terms is None else terms
    if not terms:
        return None
    match = f"{column} : (" + " OR ".join(_quoted(term) for term in terms) + ")"
    if _WORDS.search(session_id):
        match += f" AND session_id : {_quoted(session_id)}"
    return match
