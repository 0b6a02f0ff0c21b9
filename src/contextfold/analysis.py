"""Text analysis shared by every index: word tokens, English stop words and Snowball stems.

BM25 (``contextfold.retrieval.sparse``) and the memory stores' full-text queries read text the
same way through ``analyze``; it lives here, below both, so a store never imports retrieval.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from contextfold.errors import ConfigError

__all__ = ["analyze", "content_words", "function_words"]

_TOKEN = re.compile(r"(?u)\b\w\w+\b")


@cache
def _stemmer(language: str) -> Any:
    import Stemmer

    try:
        return Stemmer.Stemmer(language)
    except KeyError:
        raise ConfigError(
            f"no Snowball stemmer for {language!r}; one of {sorted(Stemmer.algorithms())}"
        ) from None


@cache
def _stopwords(language: str) -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    if language not in {"en", "english"}:
        raise ConfigError(f"stop words are available for 'en' only, not {language!r}")
    return frozenset(STOPWORDS_EN)


@cache
def function_words() -> frozenset[str]:
    """English function words (pronouns, determiners, auxiliaries, question words,
    prepositions, conjunctions: NLTK's list as ``bm25s`` ships it, plus the index's own stop
    words). They say nothing about a text's topic, whatever the corpus; on a corpus of a few
    documents IDF cannot learn that, since "what" is as rare there as "refund"."""
    from bm25s.stopwords import STOPWORDS_EN, STOPWORDS_EN_PLUS

    return frozenset(STOPWORDS_EN_PLUS) | frozenset(STOPWORDS_EN)


def content_words(text: str) -> str:
    """``text`` without its function words (lower-cased word tokens, space-separated): the
    part of a query that can be evidence of relevance.

    >>> content_words("What is the weather on Mars?"), content_words("what is it")
    ('weather mars', '')
    """
    stop = function_words()
    return " ".join(w for w in _TOKEN.findall(text.lower()) if w not in stop)


def analyze(
    text: str, *, stemmer: str | None = "english", stopwords: str | None = "en"
) -> list[str]:
    """The terms BM25 sees for ``text``: lower-cased word tokens of two or more characters,
    stop words removed, Snowball-stemmed. Documents and queries go through the same function.

    >>> analyze("The runners are running quickly")
    ['runner', 'run', 'quick']
    """
    words = _TOKEN.findall(text.lower())
    if stopwords:
        stop = _stopwords(stopwords)
        words = [w for w in words if w not in stop]
    if stemmer and words:
        # Stem each distinct word once: a document repeats most of its words.
        distinct = list(dict.fromkeys(words))
        stems = dict(zip(distinct, _stemmer(stemmer).stemWords(distinct), strict=True))
        words = [stems[w] for w in words]
    return words
