"""Sparse retrieval: a BM25 index over ids and texts, backed by ``bm25s``.

``bm25s`` precomputes every document's per-term score at index time, so a query is a sparse
column sum; the index saves to a folder and loads back memory-mapped in milliseconds. This
module adds what an application needs around it: string ids instead of row numbers, English
stemming and stop words by default, filters (only these ids may match), and incremental adds
(bm25s has no in-place add, so the index is rebuilt lazily on the next search).

>>> index = BM25Index()
>>> index.add(["a", "b"], ["The cat sat on the mat.", "Dogs chase cats in the park."])
>>> [doc_id for doc_id, _ in index.search("dogs in a park", k=5)]
['b']
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contextfold.analysis import analyze, content_words, function_words
from contextfold.errors import ConfigError, StoreError

__all__ = ["BM25Index", "analyze", "content_words", "function_words"]

_META = "contextfold.bm25.json"


class BM25Index:
    """A BM25 index from string ids to texts (Lucene BM25 by default, ``k1=1.5, b=0.75``).

    ``search`` returns ``(id, score)`` pairs, best first, only for documents that share at
    least one term with the query. Ids are unique: adding an id again replaces its text.
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
        self._texts: dict[str, str] = {}
        self._ids: list[str] = []
        self._row: dict[str, int] = {}
        self._model: Any = None
        self._dirty = False
        self._texts_attached = True  # False for an index loaded from disk without its texts

    def __len__(self) -> int:
        return len(self._texts) if self._texts_attached else len(self._ids)

    @property
    def has_texts(self) -> bool:
        """False for an index loaded from disk until ``set_texts`` attaches its texts."""
        return self._texts_attached

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in (self._texts if self._texts_attached else self._row)

    def _analyze(self, text: str) -> list[str]:
        return analyze(text, stemmer=self.stemmer, stopwords=self.stopwords)

    def add(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Add (or replace) documents; the index is rebuilt on the next search."""
        if len(ids) != len(texts):
            raise ConfigError(f"add() got {len(ids)} ids but {len(texts)} texts")
        if not ids:
            return
        self._require_texts()
        self._texts.update(zip(ids, texts, strict=True))
        self._dirty = True

    def remove(self, ids: Collection[str]) -> None:
        """Remove documents by id (unknown ids are ignored)."""
        self._require_texts()
        before = len(self._texts)
        for doc_id in ids:
            self._texts.pop(doc_id, None)
        self._dirty = self._dirty or len(self._texts) != before

    def empty_copy(self) -> BM25Index:
        """A new, empty index with the same settings."""
        return BM25Index(
            k1=self.k1, b=self.b, method=self.method, stemmer=self.stemmer, stopwords=self.stopwords
        )

    def clear(self) -> None:
        self._texts, self._ids, self._row, self._model, self._dirty = {}, [], {}, None, False
        self._texts_attached = True

    def _require_texts(self) -> None:
        if not self._texts_attached:
            raise StoreError(
                "this BM25 index was loaded without its texts, so it cannot be extended; "
                "rebuild it from the document store"
            )

    def build(self) -> None:
        """Index the current texts now (``search`` does this on demand)."""
        import bm25s

        self._ids = list(self._texts)
        self._row = {doc_id: row for row, doc_id in enumerate(self._ids)}
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        if self._ids:
            corpus = [self._analyze(self._texts[doc_id]) for doc_id in self._ids]
            model.index(corpus, show_progress=False)
        self._model = model if self._ids else None
        self._dirty = False

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every indexed document for ``query``, in index order."""
        if self._dirty:
            self.build()
        if self._model is None:
            return np.zeros(0, dtype=np.float32)
        vocab = self._model.vocab_dict
        term_ids = [vocab[t] for t in self._analyze(query) if t in vocab]
        if not term_ids:
            return np.zeros(len(self._ids), dtype=np.float32)
        return np.asarray(self._model.get_scores_from_ids(term_ids), dtype=np.float32)

    def ceiling(self, query: str) -> float:
        """The most a document of this index could score for ``query``: for each of its terms
        the best score any document gets for that term, summed; a term no document has counts
        as much as the index's rarest term (it is evidence no document matches). Dividing a
        score by it gives a share in [0, 1] that does not grow with the query's length or the
        corpus's size, which is what a relevance floor compares."""
        if self._dirty:
            self.build()
        if self._model is None:
            return 0.0
        matrix = self._model.scores
        data, indptr = matrix["data"], matrix["indptr"]
        vocab = self._model.vocab_dict
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
        """The evidence a relevance floor compares: for each of ``ids``, the BM25 score its
        document gets from the query's *content* words (``content_words``), as a share of the
        most those words could score (``ceiling``). Function words count in neither, so a
        query made of them alone ("what is it") has no evidence (an empty dict) however small
        the corpus. ``scores`` may pass ``scores(query)`` when already computed; it is reused
        when the query has no function word to leave out."""
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
        return [float(scores[self._row[i]]) if i in self._row else 0.0 for i in ids]

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
        if k <= 0:
            return []
        if scores is None:
            scores = self.scores(query)
        if scores.size == 0:
            return []
        if allowed is not None:
            mask = np.zeros(scores.size, dtype=bool)
            rows = [self._row[i] for i in allowed if i in self._row]
            mask[rows] = True
            scores = np.where(mask, scores, 0.0)
        positive = np.flatnonzero(scores > 0)
        if positive.size > k:
            part = np.argpartition(-scores[positive], k - 1)[:k]
            positive = positive[part]
        order = positive[np.lexsort((positive, -scores[positive]))]
        return [(self._ids[row], float(scores[row])) for row in order]

    def save(self, folder: str | Path) -> None:
        """Write the index (scores, vocabulary, ids, settings) to ``folder``."""
        if self._dirty:
            self.build()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "stemmer": self.stemmer,
            "stopwords": self.stopwords,
            "ids": self._ids,
        }
        if self._model is not None:
            self._model.save(str(folder), show_progress=False)
        (folder / _META).write_text(json.dumps(meta), encoding="utf-8")

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
        index._ids = list(meta["ids"])
        index._row = {doc_id: row for row, doc_id in enumerate(index._ids)}
        index._texts_attached = False
        if index._ids:
            index._model = bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
        return index

    def set_texts(self, texts: dict[str, str]) -> None:
        """Attach the texts of a loaded index (ids must match) so it can take adds again."""
        if set(texts) != set(self._ids):
            raise StoreError("the texts given do not match the ids of the loaded index")
        self._texts = {doc_id: texts[doc_id] for doc_id in self._ids}
        self._texts_attached = True
