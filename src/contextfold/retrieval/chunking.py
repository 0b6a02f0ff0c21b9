"""Splitting documents into chunks measured in tokens.

Four chunkers implement the ``Chunker`` protocol:

- ``TextChunker``: packs paragraphs; splits a paragraph too big for a chunk by sentences and a
  sentence too big by tokens.
- ``RecursiveChunker``: a separator hierarchy (paragraph, line, sentence, word, token).
- ``MarkdownChunker``: one section per ATX heading, never merged across headings; every chunk
  knows its ``heading_path``.
- ``SemanticChunker``: breaks where consecutive sentences' embeddings drift apart.

They share one engine that works on character offsets, so a chunk's own content is always the
verbatim slice ``source[start:end]`` (whitespace at its edges trimmed) and nothing but
whitespace between chunks is ever dropped. With ``overlap``, a chunk's ``text`` also starts
with the last ``<= overlap`` tokens of the previous chunk (again a verbatim slice of the source,
so ``text == source[text_start:end]``), and the whole ``text`` still fits ``chunk_size``.

Sizes are tokens of the chunker's ``counter`` (``cl100k_base`` by default). Each piece is
counted once per level it is looked at, and each chunk once more, so chunking is linear in
the text. The one case a chunk can exceed ``chunk_size``: a single character that alone
counts more tokens than the room left for content (at most 4 tokens with tiktoken).
"""

from __future__ import annotations

import itertools
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from contextfold.errors import ConfigError, EmbeddingError
from contextfold.retrieval.base import Chunk, Embedder, chunk_id
from contextfold.tokens import TiktokenCounter, TokenCounter

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "DEFAULT_SEPARATORS",
    "MarkdownChunker",
    "RecursiveChunker",
    "SemanticChunker",
    "TextChunker",
    "markdown_sections",
    "sentence_spans",
]

#: A piece longer than ``limit * this`` characters is taken as too big without counting it
#: (an average token never spans this many characters); splitting it further loses nothing,
#: because its sub-pieces are packed back together.
_MAX_CHARS_PER_TOKEN = 64

Span = tuple[int, int]
Splitter = Callable[[str, int, int], list[Span]]


@cache
def _default_counter() -> TiktokenCounter:
    return TiktokenCounter("cl100k_base")


# --- sentences ------------------------------------------------------------------------------

# A terminator run (. ! ? …) with closing quotes or brackets, followed by whitespace; CJK full
# stops whether or not whitespace follows; every line break.
_TERMINATOR = re.compile(
    r"""(?P<end>[.!?…]+["'”’)\]]*)(?=\s)|(?P<cjk>[。！？]+[」』"'”’)\]]*)|(?P<nl>\n)"""
)
_NEXT_CHAR = re.compile(r"\s*(\S)")
_SPACE = re.compile(r"\s+")
_WORD_BEFORE = re.compile(r"\S{1,32}$")
_INITIALS = re.compile(r"(?:[^\W\d_]\.)*[^\W\d_]")  # "J", "U.S", "e.g"
_NO_BREAK_AFTER = frozenset((
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "gen", "col", "capt", "lt", "sgt",
    "rev", "hon", "fr", "e.g", "i.e", "cf", "vs", "viz", "approx", "ca", "al", "fig", "figs",
    "vol", "vols", "pp", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct",
    "nov", "dec",
))  # fmt: skip
_BEFORE_NUMBER = frozenset((
    "no", "nos", "fig", "figs", "vol", "vols", "pp", "ch", "sec", "art", "eq", "ref",
))  # fmt: skip


def _is_sentence_end(text: str, match: re.Match[str]) -> bool:
    nxt = _NEXT_CHAR.match(text, match.end())
    following = nxt.group(1) if nxt else ""
    if following.islower():  # a sentence rarely starts in lower case: "approx. three"
        return False
    if match.group("end") != ".":
        return True
    word_match = _WORD_BEFORE.search(text, max(0, match.start() - 32), match.start())
    word = word_match.group().lstrip("([{\"'“‘") if word_match else ""
    lowered = word.lower()
    if lowered in _NO_BREAK_AFTER or _INITIALS.fullmatch(word):
        return False
    return not (following.isdigit() and lowered in _BEFORE_NUMBER)


def sentence_spans(text: str, start: int = 0, end: int | None = None) -> list[Span]:
    """``(start, end)`` offsets of the sentences of ``text[start:end]``, whitespace trimmed.

    A small regex splitter, no model: a sentence ends after ``.``, ``!``, ``?`` or ``…``
    (with any closing quotes or brackets) followed by whitespace, after a CJK full stop, and
    at every line break. Its limits: a period after a known English abbreviation ("Dr.",
    "e.g.", "vs.", "Fig. 3"), a single initial ("J. Smith") or a dotted acronym ("U.S.") never
    ends a sentence, so "... in the U.S. He left." stays one sentence; a terminator followed
    by a lower-case word never ends one ("approx. three"); hard-wrapped prose is split at its
    line ends; decimals ("3.14") and versions ("1.2.3") are safe because no space follows
    their dots. Other languages' abbreviations are not known.

    >>> text = "Dr. Smith paid $3.14 in the U.S. on Monday. Then he left!"
    >>> [text[s:e] for s, e in sentence_spans(text)]
    ['Dr. Smith paid $3.14 in the U.S. on Monday.', 'Then he left!']
    """
    stop = len(text) if end is None else end
    cuts = [start]
    for match in _TERMINATOR.finditer(text, start, stop):
        if match.group("nl") is not None:
            cuts.append(match.start())
        elif match.group("cjk") is not None or _is_sentence_end(text, match):
            cuts.append(match.end())
    cuts.append(stop)
    return [span for a, b in itertools.pairwise(cuts) if (span := _trim(text, a, b))]


# --- splitters: (text, start, end) -> trimmed spans that cover every non-space character -----


def _trim(text: str, start: int, end: int) -> Span | None:
    """``(start, end)`` narrowed past whitespace at both edges; ``None`` if nothing is left."""
    piece = text[start:end]
    stripped = piece.lstrip()
    if not stripped:
        return None
    left = start + len(piece) - len(stripped)
    return left, left + len(stripped.rstrip())


_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")


def _paragraphs(text: str, start: int, end: int) -> list[Span]:
    cuts = [start]
    for match in _BLANK_LINE.finditer(text, start, end):
        cuts.extend((match.start(), match.end()))
    cuts.append(end)
    return [s for a, b in zip(cuts[::2], cuts[1::2], strict=True) if (s := _trim(text, a, b))]


def _separator_splitter(separator: str) -> Splitter:
    """Splits at every ``separator``, which stays at the end of the piece before it."""

    def split(text: str, start: int, end: int) -> list[Span]:
        spans: list[Span] = []
        pos = start
        while pos < end:
            found = text.find(separator, pos, end)
            stop = end if found < 0 else found + len(separator)
            if (span := _trim(text, pos, stop)) is not None:
                spans.append(span)
            pos = stop
        return spans

    return split


# --- the engine -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Piece:
    start: int
    end: int
    tokens: int  # exact count of text[start:end]; while packing, its cost after its neighbour


@dataclass(frozen=True, slots=True)
class _Section:
    """A stretch of the source whose chunks may overlap each other but nothing outside."""

    start: int
    end: int
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Planned:
    text_start: int  # where ``text`` starts: ``start`` minus any overlap
    start: int
    end: int
    metadata: dict[str, Any]


def _check_sizes(chunk_size: int, overlap: int) -> None:
    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be a positive number of tokens, got {chunk_size}")
    if overlap < 0:
        raise ConfigError(f"overlap must be >= 0 tokens, got {overlap}")
    if overlap >= chunk_size:
        raise ConfigError(
            f"overlap ({overlap} tokens) must be smaller than chunk_size ({chunk_size} tokens): "
            f"each chunk holds chunk_size - overlap tokens of new content; lower the overlap"
        )


class _Engine:
    """Splits and packs spans of one text under a token limit."""

    def __init__(self, text: str, counter: TokenCounter, limit: int) -> None:
        self.text = text
        self.counter = counter
        self.limit = limit

    def count(self, start: int, end: int) -> int:
        if end - start > self.limit * _MAX_CHARS_PER_TOKEN:
            return self.limit + 1
        return self.counter.count(self.text[start:end])

    def split(self, start: int, end: int, levels: Sequence[Splitter]) -> list[_Piece]:
        """Pieces of at most ``limit`` tokens covering ``text[start:end]``: split with
        ``levels[0]``, pack neighbours that fit, recurse into pieces that do not."""
        if not levels:
            return self.token_pieces(start, end)
        out: list[_Piece] = []
        run: list[_Piece] = []
        previous_end: int | None = None
        for s, e in levels[0](self.text, start, end):
            # Counted with the whitespace before it: what the piece costs after a neighbour.
            tokens = self.count(s if previous_end is None else previous_end, e)
            previous_end = e
            if tokens <= self.limit:
                run.append(_Piece(s, e, tokens))
                continue
            out.extend(self.pack(run))
            run = []
            out.extend(self.split(s, e, levels[1:]))
        out.extend(self.pack(run))
        return out

    def pack(
        self, pieces: Sequence[_Piece], breaks: frozenset[int] = frozenset(), min_tokens: int = 0
    ) -> list[_Piece]:
        """Greedily merge consecutive pieces while their estimated sum fits, then check each
        merge with an exact count (binary search for the longest prefix that fits if not).
        A merge also ends before a piece index in ``breaks`` once it holds ``min_tokens``."""
        out: list[_Piece] = []
        i = 0
        while i < len(pieces):
            estimate, j = pieces[i].tokens, i + 1
            while j < len(pieces) and estimate + pieces[j].tokens <= self.limit:
                if j in breaks and estimate >= min_tokens:
                    break
                estimate += pieces[j].tokens
                j += 1
            start = pieces[i].start
            exact = self.counter.count(self.text[start : pieces[j - 1].end])
            if exact > self.limit and j - i > 1:
                lo, hi = i + 1, j - 1  # the longest prefix that fits ends in [lo, hi]
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if self.count(start, pieces[mid - 1].end) <= self.limit:
                        lo = mid
                    else:
                        hi = mid - 1
                j = lo
                exact = self.counter.count(self.text[start : pieces[j - 1].end])
            if exact > self.limit:  # one piece that fits after a space but not on its own
                out.extend(self.token_pieces(start, pieces[j - 1].end))
            else:
                out.append(_Piece(start, pieces[j - 1].end, exact))
            i = j
        return out

    def token_pieces(self, start: int, end: int) -> list[_Piece]:
        """Cut ``text[start:end]`` at token boundaries into pieces of at most ``limit``
        tokens, reading a window a few times the limit at a time (never the whole text)."""
        out: list[_Piece] = []
        pos, budget = start, self.limit
        window = max(16, self.limit * 8)
        while (span := _trim(self.text, pos, end)) is not None:
            pos = span[0]
            while True:
                stop = min(end, pos + window)
                chunk = self.text[pos:stop]
                piece = self.counter.cut(chunk, budget)
                if len(piece) < len(chunk) or stop == end:
                    break
                window *= 2  # the whole window fits: look further ahead
            if not piece or not chunk.startswith(piece):
                piece = chunk[0]  # one character that alone exceeds the limit
            piece_end = pos + len(piece.rstrip())
            tokens = self.counter.count(self.text[pos:piece_end])
            if tokens > self.limit and budget > 1 and len(piece) > 1:
                budget -= 1  # trimming the piece made it count more: cut a little shorter
                continue
            out.append(_Piece(pos, piece_end, tokens))
            pos, budget = pos + len(piece), self.limit
        return out

    def overlap_start(self, previous: _Piece, piece: _Piece, overlap: int, size: int) -> int:
        """Where the text of ``piece`` starts once the tail of ``previous`` is prepended: at
        most ``overlap`` tokens, at a word boundary where one exists, the whole within
        ``size`` tokens."""
        room = min(overlap, size - piece.tokens)
        content = self.text[previous.start : previous.end]
        while room > 0:
            tail = self.counter.cut(content, room, from_end=True)
            if not tail or not content.endswith(tail):
                return piece.start
            if len(tail) < len(content) and not content[-len(tail) - 1].isspace():
                space = _SPACE.search(tail)  # the tail starts mid-word: begin after a space
                if space is not None and space.end() < len(tail):
                    tail = tail[space.end() :]
            tail = tail.lstrip()
            if not tail:
                return piece.start
            begin = previous.end - len(tail)
            total = self.counter.count(self.text[begin : piece.end])
            if total <= size and self.counter.count(tail) <= overlap:
                return begin
            room -= max(1, total - size)
        return piece.start


class _BaseChunker(ABC):
    """Turns planned spans into chunk texts and ``Chunk`` values."""

    chunk_size: int
    overlap: int
    _counter: TokenCounter | None

    @property
    def counter(self) -> TokenCounter:
        """The token counter sizes are measured with."""
        if self._counter is None:
            self._counter = _default_counter()
        return self._counter

    def _sections(self, text: str) -> list[_Section]:
        return [_Section(0, len(text))]

    @abstractmethod
    def _section_pieces(self, engine: _Engine, section: _Section) -> list[_Piece]:
        """The pieces of one section, in order (each subclass splits its own way)."""

    def _plan(self, text: str) -> list[_Planned]:
        engine = _Engine(text, self.counter, self.chunk_size - self.overlap)
        planned: list[_Planned] = []
        for section in self._sections(text):
            previous: _Piece | None = None
            for piece in self._section_pieces(engine, section):
                text_start = piece.start
                if previous is not None and self.overlap:
                    text_start = engine.overlap_start(
                        previous, piece, self.overlap, self.chunk_size
                    )
                planned.append(_Planned(text_start, piece.start, piece.end, section.metadata))
                previous = piece
        return planned

    def chunk(self, text: str) -> list[str]:
        """The chunk texts of ``text`` in order."""
        return [text[p.text_start : p.end] for p in self._plan(text)]

    def split(
        self, text: str, *, doc_id: str, metadata: dict[str, Any] | None = None
    ) -> list[Chunk]:
        """``Chunk`` values with stable ids, offsets, token counts and metadata."""
        planned = self._plan(text)
        chunks = []
        for index, p in enumerate(planned):
            body = text[p.text_start : p.end]
            meta = {**(metadata or {})}
            meta.update((k, list(v) if isinstance(v, list) else v) for k, v in p.metadata.items())
            meta.update(chunk_index=index, chunk_count=len(planned))
            chunks.append(
                Chunk(
                    id=chunk_id(doc_id, index, body),
                    doc_id=doc_id,
                    index=index,
                    text=body,
                    start=p.start,
                    end=p.end,
                    token_count=self.counter.count(body),
                    metadata=meta,
                )
            )
        return chunks

    def __repr__(self) -> str:
        return f"{type(self).__name__}(chunk_size={self.chunk_size}, overlap={self.overlap})"


class TextChunker(_BaseChunker):
    """Packs paragraphs (blank-line separated) into chunks of at most ``chunk_size`` tokens.

    A paragraph too big for a chunk is split by sentences (``sentence_spans``), a sentence too
    big by tokens. With ``overlap``, each chunk after the first starts with the last
    ``<= overlap`` tokens of the previous one, so each holds ``chunk_size - overlap`` tokens
    of new content.

    >>> chunker = TextChunker(chunk_size=8, overlap=0)
    >>> chunker.chunk("One short paragraph.\\n\\nAnother one here. And a third sentence.")
    ['One short paragraph.', 'Another one here.', 'And a third sentence.']
    """

    def __init__(
        self, chunk_size: int = 256, overlap: int = 32, counter: TokenCounter | None = None
    ) -> None:
        _check_sizes(chunk_size, overlap)
        self.chunk_size = chunk_size
        self.overlap = overlap
        self._counter = counter

    def _section_pieces(self, engine: _Engine, section: _Section) -> list[_Piece]:
        return engine.split(section.start, section.end, (_paragraphs, sentence_spans))


DEFAULT_SEPARATORS = ("\n\n", "\n", ". ", " ", "")


def _levels(separators: Sequence[str]) -> tuple[Splitter, ...]:
    """One splitter per separator up to ``""`` (token cuts, always the last resort)."""
    levels: list[Splitter] = []
    for separator in separators:
        if separator == "":
            break
        levels.append(_separator_splitter(separator))
    return tuple(levels)


class RecursiveChunker(_BaseChunker):
    """Splits on the first separator, recurses with the next one into pieces still too big,
    and merges neighbouring pieces up to ``chunk_size`` tokens.

    Separators stay attached to the end of the piece before them, so no text is lost; ``""``
    means a cut at token boundaries, which is also the implied last resort.

    >>> chunker = RecursiveChunker(chunk_size=6, overlap=0)
    >>> chunker.chunk("alpha beta gamma.\\nDelta epsilon zeta eta theta.")
    ['alpha beta gamma.', 'Delta epsilon zeta eta', 'theta.']
    """

    def __init__(
        self,
        chunk_size: int = 256,
        overlap: int = 32,
        separators: Sequence[str] = DEFAULT_SEPARATORS,
        counter: TokenCounter | None = None,
    ) -> None:
        _check_sizes(chunk_size, overlap)
        if not separators:
            raise ConfigError(
                "separators must not be empty; the default is " + repr(DEFAULT_SEPARATORS)
            )
        self.chunk_size = chunk_size
        self.overlap = overlap
        self.separators = tuple(separators)
        self._counter = counter
        self._levels = _levels(self.separators)

    def _section_pieces(self, engine: _Engine, section: _Section) -> list[_Piece]:
        return engine.split(section.start, section.end, self._levels)


# --- Markdown -------------------------------------------------------------------------------

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+|$)(.*)")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")


def markdown_sections(text: str) -> list[tuple[int, int, list[str]]]:
    """``(start, end, heading_path)`` for each section of a Markdown text: the text before the
    first heading (path ``[]``), then one section per ATX heading (``#`` to ``######``), from
    its heading line to the next heading. ``#`` lines inside fenced code blocks (backticks or
    tildes) are not headings; setext (underlined) headings are not recognised."""
    sections: list[tuple[int, int, list[str]]] = []
    stack: list[tuple[int, str]] = []
    section_start, path = 0, list[str]()
    fence: str | None = None
    pos = 0
    for line in text.split("\n"):  # lines end at \n or \r\n (a lone \r is no line end)
        bare = line.rstrip("\r")
        if fence is not None:
            if (
                bare.strip()
                and bare.lstrip(" ").startswith(fence)
                and (not bare.strip().strip(fence[0]))
            ):
                fence = None
        elif (opening := _FENCE.match(bare)) is not None:
            marker = opening.group(1)
            if not (marker[0] == "`" and "`" in bare[opening.end() :]):
                fence = marker
        elif (heading := _ATX.match(bare)) is not None:
            level = len(heading.group(1))
            title = _CLOSING_HASHES.sub("", heading.group(2)).strip()
            sections.append((section_start, pos, path))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            section_start, path = pos, [t for _, t in stack]
        pos += len(line) + 1
    sections.append((section_start, len(text), path))
    return [s for s in sections if s[0] < s[1]]


class MarkdownChunker(_BaseChunker):
    """Splits Markdown at its ATX headings and never merges text under different headings.

    Each chunk's metadata carries ``heading_path`` (the headings above it, outermost first)
    and ``heading`` (the innermost, ``None`` before the first heading). A section too big for
    one chunk is split like ``RecursiveChunker`` does, inside the section. Text is kept
    verbatim, heading lines included; ``#`` lines inside fenced code blocks are not headings.

    >>> chunks = MarkdownChunker(chunk_size=64).split("# Travel\\n\\n## Taxis\\nUse the app.",
    ...     doc_id="policy")
    >>> [(c.text, c.metadata["heading_path"]) for c in chunks]
    [('# Travel', ['Travel']), ('## Taxis\\nUse the app.', ['Travel', 'Taxis'])]
    """

    def __init__(
        self, chunk_size: int = 256, overlap: int = 0, counter: TokenCounter | None = None
    ) -> None:
        _check_sizes(chunk_size, overlap)
        self.chunk_size = chunk_size
        self.overlap = overlap
        self._counter = counter
        self._levels = _levels(DEFAULT_SEPARATORS)

    def _sections(self, text: str) -> list[_Section]:
        return [
            _Section(start, end, {"heading_path": path, "heading": path[-1] if path else None})
            for start, end, path in markdown_sections(text)
        ]

    def _section_pieces(self, engine: _Engine, section: _Section) -> list[_Piece]:
        return engine.split(section.start, section.end, self._levels)


# --- semantic -------------------------------------------------------------------------------


class SemanticChunker(_BaseChunker):
    """Breaks between sentences whose meaning drifts apart, and whenever a chunk would exceed
    ``chunk_size`` tokens.

    Sentences (``sentence_spans``; one too big for a chunk is cut by tokens) are embedded with
    ``embedder``. For each gap, the cosine distance between the mean embedding of the
    ``window`` sentences before it and of the ``window`` after it is computed; gaps whose
    distance is above the ``breakpoint_percentile``-th percentile of all gaps become breaks,
    unless the chunk so far holds fewer than ``min_chunk_tokens`` tokens. Chunks do not
    overlap.

    >>> import numpy as np
    >>> class TopicEmbedder:  # "cat" sentences and the rest, as two directions
    ...     name, dim = "topics", 2
    ...     def embed(self, texts):
    ...         rows = [[1, 0] if "cat" in t.lower() else [0, 1] for t in texts]
    ...         return np.array(rows, dtype=np.float32)
    >>> text = "The cat sleeps. A cat purrs. Cats nap. Stocks fell. Bonds rose."
    >>> SemanticChunker(TopicEmbedder(), chunk_size=64, breakpoint_percentile=50).chunk(text)
    ['The cat sleeps. A cat purrs. Cats nap.', 'Stocks fell. Bonds rose.']
    """

    overlap = 0

    def __init__(
        self,
        embedder: Embedder,
        *,
        chunk_size: int = 256,
        breakpoint_percentile: float = 90.0,
        window: int = 1,
        min_chunk_tokens: int = 0,
        counter: TokenCounter | None = None,
    ) -> None:
        _check_sizes(chunk_size, 0)
        if not 0.0 <= breakpoint_percentile <= 100.0:
            raise ConfigError(
                f"breakpoint_percentile must be within 0..100, got {breakpoint_percentile}"
            )
        if window < 1:
            raise ConfigError(f"window must be >= 1 sentence, got {window}")
        if not 0 <= min_chunk_tokens <= chunk_size:
            raise ConfigError(
                f"min_chunk_tokens ({min_chunk_tokens}) must be within 0..chunk_size ({chunk_size})"
            )
        self.embedder = embedder
        self.chunk_size = chunk_size
        self.breakpoint_percentile = breakpoint_percentile
        self.window = window
        self.min_chunk_tokens = min_chunk_tokens
        self._counter = counter

    def __repr__(self) -> str:
        return (
            f"SemanticChunker({self.embedder.name!r}, chunk_size={self.chunk_size}, "
            f"breakpoint_percentile={self.breakpoint_percentile}, window={self.window})"
        )

    def _section_pieces(self, engine: _Engine, section: _Section) -> list[_Piece]:
        pieces: list[_Piece] = []
        previous_end: int | None = None
        for s, e in sentence_spans(engine.text, section.start, section.end):
            tokens = engine.count(s if previous_end is None else previous_end, e)
            previous_end = e
            if tokens <= engine.limit or engine.count(s, e) <= engine.limit:
                pieces.append(_Piece(s, e, tokens))
            else:
                pieces.extend(engine.token_pieces(s, e))
        if len(pieces) < 2:
            return engine.pack(pieces)
        distances = self._distances([engine.text[p.start : p.end] for p in pieces])
        import numpy as np

        threshold = np.percentile(distances, self.breakpoint_percentile)
        breaks = frozenset(int(i) + 1 for i in np.flatnonzero(distances > threshold))
        return engine.pack(pieces, breaks, self.min_chunk_tokens)

    def _distances(self, sentences: list[str]) -> npt.NDArray[np.float64]:
        """Cosine distance across each gap between the windows of sentences around it."""
        import numpy as np

        vectors = np.asarray(self.embedder.embed(sentences), dtype=np.float64)
        n = len(sentences)
        if vectors.ndim != 2 or vectors.shape[0] != n:
            raise EmbeddingError(
                f"embedder {self.embedder.name!r} returned shape {vectors.shape} for {n} "
                "sentences; expected one row per sentence"
            )
        sums = np.vstack([np.zeros((1, vectors.shape[1])), np.cumsum(vectors, axis=0)])
        gaps = np.arange(1, n)  # gap g lies between sentence g - 1 and sentence g
        left = sums[gaps] - sums[np.maximum(gaps - self.window, 0)]
        right = sums[np.minimum(gaps + self.window, n)] - sums[gaps]
        norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
        dots = np.einsum("ij,ij->i", left, right)
        cosine = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
        # Rounded so float noise between equally distant gaps never decides a break.
        result: npt.NDArray[np.float64] = np.round(1.0 - cosine, 9)
        return result
