"""Cutting text to a token budget: sentence boundaries first, token boundaries as the fallback,
a visible marker, and never more than the budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.tokens import CharCounter, TiktokenCounter
from contextfold.truncation import TRUNCATION_MARKER, sentence_ends, truncate_text

TEXT = "First sentence here. Second sentence is longer than the first one. Third."
KEEPS = ["head", "tail", "middle"]


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("A. B! C? D", [2, 5, 8, 10]),
        ("No boundary at all", [18]),
        ("Version 1.2.3 is out. Yes.", [21, 26]),  # a dot without whitespace is no end
        ("line1\nline2\n\nline3", [5, 11, 18]),
        ('He said "Stop." Then left.', [15, 26]),  # the closing quote stays in the sentence
        ("(Aside.) Main text.", [8, 19]),
        ("第一句。第二句！第三句", [4, 8, 11]),  # CJK stops need no whitespace after them
        ("他说：“好。”然后走了。", [7, 12]),
        ("Wait… what? ", [5, 11, 12]),
    ],
)
def test_sentence_ends(text: str, ends: list[int]) -> None:
    assert sentence_ends(text) == ends


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (14, "First sentence here. […truncated]"),
        (8, "First sentence here. […truncated]"),  # exactly 8 tokens
        (7, "First sentence here […truncated]"),  # no sentence fits: token-boundary fallback
        (5, "First […truncated]"),
    ],
)
def test_head_cuts_at_sentence_then_token_boundary(
    o200k: TiktokenCounter, budget: int, expected: str
) -> None:
    assert o200k.count(TEXT) == 15
    result = truncate_text(TEXT, budget, o200k)
    assert result == expected
    assert o200k.count(result) <= budget


@pytest.mark.parametrize(
    ("keep", "budget", "expected"),
    [
        ("tail", 12, "[…truncated] Third."),
        ("tail", 6, "[…truncated] Third."),  # exactly 6 tokens
        ("tail", 5, "[…truncated] ."),  # token-boundary fallback from the end
        ("middle", 12, "First sentence here. […truncated] Third."),
        ("middle", 8, "First sentence […truncated] Third."),
        ("middle", 6, "First […truncated] ."),
    ],
)
def test_tail_and_middle(o200k: TiktokenCounter, keep: str, budget: int, expected: str) -> None:
    result = truncate_text(TEXT, budget, o200k, keep=keep)  # type: ignore[arg-type]
    assert result == expected
    assert o200k.count(result) <= budget


def test_closing_quote_is_kept_with_its_sentence(o200k: TiktokenCounter) -> None:
    text = 'He said "Stop here." Then he went on and on about other things at length. End.'
    assert truncate_text(text, 12, o200k) == 'He said "Stop here." […truncated]'
    text = "(Note one.) Then a much longer second sentence goes here for a while. End."
    assert truncate_text(text, 10, o200k) == "(Note one.) […truncated]"


def test_cjk_text_cuts_at_full_stops(o200k: TiktokenCounter) -> None:
    text = "第一句话很短。第二句话比第一句话长得多得多得多得多。第三句。"
    head = truncate_text(text, 14, o200k)
    tail = truncate_text(text, 14, o200k, keep="tail")
    assert head == f"第一句话很短。 {TRUNCATION_MARKER}"
    assert tail == f"{TRUNCATION_MARKER} 第三句。"
    assert (
        truncate_text(text, 14, o200k, keep="middle")
        == f"第一句话很短。 {TRUNCATION_MARKER} 第三句。"
    )


@pytest.mark.parametrize("keep", KEEPS)
def test_text_that_fits_is_returned_unchanged(o200k: TiktokenCounter, keep: str) -> None:
    for budget in (15, 16, 1000):
        assert truncate_text(TEXT, budget, o200k, keep=keep) is TEXT  # type: ignore[arg-type]
    assert truncate_text("", 0, o200k, keep=keep) == ""  # type: ignore[arg-type]


@pytest.mark.parametrize("keep", KEEPS)
@pytest.mark.parametrize("budget", [-3, 0, 1, 4])
def test_impossible_budgets_return_empty(o200k: TiktokenCounter, keep: str, budget: int) -> None:
    # The marker alone is 4 tokens: a bare marker is never returned, it needs text beside it.
    assert o200k.count(TRUNCATION_MARKER) == 4
    result = truncate_text(TEXT, budget, o200k, keep=keep)  # type: ignore[arg-type]
    assert result == ""


@pytest.mark.parametrize("keep", KEEPS)
def test_long_unbroken_text_falls_back_to_tokens(o200k: TiktokenCounter, keep: str) -> None:
    text = "x" * 500
    result = truncate_text(text, 20, o200k, keep=keep)  # type: ignore[arg-type]
    assert TRUNCATION_MARKER in result
    assert 15 <= o200k.count(result) <= 20
    assert set(result.replace(TRUNCATION_MARKER, "").replace(" ", "")) == {"x"}


def test_custom_marker_and_char_counter() -> None:
    counter = CharCounter()
    text = "Alpha beta gamma. Delta epsilon zeta eta theta iota kappa lambda."
    assert truncate_text(text, 7, counter, marker="<cut>") == "Alpha beta gamma. <cut>"
    # No sentence fits 4 tokens: 2 tokens (8 characters) of text, then the marker.
    assert truncate_text(text, 4, counter, marker="<cut>") == "Alpha be <cut>"
    assert truncate_text(text, 2, counter, marker="<cut>") == ""


@given(
    st.text(alphabet=st.sampled_from("ab .!?\n。é🤖"), max_size=120),
    st.integers(min_value=0, max_value=40),
    st.sampled_from(KEEPS),
)
def test_result_always_fits_and_is_marked(text: str, budget: int, keep: str) -> None:
    counter = TiktokenCounter("o200k_base")
    result = truncate_text(text, budget, counter, keep=keep)  # type: ignore[arg-type]
    assert counter.count(result) <= max(budget, 0)
    if result and result != text:
        assert TRUNCATION_MARKER in result
        assert result.strip() != TRUNCATION_MARKER
    if counter.count(text) <= budget:
        assert result == text
