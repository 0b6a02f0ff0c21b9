"""Deterministic stand-ins for tests and examples: real implementations of the protocols that
need no model files.

``HashEmbedder`` embeds a text as its hashed, stemmed bag of words (the "hashing trick"),
L2-normalised: texts that share words are similar, texts that don't are orthogonal. It is fast
and deterministic across processes, which makes it the embedder for tests that are not about
embedding quality.

>>> e = HashEmbedder(dim=64)
>>> v = e.embed(["refund policy", "refund rules", "weather today"])
>>> bool(v[0] @ v[1] > v[0] @ v[2])
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from contextfold.retrieval.sparse import analyze

__all__ = ["HashEmbedder"]


class HashEmbedder:
    """An ``Embedder`` from hashed word counts; ``dim`` buckets (default 256)."""

    def __init__(self, dim: int = 256) -> None:
        self._dim = dim

    @property
    def name(self) -> str:
        return f"hash-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for term in analyze(text) or analyze(text, stopwords=None):
                digest = hashlib.blake2b(term.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self._dim
                out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out
