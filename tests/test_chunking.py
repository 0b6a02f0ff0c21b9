"""Chunkers: sizes in tokens, nothing lost, verbatim offsets, stable ids, headings, topics."""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.errors import ConfigError, EmbeddingError
from contextfold.retrieval.base import Chunk, Chunker, chunk_id
from contextfold.retrieval.chunking import (
    MarkdownChunker,
    RecursiveChunker,
    SemanticChunker,
    TextChunker,
    markdown_sections,
    sentence_spans,
)
from contextfold.tokens import CharCounter, TiktokenCounter, TokenCounter

CL100K = TiktokenCounter("cl100k_base")
TOPICS = {
    "cat": 0, "cats": 0, "kitten": 0, "purrs": 0, "whiskers": 0,
    "stock": 1, "stocks": 1, "bond": 1, "bonds": 1, "market": 1, "shares": 1,
}  # fmt: skip


class TopicEmbedder:
    """Deterministic fake: topic words pull a sentence towards their topic's axis; any other
    word adds a small component on one of a few hashed axes."""

    name = "fake-topics"
    dim = 8

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                word = word.strip(".,!?;:")
                if word in TOPICS:
                    vectors[row, TOPICS[word]] += 1.0
                else:
                    vectors[row, 2 + zlib.crc32(word.encode()) % (self.dim - 2)] += 0.1
            if not vectors[row].any():
                vectors[row, -1] = 1.0
        normalised: npt.NDArray[np.float32] = vectors / np.linalg.norm(
            vectors, axis=1, keepdims=True
        )
        return normalised


def squash(text: str) -> str:
    return "".join(text.split())


# --- strategies -----------------------------------------------------------------------------

WORDS = st.one_of(
    st.text("abcdefghij", min_size=1, max_size=10),
    st.sampled_from(["Dr.", "e.g.", "3.14", "U.S.", "über", "東京", "🙂", "naïve", "#", "```"]),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8),
    st.text("xyz-=", min_size=40, max_size=160),  # long words without spaces
)
SENTENCES = st.builds(
    lambda words, end: " ".join(words) + end,
    st.lists(WORDS, min_size=1, max_size=16),
    st.sampled_from(["", ".", "!", "?", "…", "。", '."']),
)
PARAGRAPHS = st.builds(
    lambda sentences, sep: sep.join(sentences),
    st.lists(SENTENCES, min_size=1, max_size=5),
    st.sampled_from([" ", "  ", "\n", " \t "]),
)
LINE_PREFIXES = st.sampled_from(["", "", "", "# ", "## ", "### ", "```\n", "~~~\n", "- "])
BLOCKS = st.builds(lambda prefix, paragraph: prefix + paragraph, LINE_PREFIXES, PARAGRAPHS)
TEXTS = st.one_of(
    st.builds(
        lambda blocks, sep: sep.join(blocks),
        st.lists(BLOCKS, max_size=6),
        st.sampled_from(["\n\n", "\n \n", "\n\n\n\n", "\n", "   "]),
    ),
    st.text(max_size=400),  # anything at all: control characters, lone whitespace runs
)

Factory = Callable[[int, int, TokenCounter], Chunker]
FACTORIES: dict[str, Factory] = {
    "text": lambda size, overlap, counter: TextChunker(size, overlap, counter),
    "recursive": lambda size, overlap, counter: RecursiveChunker(size, overlap, counter=counter),
    "markdown": lambda size, overlap, counter: MarkdownChunker(size, overlap, counter),
    "semantic": lambda size, overlap, counter: SemanticChunker(
        TopicEmbedder(), chunk_size=size, counter=counter
    ),
}
COUNTERS: dict[str, TokenCounter] = {"cl100k": CL100K, "chars": CharCounter(4)}


@st.composite
def sizes(draw: st.DrawFn) -> tuple[int, int]:
    """A chunk size and an overlap leaving at least 4 tokens of content (a character is at
    most 4 tokens, so every chunk can hold one)."""
    size = draw(st.integers(4, 48))
    return size, draw(st.integers(0, size - 4))


def own_content(source: str, chunk: Chunk) -> str:
    return source[chunk.start : chunk.end]


def check_invariants(
    source: str, chunks: list[Chunk], size: int, overlap: int, counter: TokenCounter
) -> None:
    for i, chunk in enumerate(chunks):
        own = own_content(source, chunk)
        assert chunk.text.strip() and own and own == own.strip()
        assert chunk.token_count == counter.count(chunk.text) <= size
        assert chunk.index == chunk.metadata["chunk_index"] == i
        assert chunk.metadata["chunk_count"] == len(chunks)
        assert chunk.id == chunk_id("doc", i, chunk.text)
        # ``text`` is a verbatim slice of the source that ends with the chunk's own content.
        assert source[: chunk.end].endswith(chunk.text) and chunk.text.endswith(own)
        carried = chunk.text[: len(chunk.text) - len(own)].rstrip()
        if carried:
            assert i > 0 and own_content(source, chunks[i - 1]).endswith(carried)
            assert counter.count(carried) <= overlap
    for before, after in itertools.pairwise(chunks):
        assert before.start < before.end <= after.start < after.end
    assert squash("".join(own_content(source, c) for c in chunks)) == squash(source)
    if overlap == 0:
        assert squash("".join(c.text for c in chunks)) == squash(source)


# --- properties -----------------------------------------------------------------------------

# The 1,000-example CI profile is for the packer invariants of DESIGN §5; these chunking
# properties run eight parametrisations each, so CI caps them at 200 examples apiece to stay
# inside its time budget (locally the dev profile's 100 applies).
CHUNKING = settings(max_examples=min(settings.default.max_examples, 200))


@pytest.mark.parametrize("counter_name", COUNTERS)
@pytest.mark.parametrize("kind", FACTORIES)
@CHUNKING
@given(text=TEXTS, size_overlap=sizes())
def test_chunks_fit_lose_nothing_and_point_at_their_source(
    kind: str, counter_name: str, text: str, size_overlap: tuple[int, int]
) -> None:
    size, overlap = size_overlap
    if kind == "semantic":
        overlap = 0
    counter = COUNTERS[counter_name]
    chunker = FACTORIES[kind](size, overlap, counter)
    chunks = chunker.split(text, doc_id="doc")
    check_invariants(text, chunks, size, overlap, counter)
    assert chunker.chunk(text) == [c.text for c in chunks]


@pytest.mark.parametrize("kind", FACTORIES)
@CHUNKING
@given(text=TEXTS, size_overlap=sizes())
def test_splitting_is_deterministic_and_ids_depend_on_the_document(
    kind: str, text: str, size_overlap: tuple[int, int]
) -> None:
    size, overlap = size_overlap
    chunker = FACTORIES[kind](size, 0 if kind == "semantic" else overlap, CL100K)
    first = chunker.split(text, doc_id="doc", metadata={"source": "a.txt"})
    again = FACTORIES[kind](size, 0 if kind == "semantic" else overlap, CL100K).split(
        text, doc_id="doc", metadata={"source": "a.txt"}
    )
    assert first == again
    other = chunker.split(text, doc_id="other-doc")
    assert [c.text for c in other] == [c.text for c in first]
    assert not {c.id for c in other} & {c.id for c in first}


@CHUNKING
@given(text=TEXTS, size_overlap=sizes())
def test_markdown_chunks_stay_inside_one_section(text: str, size_overlap: tuple[int, int]) -> None:
    size, overlap = size_overlap
    sections = markdown_sections(text)
    for chunk in MarkdownChunker(size, overlap).split(text, doc_id="doc"):
        text_start = chunk.end - len(chunk.text)
        (path,) = [p for s, e, p in sections if s <= text_start and chunk.end <= e]
        assert chunk.metadata["heading_path"] == path
        assert chunk.metadata["heading"] == (path[-1] if path else None)


@CHUNKING
@given(text=TEXTS)
def test_sentence_spans_cover_the_text(text: str) -> None:
    spans = sentence_spans(text)
    pieces = [text[s:e] for s, e in spans]
    assert all(p and p == p.strip() for p in pieces)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert squash("".join(pieces)) == squash(text)


# --- examples -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Dr. Smith arrived. He sat.", ["Dr. Smith arrived.", "He sat."]),
        ("Bring snacks, e.g. apples. Then go.", ["Bring snacks, e.g. apples.", "Then go."]),
        ("Pi is 3.14 roughly. Yes.", ["Pi is 3.14 roughly.", "Yes."]),
        ("Made in the U.S. by J. Smith. Done.", ["Made in the U.S. by J. Smith.", "Done."]),
        ("See Fig. 3 and No. 5 here. Ok.", ["See Fig. 3 and No. 5 here.", "Ok."]),
        ("It costs approx. three euros. Fine!", ["It costs approx. three euros.", "Fine!"]),
        ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
        ("Why? Because! Ok… Next", ["Why?", "Because!", "Ok…", "Next"]),
        ("line one\nline two", ["line one", "line two"]),
        ("第一句。第二句！第三句", ["第一句。", "第二句！", "第三句"]),
        ("   ", []),
    ],
)
def test_sentence_spans_examples(text: str, sentences: list[str]) -> None:
    assert [text[s:e] for s, e in sentence_spans(text)] == sentences


MARKDOWN = """Intro before any heading.

# Travel policy

All travel needs approval.

## Ground transport

```bash
# not a heading: a shell comment
echo hi
```

### Ride-hailing ###

Use the company account.

~~~
## also not a heading
~~~

## Meals

Up to 50 dollars.
"""


def test_markdown_heading_paths_skip_fenced_code() -> None:
    chunks = MarkdownChunker(chunk_size=200).split(MARKDOWN, doc_id="policy")
    paths = [(c.metadata["heading_path"], c.metadata["heading"]) for c in chunks]
    assert paths == [
        ([], None),
        (["Travel policy"], "Travel policy"),
        (["Travel policy", "Ground transport"], "Ground transport"),
        (["Travel policy", "Ground transport", "Ride-hailing"], "Ride-hailing"),
        (["Travel policy", "Meals"], "Meals"),
    ]
    assert "# not a heading" in chunks[2].text
    assert chunks[3].text.startswith("### Ride-hailing ###") and "## also not" in chunks[3].text
    assert squash("".join(c.text for c in chunks)) == squash(MARKDOWN)


def test_markdown_headings_with_crlf_line_ends() -> None:
    text = "# One\r\nfirst\r\n## Two ##\r\nsecond\r\n"
    chunks = MarkdownChunker(chunk_size=64).split(text, doc_id="d")
    assert [c.metadata["heading_path"] for c in chunks] == [["One"], ["One", "Two"]]
    assert [c.text for c in chunks] == ["# One\r\nfirst", "## Two ##\r\nsecond"]


def test_markdown_splits_a_big_section_inside_it() -> None:
    body = " ".join(f"Sentence number {i} about ride-hailing rules." for i in range(40))
    text = f"# Policy\n\n## Taxis\n\n{body}\n\n## Meals\n\nCovered."
    chunks = MarkdownChunker(chunk_size=40).split(text, doc_id="d", metadata={"lang": "en"})
    taxis = [c for c in chunks if c.metadata["heading"] == "Taxis"]
    assert len(taxis) > 5 and all(c.token_count <= 40 for c in chunks)
    assert all(c.metadata["lang"] == "en" for c in chunks)
    assert chunks[-1].text == "## Meals\n\nCovered."


def test_a_sentence_longer_than_a_chunk_is_cut_at_token_boundaries() -> None:
    sentence = "-".join(f"segment{i}" for i in range(300)) + "."
    chunks = TextChunker(chunk_size=16, overlap=0).split(sentence, doc_id="d")
    assert "".join(c.text for c in chunks) == sentence
    tokens = [CL100K.count(c.text) for c in chunks]
    assert sum(tokens) == CL100K.count(sentence)  # no cut split a token
    assert all(n == 16 for n in tokens[:-1])  # and each cut took as much as fits


def test_overlap_starts_at_a_word_boundary_and_repeats_the_previous_tail() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    chunks = TextChunker(chunk_size=30, overlap=10).split(text, doc_id="d")
    for before, after in itertools.pairwise(chunks):
        carried = after.text[: after.text.index(text[after.start : after.end])].strip()
        assert carried and text[before.start : before.end].endswith(" " + carried)
        assert 5 <= CL100K.count(carried) <= 10
        assert after.token_count <= 30


def test_recursive_chunker_prefers_the_biggest_separator() -> None:
    paragraphs = ["First paragraph is short.", "Second one too.", "Third closes it."]
    text = "\n\n".join(paragraphs)
    assert RecursiveChunker(chunk_size=8, overlap=0).chunk(text) == paragraphs
    assert RecursiveChunker(chunk_size=512, overlap=64).chunk(text) == [text]


def test_recursive_chunker_custom_separators_keep_them_attached() -> None:
    text = "a;b;c;d;e;f;g;h"
    chunks = RecursiveChunker(chunk_size=4, overlap=0, separators=(";",)).chunk(text)
    assert len(chunks) > 1 and "".join(chunks) == text
    assert all(c.endswith(";") for c in chunks[:-1])


SENTENCES_BY_TOPIC = [
    "The cat sleeps on the sofa.",
    "A kitten purrs softly.",
    "Cats have long whiskers.",
    "My cat purrs at night.",
    "Stocks fell sharply today.",
    "The bond market rallied.",
    "Shares of the bank rose.",
    "Bonds and stocks diverged.",
]


@pytest.mark.parametrize("window", [1, 2])
def test_semantic_chunker_breaks_between_topics(window: int) -> None:
    text = " ".join(SENTENCES_BY_TOPIC)
    chunker = SemanticChunker(TopicEmbedder(), chunk_size=500, window=window)
    assert chunker.chunk(text) == [
        " ".join(SENTENCES_BY_TOPIC[:4]),
        " ".join(SENTENCES_BY_TOPIC[4:]),
    ]


def test_semantic_chunker_also_breaks_on_size() -> None:
    text = " ".join(SENTENCES_BY_TOPIC)
    chunks = SemanticChunker(TopicEmbedder(), chunk_size=16).split(text, doc_id="d")
    assert len(chunks) > 2 and all(c.token_count <= 16 for c in chunks)
    assert not any("cat" in c.text.lower() and "stock" in c.text.lower() for c in chunks)


def test_semantic_chunker_does_not_break_text_on_one_topic() -> None:
    text = " ".join(["The cat purrs."] * 12)
    assert SemanticChunker(TopicEmbedder(), chunk_size=500).chunk(text) == [text]


def test_semantic_chunker_keeps_small_chunks_together_with_min_chunk_tokens() -> None:
    cats, stocks, more_cats = "The cat sleeps. A kitten purrs.", "Stocks fell.", "My cat naps."
    text = f"{cats} {stocks} {more_cats}"
    chunker = SemanticChunker(TopicEmbedder(), breakpoint_percentile=30)
    assert chunker.chunk(text) == [cats, stocks, more_cats]
    chunker = SemanticChunker(TopicEmbedder(), breakpoint_percentile=30, min_chunk_tokens=6)
    assert chunker.chunk(text) == [cats, f"{stocks} {more_cats}"]


def test_semantic_chunker_rejects_an_embedder_that_returns_the_wrong_shape() -> None:
    class Broken(TopicEmbedder):
        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            return np.ones((1, self.dim), dtype=np.float32)

    with pytest.raises(EmbeddingError, match="shape"):
        SemanticChunker(Broken()).chunk("One sentence. Two sentences. Three.")


@pytest.mark.parametrize(
    ("make", "numbers"),
    [
        (lambda: TextChunker(chunk_size=0), ["0"]),
        (lambda: TextChunker(chunk_size=100, overlap=100), ["100"]),
        (lambda: TextChunker(chunk_size=64, overlap=128), ["128", "64"]),
        (lambda: RecursiveChunker(chunk_size=-5), ["-5"]),
        (lambda: RecursiveChunker(chunk_size=10, overlap=-1), ["-1"]),
        (lambda: RecursiveChunker(separators=()), []),
        (lambda: MarkdownChunker(chunk_size=32, overlap=40), ["40", "32"]),
        (lambda: SemanticChunker(TopicEmbedder(), chunk_size=0), ["0"]),
        (lambda: SemanticChunker(TopicEmbedder(), breakpoint_percentile=101), ["101"]),
        (lambda: SemanticChunker(TopicEmbedder(), window=0), ["0"]),
        (lambda: SemanticChunker(TopicEmbedder(), chunk_size=8, min_chunk_tokens=9), ["9", "8"]),
    ],
)
def test_invalid_configuration_is_a_config_error_with_the_numbers(
    make: Callable[[], object], numbers: list[str]
) -> None:
    with pytest.raises(ConfigError) as error:
        make()
    assert all(n in str(error.value) for n in numbers)


@pytest.mark.parametrize("kind", FACTORIES)
def test_every_chunker_meets_the_protocol_and_handles_empty_text(kind: str) -> None:
    chunker = FACTORIES[kind](32, 0, CL100K)
    assert isinstance(chunker, Chunker)
    assert chunker.chunk("") == [] and chunker.split(" \n\t ", doc_id="d") == []


def test_metadata_is_merged_and_the_callers_dict_is_left_alone() -> None:
    metadata = {"source": "a.txt", "chunk_index": 99}
    chunks = TextChunker(chunk_size=8, overlap=0).split(
        "First part here. Second part here. Third.", doc_id="d", metadata=metadata
    )
    assert [c.metadata["chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert all(c.metadata["source"] == "a.txt" for c in chunks)
    assert metadata == {"source": "a.txt", "chunk_index": 99}


def test_the_default_counter_is_cl100k_and_shared() -> None:
    assert TextChunker().counter is MarkdownChunker().counter
    assert TextChunker().counter.name == "cl100k_base"


def test_one_megabyte_chunks_in_linear_time() -> None:
    sentence = "Employees book travel through the portal, e.g. flights and 3.14 km taxis. "
    paragraph = sentence * 12
    text = "\n\n".join([paragraph] * (1_000_000 // len(paragraph)))
    for chunker in (TextChunker(), RecursiveChunker(chunk_size=512, overlap=64)):
        started = time.perf_counter()
        chunks = chunker.split(text, doc_id="big")
        assert time.perf_counter() - started < 20  # ~0.6 s here; quadratic work takes minutes
        assert chunks and max(c.token_count for c in chunks) <= chunker.chunk_size
