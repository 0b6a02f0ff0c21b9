"""The shapes retrieval parts share: the ``Embedder`` and ``Chunker`` protocols, chunks and hits.

Everything in ``contextfold.retrieval`` speaks these types, so an embedder, a chunker or an index
can be swapped without touching the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Chunk", "Chunker", "Embedder", "MatchSource", "SearchHit", "chunk_id", "content_hash"]

MatchSource = Literal["bm25", "vector", "hybrid"]


def content_hash(text: str) -> str:
    """The sha256 hex digest of ``text`` (UTF-8); the key of every content-addressed cache."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(doc_id: str, index: int, text: str) -> str:
    """A stable chunk id: the same document, position and text always give the same id."""
    return hashlib.sha256(f"{doc_id}\x1f{index}\x1f{text}".encode()).hexdigest()[:20]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors.

    Implementations must guarantee: ``embed(texts)`` returns a ``float32`` array of shape
    ``(len(texts), dim)`` whose rows are L2-normalised (so a dot product is the cosine), row *i*
    for ``texts[i]``; the same text always gives the same vector; the input is never mutated;
    an empty input gives shape ``(0, dim)``. ``name`` identifies the model (and revision) so
    vectors from different models never share a cache or an index.
    """

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...


class Chunk(BaseModel):
    """One piece of a document, with where it came from.

    ``start``/``end`` are character offsets into the source text (``text`` may carry overlap
    from the previous chunk, so ``text`` is not always ``source[start:end]``; ``start`` is where
    the chunk's own content begins).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    doc_id: str
    index: int
    text: str
    start: int
    end: int
    token_count: int
    metadata: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Chunker(Protocol):
    """Splits a document into chunks.

    ``chunk(text)`` returns the chunk texts in document order (seed API); ``split`` returns
    ``Chunk`` values with stable ids (``chunk_id(doc_id, index, text)``), offsets, token counts
    and ``metadata`` merged into each chunk's metadata. Both never return empty chunks, and
    splitting the same text twice gives the same chunks.
    """

    def chunk(self, text: str) -> list[str]: ...

    def split(
        self, text: str, *, doc_id: str, metadata: dict[str, Any] | None = None
    ) -> list[Chunk]: ...


class SearchHit(BaseModel):
    """One retrieved chunk with every signal that ranked it.

    ``ranks`` and ``scores`` are keyed by signal (``"bm25"``, ``"vector"``, ``"hybrid"``); ranks
    are 1-based, and a signal that did not return the chunk is absent. ``match_source`` says
    which signals found it: ``"hybrid"`` when both did.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    text: str
    score: float
    match_source: MatchSource
    ranks: dict[str, int] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
