"""How ``MemoryStore`` turns a user's free text into an FTS5 ``MATCH`` expression
(``_fts_query``), leaving out the words of a question's grammar (``QUESTION_STOPWORDS``)."""

from __future__ import annotations

import re

from contextfold.retrieval.sparse import analyze

__all__ = ["QUESTION_STOPWORDS"]

# Words a question is made of but an answer rarely shares: interrogatives, auxiliaries,
# pronouns and fillers. BM25's own stop list (Lucene's 33 words) keeps them, and in an OR
# query every one of them pulls in turns that only share the grammar of the question.
_WORDS = re.compile(r"\w")

QUESTION_STOPWORDS = frozenset(
    """
    what whats when where which who whom whose why how
    do does did doing done have has had having am were been being can could would should
    shall may might must i me my mine myself you your yours yourself he him his himself she
    her hers herself we us our ours its them theirs themselves
    about any anything some something ever also just so very much many more most other
    than too from up out over again once here there now all both each few own same only
    tell know think
    """.split()  # noqa: SIM905 - a word list reads best as words
)


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _fts_query(query: str, column: str, session_id: str) -> str | None:
    """An FTS5 query: any of the query's words in ``column``, stop words (and the grammar of a
    question: ``QUESTION_STOPWORDS``) removed, each quoted (so no character of the user's text
    is FTS5 syntax), within the session's rows; ``None`` when no word is left. A query of
    nothing but such words keeps them. The session phrase narrows the search inside the index;
    callers still compare ``session_id`` exactly (a phrase also matches inside a longer id)."""
    words = analyze(query, stemmer=None)
    terms = dict.fromkeys(w for w in words if w not in QUESTION_STOPWORDS) or dict.fromkeys(words)
    if not terms:
        return None
    match = f"{column} : (" + " OR ".join(_quoted(term) for term in terms) + ")"
    if _WORDS.search(session_id):
        match += f" AND session_id : {_quoted(session_id)}"
    return match
