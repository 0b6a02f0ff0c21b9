"""Recall: which stored turns, segments and tag summaries answer an inbound message.

Three signals rank the stored raw turns:

* **tag overlap**, IDF-weighted: each inbound tag a turn carries adds ``log(1 + N / df)``
  (N turns, df turns with the tag); a match through a related tag counts half;
* **full text**: SQLite FTS5 ``bm25()`` over the stored turn text (an OR query, stop words
  removed);
* **dense**: cosine between the message and each turn's embedding. Turns are embedded by the
  derived work (``MemoryEngine.derive``: inside ``on_turn_complete``, or a store-kept job),
  never inside a recall: a recall ranks the turns not embedded yet by full text and tags only
  (``pending_vectors`` says how many; the engine reports it as ``AssembledContext.unembedded``).
  A session's vectors are kept per process by ``memory.turn_index`` (exact scan; an HNSW
  index above ``ann_min_turns``; files beside a SQLite database so a restart maps them).

Fusion is ``"score"`` by default: each signal's scores are min-max scaled over its own top
list and summed with the signal's weight; ``"rrf"`` (reciprocal-rank fusion with constant
``k``) is the alternative. Scores carry information ranks drop — a clear dense winner stays
ahead — and on LoCoMo score fusion recalled about one point more (docs/eval-locomo.md). Then
each turn earns a share (``neighbor_weight``) of its better neighbour's score, since a
dialogue answer sits next to its question, and a length prior multiplies each score by
``(tokens + 2) ** length_prior``: a two-word "thanks!" rarely holds the fact asked about.
When the message names a period ("in January 2022", "between August 11 and August 15 2023";
``periods.query_period``), the turns stored in it, or up to ``date_slack_days`` after it,
have their score multiplied by ``1 + date_weight``: among the turns that match, the ones said
then come first (turns that match nothing are not pulled in).
When the message names the author of turns stored as ``"Name: text"`` (a transcript's
convention; ``memory.authors``), those turns have their score multiplied by
``1 + author_weight``: what a person did is mostly told in their own turns.

Raw turns are the only thing that can hold a detail verbatim, so they are what recall ranks;
summaries are chosen by the assembler (broad queries: tag summaries; temporal ones: segment
summaries earliest first). ``find_quote`` searches the raw text directly and returns excerpts
with the tags of the turn and of its segment.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from contextfold.memory.authors import OPENING_CHARS, TurnAuthors, names_named
from contextfold.memory.decompose import query_parts, question_focus
from contextfold.memory.fusion import (
    Fused,
    Hit,
    best_hits,
    fuse_signals,
    merge_parts,
    with_neighbours,
)
from contextfold.memory.periods import Period, query_period
from contextfold.memory.turn_index import (
    ANN_DEFAULTS,
    IndexWorker,
    SessionVectors,
    VectorFiles,
    ann_available,
    grow_index,
    quantized_available,
)
from contextfold.memory.turn_lengths import TurnLengths
from contextfold.retrieval.base import Embedder
from contextfold.retrieval.embedders import EmbeddingQueue
from contextfold.store.protocols import MemoryStorage

__all__ = ["Quote", "RankedTurn", "Recaller"]


class RankedTurn(BaseModel):
    """A stored turn's place in a recall: its fused ``score``, the rank (1 = best) each
    signal gave it (``tags``, ``fts``, ``dense``; absent when the signal did not find it) and
    its cosine ``similarity`` with the message (``None`` when the dense signal did not score
    it): the absolute evidence the relevance floor (``recall.relevance_floor``) judges."""

    model_config = ConfigDict(frozen=True)
    seq: int
    score: float
    ranks: dict[str, int]
    similarity: float | None = None


class Quote(BaseModel):
    """A ``find_quote`` hit: an excerpt of a stored turn, where it is, and its topics."""

    model_config = ConfigDict(frozen=True)
    seq: int
    role: str
    excerpt: str
    tags: tuple[str, ...]
    segment_id: int | None
    compacted: bool
    created_at: str


def _excerpt(text: str, words: Collection[str], width: int) -> str:
    """Up to ``width`` characters of ``text`` around its first occurrence of any of ``words``."""
    if len(text) <= width:
        return text
    low = text.lower()
    hits = [i for w in words if (i := low.find(w)) >= 0]
    centre = min(hits) if hits else 0
    start = max(0, min(centre - width // 3, len(text) - width))
    piece = text[start : start + width]
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


log = logging.getLogger(__name__)
Fusion = Literal["score", "rrf"]
_PREFETCHED = 256  # queries started and not yet ranked, kept at most
_PREFETCHED_CHARS = 4 * 1024 * 1024  # and at most this many characters of them
FILES_MIN_TURNS = 1_000  # a session's vectors go to files once it has this many
ANN_TAIL = 512  # rows scanned exactly beside the index before the worker adds them
READ_LATER_MIN = 20_000  # vectors read by the worker, not a recall, when nothing holds them
# A session's token counts and authors are read whole by the worker, after the recall that
# first needs them, from this many turns; until then a recall reads its candidates' own.
LENGTHS_LATER_MIN = 200


class SessionLines:
    """One session's line costs (``TurnLengths.lines``) as the assembler reads and keeps them:
    read from the recaller's kept counts (or the costs kept ahead of them), kept through
    ``Recaller.note_lines``, which charges them to the cache limit."""

    __slots__ = ("_born", "_recaller", "_session_id")

    def __init__(self, recaller: Recaller, session_id: str, born: int) -> None:
        self._recaller, self._session_id, self._born = recaller, session_id, born

    def lines(self, seqs: Sequence[int], counter: str) -> list[int]:
        entry = self._recaller._line_entry(self._session_id, self._born)
        return entry.lines(seqs, counter) if entry is not None else [0] * len(seqs)

    def set_lines(self, costs: Sequence[tuple[int, int]], counter: str) -> None:
        self._recaller.note_lines(self._session_id, self._born, counter, costs)


class Recaller:
    """Ranks a session's stored turns for a message (see the module docstring).

    ``embedder`` may be ``None`` (no dense signal). ``fusion`` is ``"score"`` or ``"rrf"``
    (``k`` is the RRF constant); ``fts_limit`` how many full-text and dense hits to fuse;
    ``weights`` scale each signal's share; ``neighbor_weight``, ``length_prior``,
    ``date_weight`` and ``author_weight`` as in the module docstring (0 turns each off);
    ``common_limit`` leaves a
    query word or tag on more than that many of the session's turns (a tag's counting those
    that carry it as a related tag) out of the full-text and tag signals (``None``: no
    limit), so what they read is bounded by the words' rarity; only in a session of at least
    ``common_min_turns`` turns (in a smaller one what a word reads is bounded by the session
    itself, and every word is kept)."""

    def __init__(
        self,
        store: MemoryStorage,
        *,
        embedder: Embedder | None = None,
        k: int = 60,
        fts_limit: int = 300,
        related_weight: float = 0.5,
        weights: dict[str, float] | None = None,
        embed_batch: int = 256,
        neighbor_weight: float = 0.0,
        fusion: Fusion = "score",
        length_prior: float = 0.0,
        date_weight: float = 0.0,
        date_slack_days: int = 14,
        vector_cache_bytes: int = 512 * 2**20,
        tag_limit: int | None = None,
        common_limit: int | None = None,
        common_min_turns: int = 0,
        ann_min_turns: int | None = None,
        ann_expansion: int = ANN_DEFAULTS["expansion_search"],
        vector_dir: str | Path | None = None,
        decompose: bool = False,
        author_weight: float = 0.0,
        scan_threads: int = 1,
        quantize_min_turns: int | None = None,
    ) -> None:
        if fusion not in ("score", "rrf"):
            raise ValueError(f"fusion must be 'score' or 'rrf', not {fusion!r}")
        self.store = store
        self.embedder = embedder
        self.k = k
        self.fts_limit = fts_limit
        self.tag_limit = tag_limit
        self.common_limit = common_limit
        self.common_min_turns = common_min_turns
        self.related_weight = related_weight
        self.weights = {"tags": 1.0, "fts": 1.0, "dense": 1.0, **(weights or {})}
        self.embed_batch = embed_batch
        self.scan_threads = scan_threads
        self.neighbor_weight = neighbor_weight
        self.fusion: Fusion = fusion
        self.length_prior = length_prior
        self.date_weight = date_weight
        self.date_slack = timedelta(days=date_slack_days)
        self.decompose = decompose
        self.author_weight = author_weight
        # Per session, the turns' authors for the author prior (``memory.authors``): two
        # bytes a turn, for the ``cached_sessions`` most recently used sessions.
        self._authors: OrderedDict[str, TurnAuthors] = OrderedDict()
        self._reading_authors: set[str] = set()
        # Per session (the most recently used ``cached_sessions``, and at most
        # ``vector_cache_bytes`` in all; read back from the store).
        self._vectors: OrderedDict[str, SessionVectors] = OrderedDict()
        self._vector_bytes = 0
        # Per session, the turns' token counts for the length prior (``turn_lengths``),
        # charged to the same limit.
        self._lengths: OrderedDict[str, TurnLengths] = OrderedDict()
        # Sessions whose own token counts were dropped to fit their own vectors (``_fit``):
        # their recalls read their candidates' counts, not the whole session's again and
        # again. A session leaves it when its vectors leave the cache.
        self._lengths_unkept: set[str] = set()
        # Per session whose token counts are not kept yet, the line costs its derive counted
        # (``note_lines``: line costs only, ``last`` 0), charged to the same limit; the first
        # read of the session's counts starts from them.
        self._early_lines: OrderedDict[str, TurnLengths] = OrderedDict()
        self._length_bytes = 0
        # A session of at least this many turns has its counts read by the worker; until then
        # a recall reads its candidates' counts from the store (``None``: read in the recall).
        self.lengths_later_min: int | None = LENGTHS_LATER_MIN
        self._reading_lengths: set[str] = set()
        # The worker's whole reads a recall asked for, started when it is done (``start_reads``):
        # started at once they would compete with the recall for the two cores and the GIL.
        self._pending: list[Callable[[], None]] = []
        self.cached_sessions = 1000
        self.vector_cache_limit = vector_cache_bytes
        # The HNSW index above ``ann_min_turns`` vectors (``None``, or no usearch: exact
        # only); grown and saved by ``_worker``, in ``vector_dir`` files when there is one.
        self.ann_min_turns = ann_min_turns if ann_available() else None
        self.ann_settings = {**ANN_DEFAULTS, "expansion_search": ann_expansion}
        # The int8 copy the exact scan reads from ``quantize_min_turns`` vectors (``None``, or
        # no simsimd: float32 only); coded by ``_worker``, never inside a recall.
        self.quantize_min_turns = quantize_min_turns if quantized_available() else None
        self.files = VectorFiles(vector_dir) if vector_dir is not None else None
        self._closing = threading.Event()  # set by ``close``: index builds stop
        self.files_min_turns = FILES_MIN_TURNS
        self.ann_tail = ANN_TAIL
        # A session with at least this many vectors and no files (PostgreSQL, a first start)
        # is read by the worker while recall answers without the dense signal.
        self.read_later_min: int | None = READ_LATER_MIN
        self._reading: set[str] = set()
        # Sessions this process embedded (``ensure_vectors``): their files are written at
        # close where no recall cached them (``_write_embedded``).
        self._embedded: set[str] = set()
        # Sessions read so that were found too large for the cache: their ``born`` and bytes.
        # They are not read again (every recall would) while the limit stays below that.
        self._too_large: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._worker = IndexWorker()
        self.last_dense: dict[str, object] = {}  # how the last dense search ran (benchmarks)
        self._lock = threading.Lock()
        # Query vectors: concurrent recalls' queries are embedded in one batch, and a query
        # can be started early (``prefetch``) and collected by ``rank``.
        self._queries: EmbeddingQueue | None = None
        self._prefetched: OrderedDict[str, Future[npt.NDArray[np.float32]]] = OrderedDict()
        self._prefetched_chars = 0

    def __repr__(self) -> str:
        return f"Recaller(embedder={self.embedder!r}, k={self.k})"

    @property
    def _model(self) -> str:
        return getattr(self.embedder, "name", type(self.embedder).__name__)

    # -- dense ----------------------------------------------------------------------------------

    def ensure_vectors(self, session_id: str) -> int:
        """Embed the session's turns that have no vector yet; returns how many were embedded.
        Vectors are written in seq order, so only the turns after the last vector are read
        (nothing is read when the session is embedded up to its last turn)."""
        if self.embedder is None:
            return 0
        done = self.store.last_vector_seq(session_id, self._model)
        if done >= self.store.last_seq(session_id):
            return 0
        todo = self.store.turns_without_vectors(session_id, self._model, after=done)
        for start in range(0, len(todo), self.embed_batch):
            batch = todo[start : start + self.embed_batch]
            vectors = self.embedder.embed([text for _, text in batch])
            self.store.add_turn_vectors(session_id, self._model, [s for s, _ in batch], vectors)
        if todo and self.files is not None:
            with self._lock:
                self._embedded.add(session_id)
        return len(todo)

    def pending_vectors(self, session_id: str) -> int:
        """How many of the session's turns the dense signal could not rank (0 without an
        embedder): those without a vector yet — two look-ups in primary keys, as vectors are
        written in seq order (``ensure_vectors``) — or every turn while the worker reads the
        session's vectors (``read_later_min``) or when they are too many for the cache."""
        if self.embedder is None:
            return 0
        with self._lock:
            reading = session_id in self._reading
            too_large = self._too_large.get(session_id)
        if reading or (too_large is not None and self._still_too_large(session_id, too_large)):
            return self.store.last_seq(session_id)
        return max(
            0, self.store.last_seq(session_id) - self.store.last_vector_seq(session_id, self._model)
        )

    def _session_vectors(self, session_id: str) -> SessionVectors:
        """The session's vectors: the cached ones plus those stored since (by this or another
        process), appended in place (all read again when the session was deleted and written
        again); on a miss, mapped from the session's files when they hold it (checked against
        the store), else read from the store. A session whose vectors alone pass the cache's
        byte limit is not kept. Nothing is embedded here: the turns without a vector yet wait
        for the derived work."""
        with self._lock:
            entry = self._vectors.pop(session_id, None)
            if entry is not None:
                self._vector_bytes -= entry.charged
        # Vectors are appended only, while the session lives: a session deleted and written
        # again (by any process) has a new ``born`` number, and its cached rows are dropped.
        version = self.store.session_version(session_id)
        born = version[0] if version is not None else 0
        if entry is None or entry.born != born:
            entry = None
            if version is not None:
                entry = self._from_files(session_id, born)
                if entry is not None:
                    if entry.coded and not self._copy_kept(entry):
                        entry.drop_codes()
                    with self._lock:
                        self._too_large.pop(session_id, None)  # the files serve it now
            if entry is None:
                if self._read_later(session_id, born):
                    return SessionVectors(born)  # none yet: ``pending_vectors`` says so
                entry = SessionVectors(born)
                new_seqs, new = self.store.turn_vectors(session_id, self._model, after=0)
                entry.append(new_seqs, new)
        else:
            new_seqs, new = self.store.turn_vectors(session_id, self._model, after=entry.last)
            entry.append(new_seqs, new)
        self._schedule(session_id, entry)
        self._keep(session_id, entry)
        return entry

    def _read_later(self, session_id: str, born: int) -> bool:
        """Whether the session's vectors, absent from the cache and from files, are many
        enough (``read_later_min``) to be read by the worker instead of this recall: then the
        read is started (once) and the recall goes on without the dense signal."""
        if self.read_later_min is None:
            return False
        with self._lock:
            if session_id in self._reading:
                return True
            too_large = self._too_large.get(session_id)
        if too_large is not None:
            if self._still_too_large(session_id, too_large, born):
                return True  # not read again: no dense signal, ``pending_vectors`` says so
            with self._lock:
                self._too_large.pop(session_id, None)
        if self.store.last_vector_seq(session_id, self._model) < self.read_later_min:
            return False
        with self._lock:
            if session_id in self._reading:
                return True
            self._reading.add(session_id)
        self._worker.submit(functools.partial(self._read, session_id, born))
        return True

    def _read(self, session_id: str, born: int) -> None:
        """The worker's read of a session's vectors (``_read_later``)."""
        try:
            entry = SessionVectors(born)
            new_seqs, new = self.store.turn_vectors(session_id, self._model, after=0)
            entry.append(new_seqs, new)
            if not self._keep(session_id, entry):
                # Read again it would be dropped again, at every recall: remembered instead.
                with self._lock:
                    self._too_large[session_id] = (born, entry.nbytes)
                    while len(self._too_large) > self.cached_sessions:
                        self._too_large.popitem(last=False)
        finally:
            with self._lock:
                self._reading.discard(session_id)
        if self._due(entry):
            self._work(session_id, entry)

    def _still_too_large(
        self, session_id: str, too_large: tuple[int, int], born: int | None = None
    ) -> bool:
        """Whether a session found too large for the cache (``_read``) still is: the same
        incarnation, and a limit still below its bytes (more vectors only add to them)."""
        if born is None:
            born = self._born(session_id)
        return too_large[0] == born and too_large[1] > self.vector_cache_limit

    def _keep(self, session_id: str, entry: SessionVectors) -> bool:
        """Put the entry in the cache, within its bounds (one too large is not kept);
        returns whether it was kept."""
        with self._lock:
            entry.charged = entry.nbytes
            if not 0 < entry.charged <= self.vector_cache_limit:
                return False
            other = self._vectors.pop(session_id, None)  # another thread's read of it
            if other is not None:
                self._vector_bytes -= other.charged
            self._vectors[session_id] = entry
            self._vector_bytes += entry.charged
            while len(self._vectors) > self.cached_sessions:
                _, dropped = self._vectors.popitem(last=False)
                self._vector_bytes -= dropped.charged
            self._fit(session_id)
            return self._vectors.get(session_id) is entry

    def _over(self) -> bool:
        return self._vector_bytes + self._length_bytes > self.vector_cache_limit

    def _fit(self, session_id: str) -> None:
        """Make what is cached fit ``vector_cache_limit`` (the lock held): other sessions'
        vectors go first, least recently used first, then their token counts, then this
        session's token counts, and its vectors last (line costs counted ahead of a session's
        token counts go before anything else)."""
        for other in list(self._early_lines):
            if not self._over():
                return
            self._length_bytes -= self._early_lines.pop(other).charged
        for other in [sid for sid in self._vectors if sid != session_id]:
            if not self._over():
                return
            self._vector_bytes -= self._vectors.pop(other).charged
            self._lengths_unkept.discard(other)
        for other in [sid for sid in self._lengths if sid != session_id]:
            if not self._over():
                return
            self._length_bytes -= self._lengths.pop(other).charged
        if self._over() and session_id in self._lengths:
            self._length_bytes -= self._lengths.pop(session_id).charged
            if session_id in self._vectors:  # its counts do not fit beside its own vectors
                if len(self._lengths_unkept) >= self.cached_sessions:
                    self._lengths_unkept.clear()
                self._lengths_unkept.add(session_id)
        if self._over() and session_id in self._vectors:
            self._vector_bytes -= self._vectors.pop(session_id).charged
            self._lengths_unkept.discard(session_id)

    def _recharge(self, session_id: str, entry: SessionVectors) -> None:
        """Charge the cache for an entry whose index grew (``_work``): other sessions go, least
        recently used first, to make room; an index that alone passes the limit is dropped
        and not built again for this entry (its rows, if they fit, are scanned exactly)."""
        with self._lock:
            if self._vectors.get(session_id) is not entry:
                return  # not cached (too large, or evicted meanwhile): nothing charged
            if entry.nbytes > self.vector_cache_limit and entry.index is not None:
                with entry.lock:
                    entry.index, entry.indexed, entry.index_is_view = None, 0, False
                entry.index_too_large = True
            self._vector_bytes += entry.nbytes - entry.charged
            entry.charged = entry.nbytes
            self._fit(session_id)

    def _due(self, entry: SessionVectors) -> bool:
        """Whether the entry has index or file work to do (``_work``)."""
        n = len(entry)
        grow = (
            self.ann_min_turns is not None
            and not entry.index_too_large
            and n >= self.ann_min_turns
            and (entry.indexed == 0 or n - entry.indexed >= self.ann_tail)
        )
        rows = (
            self.files is not None
            and n >= self.files_min_turns
            and (entry.saved_rows < n or entry.saved_coded < entry.coded)
        )
        index = self.files is not None and entry.indexed - entry.saved_indexed >= max(
            self.ann_tail, entry.saved_indexed // 10
        )
        stale = bool(entry.coded) and self._ann_answers(entry)  # a copy the index replaced
        return grow or rows or index or stale or self._code_due(entry)

    def _code_due(self, entry: SessionVectors) -> bool:
        """Whether the entry's int8 copy lags its rows by enough to extend it (the first
        time: all of them; then ``ann_tail`` rows, scanned in float32 until then), and the
        copy as it would then be allocated (``code_capacity``: a row's copy is its
        dimensions' bytes and a scale) fits the cache beside the rows, so making it never
        evicts them; a copy that does not fit is not extended (its tail is scanned in
        float32)."""
        n = len(entry)
        if self.quantize_min_turns is None or n < self.quantize_min_turns:
            return False
        if self._ann_answers(entry):
            return False
        if n - entry.coded < (self.ann_tail if entry.coded else 1):
            return False
        grown = (entry.code_capacity(n) - entry.code_capacity(entry.coded)) * (entry.dim + 4)
        return entry.nbytes + grown <= self.vector_cache_limit

    def _copy_kept(self, entry: SessionVectors) -> bool:
        """Whether an int8 copy mapped from the files stays with its entry: as one the worker
        would make (``_code_due``: the session at ``quantize_min_turns`` or more, no index
        answering it, and the copy fitting the cache beside the rows), else the rows are
        scanned in float32 as they would be without the files."""
        return (
            self.quantize_min_turns is not None
            and len(entry) >= self.quantize_min_turns
            and not self._ann_answers(entry)
            and entry.nbytes <= self.vector_cache_limit
        )

    def _ann_answers(self, entry: SessionVectors) -> bool:
        """Whether the HNSW index, not a scan, answers the entry (``ann_min_turns``; not one
        whose index the cache could not hold)."""
        return (
            self.ann_min_turns is not None
            and len(entry) >= self.ann_min_turns
            and not entry.index_too_large
        )

    def _schedule(self, session_id: str, entry: SessionVectors) -> None:
        if entry.queued or not self._due(entry):
            return
        entry.queued = True
        self._worker.submit(lambda: self._work(session_id, entry))

    def _work(self, session_id: str, entry: SessionVectors, *, final: bool = False) -> None:
        """Grow the entry's index and write its files (the worker's job; ``final``: write
        whatever is not written yet, as ``close`` does)."""
        entry.queued = False
        n = len(entry)
        if (
            self.ann_min_turns is not None
            and not entry.index_too_large
            and n >= self.ann_min_turns
            and (entry.indexed == 0 or n - entry.indexed >= (1 if final else self.ann_tail))
        ):
            grow_index(entry, self.ann_settings, (self._worker.stopping, self._closing))
            self._recharge(session_id, entry)
        if not final and self._code_due(entry):
            entry.code(stopping=lambda: self._worker.stopping.is_set() or self._closing.is_set())
            self._recharge(session_id, entry)
        elif entry.coded and self._ann_answers(entry):
            entry.drop_codes()  # the index answers now: the copy would only hold memory
            self._recharge(session_id, entry)
        if self.files is None or n < self.files_min_turns:
            return
        # (the int8 copy is written with the rows: a restart scans it from its first recall,
        # instead of float32 until the worker has made it again)
        self._save_rows(session_id, entry)
        step = 1 if final else max(self.ann_tail, entry.saved_indexed // 10)
        if entry.index is not None and entry.indexed - entry.saved_indexed >= step:
            self.files.save_index(session_id, self._model, entry)

    def _born(self, session_id: str) -> int | None:
        version = self.store.session_version(session_id)
        return None if version is None else version[0]

    def settle(self) -> None:
        """Wait until the index and file work queued so far is done."""
        self._worker.wait()

    def close(self) -> None:
        """Finish the queued work, write what the files lack (every cached session's rows and
        the index as far as it is built), and stop the worker. An index build in progress
        stops between chunks (building one for 100k vectors takes minutes); the next start
        builds it again while the exact scan answers."""
        self._closing.set()
        with self._lock:
            entries = list(self._vectors.items())
        for session_id, entry in entries:
            self._worker.submit(functools.partial(self._work, session_id, entry, final=True))
        self._worker.wait()
        self._write_embedded()
        self._worker.close()
        if self.files is not None:
            # A deleted session's vectors do not outlive it on disk.
            self.files.prune(self._born)

    def _write_embedded(self) -> None:
        """At close, after the cached sessions' own writes: the files of the sessions this
        process embedded, brought up to the store's vectors (a bulk ingest never recalled has
        none; one recalled and written to since lags), for sessions of ``files_min_turns``
        vectors or more that the cache could hold, with their int8 copy where a recall would
        scan one (``quantize_min_turns``, no index answering). A restart then maps them: its
        first recall of a 10k-turn session no longer reads every vector from the store (about
        30 ms, a steady recall's 22), nor does a 100k-turn one go without the dense signal
        while the worker reads them. One session at a time, outside the cache (nothing cached
        is pushed out); files that hold every row and the copy are left as they are."""
        if self.files is None:
            return
        with self._lock:
            todo = sorted(self._embedded)
            self._embedded.clear()
        for session_id in todo:
            try:
                self._write_files_of(session_id)
            except Exception as exc:  # never keeps close() from closing the rest
                log.warning("could not write the vector files of session %r: %s", session_id, exc)

    def _write_files_of(self, session_id: str) -> None:
        """``_write_embedded`` for one session."""
        assert self.files is not None
        born = self._born(session_id)
        if born is None:
            return
        # The last seq bounds the count from above: a session under ``files_min_turns`` is
        # not read, nor one whose vectors might not fit the cache (a recall never caches one
        # too large, nor gives it files; the rows read are checked again below).
        last = self.store.last_vector_seq(session_id, self._model)
        dim = self.embedder.dim if self.embedder is not None else 0
        if last < self.files_min_turns or last * dim * 4 > self.vector_cache_limit:
            return
        entry = self._from_files(session_id, born)
        if entry is None:
            entry = SessionVectors(born)
            entry.append(*self.store.turn_vectors(session_id, self._model, after=0))
        if len(entry) < self.files_min_turns or entry.nbytes > self.vector_cache_limit:
            return
        if self._code_due(entry):
            entry.code(stopping=lambda: False)
        self._save_rows(session_id, entry)

    def _from_files(self, session_id: str, born: int) -> SessionVectors | None:
        """The session's entry mapped from its files (with the int8 copy where one may be
        scanned: dropped where the index answers) and the store's rows after them, or
        ``None`` (no files, or files that failed their checks)."""
        if self.files is None:
            return None
        loaded = self.files.load(
            session_id,
            self._model,
            born,
            lambda after: self.store.turn_vectors(session_id, self._model, after=after),
            codes=self.quantize_min_turns is not None,
        )
        if loaded is None:
            return None
        entry, new_seqs, new = loaded
        entry.append(new_seqs, new)
        return entry

    def _save_rows(self, session_id: str, entry: SessionVectors) -> None:
        """Write the entry's rows and int8 copy the files lack (none: nothing). Asked under
        the file lock: a session deleted meanwhile gets no files written again
        (``MemoryEngine.delete_session`` discards under that lock)."""
        assert self.files is not None
        if entry.saved_rows < len(entry) or entry.saved_coded < entry.coded:
            self.files.save_rows(
                session_id, self._model, entry, alive=lambda: self._born(session_id) == entry.born
            )

    def vector_cache_bytes(self) -> int:
        """The bytes the cached session vectors and token counts hold (never above
        ``vector_cache_limit``)."""
        with self._lock:
            return self._vector_bytes + self._length_bytes

    def lengths_to_save(self, session_id: str) -> TurnLengths | None:
        """The session's token counts up to the turns stored, for its state file
        (``memory.snapshots``, saved at close and after a compaction): the kept ones with the
        turns stored since, or, none kept, read whole (a large session's too) with the line
        costs kept ahead of them. A session derived but never recalled, or written to since
        its last recall, so restarts with them: its first recalls read the candidates'
        counts while the worker read every turn's (at 100k turns with the embedder, the first
        six took 51-142 ms, 28-57 with them). Read beside the cache, never at another
        session's expense: a kept entry is neither taken out nor changed (a recall meanwhile
        finds it as it was), and counts read whole are kept only where they fit without
        evicting anything (so a session's counts that never fit are read whole at each save:
        after each of its compactions, and at close). ``None`` with the prior off, for no
        such session, or while the worker reads them."""
        if not self.length_prior:
            return None
        with self._lock:
            if session_id in self._reading_lengths:
                return None
            entry = self._lengths.get(session_id)
            early = self._early_lines.get(session_id)
            last = entry.last if entry is not None else 0
        born, rows = self.store.turn_token_counts_after(session_id, last)
        if born is None:
            return None
        if entry is not None and entry.born == born:
            out = entry.copy()
            out.extend(rows)
            return out
        if entry is not None:  # another incarnation: every turn read
            born, rows = self.store.turn_token_counts_after(session_id, 0)
            if born is None:
                return None
        out = TurnLengths(born)
        out.extend(rows)
        if early is not None:
            _take_lines(out, early)
        with self._lock:
            fits = (
                self._vector_bytes + self._length_bytes + out.nbytes <= self.vector_cache_limit
                and len(self._lengths) < self.cached_sessions
            )
            busy = session_id in self._reading_lengths or session_id in self._lengths_unkept
            if fits and not busy and session_id not in self._lengths:
                self._keep_lengths(session_id, out)
        return out

    def _turn_lengths(self, session_id: str) -> TurnLengths | None:
        """The session's turn token counts: the cached ones plus the turns stored since (all
        read again when the session was deleted and written again); ``None`` when there is
        no such session, or while the worker reads a large session's counts
        (``lengths_later_min``: a first recall after a start does not wait for 100k rows).
        Kept within ``vector_cache_limit`` (``_fit``)."""
        with self._lock:
            entry = self._lengths.pop(session_id, None)
            if entry is not None:
                self._length_bytes -= entry.charged
            elif session_id in self._reading_lengths or session_id in self._lengths_unkept:
                return None
        later = self.lengths_later_min
        if entry is None and later is not None and self.store.last_seq(session_id) >= later:
            with self._lock:
                if session_id in self._reading_lengths:
                    return None
                self._reading_lengths.add(session_id)
                self._pending.append(functools.partial(self._read_lengths, session_id))
            return None
        return self._extend_lengths(session_id, entry)

    def _read_lengths(self, session_id: str) -> None:
        """The worker's read of a large session's token counts (``_turn_lengths``)."""
        try:
            if not self._closing.is_set():
                self._extend_lengths(session_id, None)
        finally:
            with self._lock:
                self._reading_lengths.discard(session_id)

    def _extend_lengths(self, session_id: str, entry: TurnLengths | None) -> TurnLengths | None:
        """``entry`` (taken out of the cache) with the turns stored since, or the session's
        counts read whole; put back in the cache."""
        born, rows = self.store.turn_token_counts_after(
            session_id, entry.last if entry is not None else 0
        )
        if born is None:
            return None
        if entry is None or entry.born != born:
            if entry is not None:  # another incarnation: its counts are all read again
                born, rows = self.store.turn_token_counts_after(session_id, 0)
                if born is None:
                    return None
            entry = self._take_early_lines(session_id, born) or TurnLengths(born)
        entry.extend(rows)
        with self._lock:
            other = self._lengths.pop(session_id, None)  # another thread's read of it
            if other is not None:
                self._length_bytes -= other.charged
            self._keep_lengths(session_id, entry)
        return entry

    def _take_early_lines(self, session_id: str, born: int) -> TurnLengths | None:
        """The line costs counted ahead of the session's token counts (``note_lines``), taken
        out of the cache, if they are of incarnation ``born``."""
        with self._lock:
            early = self._early_lines.pop(session_id, None)
            if early is not None:
                self._length_bytes -= early.charged
        return early if early is not None and early.born == born else None

    def note_lines(
        self, session_id: str, born: int, counter: str, costs: Sequence[tuple[int, int]]
    ) -> None:
        """Keep line costs counted off the request path (the engine's derive counts each new
        turn's: ``TurnLengths.lines``), of the session's incarnation ``born``, counted by the
        counter ``counter`` names (``turn_lengths.line_key``): beside its kept token counts,
        or, until they are read, on their own within the same cache limit."""
        if not costs:
            return
        with self._lock:
            entry = self._lengths.get(session_id)
            if entry is not None:
                if entry.born == born:
                    entry.set_lines(costs, counter)
                    self._length_bytes += entry.nbytes - entry.charged
                    entry.charged = entry.nbytes
                    self._fit(session_id)
                    if self._lengths.get(session_id) is entry and self._over():  # too large
                        self._length_bytes -= self._lengths.pop(session_id).charged
                return
            early = self._early_lines.pop(session_id, None)
            if early is not None:
                self._length_bytes -= early.charged
            if early is None or early.born != born:
                early = TurnLengths(born)
            early.set_lines(costs, counter)
            self._keep_early(session_id, early)

    def _keep_early(self, session_id: str, entry: TurnLengths) -> None:
        """Keep line costs ahead of the session's token counts (the lock held; none kept for
        it), within the limits: the ``cached_sessions`` most recently kept, and dropped when
        too large alone."""
        entry.charged = entry.nbytes
        self._early_lines[session_id] = entry
        self._length_bytes += entry.charged
        while len(self._early_lines) > self.cached_sessions:
            self._length_bytes -= self._early_lines.popitem(last=False)[1].charged
        self._fit(session_id)
        if self._early_lines.get(session_id) is entry and self._over():
            self._length_bytes -= self._early_lines.pop(session_id).charged

    def _keep_lengths(self, session_id: str, entry: TurnLengths) -> None:
        """Cache a session's token counts within the limits (the lock held; none cached for
        it), with the line costs kept ahead of them (``note_lines`` while they were read):
        too large alone, it is not kept."""
        early = self._early_lines.pop(session_id, None)
        if early is not None:
            self._length_bytes -= early.charged
            _take_lines(entry, early)
        entry.charged = entry.nbytes
        if entry.charged <= self.vector_cache_limit:
            self._lengths[session_id] = entry
            self._length_bytes += entry.charged
            while len(self._lengths) > self.cached_sessions:
                _, dropped = self._lengths.popitem(last=False)
                self._length_bytes -= dropped.charged
            self._fit(session_id)

    def _named_authors(
        self, session_id: str, text: str
    ) -> tuple[TurnAuthors | None, frozenset[str]] | None:
        """The session's kept authors (``None`` while the worker reads a large session's:
        ``_authored`` then reads the candidates' own) and the names ``text`` names
        (``memory.authors``); ``None`` when the prior is off or the message names nobody."""
        if not self.author_weight:
            return None
        names = names_named(text)
        if not names:
            return None
        return self._turn_authors(session_id), names

    def _authored(
        self,
        session_id: str,
        cands: npt.NDArray[np.int64],
        authors: TurnAuthors | None,
        names: frozenset[str],
    ) -> npt.NDArray[np.bool_] | None:
        """Whether each candidate is by an author ``names`` names (``None``: none is), from
        the session's kept authors or, while they are not kept, the candidates' openings."""
        seqs = cands.tolist()
        if authors is None:
            authors = TurnAuthors(0)
            authors.extend(
                sorted(self.store.turn_openings(session_id, seqs, OPENING_CHARS).items())
            )
        ids = authors.named(names)
        return authors.authored(seqs, ids) if ids else None

    def _turn_authors(self, session_id: str) -> TurnAuthors | None:
        """The session's turn authors: the cached ones plus the turns stored since (all read
        again when the session was deleted and written again); ``None`` when there is no such
        session, or while the worker reads a large session's (``lengths_later_min``, as for
        the token counts). The cached entry stays in the cache while it is extended (under
        its own lock), so a concurrent recall of the session waits for the few new turns
        instead of reading the whole session again."""
        with self._lock:
            entry = self._authors.get(session_id)
            if entry is not None:
                self._authors.move_to_end(session_id)
            elif session_id in self._reading_authors:
                return None
        later = self.lengths_later_min
        if entry is None and later is not None and self.store.last_seq(session_id) >= later:
            with self._lock:
                if session_id in self._reading_authors:
                    return None
                self._reading_authors.add(session_id)
                self._pending.append(functools.partial(self._read_authors, session_id))
            return None
        return self._extend_authors(session_id, entry)

    def _read_authors(self, session_id: str) -> None:
        """The worker's read of a large session's authors (``_turn_authors``)."""
        try:
            if not self._closing.is_set():
                self._extend_authors(session_id, None)
        finally:
            with self._lock:
                self._reading_authors.discard(session_id)

    def _extend_authors(self, session_id: str, entry: TurnAuthors | None) -> TurnAuthors | None:
        """``entry`` (still cached) with the turns stored since, or the session's authors
        read whole and cached."""
        if entry is not None:
            with entry.lock:
                born, rows = self.store.turn_openings_with_incarnation(
                    session_id, entry.last, OPENING_CHARS
                )
                if born is not None and born == entry.born:
                    entry.extend(rows)
                    return entry
        # No entry yet, or another incarnation: every turn is read.
        born, rows = self.store.turn_openings_with_incarnation(session_id, 0, OPENING_CHARS)
        if born is None:
            with self._lock:
                self._authors.pop(session_id, None)
            return None
        fresh = TurnAuthors(born)
        fresh.extend(rows)
        with self._lock:
            self._keep_authors(session_id, fresh)
        return fresh

    def _keep_authors(self, session_id: str, authors: TurnAuthors) -> None:
        """Keep a session's authors as the most recently used (the lock held), at most
        ``cached_sessions`` sessions'."""
        self._authors[session_id] = authors
        self._authors.move_to_end(session_id)
        while len(self._authors) > self.cached_sessions:
            self._authors.popitem(last=False)

    def note_authors(
        self, session_id: str, born: int, after: int, rows: Sequence[tuple[int, str]]
    ) -> None:
        """Keep the authors of turns a derive just wrote, off the request path: ``rows`` are
        (seq, opening) of every turn of incarnation ``born`` after ``after``, in order. With
        none kept, they are kept when they start the session (``after`` 0: a bulk ingest
        derived chunk by chunk keeps them whole, and a restart restores them, where a large
        session's first recall naming someone would read the candidates' openings while the
        worker read every turn's); kept ones covering the turns up to ``after`` are extended.
        Otherwise nothing: the next recall reads the turns stored since, as before."""
        if not rows or not self.author_weight:
            return
        with self._lock:
            entry = self._authors.get(session_id)
            reading = session_id in self._reading_authors
        if entry is None:
            if after != 0 or reading:
                return
            fresh = TurnAuthors(born)
            fresh.extend(rows)
            with self._lock:
                if session_id in self._authors or session_id in self._reading_authors:
                    return
                self._keep_authors(session_id, fresh)
            return
        with entry.lock:
            if entry.born == born and after <= entry.last < rows[-1][0]:
                entry.extend([row for row in rows if row[0] > entry.last])

    def kept_state(self, session_id: str) -> tuple[TurnLengths | None, TurnAuthors | None]:
        """The session's kept token counts (else the line costs kept ahead of them: ``last``
        0) and authors (``None`` when not kept), for ``memory.snapshots``."""
        with self._lock:
            lengths = self._lengths.get(session_id)
            if lengths is None:
                lengths = self._early_lines.get(session_id)
            return lengths, self._authors.get(session_id)

    def session_lines(
        self, session_id: str, version: tuple[int, int] | None
    ) -> SessionLines | None:
        """The session's line costs as the assembler reads and keeps them, for its incarnation
        ``version`` (the store's ``session_version``) names; ``None`` when there is none."""
        return None if version is None else SessionLines(self, session_id, version[0])

    def _line_entry(self, session_id: str, born: int) -> TurnLengths | None:
        """The kept counts of incarnation ``born``, else the line costs kept ahead of them."""
        with self._lock:
            entry = self._lengths.get(session_id)
            if entry is None:
                entry = self._early_lines.get(session_id)
        return entry if entry is not None and entry.born == born else None

    def adopt(
        self, session_id: str, lengths: TurnLengths | None, authors: TurnAuthors | None
    ) -> None:
        """Keep a session's token counts and authors saved by an earlier process
        (``memory.snapshots``; of the session's incarnation now), unless some are kept or
        being read already: the recalls then read only the turns stored since."""
        with self._lock:
            busy = session_id in self._reading_lengths or session_id in self._lengths_unkept
            if lengths is not None and lengths.last == 0:  # line costs only: a derive's
                if session_id not in self._lengths and session_id not in self._early_lines:
                    self._keep_early(session_id, lengths)
            elif lengths is not None and session_id not in self._lengths and not busy:
                self._keep_lengths(session_id, lengths)  # (with the costs counted since)
            if (
                authors is not None
                and session_id not in self._authors
                and session_id not in self._reading_authors
            ):
                self._keep_authors(session_id, authors)

    def forget(self, session_id: str) -> None:
        """Drop the cached vectors of a session (after it was deleted), and its files (every
        model's: found by name, ``VectorFiles.discard_session``)."""
        with self._lock:
            entry = self._vectors.pop(session_id, None)
            if entry is not None:
                self._vector_bytes -= entry.charged
            for table in (self._lengths, self._early_lines):
                lengths = table.pop(session_id, None)
                if lengths is not None:
                    self._length_bytes -= lengths.charged
            self._too_large.pop(session_id, None)
            self._lengths_unkept.discard(session_id)
            self._authors.pop(session_id, None)
        if self.files is not None:
            self.files.discard_session(session_id)

    def _queue(self, embedder: Embedder) -> EmbeddingQueue:
        with self._lock:
            if self._queries is None or self._queries.inner is not embedder:
                self._queries = EmbeddingQueue(embedder)
                self._prefetched.clear()
                self._prefetched_chars = 0
            return self._queries

    def prefetch(self, text: str) -> None:
        """Start embedding ``text`` for a ``rank`` that will follow, so the model runs while
        the rest of the recall (tags, full text) does; with ``decompose``, its parts too, in
        the same batch. A no-op without an embedder."""
        self._prefetch_all(self._asked(text)[0])

    def _prefetch_all(self, texts: Sequence[str]) -> None:
        """Start embedding the ``texts`` not started yet, together (one model batch)."""
        if self.embedder is None:
            return
        queue = self._queue(self.embedder)
        with self._lock:
            new = [t for t in dict.fromkeys(texts) if t.strip() and t not in self._prefetched]
            if not new:
                return
            for text, future in zip(new, queue.submit_many(new), strict=True):
                self._prefetched[text] = future
                self._prefetched_chars += len(text)
            while len(self._prefetched) > _PREFETCHED or (
                self._prefetched_chars > _PREFETCHED_CHARS and len(self._prefetched) > 1
            ):
                dropped, _ = self._prefetched.popitem(last=False)
                self._prefetched_chars -= len(dropped)

    def _query_vector(self, embedder: Embedder, text: str) -> npt.NDArray[np.float32]:
        queue = self._queue(embedder)
        with self._lock:
            future = self._prefetched.pop(text, None)
            if future is not None:
                self._prefetched_chars -= len(text)
        if future is None:  # not prefetched: embedded in this thread when the queue is idle
            vector: npt.NDArray[np.float32] = queue.embed([text])[0].astype(np.float32)
            return vector
        return future.result().astype(np.float32)

    def _dense(
        self, session_id: str, texts: Sequence[str], limit: int
    ) -> list[list[tuple[int, float]]]:
        """Each text's ``limit`` nearest turns, (seq, cosine) best first, from one scan of the
        session's vectors for all of them (``SessionVectors.search``)."""
        lists: list[list[tuple[int, float]]] = [[] for _ in texts]
        asked = [i for i, text in enumerate(texts) if text.strip()]
        if self.embedder is None or not asked:
            return lists
        entry = self._session_vectors(session_id)
        if not len(entry):
            return lists
        queries = np.stack([self._query_vector(self.embedder, texts[i]) for i in asked])
        use = self.ann_min_turns is not None and len(entry) >= self.ann_min_turns
        found, ann = entry.search(
            queries,
            limit,
            self.ann_settings["expansion_search"],
            ann=use,
            threads=self.scan_threads,
        )
        self.last_dense = {"rows": len(entry), "ann": ann, "indexed": entry.indexed}
        for i, hits in zip(asked, found, strict=True):
            lists[i] = hits
        return lists

    # -- tags -----------------------------------------------------------------------------------

    def _tag_scores(
        self,
        session_id: str,
        tags: Sequence[str],
        related: Sequence[str],
        counts: Mapping[str, int] | None,
        related_counts: Mapping[str, int] | None = None,
        turns: int | None = None,
    ) -> tuple[list[tuple[int, float]], float | None]:
        """The best ``tag_limit`` turns by tag overlap, best first, and the lowest overlap score
        of every turn that matched (``None`` when none did); ``turns``: the session's last seq,
        read here when not given."""
        wanted = list(dict.fromkeys([*tags, *related]))
        if not wanted:
            return [], None
        if counts is None:
            counts = self.store.tag_counts(session_id)
        total = max(1, self.store.last_seq(session_id) if turns is None else turns)
        limit = self._common_limit(total)
        if limit is not None:
            # A tag on more turns than ``common_limit`` tells few of them apart (its IDF is
            # the lowest), and summing its rows is what grows with the conversation. Its rows
            # are the turns carrying it as a tag and those carrying it as a related tag (one
            # row per turn either way, so never more than the session's turns).
            if related_counts is None:
                related_counts = self.store.vocab.related_tag_counts(session_id)
            wanted = [
                tag for tag in wanted if counts.get(tag, 0) + related_counts.get(tag, 0) <= limit
            ]
            if not wanted:
                return [], None
        primary = set(tags)
        weights: dict[str, tuple[float, float]] = {}
        for tag in wanted:
            idf = math.log(1 + total / max(1, counts.get(tag, 1)))
            half = idf * self.related_weight
            weights[tag] = (idf if tag in primary else half, half)
        if self.tag_limit is None:
            scores = self.store.tag_overlap_scores(session_id, weights)
            hits = sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))
            return hits, hits[-1][1] if hits else None
        hits, low = self.store.tag_overlap_top(session_id, weights, self.tag_limit)
        return hits, low if hits else None

    def _common_limit(self, turns: int) -> int | None:
        """``common_limit`` for a session of ``turns`` turns: ``None`` (every word and tag
        kept) below ``common_min_turns``."""
        return None if turns < self.common_min_turns else self.common_limit

    # -- fusion ---------------------------------------------------------------------------------

    def rank(
        self,
        session_id: str,
        text: str,
        *,
        tags: Sequence[str] = (),
        related: Sequence[str] = (),
        exclude: Collection[int] = (),
        limit: int = 200,
        tag_counts: Mapping[str, int] | None = None,
        related_counts: Mapping[str, int] | None = None,
        defer_reads: bool = False,
    ) -> list[RankedTurn]:
        """The session's turns for ``text``, best first (at most ``limit``), skipping the seqs
        in ``exclude`` (e.g. turns the live history already holds). ``tag_counts`` (turns per
        tag) and ``related_counts`` (turns per related tag) save a query each when the caller
        keeps them. With ``decompose``, a message that names people or things is also ranked
        in parts (``memory.decompose``) and the rankings are interleaved. The worker's reads
        this recall asks for start when it returns, or with ``defer_reads`` when the caller
        calls ``start_reads`` (after the rest of its own work)."""
        try:
            return self._rank(
                session_id, text, tags, related, exclude, limit, tag_counts, related_counts
            )
        finally:
            if not defer_reads:
                self.start_reads()

    def _rank(
        self,
        session_id: str,
        text: str,
        tags: Sequence[str],
        related: Sequence[str],
        exclude: Collection[int],
        limit: int,
        tag_counts: Mapping[str, int] | None,
        related_counts: Mapping[str, int] | None,
    ) -> list[RankedTurn]:
        texts, judged = self._asked(text)
        if len(texts) > 1:  # embedded in one batch (already, when ``prefetch`` saw the message)
            self._prefetch_all(texts)
        # The tag signal depends on the message's tags only: the same for each part, as do
        # the authors it names (a part without a name still asks about that person).
        turns = self.store.last_seq(session_id)  # (the tag and full-text signals' limits)
        tag_scores = self._tag_scores(session_id, tags, related, tag_counts, related_counts, turns)
        authored = self._named_authors(session_id, text)
        # The full-text signal of the message and its parts in one read (they share words).
        fts = self.store.search_turn_seqs_many(
            session_id, texts, limit=self.fts_limit, common_limit=self._common_limit(turns)
        )
        dense = self._dense(session_id, texts, self.fts_limit)
        lists = [
            self._rank_text(
                session_id,
                t,
                tag_scores,
                hits,
                near,
                exclude=exclude,
                limit=limit,
                authored=authored,
            )
            for t, hits, near in zip(texts, fts, dense, strict=True)
        ]
        ranked = merge_parts(lists, limit, judged) if len(lists) > 1 else lists[0]
        # Built without validation (200 a recall, 0.7 ms validated): the fields are Python
        # ints, floats and dicts already (``best_hits`` converts with ``tolist``).
        return [
            RankedTurn.model_construct(
                seq=h.seq, score=h.score, ranks=h.ranks, similarity=h.similarity
            )
            for h in ranked
        ]

    def _asked(self, text: str) -> tuple[list[str], int]:
        """What a recall of ``text`` ranks, and how many of those the relevance floor judges:
        the message; with ``decompose``, a long message's asking sentences
        (``question_focus``, judged too) and the parts of the message or of that focus
        (``query_parts``)."""
        if not self.decompose:
            return [text], 1
        focus = question_focus(text)
        asked = [text] if focus is None else [text, focus]
        return [*asked, *query_parts(focus or text)], len(asked)

    def judged_text(self, text: str) -> str:
        """The text whose names the relevance floor looks up (``memory.relevance``): a long
        message's asking sentences (``question_focus``, with ``decompose``), else the message."""
        return (question_focus(text) if self.decompose else None) or text

    def start_reads(self) -> None:
        """Start the worker's whole reads of token counts and authors that recalls asked for
        (``rank``'s ``defer_reads``)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for job in pending:
            self._worker.submit(job)

    def _rank_text(
        self,
        session_id: str,
        text: str,
        tag_scores: tuple[list[tuple[int, float]], float | None],
        fts: list[tuple[int, float]],
        dense: list[tuple[int, float]],
        *,
        exclude: Collection[int] = (),
        limit: int = 200,
        authored: tuple[TurnAuthors | None, frozenset[str]] | None = None,
    ) -> list[Hit]:
        """``rank`` for one text (the message, or one of its parts), with the message's tag
        signal (``_tag_scores``), the text's full-text hits, its nearest turns (``_dense``)
        and the authors the message names (``_named_authors``): the signals fused
        (``memory.fusion``), then the per-turn priors that need the store (length, author,
        period)."""
        tag_hits, tag_low = tag_scores
        signals = {"tags": tag_hits, "fts": fts, "dense": dense}
        excluded = np.fromiter(exclude, np.int64) if exclude else None
        found = fuse_signals(
            signals,
            weights=self.weights,
            fusion=self.fusion,
            k=self.k,
            tag_limit=self.tag_limit,
            tag_low=tag_low,
            excluded=excluded,
        )
        if found is None:
            return []
        cands, fused = found.cands, found.scores
        if self.neighbor_weight:
            cands, fused = with_neighbours(cands, fused, excluded, self.neighbor_weight)
        if self.length_prior:
            lengths = self._turn_lengths(session_id)
            if lengths is not None:
                counts = np.asarray(lengths.counts(cands.tolist()), np.int64)
            else:  # not kept (yet): the candidates' counts from the store
                stored = self.store.turn_token_counts(session_id, cands.tolist())
                counts = np.fromiter((stored.get(s, 0) for s in cands.tolist()), np.int64)
            # Python's pow per distinct count (a few hundred), so every factor is the one a
            # scalar recall used; numpy's vectorised pow may differ in the last bit.
            distinct, which = np.unique(counts, return_inverse=True)
            factors = np.array([(int(n) + 2) ** self.length_prior for n in distinct])
            fused *= factors[which]
        if authored is not None:
            lifted = self._authored(session_id, cands, *authored)
            if lifted is not None:
                fused[lifted] *= 1 + self.author_weight
        period = query_period(text) if self.date_weight else None
        if period is not None:
            self._prefer_period(session_id, cands, fused, period, limit)
        similarity = {seq: score for seq, score in signals["dense"] if seq not in exclude}
        return best_hits(Fused(cands, fused, found.kept), similarity, limit)

    def _prefer_period(
        self,
        session_id: str,
        cands: npt.NDArray[np.int64],
        fused: npt.NDArray[np.float64],
        period: Period,
        limit: int,
    ) -> None:
        """Lift the candidates said within ``period`` (and ``date_slack`` after it) by
        ``date_weight``. Only the ``limit`` best are kept after it (``best_hits``), so a
        candidate that could not reach them even lifted is not looked up: its time is read only
        when its lifted score reaches the ``limit``-th best unlifted one (which at least
        ``limit`` candidates keep or pass). At 100k turns that reads a few hundred times
        instead of the 2–3k candidates'."""
        window = Period(period.start, period.end + self.date_slack)
        lift = 1 + self.date_weight
        wanted = np.arange(len(cands))
        if len(cands) > limit and lift >= 1 and np.isfinite(fused).all():
            floor = np.partition(fused, len(fused) - limit)[len(fused) - limit]
            if floor > 0:  # every one of the ``limit`` best is lifted up, never down
                wanted = np.flatnonzero(np.maximum(fused, fused * lift) >= floor)
        seqs = cands[wanted].tolist()
        times = self.store.turn_times(session_id, seqs)
        inside = np.fromiter(
            (seq in times and times[seq] in window for seq in seqs), bool, len(seqs)
        )
        fused[wanted[inside]] *= lift

    # -- find_quote -----------------------------------------------------------------------------

    def find_quote(
        self, session_id: str, query: str, *, limit: int = 5, width: int = 300
    ) -> list[Quote]:
        """Full-text search of the raw stored turns (compacted or not), bypassing tags: each hit
        is an excerpt around the match, with the tags of the turn and of its segment."""
        hits = self.store.search_turns(session_id, query, limit=limit)
        if not hits:
            return []
        watermark = self.store.session(session_id).compaction_watermark
        segment_of: dict[int, tuple[int, tuple[str, ...]]] = {}
        for seg in self.store.segments(session_id, full_text=False):
            for seq in seg.seqs:
                segment_of[seq] = (seg.id, seg.tags)
        words = [w.lower() for w in query.split() if len(w) > 2]
        quotes = []
        for turn, _ in hits:
            seg_id, seg_tags = segment_of.get(turn.seq, (None, ()))
            quotes.append(
                Quote(
                    seq=turn.seq,
                    role=turn.message.role,
                    excerpt=_excerpt(turn.message.text(), words, width),
                    tags=tuple(dict.fromkeys([*turn.tags, *seg_tags])),
                    segment_id=seg_id,
                    compacted=turn.seq < watermark,
                    created_at=turn.created_at.isoformat(),
                )
            )
        return quotes


def _take_lines(entry: TurnLengths, early: TurnLengths) -> None:
    """Give ``entry`` the line costs counted ahead of it (``early``, ``note_lines``), when
    they are of its incarnation."""
    counted = np.flatnonzero(early.line_array)
    if early.born == entry.born and early.line_counter and len(counted):
        costs = early.line_array[counted].tolist()
        entry.set_lines(list(zip(counted.tolist(), costs, strict=True)), early.line_counter)
