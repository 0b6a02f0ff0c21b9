"""A query's search words (``store.text.query_terms``): a message of more distinct words than
``MAX_QUERY_TERMS`` (a pasted log) is searched by its first and last half of that many, so
its cost is bounded, and what the question says at either end of the paste is still found."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from contextfold.memory.engine import MemoryEngine
from contextfold.store.text import MAX_QUERY_TERMS, query_terms

WORDS = st.lists(
    st.text(alphabet="bcdfghjklmnpqrstvwxz", min_size=3, max_size=8), unique=True, max_size=200
)


@given(WORDS, st.lists(st.integers(min_value=0, max_value=199), max_size=40))
def test_at_most_the_cap_the_first_words_and_the_last(words: list[str], again: list[int]) -> None:
    """``words`` (distinct), then some of them said again at the end (a question about lines
    of the paste): the first half of the cap, then the words the query ends with."""
    said = words + [words[i] for i in again if i < len(words)]
    terms = query_terms(" ".join(said))
    assert len(terms) == len(set(terms)) == min(len(words), MAX_QUERY_TERMS)
    if len(words) <= MAX_QUERY_TERMS:
        assert terms == words
        return
    half = MAX_QUERY_TERMS // 2
    assert terms[:half] == words[:half]
    ending = list(dict.fromkeys(w for w in reversed(said) if w not in words[:half]))[:half]
    assert terms[half:] == ending[::-1]


def test_a_question_closing_a_paste_keeps_the_words_the_paste_said_too() -> None:
    lines = [f"10:{i:02d} req{i:04d} GET /items/{i} 200 {i}ms" for i in range(100)]
    lines[50] = "10:50 req0050 GET /items/50 504 upstream timeout"
    terms = query_terms("\n".join(lines) + "\nWhat caused the upstream timeout?")
    assert len(terms) == MAX_QUERY_TERMS
    assert {"upstream", "timeout", "caused"} <= set(terms[-3:])


def test_a_question_after_a_long_paste_still_finds_its_turn(tmp_path: Path) -> None:
    with MemoryEngine(store=tmp_path / "memory.db", embedder=None) as memory:
        memory.on_turn_complete(
            [
                {"role": "user", "content": "The staging deploy key is kept in vault slot 7."},
                {"role": "assistant", "content": "Noted."},
            ]
            + [{"role": "user", "content": f"Unrelated note {i} about lunch."} for i in range(20)],
            session_id="s",
        )
        paste = " ".join(f"req{i:04d} GET /items/{i} 200 {i}ms" for i in range(300))
        found = memory.on_message_inbound(
            f"{paste}\nWhere is the staging deploy key?", session_id="s"
        )
    assert len(query_terms(paste)) == MAX_QUERY_TERMS
    assert "vault slot 7" in found.prepend_text
