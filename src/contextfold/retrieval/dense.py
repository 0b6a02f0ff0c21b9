"""Dense retrieval: vector indexes from string ids to L2-normalised vectors.

``NumpyVectorIndex`` is exact (one matrix-vector product; ~2.5 ms for 100k × 384 on two
cores) and the default. ``USearchVectorIndex`` is an HNSW index for large collections, behind
the same interface; it is approximate, so measure its recall against the exact index
(``benchmarks/bench_retrieval.py`` does) before choosing it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError, StoreError

__all__ = ["NumpyVectorIndex", "USearchVectorIndex", "VectorIndex"]

Vectors = npt.NDArray[np.float32]


@runtime_checkable
class VectorIndex(Protocol):
    """Maps ids to vectors and finds the nearest ones by cosine similarity.

    Implementations must guarantee: ``add`` replaces the vector of an id already present;
    ``search`` returns at most ``k`` ``(id, similarity)`` pairs, best first, only ids in
    ``allowed`` when it is given; vectors are expected L2-normalised (so the dot product is
    the cosine).
    """

    dim: int

    def __len__(self) -> int: ...

    def add(self, ids: Sequence[str], vectors: Vectors) -> None: ...

    def remove(self, ids: Collection[str]) -> None: ...

    def search(
        self, vector: Vectors, k: int, *, allowed: Collection[str] | None = None
    ) -> list[tuple[str, float]]: ...

    def similarities(self, vector: Vectors, ids: Sequence[str]) -> list[float | None]: ...

    def clear(self) -> None: ...


def _check(ids: Sequence[str], vectors: Vectors, dim: int) -> Vectors:
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] != len(ids) or array.shape[1] != dim:
        raise ConfigError(
            f"expected {len(ids)} vectors of dimension {dim}, got an array of shape {array.shape}"
        )
    return array


def _top(scores: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.intp]:
    """Row numbers of the ``k`` highest scores, best first (ties: lower row first)."""
    rows = np.argpartition(-scores, k - 1)[:k] if scores.size > k else np.arange(scores.size)
    return rows[np.lexsort((rows, -scores[rows]))]


class NumpyVectorIndex:
    """Exact cosine search over a growable float32 matrix.

    >>> index = NumpyVectorIndex(dim=2)
    >>> index.add(["x", "y"], np.array([[1, 0], [0, 1]], dtype=np.float32))
    >>> [(i, round(s, 2)) for i, s in index.search(np.array([0.6, 0.8], np.float32), k=2)]
    [('y', 0.8), ('x', 0.6)]
    """

    def __init__(self, dim: int) -> None:
        if dim <= 0:
            raise ConfigError(f"a vector index needs a positive dimension, got {dim}")
        self.dim = dim
        self._matrix = np.zeros((0, dim), dtype=np.float32)
        self._size = 0
        self._ids: list[str] = []
        self._row: dict[str, int] = {}

    def __len__(self) -> int:
        return self._size

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def add(self, ids: Sequence[str], vectors: Vectors) -> None:
        array = _check(ids, vectors, self.dim)
        new_rows: list[int] = []
        for i, doc_id in enumerate(ids):
            row = self._row.get(doc_id)
            if row is None:
                row = self._size + len(new_rows)
                self._row[doc_id] = row
                self._ids.append(doc_id)
                new_rows.append(i)
            else:
                self._matrix[row] = array[i]
        if new_rows:
            needed = self._size + len(new_rows)
            if needed > self._matrix.shape[0]:
                grown = np.zeros((max(needed, 2 * self._matrix.shape[0]), self.dim), np.float32)
                grown[: self._size] = self._matrix[: self._size]
                self._matrix = grown
            self._matrix[self._size : needed] = array[new_rows]
            self._size = needed

    def remove(self, ids: Collection[str]) -> None:
        doomed = {self._row[i] for i in ids if i in self._row}
        if not doomed:
            return
        keep = [row for row in range(self._size) if row not in doomed]
        self._matrix = np.ascontiguousarray(self._matrix[keep])
        self._ids = [self._ids[row] for row in keep]
        self._row = {doc_id: row for row, doc_id in enumerate(self._ids)}
        self._size = len(keep)

    def clear(self) -> None:
        self.__init__(self.dim)  # type: ignore[misc]

    def similarities(self, vector: Vectors, ids: Sequence[str]) -> list[float | None]:
        """Exact cosine of ``vector`` with each of ``ids`` (``None`` for unknown ids)."""
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        rows = [self._row.get(i) for i in ids]
        known = [r for r in rows if r is not None]
        values = iter((self._matrix[known] @ query).tolist()) if known else iter(())
        return [None if r is None else float(next(values)) for r in rows]

    def vector(self, doc_id: str) -> Vectors:
        """The stored vector of ``doc_id`` (``KeyError`` when absent)."""
        row: Vectors = self._matrix[self._row[doc_id]].copy()
        return row

    def search(
        self, vector: Vectors, k: int, *, allowed: Collection[str] | None = None
    ) -> list[tuple[str, float]]:
        if k <= 0 or self._size == 0:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dim:
            raise ConfigError(f"query vector has dimension {query.shape[0]}, index has {self.dim}")
        if allowed is None:
            scores = self._matrix[: self._size] @ query
            rows = _top(scores, k)
        else:
            candidates = np.fromiter(
                (self._row[i] for i in allowed if i in self._row), dtype=np.intp
            )
            if candidates.size == 0:
                return []
            candidates.sort()
            scores = self._matrix[candidates] @ query
            local = _top(scores, k)
            rows, scores = candidates[local], scores[local]
            return [(self._ids[r], float(s)) for r, s in zip(rows, scores, strict=True)]
        return [(self._ids[r], float(scores[r])) for r in rows]

    def save(self, folder: str | Path) -> None:
        """Write ``vectors.npy`` and ``ids.json`` to ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "vectors.npy", self._matrix[: self._size])
        (folder / "ids.json").write_text(json.dumps({"dim": self.dim, "ids": self._ids}))

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = False) -> NumpyVectorIndex:
        folder = Path(folder)
        try:
            meta = json.loads((folder / "ids.json").read_text())
            matrix = np.load(folder / "vectors.npy", mmap_mode="r" if mmap else None)
        except (OSError, ValueError) as exc:
            raise StoreError(f"no readable vector index in {folder}: {exc}") from exc
        index = cls(int(meta["dim"]))
        if matrix.shape != (len(meta["ids"]), index.dim):
            raise StoreError(f"vector index in {folder} is inconsistent: {matrix.shape}")
        index._matrix = matrix if mmap else np.ascontiguousarray(matrix, dtype=np.float32)
        index._ids = list(meta["ids"])
        index._row = {doc_id: row for row, doc_id in enumerate(index._ids)}
        index._size = len(index._ids)
        if mmap:  # a mapped file is read-only: copy on the first write
            index._matrix = np.array(matrix) if index._size == 0 else matrix
        return index


class USearchVectorIndex:
    """Approximate (HNSW) cosine search with ``usearch``; the same interface as
    ``NumpyVectorIndex``. ``allowed`` filters are applied by over-fetching, then falling back
    to exact search over the allowed vectors when too few survive."""

    def __init__(
        self,
        dim: int,
        *,
        connectivity: int = 16,
        expansion_add: int = 128,
        expansion_search: int = 64,
    ) -> None:
        # usearch's native library, loaded first, crashes onnxruntime when it loads later
        # (a segfault on the first embedding); loading onnxruntime first avoids it.
        with contextlib.suppress(ImportError):
            import onnxruntime  # noqa: F401
        try:
            from usearch.index import Index
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ConfigError(
                'the usearch index needs the "ann" extra: pip install "contextfold[ann]"'
            ) from exc
        if dim <= 0:
            raise ConfigError(f"a vector index needs a positive dimension, got {dim}")
        self.dim = dim
        self._params = (connectivity, expansion_add, expansion_search)
        self._index: Any = Index(
            ndim=dim,
            metric="cos",
            dtype="f32",
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        self._exact = NumpyVectorIndex(dim)  # for filters and removal bookkeeping
        self._key: dict[str, int] = {}
        self._id: dict[int, str] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._exact)

    def add(self, ids: Sequence[str], vectors: Vectors) -> None:
        array = _check(ids, vectors, self.dim)
        replaced = [i for i in ids if i in self._key]
        if replaced:
            self.remove(replaced)
        keys = np.arange(self._next, self._next + len(ids), dtype=np.uint64)
        self._next += len(ids)
        for key, doc_id in zip(keys.tolist(), ids, strict=True):
            self._key[doc_id], self._id[key] = key, doc_id
        self._index.add(keys, array)
        self._exact.add(ids, array)

    def remove(self, ids: Collection[str]) -> None:
        for doc_id in ids:
            key = self._key.pop(doc_id, None)
            if key is not None:
                self._index.remove(key)
                del self._id[key]
        self._exact.remove(ids)

    def clear(self) -> None:
        connectivity, expansion_add, expansion_search = self._params
        self.__init__(  # type: ignore[misc]
            self.dim,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )

    def similarities(self, vector: Vectors, ids: Sequence[str]) -> list[float | None]:
        return self._exact.similarities(vector, ids)

    def search(
        self, vector: Vectors, k: int, *, allowed: Collection[str] | None = None
    ) -> list[tuple[str, float]]:
        if k <= 0 or len(self) == 0:
            return []
        if allowed is not None:
            return self._exact.search(vector, k, allowed=allowed)
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        matches = self._index.search(query, min(k, len(self)))
        return [
            (self._id[int(key)], 1.0 - float(distance))
            for key, distance in zip(matches.keys, matches.distances, strict=True)
        ]
