"""A composer never returns more tokens than its ``max_context_length``, counted on the
composed string itself: text that is counted in pieces can tokenise to more once joined or
stripped (``«x»`` then ``"\\n"`` is one token more than counted as ``«x»\\n\\n``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold import ContextComposer, ContextItem, PromptComposer, SourceType, TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")  # the composers' default


def _chunk(text: str, score: float = 0.824, source: str = "a.md") -> ContextItem:
    return ContextItem(
        content=text, source=SourceType.RETRIEVAL, score=score, metadata={"source": source}
    )


def test_the_reviewers_case_stays_within_the_limit() -> None:
    query = "What is the refund policy?"
    for limit in (31, 30, 29, 20):
        out = ContextComposer(max_context_length=limit).compose(query, [_chunk("«x»")])
        assert COUNTER.count(out) <= limit, (limit, out)
    # The limit that holds the whole chunk still gets it.
    assert "«x»" in ContextComposer(max_context_length=31).compose(query, [_chunk("«x»")])


# Texts that end in characters whose tokens merge with a following newline differently from
# a following blank line.
_ENDINGS = st.sampled_from(["«x»", "—", "»", "…", "x»", " —", "。", "?»", ":", "”", "\u00a0"])
_WORDS = st.text(alphabet=st.sampled_from(list("abc xyz.,;«»—…\n")), min_size=0, max_size=30)
_TEXTS = st.builds(lambda body, end: body + end, _WORDS, _ENDINGS).filter(lambda t: t.strip())


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(_TEXTS, min_size=1, max_size=4),
    query=st.sampled_from(["What is the refund policy?", "q", "«x»?"]),
    limit=st.integers(min_value=24, max_value=80),
)
def test_composed_output_never_exceeds_its_limit(texts: list[str], query: str, limit: int) -> None:
    chunks = [_chunk(t, score=1.0 / (i + 1)) for i, t in enumerate(texts)]
    out = ContextComposer(max_context_length=limit).compose(query, chunks)
    assert COUNTER.count(out) <= limit
    assert out.startswith(f"Query: {query}")


@settings(max_examples=100, deadline=None)
@given(
    texts=st.lists(_TEXTS, min_size=1, max_size=4),
    limit=st.integers(min_value=60, max_value=120),
)
def test_prompt_composer_never_exceeds_its_limit(texts: list[str], limit: int) -> None:
    chunks = [_chunk(t, score=1.0 / (i + 1)) for i, t in enumerate(texts)]
    out = PromptComposer(max_context_length=limit).compose("What?", chunks)
    assert COUNTER.count(out) <= limit
    assert out.endswith("Question: What?\nAnswer:")
