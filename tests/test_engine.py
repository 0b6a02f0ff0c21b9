"""ContextEngine (seed 002 facade) and the composers."""

from __future__ import annotations

import pytest

from contextfold.errors import ConfigError
from contextfold.items import ContextItem
from contextfold.retrieval.engine import (
    ChainComposer,
    ContextComposer,
    ContextEngine,
    PromptComposer,
)
from contextfold.retrieval.index import DocumentIndex
from contextfold.testing import HashEmbedder
from contextfold.tokens import TiktokenCounter

PYTHON = "Python was created by Guido van Rossum and first released in 1991."
JS = "JavaScript was created by Brendan Eich and first released in 1995."


@pytest.fixture
def engine() -> ContextEngine:
    engine = ContextEngine(memory=DocumentIndex(embedder=HashEmbedder()))
    engine.add_document(PYTHON, {"source": "python.txt"})
    engine.add_document(JS, {"source": "js.txt"})
    return engine


def test_get_context_puts_the_best_chunk_first(engine: ContextEngine) -> None:
    context = engine.get_context("Who created Python?", k=2)
    assert context.startswith("Query: Who created Python?\n\nRelevant Context:")
    assert context.index("Guido") < context.index("Brendan")
    assert "[Source 1: python.txt]" in context


def test_results_are_cached_until_the_corpus_changes(engine: ContextEngine) -> None:
    first = engine.get_context("Who created Python?", k=1)
    assert engine.get_context("Who created Python?", k=1) == first and engine.cache_hits == 1
    engine.add_document("Python 3.0 was released in 2008 and broke compatibility.")
    engine.get_context("Who created Python?", k=1)
    assert engine.cache_hits == 1  # the version changed, so the cache was not used


def test_add_document_is_idempotent_and_clear_forgets(engine: ContextEngine) -> None:
    assert engine.add_document(PYTHON) in engine.document_ids
    assert len(engine.document_ids) == 2
    engine.clear()
    assert engine.document_ids == {} and engine.retrieve("Python", k=3) == []
    with pytest.raises(ConfigError, match="k must be positive"):
        engine.retrieve("Python", k=0)


def _items(*texts: str) -> list[ContextItem]:
    return [ContextItem(content=t, score=1.0 / (n + 1)) for n, t in enumerate(texts)]


def test_context_composer_respects_its_token_limit_and_cuts_at_a_sentence() -> None:
    counter = TiktokenCounter("cl100k_base")
    long = " ".join(f"Sentence number {n} is about budgets." for n in range(60))
    composer = ContextComposer(max_context_length=120, counter=counter)
    out = composer.compose("budgets?", _items("Short first chunk.", long, "Never reached."))
    assert counter.count(out) <= 120
    assert "Short first chunk." in out and "[…truncated]" in out and "Never reached" not in out


def test_prompt_composer_asks_for_citations_and_ends_with_the_question() -> None:
    out = PromptComposer(max_context_length=500).compose("What?", _items("Alpha.", "Beta."))
    assert "[Source 1]" in out and "[Source 2]" in out
    assert out.index("Alpha.") < out.index("Beta.")
    assert out.endswith("Question: What?\nAnswer:")


def test_chain_composer_joins_outputs_in_order() -> None:
    chain = ChainComposer([ContextComposer(300), PromptComposer(300)])
    out = chain.compose("q", _items("Alpha."))
    assert out.index("Relevant Context:") < out.index("Answer the question")
    with pytest.raises(ConfigError):
        ChainComposer([])


def test_composer_limits_are_validated() -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        ContextComposer(max_context_length=0)
    with pytest.raises(ConfigError, match="fixed text needs"):
        PromptComposer(max_context_length=10).compose("q", _items("x"))
