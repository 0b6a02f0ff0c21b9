"""Extension points as structural protocols: implement the method, no base class needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from contextfold.items import ContextItem, QueryBundle

__all__ = ["AsyncRetriever", "MemoryProvider", "PostProcessor", "Reranker", "Retriever"]


@runtime_checkable
class Retriever(Protocol):
    """Finds items for a query. Must return at most ``top_k`` items, best first, and never
    mutate its inputs."""

    def retrieve(self, query: QueryBundle, top_k: int) -> list[ContextItem]: ...


@runtime_checkable
class AsyncRetriever(Protocol):
    """``Retriever`` for async code (used by ``abuild()``)."""

    async def aretrieve(self, query: QueryBundle, top_k: int) -> list[ContextItem]: ...


@runtime_checkable
class PostProcessor(Protocol):
    """Transforms the candidate list (e.g. deduplicate, redact). Returns a new list."""

    def process(self, items: list[ContextItem], query: QueryBundle) -> list[ContextItem]: ...


@runtime_checkable
class Reranker(Protocol):
    """Re-orders items for a query; returns at most ``top_k``, best first, with scores set."""

    def rerank(
        self, query: QueryBundle, items: Sequence[ContextItem], top_k: int
    ) -> list[ContextItem]: ...


@runtime_checkable
class MemoryProvider(Protocol):
    """Supplies memory for a build: conversation turns, facts, summaries, paged-in topics."""

    def context_items(self, query: QueryBundle) -> list[ContextItem]: ...
