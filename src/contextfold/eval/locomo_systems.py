"""The systems the LoCoMo harness compares: a protocol, a registry of factories, and the
baselines (``truncation``, ``bm25``, ``dense``, ``rrf``, ``oracle``).

A system is built fresh for every conversation by its factory, which receives the shared
:class:`SystemContext` (the token counter every budget is measured with, and one embedder whose
vectors for stored texts are cached, so ``dense`` and ``rrf`` embed each turn once). Adding a
system takes a class and one decorator::

    @register_system("recent-first")
    class RecentFirst(RankingSystem):
        fill = "stop"

        def rank(self, question: str) -> list[int]:
            return list(reversed(range(len(self.turns))))

or, for a system that is not a turn ranker (the memory engine), any object with ``name``,
``ingest`` and ``contexts`` registered with ``register_system("engine", Engine)``.

Every baseline returns the chosen turns' ``turn_text`` joined by ``"\\n"`` and presented in
*conversation order* (evidence recall does not depend on the order; see docs/eval-locomo.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    ClassVar,
    Literal,
    Protocol,
    TypeVar,
    overload,
    runtime_checkable,
)

import numpy as np

from contextfold.errors import ConfigError
from contextfold.eval.locomo import LocomoConversation, LocomoTurn
from contextfold.tokens import TiktokenCounter, TokenCounter

if TYPE_CHECKING:
    import numpy.typing as npt

    from contextfold.retrieval.base import Embedder
    from contextfold.retrieval.embedders import CachedEmbedder
    from contextfold.store.protocols import MemoryStorage

__all__ = [
    "SYSTEMS",
    "ContextSystem",
    "Fill",
    "RankingSystem",
    "SystemContext",
    "SystemFactory",
    "pack_turns",
    "register_system",
]

Fill = Literal["skip", "stop"]
"""How a ranked list fills a budget: ``skip`` passes over a turn that does not fit and tries
the next; ``stop`` ends at the first turn that does not fit."""


@runtime_checkable
class ContextSystem(Protocol):
    """What the harness evaluates: a memory that is fed one conversation, then asked for
    context under several token budgets at once.

    The harness calls ``ingest`` once, with the conversation whose ``turns`` are in order and
    timestamped, then ``contexts`` once per question with every budget, so a system can rank
    once and pack per budget. Implementers guarantee:

    - ``contexts`` returns a ``str`` for every budget asked, each at most that many tokens
      under the :class:`SystemContext`'s counter (the harness checks and fails loudly);
    - only ``conversation.speakers`` and ``conversation.turns`` are read: ``qa`` is the gold
      (the ``oracle`` baseline is the one exception, by definition);
    - a turn counts as recalled only if its ``turn_text`` appears verbatim in the context.
    """

    name: str

    def ingest(self, conversation: LocomoConversation) -> None: ...

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]: ...


class SystemContext:
    """What every system of a run shares: the token ``counter`` (default ``cl100k_base``)
    and a lazily created embedder (default all-MiniLM-L6-v2).

    ``embed_stored`` caches vectors by text (in memory, and in the SQLite file
    ``embedding_cache`` when given), so systems that embed the same turns pay once.
    ``embed_query`` never caches: a question's embedding is part of the latency measured.

    ``memory_store`` is where the ``contextfold`` system keeps each conversation: ``None``
    (default) a fresh in-memory SQLite store per conversation; a ``postgresql://`` URL or a
    file path one store for the run, each conversation's session deleted before the next is
    ingested (so its ranking statistics are those of that conversation alone, as in memory).

    >>> from contextfold.testing import HashEmbedder
    >>> ctx = SystemContext(embedder=HashEmbedder(dim=32))
    >>> ctx.embed_stored(["a cat", "a dog"]).shape, ctx.embed_query("cat").shape
    ((2, 32), (32,))
    """

    def __init__(
        self,
        counter: TokenCounter | None = None,
        *,
        embedder: Embedder | None = None,
        embedding_cache: str | Path | None = None,
        memory_store: str | None = None,
    ) -> None:
        # A bounded cache: contexts are counted too, and 4k-token strings add up.
        self.counter: TokenCounter = (
            counter if counter is not None else TiktokenCounter("cl100k_base", cache_size=8_192)
        )
        self._inner = embedder
        self._cache_path = embedding_cache
        self._cached: CachedEmbedder | None = None
        self.memory_store = memory_store
        self._store: MemoryStorage | None = None

    def shared_store(self) -> MemoryStorage:
        """The run's one memory store at ``memory_store`` (opened on first use)."""
        if self._store is None:
            from contextfold.store import open_memory_store

            assert self.memory_store is not None
            self._store = open_memory_store(self.memory_store, counter=self.counter)
        return self._store

    @property
    def embedding_cache(self) -> str | None:
        """The SQLite file stored vectors are cached in across runs (``None``: memory only)."""
        return None if self._cache_path is None else str(self._cache_path)

    @property
    def embedder(self) -> Embedder:
        """The uncached embedder (created on first use)."""
        if self._inner is None:
            from contextfold.retrieval.embedders import MiniLMEmbedder

            self._inner = MiniLMEmbedder()
        return self._inner

    def embed_stored(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Unit vectors for texts a system stores, one row each, embedded once per run."""
        if self._cached is None:
            from contextfold.retrieval.embedders import CachedEmbedder

            self._cached = CachedEmbedder(self.embedder, path=self._cache_path)
        return self._cached.embed(texts)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The unit vector of one question, embedded now."""
        vectors = self.embedder.embed([text])
        return np.asarray(vectors[0], dtype=np.float32)

    def close(self) -> None:
        """Close the embedding cache file and the shared memory store, if open."""
        if self._cached is not None:
            self._cached.close()
        if self._store is not None:
            self._store.close()
            self._store = None


SystemFactory = Callable[[SystemContext], ContextSystem]
"""Builds a fresh system for one conversation; a class taking a ``SystemContext`` is one."""

SYSTEMS: dict[str, SystemFactory] = {}
"""Every registered system by name; ``contextfold eval locomo --systems`` chooses from it."""

F = TypeVar("F", bound=SystemFactory)


@overload
def register_system(
    name: str, factory: None = None, *, replace: bool = False
) -> Callable[[F], F]: ...


@overload
def register_system(name: str, factory: F, *, replace: bool = False) -> F: ...


def register_system(
    name: str, factory: F | None = None, *, replace: bool = False
) -> F | Callable[[F], F]:
    """Register ``factory`` under ``name``; without ``factory``, a decorator.

    Raises ``ConfigError`` when ``name`` is taken, unless ``replace``.
    """
    if not name or "," in name or name != name.strip():
        raise ConfigError(f"a system name must be non-empty, without commas or padding: {name!r}")

    def add(f: F) -> F:
        if name in SYSTEMS and not replace:
            raise ConfigError(f"a LoCoMo system called {name!r} is already registered")
        SYSTEMS[name] = f
        return f

    return add if factory is None else add(factory)


# --------------------------------------------------------------------------- packing


def pack_turns(
    order: Iterable[int],
    texts: Sequence[str],
    costs: Sequence[int],
    budget: int,
    counter: TokenCounter,
    *,
    fill: Fill = "skip",
) -> str:
    """Take turns in ``order`` (indices into ``texts``, best first) while they fit ``budget``
    and join the chosen ones with ``"\\n"`` in conversation (index) order.

    ``costs[i]`` is ``counter.count(texts[i] + "\\n")``, the tokens the turn takes as one line
    of the context. With cl100k the newline usually merges into the turn's final punctuation
    (``".\\n"`` is one token), so a separate newline token per join would waste budget; the
    sum of line costs is exact or one token over. The joined text is then counted exactly
    and, should it ever exceed ``budget``, the lowest-ranked turns are dropped until it fits.

    >>> counter = TiktokenCounter("cl100k_base")
    >>> texts = ["A: one two three four five six.", "B: hi.", "A: yes."]
    >>> costs = [counter.count(t + "\\n") for t in texts]
    >>> pack_turns([0, 1, 2], texts, costs, 8, counter, fill="skip")
    'B: hi.\\nA: yes.'
    >>> pack_turns([0, 1, 2], texts, costs, 8, counter, fill="stop")
    ''
    """
    picked: list[int] = []
    seen: set[int] = set()
    used = 0
    for i in order:
        if i in seen:
            continue
        if used + costs[i] <= budget:
            picked.append(i)
            seen.add(i)
            used += costs[i]
        elif fill == "stop":
            break
    while picked:
        text = "\n".join(texts[i] for i in sorted(picked))
        if counter.count(text) <= budget:
            return text
        picked.pop()
    return ""


class RankingSystem(ABC):
    """Base for systems that rank the conversation's turns per question: override ``rank``
    (and ``prepare`` to build an index at ingest); packing per budget is done here.

    ``fill`` is the :data:`Fill` rule; ``self.turns``, ``self.texts`` (``turn_text``) and
    ``self.costs`` (tokens per turn as a line of context, see :func:`pack_turns`) are set by
    ``ingest``.
    """

    name: str = "ranking"
    fill: ClassVar[Fill] = "skip"

    def __init__(self, ctx: SystemContext) -> None:
        self.ctx = ctx
        self.turns: tuple[LocomoTurn, ...] = ()
        self.texts: list[str] = []
        self.costs: list[int] = []

    def ingest(self, conversation: LocomoConversation) -> None:
        self.turns = conversation.turns
        self.texts = [t.turn_text for t in self.turns]
        self.costs = [self.ctx.counter.count(t + "\n") for t in self.texts]
        self.prepare(conversation)

    def prepare(self, conversation: LocomoConversation) -> None:  # noqa: B027 (optional hook)
        """Build whatever ``rank`` needs (called by ``ingest`` once the turns are set)."""

    @abstractmethod
    def rank(self, question: str) -> Sequence[int]:
        """Turn indices, best first (need not cover every turn)."""

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
        order = list(self.rank(question))
        counter = self.ctx.counter
        return {
            b: pack_turns(order, self.texts, self.costs, b, counter, fill=self.fill)
            for b in budgets
        }


# --------------------------------------------------------------------------- baselines


@register_system("truncation")
class TruncationSystem(RankingSystem):
    """The most recent turns that fit: a contiguous tail of the conversation."""

    name = "truncation"
    fill = "stop"

    def rank(self, question: str) -> Sequence[int]:
        return range(len(self.turns) - 1, -1, -1)


class _Bm25Ranker:
    def __init__(self, texts: Sequence[str]) -> None:
        from contextfold.retrieval.sparse import BM25Index

        self.index = BM25Index()
        self.index.add([str(i) for i in range(len(texts))], texts)
        self.index.build()  # at ingest, so its cost is not charged to the first question
        self.size = len(texts)

    def rank(self, question: str) -> list[int]:
        return [int(i) for i, _ in self.index.search(question, self.size)]


class _DenseRanker:
    def __init__(self, ctx: SystemContext, texts: Sequence[str]) -> None:
        self.ctx = ctx
        self.vectors = ctx.embed_stored(texts)

    def rank(self, question: str) -> list[int]:
        if not len(self.vectors):
            return []
        scores = self.vectors @ self.ctx.embed_query(question)
        rows = np.arange(len(scores))
        return [int(i) for i in np.lexsort((rows, -scores))]


@register_system("bm25")
class Bm25System(RankingSystem):
    """BM25 (contextfold's ``BM25Index``: Lucene, k1 1.5, b 0.75, stemmed) over ``turn_text``;
    turns sharing no term with the question are never chosen."""

    name = "bm25"

    def prepare(self, conversation: LocomoConversation) -> None:
        self.bm25 = _Bm25Ranker(self.texts)

    def rank(self, question: str) -> Sequence[int]:
        return self.bm25.rank(question)


@register_system("dense")
class DenseSystem(RankingSystem):
    """Cosine similarity of the question's and each ``turn_text``'s embedding."""

    name = "dense"

    def prepare(self, conversation: LocomoConversation) -> None:
        self.dense = _DenseRanker(self.ctx, self.texts)

    def rank(self, question: str) -> Sequence[int]:
        return self.dense.rank(question)


@register_system("rrf")
class RrfSystem(RankingSystem):
    """Plain Reciprocal Rank Fusion (k = 60, equal weights) of the bm25 and dense rankings."""

    name = "rrf"

    def prepare(self, conversation: LocomoConversation) -> None:
        self.bm25 = _Bm25Ranker(self.texts)
        self.dense = _DenseRanker(self.ctx, self.texts)

    def rank(self, question: str) -> Sequence[int]:
        from contextfold.retrieval.fusion import rrf

        rankings = {
            "bm25": [str(i) for i in self.bm25.rank(question)],
            "dense": [str(i) for i in self.dense.rank(question)],
        }
        return [int(hit.id) for hit in rrf(rankings, k=60)]


@register_system("oracle")
class OracleSystem(RankingSystem):
    """The gold evidence turns of the question asked, and nothing else: the ceiling a budget
    allows. It reads ``conversation.qa``, which no real system may."""

    name = "oracle"

    def prepare(self, conversation: LocomoConversation) -> None:
        row = {t.dia_id: i for i, t in enumerate(self.turns)}
        self.gold: dict[str, list[int]] = {}
        for qa in conversation.qa:
            rows = self.gold.setdefault(qa.question.strip(), [])
            rows.extend(row[d] for d in qa.evidence if row[d] not in rows)

    def rank(self, question: str) -> Sequence[int]:
        return sorted(self.gold.get(question.strip(), []))
