"""Sparse retrieval: a BM25 index over ids and texts, backed by ``bm25s``.

``bm25s`` precomputes every document's per-term score at index time, so a query is a sparse
column sum; the index saves to a folder and loads back memory-mapped in milliseconds. This
module adds what an application needs around it: string ids instead of row numbers, English
stemming and stop words by default, filters (only these ids may match), and incremental adds
(bm25s has no in-place add, so the index is rebuilt lazily on the next search).

An index may be shared between threads: adds and removes take a lock, and every search reads
one immutable ``BM25Snapshot`` (ids, rows and bm25s model built together), so a rebuild on
another thread never mixes one build's rows with another's scores, and an add or remove that
lands during a build is picked up by the next one, never lost.

>>> index = BM25Index()
>>> index.add(["a", "b"], ["The cat sat on the mat.", "Dogs chase cats in the park."])
>>> [doc_id for doc_id, _ in index.search("dogs in a park", k=5)]
['b']
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contextfold.analysis import analyze, content_words, function_words
from contextfold.errors import ConfigError, StoreError

__all__ = ["BM25Index", "BM25Snapshot", "analyze", "content_words", "function_words"]

_META = "contextfold.bm25.json"


class BM25Snapshot:
    """One build of a ``BM25Index``: its ids, their rows and the bm25s model, never changed
    after it is made, so any number of threads may search it while the index moves on.

    ``scores`` vectors are in this snapshot's row order: pass them only to this snapshot's
    ``search``, ``score_of`` and ``shares``.
    """

    def __init__(
        self, settings: dict[str, Any], ids: Sequence[str], model: Any, generation: int = 0
    ) -> None:
        self.settings = settings
        self.ids: tuple[str, ...] = tuple(ids)
        self.row: dict[str, int] = {doc_id: row for row, doc_id in enumerate(self.ids)}
        self.model = model if self.ids else None
        self.generation = generation  # the index's count of changes this build reflects

    def __len__(self) -> int:
        return len(self.ids)

    def _analyze(self, text: str) -> list[str]:
        return analyze(text, stemmer=self.settings["stemmer"], stopwords=self.settings["stopwords"])

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every document of this snapshot for ``query``, in row order."""
        if self.model is None:
            return np.zeros(0, dtype=np.float32)
        vocab = self.model.vocab_dict
        term_ids = [vocab[t] for t in self._analyze(query) if t in vocab]
        if not term_ids:
            return np.zeros(len(self.ids), dtype=np.float32)
        return np.asarray(self.model.get_scores_from_ids(term_ids), dtype=np.float32)

    def ceiling(self, query: str) -> float:
        """See ``BM25Index.ceiling``."""
        if self.model is None:
            return 0.0
        matrix = self.model.scores
        data, indptr = matrix["data"], matrix["indptr"]
        vocab = self.model.vocab_dict
        unseen = float(data.max()) if len(data) else 0.0
        total = 0.0
        for term in self._analyze(query):
            column = vocab.get(term)
            if column is None or indptr[column + 1] == indptr[column]:
                total += unseen
            else:
                total += float(data[indptr[column] : indptr[column + 1]].max())
        return total

    def shares(
        self, query: str, ids: Sequence[str], *, scores: np.ndarray | None = None
    ) -> dict[str, float]:
        """See ``BM25Index.shares``."""
        content = content_words(query)
        terms = self._analyze(content)
        if not terms:
            return {}
        ceiling = self.ceiling(content)
        if ceiling <= 0:
            return {}
        if scores is None or terms != self._analyze(query):
            scores = self.scores(content)
        return {i: v / ceiling for i, v in zip(ids, self.score_of(scores, ids), strict=True)}

    def score_of(self, scores: np.ndarray, ids: Sequence[str]) -> list[float]:
        """Look up ``ids`` in a ``scores(query)`` vector (0.0 for unknown ids)."""
        return [float(scores[self.row[i]]) if i in self.row else 0.0 for i in ids]

    def search(
        self,
        query: str,
        k: int = 10,
        *,
        allowed: Collection[str] | None = None,
        scores: np.ndarray | None = None,
    ) -> list[tuple[str, float]]:
        """See ``BM25Index.search``."""
        if k <= 0:
            return []
        if scores is None:
            scores = self.scores(query)
        if scores.size == 0:
            return []
        if allowed is not None:
            mask = np.zeros(scores.size, dtype=bool)
            rows = [self.row[i] for i in allowed if i in self.row]
            mask[rows] = True
            scores = np.where(mask, scores, 0.0)
        positive = np.flatnonzero(scores > 0)
        if positive.size > k:
            part = np.argpartition(-scores[positive], k - 1)[:k]
            positive = positive[part]
        order = positive[np.lexsort((positive, -scores[positive]))]
        return [(self.ids[row], float(scores[row])) for row in order]

    def save(self, folder: str | Path) -> None:
        """Write this build (scores, vocabulary, ids, settings) to ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.model is not None:
            self.model.save(str(folder), show_progress=False)
        meta = {**self.settings, "ids": list(self.ids)}
        (folder / _META).write_text(json.dumps(meta), encoding="utf-8")


class BM25Index:
    """A BM25 index from string ids to texts (Lucene BM25 by default, ``k1=1.5, b=0.75``).

    ``search`` returns ``(id, score)`` pairs, best first, only for documents that share at
    least one term with the query. Ids are unique: adding an id again replaces its text.
    Safe to share between threads (see the module docstring); a caller that chains
    ``scores`` into ``search`` or ``score_of`` while another thread writes takes one
    ``snapshot()`` and calls them on it.
    """

    def __init__(
        self,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: str | None = "english",
        stopwords: str | None = "en",
    ) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ConfigError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b, self.method = k1, b, method
        self.stemmer, self.stopwords = stemmer, stopwords
        self._lock = threading.Lock()  # guards _texts, _generation, _built, _texts_attached
        self._build_lock = threading.Lock()  # one build at a time; searches meanwhile read _built
        self._texts: dict[str, str] = {}
        self._generation = 0  # counts changes to _texts
        self._built = BM25Snapshot(self._settings(), (), None, 0)
        self._texts_attached = True  # False for an index loaded from disk without its texts

    def _settings(self) -> dict[str, Any]:
        return {
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "stemmer": self.stemmer,
            "stopwords": self.stopwords,
        }

    def __len__(self) -> int:
        return len(self._texts) if self._texts_attached else len(self._built)

    @property
    def has_texts(self) -> bool:
        """False for an index loaded from disk until ``set_texts`` attaches its texts."""
        return self._texts_attached

    @property
    def _dirty(self) -> bool:
        return self._built.generation != self._generation

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in (self._texts if self._texts_attached else self._built.row)

    def _analyze(self, text: str) -> list[str]:
        return analyze(text, stemmer=self.stemmer, stopwords=self.stopwords)

    def add(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Add (or replace) documents; the index is rebuilt on the next search."""
        if len(ids) != len(texts):
            raise ConfigError(f"add() got {len(ids)} ids but {len(texts)} texts")
        if not ids:
            return
        with self._lock:
            self._require_texts()
            self._texts.update(zip(ids, texts, strict=True))
            self._generation += 1

    def remove(self, ids: Collection[str]) -> None:
        """Remove documents by id (unknown ids are ignored)."""
        with self._lock:
            self._require_texts()
            before = len(self._texts)
            for doc_id in ids:
                self._texts.pop(doc_id, None)
            if len(self._texts) != before:
                self._generation += 1

    def empty_copy(self) -> BM25Index:
        """A new, empty index with the same settings."""
        return BM25Index(
            k1=self.k1, b=self.b, method=self.method, stemmer=self.stemmer, stopwords=self.stopwords
        )

    def clear(self) -> None:
        with self._lock:
            self._texts = {}
            self._generation += 1
            self._built = BM25Snapshot(self._settings(), (), None, self._generation)
            self._texts_attached = True

    def _require_texts(self) -> None:
        if not self._texts_attached:
            raise StoreError(
                "this BM25 index was loaded without its texts, so it cannot be extended; "
                "rebuild it from the document store"
            )

    def snapshot(self) -> BM25Snapshot:
        """The index as of now, built if an add or remove came since the last build: every
        change made before this call is in it. Searches on other threads keep reading the
        previous snapshot while this one builds."""
        wanted = self._generation
        built = self._built
        if built.generation >= wanted:
            return built
        with self._build_lock:
            with self._lock:
                if self._built.generation >= wanted:  # another thread built it meanwhile
                    return self._built
                generation, texts = self._generation, dict(self._texts)
            fresh = self._index(texts, generation)  # (the lock is free: writers go on)
            with self._lock:
                if fresh.generation > self._built.generation:  # not behind a clear()
                    self._built = fresh
                return self._built

    def _index(self, texts: dict[str, str], generation: int) -> BM25Snapshot:
        import bm25s

        ids = list(texts)
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        if ids:
            model.index([self._analyze(texts[doc_id]) for doc_id in ids], show_progress=False)
        return BM25Snapshot(self._settings(), ids, model if ids else None, generation)

    def build(self) -> None:
        """Index the current texts now (``search`` does this on demand)."""
        self.snapshot()

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every indexed document for ``query``, in index order."""
        return self.snapshot().scores(query)

    def ceiling(self, query: str) -> float:
        """The most a document of this index could score for ``query``: for each of its terms
        the best score any document gets for that term, summed; a term no document has counts
        as much as the index's rarest term (it is evidence no document matches). Dividing a
        score by it gives a share in [0, 1] that does not grow with the query's length or the
        corpus's size, which is what a relevance floor compares."""
        return self.snapshot().ceiling(query)

    def shares(
        self, query: str, ids: Sequence[str], *, scores: np.ndarray | None = None
    ) -> dict[str, float]:
        """The evidence a relevance floor compares: for each of ``ids``, the BM25 score its
        document gets from the query's *content* words (``content_words``), as a share of the
        most those words could score (``ceiling``). Function words count in neither, so a
        query made of them alone ("what is it") has no evidence (an empty dict) however small
        the corpus. ``scores`` may pass ``scores(query)`` when already computed; it is reused
        when the query has no function word to leave out."""
        return self.snapshot().shares(query, ids, scores=scores)

    def score_of(self, scores: np.ndarray, ids: Sequence[str]) -> list[float]:
        """Look up ``ids`` in a ``scores(query)`` vector (0.0 for unknown ids)."""
        return self.snapshot().score_of(scores, ids)

    def search(
        self,
        query: str,
        k: int = 10,
        *,
        allowed: Collection[str] | None = None,
        scores: np.ndarray | None = None,
    ) -> list[tuple[str, float]]:
        """The ``k`` best ``(id, score)`` pairs for ``query``, best first; ties by index order.

        ``allowed`` restricts the match to those ids (a filter applied before ranking);
        ``scores`` reuses a ``scores(query)`` vector already computed.
        """
        return self.snapshot().search(query, k, allowed=allowed, scores=scores)

    def save(self, folder: str | Path) -> None:
        """Write the index (scores, vocabulary, ids, settings) to ``folder``."""
        self.snapshot().save(folder)

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True) -> BM25Index:
        """Load an index written by ``save``; ``mmap`` maps the score arrays instead of
        reading them. A loaded index searches; to add to it, rebuild from your texts."""
        import bm25s

        folder = Path(folder)
        try:
            meta = json.loads((folder / _META).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"no readable BM25 index in {folder}: {exc}") from exc
        index = cls(
            k1=meta["k1"],
            b=meta["b"],
            method=meta["method"],
            stemmer=meta["stemmer"],
            stopwords=meta["stopwords"],
        )
        ids = list(meta["ids"])
        model = None
        if ids:
            try:
                model = bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
            except (OSError, ValueError, KeyError) as exc:
                raise StoreError(f"no readable BM25 index in {folder}: {exc}") from exc
        index._built = BM25Snapshot(index._settings(), ids, model, 0)
        index._texts_attached = False
        return index

    def set_texts(self, texts: dict[str, str]) -> None:
        """Attach the texts of a loaded index (ids must match) so it can take adds again."""
        with self._lock:
            ids = self._built.ids
            if set(texts) != set(ids):
                raise StoreError("the texts given do not match the ids of the loaded index")
            self._texts = {doc_id: texts[doc_id] for doc_id in ids}
            self._texts_attached = True
