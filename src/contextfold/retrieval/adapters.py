"""Seed 002's own plug-in shapes, adapted at the boundary of ``ContextEngine`` and
``retriever_step``.

Seed 002 writes its parts against plain shapes: a chunker with only ``chunk(text) ->
list[str]``, a retriever ``retrieve(query: str, k) -> [{"text", "metadata", "score"}]`` and a
composer ``compose(query, chunks)`` that reads ``chunk["text"]`` and ``chunk["score"]``. Such
parts are accepted as they are: ``as_chunker``, ``as_retriever`` and ``as_composer`` wrap them
so the rest of contextfold sees its own protocols, and a part without the method it needs is
refused with an error that names the method.

>>> class Paragraphs:
...     def chunk(self, text):
...         return [p for p in text.split("\\n\\n") if p.strip()]
>>> [c.text for c in as_chunker(Paragraphs()).split("One.\\n\\nTwo.", doc_id="d")]
['One.', 'Two.']
>>> class Fixed:
...     def retrieve(self, query, k=5):
...         return [{"text": "Paris is in France.", "metadata": {"src": "atlas"}, "score": 0.9}]
>>> item = as_retriever(Fixed()).retrieve(QueryBundle(query_str="where is Paris"), 3)[0]
>>> item.content, item.score, item.metadata["src"]
('Paris is in France.', 0.9, 'atlas')
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from contextfold.errors import ConfigError
from contextfold.items import ContextItem, QueryBundle, SourceType
from contextfold.retrieval.base import Chunk, Chunker, chunk_id, content_hash
from contextfold.tokens import TiktokenCounter, TokenCounter

__all__ = ["ChunkView", "as_chunker", "as_composer", "as_retriever", "to_item"]


def _method(part: object, name: str, signature: str, role: str) -> Any:
    fn = getattr(part, name, None)
    if not callable(fn):
        raise ConfigError(
            f"{type(part).__name__} cannot be used as a {role}: it has no {name}{signature} method"
        )
    return fn


# -- chunkers -------------------------------------------------------------------------------


class ChunkTextAdapter:
    """A chunker with only ``chunk(text) -> list[str]`` as a full ``Chunker``: ``split``
    finds each chunk in the text (in order; a chunk with overlap starts before the previous
    one's end) for its offsets, and gives it a stable id and a token count."""

    def __init__(self, chunker: Any, counter: TokenCounter | None = None) -> None:
        self.inner = chunker
        self._chunk = _method(chunker, "chunk", "(text) -> list[str]", "chunker")
        self.counter = counter if counter is not None else TiktokenCounter("cl100k_base")

    def __repr__(self) -> str:
        return f"ChunkTextAdapter({self.inner!r})"

    def chunk(self, text: str) -> list[str]:
        out = self._chunk(text)
        if not isinstance(out, list | tuple) or not all(isinstance(c, str) for c in out):
            raise ConfigError(
                f"{type(self.inner).__name__}.chunk(text) returned {type(out).__name__}; "
                "a chunker returns a list of strings"
            )
        return [c for c in out if c.strip()]

    def split(
        self, text: str, *, doc_id: str, metadata: dict[str, Any] | None = None
    ) -> list[Chunk]:
        pieces = self.chunk(text)
        chunks, cursor = [], 0
        for index, body in enumerate(pieces):
            start = text.find(body, cursor)
            if start < 0:
                start = text.find(body)
            if start < 0:  # rewritten text (normalised spaces …): place it after the last
                start = cursor
            end = min(len(text), start + len(body))
            cursor = max(start + 1, min(end, len(text)))
            chunks.append(
                Chunk(
                    id=chunk_id(doc_id, index, body),
                    doc_id=doc_id,
                    index=index,
                    text=body,
                    start=start,
                    end=end,
                    token_count=self.counter.count(body),
                    metadata={
                        **(metadata or {}),
                        "chunk_index": index,
                        "chunk_count": len(pieces),
                    },
                )
            )
        return chunks


def as_chunker(chunker: Any, counter: TokenCounter | None = None) -> Chunker:
    """``chunker`` itself when it has ``chunk`` and ``split``; wrapped when it has only
    ``chunk(text) -> list[str]``; ``ConfigError`` when it has neither."""
    if callable(getattr(chunker, "split", None)) and callable(getattr(chunker, "chunk", None)):
        return chunker  # type: ignore[no-any-return]
    return ChunkTextAdapter(chunker, counter)


# -- retrievers -----------------------------------------------------------------------------


def to_item(value: Any, *, where: str = "retriever") -> ContextItem:
    """A retrieved value as a retrieval ``ContextItem``: a ``ContextItem`` as it is, or a
    seed-002 dict ``{"text", "metadata", "score"}`` (``"content"`` may stand for ``"text"``;
    the id is ``metadata["id"]`` / ``["chunk_id"]``, else a hash of the text)."""
    if isinstance(value, ContextItem):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where} returned a {type(value).__name__}; expected ContextItems or dicts with "
            '"text", "metadata" and "score"'
        )
    text = value.get("text", value.get("content"))
    if not isinstance(text, str):
        raise ConfigError(
            f'{where} returned a dict without a "text" string (keys: {sorted(map(str, value))})'
        )
    metadata = value.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise ConfigError(f'{where} returned "metadata" that is not a dict')
    score = value.get("score", 0.0)
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise ConfigError(f'{where} returned a "score" that is not a number: {score!r}')
    ident = value.get("id") or metadata.get("id") or metadata.get("chunk_id")
    return ContextItem(
        id=str(ident) if ident else content_hash(text)[:20],
        content=text,
        source=SourceType.RETRIEVAL,
        score=float(score),
        metadata=dict(metadata),
    )


def _takes_text(fn: Any) -> bool:
    """Whether ``retrieve`` is seed-shaped: ``retrieve(query: str, k)`` rather than
    contextfold's ``retrieve(query: QueryBundle, top_k)``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    first = next(iter(params.values()), None)
    if first is None:
        return False
    if first.annotation in (str, "str"):
        return True
    return "k" in params and "top_k" not in params


class DictRetrieverAdapter:
    """A seed-shaped retriever (``retrieve(query: str, k)`` returning dicts or items) as a
    contextfold ``Retriever``: it gets the query text and ``k``, and what it returns becomes
    ``ContextItem``s, at most ``top_k``."""

    def __init__(self, retriever: Any) -> None:
        self.inner = retriever
        self._retrieve = _method(retriever, "retrieve", "(query, k)", "retriever")
        self._text = _takes_text(self._retrieve)

    def __repr__(self) -> str:
        return f"DictRetrieverAdapter({self.inner!r})"

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        bundle = query if isinstance(query, QueryBundle) else QueryBundle(query_str=query)
        out = (
            self._retrieve(bundle.query_str, top_k) if self._text else self._retrieve(bundle, top_k)
        )
        if not isinstance(out, list | tuple):
            raise ConfigError(
                f"{type(self.inner).__name__}.retrieve returned {type(out).__name__}; expected "
                "a list"
            )
        where = f"{type(self.inner).__name__}.retrieve"
        return [to_item(value, where=where) for value in out[:top_k]]


def as_retriever(retriever: Any) -> Any:
    """A contextfold ``Retriever`` for ``retriever``: contextfold's own retrievers as they
    are, anything else with ``retrieve`` wrapped by ``DictRetrieverAdapter`` (which also
    passes ``ContextItem``s through); ``ConfigError`` without ``retrieve``."""
    _method(retriever, "retrieve", "(query, k)", "retriever")
    if type(retriever).__module__.startswith("contextfold.") and not _takes_text(
        retriever.retrieve
    ):
        return retriever
    return DictRetrieverAdapter(retriever)


# -- composers ------------------------------------------------------------------------------


class ChunkView(dict[str, Any]):
    """A retrieved item as seed 002's chunk dict (``text``, ``metadata``, ``score``, ``id``)
    that also answers the ``ContextItem`` attributes (``chunk.content``, ``chunk.score``), so
    a composer written either way reads it."""

    def __init__(self, item: ContextItem) -> None:
        super().__init__(text=item.content, metadata=dict(item.metadata), score=item.score)
        self["id"] = item.id
        self.item = item

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["item"], name)


class DictComposerAdapter:
    """A composer that reads seed-002 chunk dicts: it gets ``ChunkView``s."""

    def __init__(self, composer: Any) -> None:
        self.inner = composer
        self._compose = _method(composer, "compose", "(query, chunks) -> str", "composer")

    def __repr__(self) -> str:
        return f"DictComposerAdapter({self.inner!r})"

    def compose(self, query: str, chunks: Sequence[ContextItem]) -> str:
        out = self._compose(query, [ChunkView(item) for item in chunks])
        if not isinstance(out, str):
            raise ConfigError(
                f"{type(self.inner).__name__}.compose returned {type(out).__name__}; a "
                "composer returns the context text"
            )
        return out


def as_composer(composer: Any) -> Any:
    """contextfold's composers as they are; any other object with ``compose`` gets chunk
    views that read both as seed dicts and as items; ``ConfigError`` without ``compose``."""
    _method(composer, "compose", "(query, chunks) -> str", "composer")
    if type(composer).__module__.startswith("contextfold."):
        return composer
    return DictComposerAdapter(composer)
