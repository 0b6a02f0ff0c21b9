"""``ContextEngine``: the seed-002 facade — add documents, get a composed context string.

It chunks with a ``Chunker``, stores in a ``DocumentIndex`` (the "memory"), retrieves with a
``Retriever`` (hybrid BM25 + dense by default) and renders with a composer. Results are cached by
``(query, k, corpus version)``; any write bumps the version, so the cache never serves stale
context.

>>> from contextfold.testing import HashEmbedder
>>> engine = ContextEngine(memory=DocumentIndex(embedder=HashEmbedder()))
>>> _ = engine.add_document("Python was created by Guido van Rossum and released in 1991.")
>>> print(engine.get_context("Who created Python?", k=1).splitlines()[0])
Query: Who created Python?
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from contextfold.errors import ConfigError
from contextfold.items import ContextItem, QueryBundle
from contextfold.protocols import Retriever
from contextfold.retrieval.adapters import as_chunker, as_composer, as_retriever
from contextfold.retrieval.base import Chunker
from contextfold.retrieval.index import DocumentIndex
from contextfold.retrieval.retrievers import HybridRetriever
from contextfold.tokens import TiktokenCounter, TokenCounter
from contextfold.truncation import truncate_text

__all__ = ["ChainComposer", "Composer", "ContextComposer", "ContextEngine", "PromptComposer"]


@runtime_checkable
class Composer(Protocol):
    """Renders retrieved items into context text. Must keep the items' order and never
    exceed the composer's own token limit."""

    def compose(self, query: str, chunks: Sequence[ContextItem]) -> str: ...


def _label(n: int, item: ContextItem) -> str:
    source = item.metadata.get("source") or item.metadata.get("doc_id")
    return f"[Source {n}{': ' + str(source) if source else ''}] (score {item.score:.3f})"


class _TokenLimited:
    def __init__(self, max_context_length: int, counter: TokenCounter | None) -> None:
        if max_context_length <= 0:
            raise ConfigError(f"max_context_length must be positive, got {max_context_length}")
        self.max_context_length = max_context_length
        self.counter = counter if counter is not None else TiktokenCounter("cl100k_base")

    def _fill(
        self,
        head: str,
        chunks: Sequence[ContextItem],
        tail: str = "",
        finish: Callable[[str], str] = lambda text: text,
    ) -> str:
        """``finish(head + as many labelled chunks as fit + tail)``; the first chunk that does
        not fit is cut at a sentence boundary (marked), the rest are left out.

        The pieces are counted one by one, but text can tokenise to more once joined or
        ``finish``-ed (``"«x»\n"`` is a token more than ``"«x»\n\n"`` counted alone), so the
        finished string is counted exactly and, while it is over the limit, packed again in
        less room: the composed text never exceeds ``max_context_length``."""
        count = self.counter.count
        room = self.max_context_length - count(head) - count(tail)
        if room < 0:
            raise ConfigError(
                f"the composer's fixed text needs {count(head) + count(tail)} tokens but "
                f"max_context_length is {self.max_context_length}"
            )
        while True:
            parts = self._pack(chunks, room)
            text = finish(head + "".join(parts) + tail)
            over = count(text) - self.max_context_length
            if over <= 0:
                return text
            if not parts:
                raise ConfigError(
                    f"the composer's fixed text needs {count(text)} tokens but "
                    f"max_context_length is {self.max_context_length}"
                )
            room -= over  # each pass packs at least a token less, so this ends

    def _pack(self, chunks: Sequence[ContextItem], room: int) -> list[str]:
        """The labelled chunk blocks that fit in ``room`` tokens, counted one by one."""
        count = self.counter.count
        parts = []
        for n, item in enumerate(chunks, start=1):
            block = f"{_label(n, item)}\n{item.content}\n\n"
            cost = count(block)
            if cost <= room:
                parts.append(block)
                room -= cost
                continue
            label = f"{_label(n, item)}\n"
            cut = truncate_text(item.content, room - count(label) - 1, self.counter)
            if cut:
                parts.append(f"{label}{cut}\n\n")
            break
        return parts


class ContextComposer(_TokenLimited):
    """Query, then the chunks best first, each labelled ``[Source n: doc] (score s)``.

    ``max_context_length`` is in tokens (the seed counted characters; tokens are what a
    model's window is measured in).
    """

    def __init__(self, max_context_length: int = 4096, counter: TokenCounter | None = None):
        super().__init__(max_context_length, counter)

    def compose(self, query: str, chunks: Sequence[ContextItem]) -> str:
        head = f"Query: {query}\n\nRelevant Context:\n\n"
        return self._fill(head, chunks, finish=lambda text: text.rstrip() + "\n")


class PromptComposer(_TokenLimited):
    """A ready prompt: instructions asking for ``[Source n]`` citations, the sources, the
    question."""

    DEFAULT_INSTRUCTIONS = (
        "Answer the question using only the sources below. Cite every claim with its source "
        "label, e.g. [Source 1]. If the sources do not contain the answer, say so."
    )

    def __init__(
        self,
        max_context_length: int = 4096,
        counter: TokenCounter | None = None,
        *,
        instructions: str = DEFAULT_INSTRUCTIONS,
    ) -> None:
        super().__init__(max_context_length, counter)
        self.instructions = instructions

    def compose(self, query: str, chunks: Sequence[ContextItem]) -> str:
        head = f"{self.instructions}\n\nSources:\n\n"
        return self._fill(head, chunks, f"Question: {query}\nAnswer:")


class ChainComposer:
    """Runs several composers on the same chunks and joins their outputs in order."""

    def __init__(self, composers: Sequence[Composer], separator: str = "\n\n") -> None:
        if not composers:
            raise ConfigError("ChainComposer needs at least one composer")
        self.composers = list(composers)
        self.separator = separator

    def compose(self, query: str, chunks: Sequence[ContextItem]) -> str:
        return self.separator.join(c.compose(query, chunks).strip() for c in self.composers)


class ContextEngine:
    """Add documents, get composed context (seed 002's interface).

    ``memory`` defaults to an in-memory ``DocumentIndex`` (pass ``DocumentIndex(path=...)`` to
    persist), ``retriever`` to hybrid BM25 + dense over that memory, ``composer`` to
    ``ContextComposer``. A ``chunker`` given here is used for every document this engine adds.
    Seed 002's own part shapes are accepted: a chunker with only ``chunk(text)``, a retriever
    ``retrieve(query: str, k)`` returning ``{"text", "metadata", "score"}`` dicts, a composer
    that reads such dicts (``contextfold.retrieval.adapters``).
    """

    def __init__(
        self,
        chunker: Chunker | None = None,
        retriever: Retriever | Any | None = None,
        composer: Composer | None = None,
        memory: DocumentIndex | None = None,
        *,
        cache_size: int = 256,
    ) -> None:
        # Seed 002's own shapes (a bare chunk(text), dict-returning retrievers and composers
        # that read dicts) are adapted here, at the boundary (``retrieval.adapters``).
        adapted = as_chunker(chunker) if chunker is not None else None
        self.memory = memory if memory is not None else DocumentIndex(chunker=adapted)
        self.chunker = adapted or self.memory.chunker
        self.retriever = (
            as_retriever(retriever)
            if retriever is not None
            else HybridRetriever(memory=self.memory)
        )
        self.composer: Composer = (
            as_composer(composer) if composer is not None else ContextComposer()
        )
        self.document_ids: dict[str, bool] = {}
        self._cache: OrderedDict[tuple[str, int, int], str] = OrderedDict()
        self._cache_size = cache_size
        self.cache_hits = 0

    def add_document(self, document: str, metadata: dict[str, Any] | None = None) -> str:
        """Chunk, embed and index ``document``; returns its id (the same text gives the same
        id). Every hit's metadata carries ``doc_id``, ``chunk_index`` and ``chunk_count``."""
        result = self.memory.add_document(document, metadata, chunker=self.chunker)
        self.document_ids[result.doc_id] = True
        return result.doc_id

    def retrieve(self, query: str, k: int = 5) -> list[ContextItem]:
        """The ``k`` best chunks for ``query`` as items (best first)."""
        if k <= 0:
            raise ConfigError(f"k must be positive, got {k}")
        return list(self.retriever.retrieve(QueryBundle(query_str=query), k))

    def get_context(self, query: str, k: int = 5) -> str:
        """The composed context for ``query`` from the ``k`` best chunks (cached until the
        next write)."""
        key = (query, k, self.memory.version)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return cached
        context = self.composer.compose(query, self.retrieve(query, k))
        self._cache[key] = context
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return context

    def clear(self) -> None:
        """Remove every document and forget cached contexts."""
        self.memory.clear()
        self.document_ids = {}
        self._cache.clear()
