"""What a memory store searches for when given a user's free text: ``query_terms``, the
question's words less stop words and the grammar of a question (``QUESTION_STOPWORDS``). Every
backend builds its full-text query from these terms, so they all match the same words."""

from __future__ import annotations

from contextfold.analysis import analyze

__all__ = ["MAX_QUERY_TERMS", "QUESTION_STOPWORDS", "query_terms"]

# Words a question is made of but an answer rarely shares: interrogatives, auxiliaries,
# pronouns and fillers. BM25's own stop list (Lucene's 33 words) keeps them, and in an OR
# query every one of them pulls in turns that only share the grammar of the question.
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


#: At most this many words of one query are searched for: a message of more distinct words (a
#: pasted log, a file) is searched by the first ``MAX_QUERY_TERMS // 2`` distinct words it
#: opens with and the last ones it ends with (read from its end, so a question closing a paste
#: keeps its words even when the paste said them too), where a question usually opens or closes
#: what it pastes. Each word costs a look-up in the index, so an uncapped paste cost the
#: proxy's memory step its whole deadline.
MAX_QUERY_TERMS = 64


def query_terms(query: str) -> list[str]:
    """The distinct words of ``query`` to search for, in order: stop words and the words of a
    question's grammar removed; a query of nothing but such words keeps them; at most
    ``MAX_QUERY_TERMS`` of them (the first distinct words, then the last ones).

    >>> query_terms("What did Caroline say about the adoption agency?")
    ['caroline', 'say', 'adoption', 'agency']
    """
    words = analyze(query, stemmer=None)
    kept = [w for w in words if w not in QUESTION_STOPWORDS] or words
    found = list(dict.fromkeys(kept))
    if len(found) <= MAX_QUERY_TERMS:
        return found
    head = found[: MAX_QUERY_TERMS // 2]
    tail = dict.fromkeys(w for w in reversed(kept) if w not in head)
    return head + list(tail)[: MAX_QUERY_TERMS - len(head)][::-1]
