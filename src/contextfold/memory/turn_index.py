"""A session's turn vectors for dense recall: a float32 matrix appended in place, an HNSW
index (``usearch``) over it once the session passes ``ann_min_turns``, and, for a file-backed
store, both kept in files beside the database so a restart maps them instead of reading every
vector back.

* **Exact** (below ``ann_min_turns``): one pass over every row, scoring each against all
  the recall's query vectors (the message and its parts) while it is in cache.
* **ANN** (at or above it): the HNSW index covers a prefix of the rows (``indexed``); the rows
  after it (the *tail*: vectors stored since the index last grew) are scanned exactly, and the
  two lists are merged. Rows join the index in a background thread (``IndexWorker``), never
  inside a recall: a recall that arrives first scans them exactly.
* **Quantized** (from ``quantize_min_turns`` rows, exact path only): the worker keeps an int8
  copy of the rows (one scale a row), and a scan reads it instead of the float32 rows (a
  quarter of the bytes, through ``simsimd``'s int8 kernels): each query's best
  ``QUANT_OVER`` x ``limit`` rows by the int8 scores are then scored exactly in float32, as
  the exact scan scores them, with the rows not coded yet (the tail). A row among a query's
  exact best ``limit`` is missed only when the int8 scores rank it below ``QUANT_OVER`` x
  ``limit`` others; the scores a search returns are the float32 ones.
* **Files** (``VectorFiles``): ``<key>.f32`` holds the rows as raw float32, appended only;
  ``<key>.seqs`` their seqs (int64); ``<key>.i8`` and ``<key>.scales`` the int8 copy of the
  first rows and their scales, appended only, so a restart scans the copy from its first
  recall; ``<key>.usearch`` the saved index (written to a temporary name, then renamed);
  ``<key>.json`` says how many rows, coded rows and index entries are whole. The key
  names the session, the embedder and the session's incarnation (``born``), so a session
  deleted and written again never reads the old files; it starts with the session's own
  digest, so deleting a session finds its files by name (``discard_session``). Loading maps
  the files and checks them against the store: sizes, the index's own header, and the last
  rows against the store's vectors for the same seqs. A file that fails any check is deleted
  and rebuilt from the store, never used. The int8 copy is checked against the rows it codes
  (its last rows quantized again): a copy that fails is not used, and the worker makes it
  again. The rows after the files' last one are read from the
  store (another process may have written them).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

try:  # int8 kernels for the quantized scan (without it, every scan is float32)
    import simsimd
except ImportError:  # pragma: no cover - a dependency; an exotic platform may lack a wheel
    simsimd = None  # type: ignore[assignment]

__all__ = [
    "ANN_DEFAULTS",
    "IndexWorker",
    "SessionVectors",
    "VectorFiles",
    "quantize",
    "quantized_available",
]

log = logging.getLogger(__name__)

Matrix = npt.NDArray[np.float32]

#: HNSW settings: ``connectivity``, ``expansion_add``, and the ``expansion_search`` floor (a
#: search uses at least ``4 × limit``). On synthetic clustered 384-d vectors they gave
#: recall@300 against exact 0.9993 at 10k vectors and 0.974 at 100k
#: (benchmarks/bench_turn_ann.py), which is why the index is off by default.
ANN_DEFAULTS = {"connectivity": 32, "expansion_add": 96, "expansion_search": 1600}
_CHECK_ROWS = 8  # rows compared with the store when files are loaded
_SAMPLE = 4096  # scores sampled for ``_top``'s floor, from ``_SAMPLE_FROM`` x its limit
_SAMPLE_FROM = 32
_BLOCK = 1024  # rows per block of an exact scan (``_dots``)
_SPLIT_ROWS = 32_768  # from this many rows a scan is split between threads (``_dots``)
_ADD_CHUNK = 16  # rows added to a live index per lock hold (a search waits at most this)
#: A quantized scan rescores each query's best ``QUANT_OVER`` x ``limit`` rows by the int8
#: scores in float32 (``SessionVectors.search``).
QUANT_OVER = 2
_CODE_CHUNK = 2048  # rows quantized per step (``SessionVectors.code``: bounded temporaries)


def _new_index(dim: int, connectivity: int, expansion_add: int, expansion_search: int) -> Any:
    # usearch's native library, loaded first, crashes onnxruntime when it loads later (a
    # segfault on the first embedding); loading onnxruntime first avoids it.
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401
    from usearch.index import Index

    return Index(
        ndim=dim,
        metric="ip",  # turn vectors are L2-normalised: the inner product is the cosine
        dtype="f32",
        connectivity=connectivity,
        expansion_add=expansion_add,
        expansion_search=expansion_search,
    )


def quantized_available() -> bool:
    """Whether the int8 kernels of the quantized scan are installed (``simsimd``)."""
    return simsimd is not None


def quantize(rows: Matrix) -> tuple[npt.NDArray[np.int8], Matrix]:
    """``rows`` as int8 codes and one float32 scale a row (``row ~ codes * scale``: the
    row's largest absolute value maps to 127)."""
    peak = np.abs(rows).max(axis=1) if len(rows) else np.zeros(0, np.float32)
    scales = np.where(peak > 0, peak / 127, 1).astype(np.float32)
    codes = np.rint(rows / scales[:, None]).astype(np.int8)
    return codes, scales


def ann_available() -> bool:
    """Whether ``usearch`` is installed (looked up, not imported: see ``_new_index``)."""
    return importlib.util.find_spec("usearch") is not None


def _top(scores: Matrix, limit: int) -> npt.NDArray[np.intp]:
    """Positions of the ``limit`` highest scores, best first; ties by position (a stable
    sort's order), every score tied with the last one kept being a candidate."""
    if len(scores) <= limit:
        return np.argsort(-scores, kind="stable")
    part = None
    if len(scores) >= _SAMPLE_FROM * limit:
        # A floor from every ``stride``-th score, about twice ``limit`` scores at or above it
        # expected: when at least ``limit`` are, the best ``limit`` (and every tie of the
        # last) are among them, and partitioning the whole array (0.7-1 ms at 100k) is
        # skipped. When fewer are, the whole array is partitioned as before.
        stride = max(1, len(scores) // _SAMPLE)
        sample = scores[::stride]
        rank = min(len(sample), -(-2 * limit // stride))
        floor = np.partition(sample, len(sample) - rank)[len(sample) - rank]
        found = np.flatnonzero(scores >= floor)
        if len(found) >= limit:
            part = found
    if part is None:
        kth = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        part = np.flatnonzero(scores >= kth)
    top: npt.NDArray[np.intp] = part[np.lexsort((part, -scores[part]))][:limit]
    return top


class SessionVectors:
    """One session's vectors: ``base`` rows (mapped from files, read-only) then rows appended
    in a buffer that grows by a quarter when full; an optional HNSW index over the first
    ``indexed`` rows. ``lock`` guards the index against a search while rows are added."""

    def __init__(self, born: int = 0, *, base: Matrix | None = None, seqs: Any = ()) -> None:
        self.born = born  # the session's ``born`` number (``MemoryStorage.session_version``)
        self._base: Matrix = base if base is not None else np.zeros((0, 0), np.float32)
        self._seqs: list[int] = seqs if isinstance(seqs, list) else [int(s) for s in seqs]
        self._buffer: Matrix = np.zeros((0, 0), np.float32)
        self._count = 0  # rows used in the buffer
        self.index: Any = None  # a usearch Index (or a read-only view of a saved one)
        self.indexed = 0  # rows 0..indexed-1 are in ``index``
        self.index_is_view = False
        self.saved_rows = len(self._base)  # rows already in the files
        self.saved_indexed = 0  # index entries in the saved index file
        self.saved_coded = 0  # rows of the int8 copy in the files
        self.codes_rejected = False  # the files' copy failed its check: rewritten whole
        self.lock = threading.Lock()
        self.queued = False  # a worker job for this entry is waiting
        self.charged = 0  # the bytes the recaller's cache counted for it
        self.index_too_large = False  # its index passed the cache's limit: none is built
        # The int8 copy of rows 0..coded-1 and their scales (``code``; read by ``search``).
        self._codes: npt.NDArray[np.int8] = np.zeros((0, 0), np.int8)
        self._scales: Matrix = np.zeros(0, np.float32)
        self.coded = 0

    @property
    def last(self) -> int:
        return self._seqs[-1] if self._seqs else 0

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def dim(self) -> int:
        return int(self._base.shape[1] if len(self._base) else self._buffer.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes this entry holds in memory: the buffer, the mapped rows (their pages count
        once read), the seqs, the index and the int8 copy."""
        index = 0
        if self.index is not None and not self.index_is_view:
            with contextlib.suppress(Exception):
                index = int(self.index.memory_usage)
        codes = self._codes.nbytes + self._scales.nbytes
        return int(self._buffer.nbytes + self._base.nbytes) + 8 * len(self._seqs) + index + codes

    @property
    def seqs(self) -> list[int]:
        return self._seqs

    def append(self, seqs: list[int], rows: Matrix) -> None:
        if not seqs:
            return
        if not self._count and not len(self._base) and _adoptable(rows):
            # The first rows of an entry read from the store: kept as they are, as the base
            # (not copied: a second copy of 100k × 384 floats is 146 MB more, which the heap
            # then kept), so the rows appended later grow a buffer of their own and never
            # copy these (growing one buffer of 100k rows faulted in 183 MB fresh: 330 ms).
            self._base = rows
            self._seqs.extend(seqs)
            return
        need = self._count + len(rows)
        if need > len(self._buffer) or self._buffer.shape[1] != rows.shape[1]:
            grown = np.empty((max(need, len(self._buffer) * 5 // 4), rows.shape[1]), np.float32)
            if self._count:
                grown[: self._count] = self._buffer[: self._count]
            self._buffer = grown
        self._buffer[self._count : need] = rows
        self._count = need
        self._seqs.extend(seqs)

    def code(self, stop: int | None = None, *, stopping: Callable[[], bool] | None = None) -> int:
        """Quantize rows ``coded`` to ``stop`` (default: every row) into the int8 copy the
        quantized scan reads (one thread at a time: the recaller's worker); returns the rows
        coded. Rows are written before ``coded`` counts them, and a copy that grows is
        filled before it replaces the old one, so a scan that reads ``coded`` first reads
        whole rows from whichever copy it then finds. ``stopping``: asked between chunks."""
        stop = len(self._seqs) if stop is None else min(stop, len(self._seqs))
        start = self.coded
        if stop <= start:
            return 0
        dim = self.dim
        codes, scales = self._codes, self._scales
        size = self.code_capacity(stop)
        if size != len(codes) or codes.shape[1] != dim or not codes.flags.writeable:
            # (a copy mapped from the files holds exactly its rows, so extending it makes a
            # copy in memory anyway; the mapping is never written)
            grown = np.empty((size, dim), np.int8)
            grown_scales = np.empty(size, np.float32)
            if start:
                grown[:start] = codes[:start]
                grown_scales[:start] = scales[:start]
            codes, scales = grown, grown_scales
            self._codes, self._scales = codes, scales
        for first in range(start, stop, _CODE_CHUNK):
            last = min(first + _CODE_CHUNK, stop)
            codes[first:last], scales[first:last] = quantize(self.rows(first, last))
            self.coded = last
            if stopping is not None and stopping():
                break
        return self.coded - start

    def code_capacity(self, stop: int) -> int:
        """The rows the int8 copy holds room for once ``code(stop)`` has run: as now when
        they fit, else grown by a quarter (at least to ``stop``)."""
        have = len(self._codes)
        return have if stop <= have else max(stop, have * 5 // 4)

    def drop_codes(self) -> None:
        """Free the int8 copy (the HNSW index answers instead); scans read float32 again."""
        self.coded = 0  # first: a scan that read it before reads the arrays it found
        self._codes = np.zeros((0, 0), np.int8)
        self._scales = np.zeros(0, np.float32)

    def rows(self, start: int, stop: int | None = None) -> Matrix:
        """Rows ``start`` to ``stop`` (a view where they lie in one part, else a copy)."""
        stop = len(self._seqs) if stop is None else stop
        nb = len(self._base)
        if stop <= nb:
            return self._base[start:stop]
        if start >= nb:
            return self._buffer[start - nb : stop - nb]
        return np.concatenate([self._base[start:], self._buffer[: stop - nb]])

    def scores(self, queries: Matrix, start: int = 0, threads: int = 1) -> Matrix:
        """Exact scores of rows ``start``.. against each of ``queries`` (a matrix, one query
        per row): shape ``(rows, len(queries))``, one ``_dots`` per part. The rows are those
        with a seq when the scan starts: ``append`` writes a row before adding its seq, and a
        buffer that grows is filled before it replaces the old one, so every row counted this
        way is whole in whichever buffer the scan then reads, appends running beside it."""
        _check_queries(queries)
        stop = len(self._seqs)  # first, then the parts (see above)
        base, buffer = self._base, self._buffer
        nb = min(len(base), stop)
        parts = []
        if start < nb:
            parts.append(_dots(base[start:nb], queries, threads))
        if stop > nb and start < stop:
            parts.append(_dots(buffer[max(0, start - nb) : stop - nb], queries, threads))
        if not parts:
            return np.zeros((0, len(queries)), np.float32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def search(
        self,
        queries: Matrix,
        limit: int,
        expansion: int,
        *,
        ann: bool = True,
        threads: int = 1,
    ) -> tuple[list[list[tuple[int, float]]], bool]:
        """For each of ``queries`` (a matrix, one query per row) the ``limit`` best (seq,
        cosine) pairs, best first, and whether the ANN index answered (``ann``: may it; rows
        it does not cover yet are scanned exactly). The exact scan reads the rows once for
        all the queries (split between ``threads``: ``_dots``); the index searches them in one
        batch."""
        _check_queries(queries)
        # Rows are only appended, so a scan needs no lock (the rows it scores keep their
        # place); the index does, against the worker adding to it.
        found = None
        if ann and self.index is not None and self.indexed:
            with self.lock:  # (the index may have been dropped since: ``Recaller._recharge``)
                index, indexed = self.index, self.indexed
                if index is not None and indexed:
                    index.expansion_search = max(expansion, 4 * limit)
                    batch = index.search(queries, min(limit, indexed), threads=1)
                    # (one query's batch comes back as that query's matches)
                    found = (
                        [batch] if len(queries) == 1 else [batch[i] for i in range(len(queries))]
                    )
        if found is None and self.coded and len(queries) and simsimd is not None:
            return self._quantized_search(queries, limit, threads), False
        if found is None:
            scores = self.scores(queries, threads=threads)
            lists = []
            for column in scores.T:
                top = _top(column, limit)
                lists.append(self._pairs(top, column[top]))
            return lists, False
        tails = self.scores(queries, indexed, threads)
        tail_seqs = np.asarray(self._seqs[indexed : indexed + len(tails)], dtype=np.int64)
        lists = []
        for hits, tail in zip(found, tails.T, strict=True):
            keys = np.asarray(hits.keys, dtype=np.int64)
            sims = 1.0 - np.asarray(hits.distances, dtype=np.float32)
            all_seqs = np.concatenate([keys, tail_seqs])
            all_scores = np.concatenate([sims, tail]).astype(np.float32)
            # Ties fall by seq, as the exact scan's rows (in seq order) would have them.
            order = np.lexsort((all_seqs, -all_scores))[:limit]
            lists.append([(int(all_seqs[i]), float(all_scores[i])) for i in order])
        return lists, True

    def _quantized_search(
        self, queries: Matrix, limit: int, threads: int
    ) -> list[list[tuple[int, float]]]:
        """``search``'s exact path over the int8 copy: each query's best ``QUANT_OVER`` x
        ``limit`` coded rows by their int8 scores (times each row's scale; the query's own
        scale ranks nothing), scored again in float32 with the rows not coded yet, the best
        ``limit`` of those kept (ties by position, as the exact scan's). The int8 pass is cut
        between ``threads`` as the float32 one is (``_split``)."""
        coded = self.coded  # first, then the copy (see ``code``)
        codes, scales = self._codes, self._scales
        queries = np.ascontiguousarray(queries, np.float32)
        query_codes, _ = quantize(queries)
        approx = np.empty((len(queries), coded), np.float32)

        def scan(start: int, stop: int) -> None:
            # One call a part for all the queries (smaller blocks of rows were slower: each
            # call's own cost; simsimd's own threads too, on two busy cores), the rows first:
            # simsimd loops over its first argument outside, so each row is read from memory
            # once for every query, not once per query (the stored 100k-turn session, recall
            # p50 26.1-26.4 -> 23.2-24.3 ms; the same integer dot products). Not ``out=``: in
            # simsimd 6.5 a call with it drops a reference to ``None`` each time, until the
            # interpreter aborts.
            part = simsimd.cdist(
                codes[start:stop], query_codes, metric="dot", dtype="int8", out_dtype="float32"
            )
            approx[:, start:stop] = np.asarray(part).T
            approx[:, start:stop] *= scales[start:stop]

        _split(coded, threads, scan)
        tail = self.scores(queries, coded)  # the rows not coded yet, exactly
        lists = []
        for j, query in enumerate(queries):
            picked = np.sort(_top(approx[j], QUANT_OVER * limit))
            exact = np.empty((len(picked), 1), np.float32)
            _dots_into(self._gather(picked), query[None, :], exact)
            where = np.concatenate([picked, np.arange(coded, coded + len(tail))])
            scores = np.concatenate([exact[:, 0], tail[:, j]])
            top = _top(scores, limit)
            lists.append(self._pairs(where[top], scores[top]))
        return lists

    def _pairs(
        self, positions: npt.NDArray[np.intp], scores: npt.NDArray[np.float32]
    ) -> list[tuple[int, float]]:
        """(seq, score) for the rows at ``positions`` and their ``scores``: converted in two
        ``tolist`` calls, not a numpy scalar per hit (1 ms a recall at 100k rows)."""
        seqs = self._seqs
        return list(zip([seqs[i] for i in positions.tolist()], scores.tolist(), strict=True))

    def _gather(self, positions: npt.NDArray[np.intp]) -> Matrix:
        """The rows at ``positions`` (ascending), from the base and the buffer."""
        nb = len(self._base)
        cut = int(np.searchsorted(positions, nb))
        if cut == len(positions):
            return self._base[positions]
        if cut == 0:
            return self._buffer[positions - nb]
        return np.concatenate([self._base[positions[:cut]], self._buffer[positions[cut:] - nb]])


def _check_queries(queries: Matrix) -> None:
    if np.ndim(queries) != 2:
        raise ValueError(f"queries must be a matrix, one query per row; got {np.shape(queries)}")


def _dots(rows: Matrix, queries: Matrix, threads: int = 1) -> Matrix:
    """``rows @ queries.T`` without BLAS's threads, which, woken for every product, cost more
    than the product on a loaded machine (3,000 x 384 through ``@``: 7-12 ms): ``np.vecdot``
    makes one BLAS dot per row and query, over blocks of ``_BLOCK`` rows that stay in cache
    while every query reads them. 100k x 384 rows (benchmarks/bench_turn_ann.py's machine):
    one query 6.1 ms (``einsum``: 7.8), three 9.5 (three ``einsum``: 21). A row's score is
    the same whatever the block, the thread or the other queries (the queries made
    C-contiguous float32 first: a Fortran-ordered matrix sums in another order).

    With ``threads`` > 1 and at least ``_SPLIT_ROWS`` rows, the rows are cut into ``threads``
    parts and all but the first go to ``_scan_pool``'s threads while the caller scans the
    first; a part no thread has started by then (the pool busy with other recalls' parts) is
    taken back and scanned by the caller, so a busy pool never makes a scan wait. Measured on
    the stored 100k session with MiniLM, two threads against one, questions alternating in one
    process: recall p50 26.8 against 29.5 ms and 29.4 against 32.5 (two runs of 200)."""
    queries = np.ascontiguousarray(queries, np.float32)
    out = np.empty((len(rows), len(queries)), np.float32)
    _split(len(rows), threads, lambda a, b: _dots_into(rows[a:b], queries, out[a:b]))
    return out


def _split(rows: int, threads: int, scan: Callable[[int, int], None]) -> None:
    """``scan(start, stop)`` over rows ``0..rows``: in one call below ``_SPLIT_ROWS`` rows or
    with one thread, else in ``threads`` parts of which the caller scans the first while
    ``_scan_pool``'s threads take the others, a part no thread has started by then being
    taken back and scanned by the caller (``_dots``)."""
    if threads < 2 or rows < _SPLIT_ROWS:
        scan(0, rows)
        return
    step = -(-rows // threads // _BLOCK) * _BLOCK
    cuts = [(start, min(start + step, rows)) for start in range(0, rows, step)]
    pool = _scan_pool(threads - 1)
    others = [(a, b, pool.submit(scan, a, b)) for a, b in cuts[1:]]
    scan(*cuts[0])
    for a, b, future in others:
        if future.cancel():  # not started: scanned here
            scan(a, b)
        else:
            future.result()


def _dots_into(rows: Matrix, queries: Matrix, out: Matrix) -> None:
    for start in range(0, len(rows), _BLOCK):
        block = rows[start : start + _BLOCK]
        np.vecdot(block[:, None, :], queries[None, :, :], out=out[start : start + len(block)])


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _scan_pool(workers: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` threads for scans' parts (made on first use, shared by
    every recaller asking for that many)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = ThreadPoolExecutor(workers, thread_name_prefix="contextfold-scan")
            _POOLS[workers] = pool
        return pool


def _adoptable(rows: Matrix) -> bool:
    """Whether ``rows`` can become an entry's buffer as they are: a float32 matrix that owns
    its memory, writable and in row order (what ``MemoryStorage.turn_vectors`` returns)."""
    flags = rows.flags
    return (
        rows.dtype == np.float32
        and rows.ndim == 2
        and bool(flags.owndata and flags.writeable and flags.c_contiguous)
    )


def _write_tail(path: Path, data: npt.NDArray[Any], start: int) -> None:
    """Write ``data`` as the rows from row ``start`` of ``path`` (cut there first), synced;
    from row 0, a new file renamed into place (a mapping of the old one keeps its pages)."""
    if not start:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with tmp.open("wb") as handle:
            handle.write(data.tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
        return
    with path.open("r+b") as handle:
        handle.truncate(start * (data.itemsize * (data.shape[1] if data.ndim > 1 else 1)))
        handle.seek(0, os.SEEK_END)
        handle.write(data.tobytes())
        handle.flush()
        os.fsync(handle.fileno())


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


class VectorFiles:
    """The files of sessions' vectors and indexes in one folder (see the module docstring).
    A process's writers take an advisory lock per session (``fcntl``) so two processes
    sharing the store append the same rows once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _key(self, session_id: str, model: str, born: int) -> str:
        pair = _digest(session_id + "\0" + model, 12)
        return f"{self._prefix(session_id)}{pair}-{born}"

    @staticmethod
    def _prefix(session_id: str) -> str:
        """The start of every key of the session's files, whatever the model and
        incarnation: its files are found by name alone (``discard_session``)."""
        return f"{_digest(session_id, 16)}_"

    def _paths(self, key: str) -> dict[str, Path]:
        names = ("f32", "seqs", "i8", "scales", "usearch", "json", "lock")
        return {s: self.folder / f"{key}.{s}" for s in names}

    @contextlib.contextmanager
    def _locked(self, key: str) -> Any:
        """Hold the session's lock. The lock file is deleted only by its holder
        (``_discard_locked``): a writer that got the lock of a file deleted meanwhile opens
        the path again, so two writers never hold locks on two files of one name."""
        path = self._paths(key)["lock"]
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            with path.open("a+b") as handle:
                try:
                    import fcntl

                    fcntl.flock(handle, fcntl.LOCK_EX)
                except ImportError:  # pragma: no cover - not on POSIX: one process per store
                    pass
                try:
                    now = path.stat()
                except FileNotFoundError:
                    continue  # deleted while this writer waited: lock the new one
                held = os.fstat(handle.fileno())
                if (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev):
                    continue
                yield
                return

    def _meta(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._paths(key)["json"].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_meta(self, key: str, meta: dict[str, Any]) -> None:
        path = self._paths(key)["json"]
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(meta), encoding="utf-8")
        tmp.replace(path)

    def discard(
        self, session_id: str, model: str, born: int | None = None, *, keep: int | None = None
    ) -> None:
        """Delete a session's files: one incarnation's (``born``), or every one's but
        ``keep``'s; each under its lock (a writer's append is never cut)."""
        if not self.folder.is_dir():
            return
        prefix = self._key(session_id, model, 0).rsplit("-", 1)[0]
        keys = {path.name.split(".", 1)[0] for path in self.folder.glob(f"{prefix}-*")}
        for key in sorted(keys):
            if (born is None or key == f"{prefix}-{born}") and (
                keep is None or key != f"{prefix}-{keep}"
            ):
                with self._locked(key):
                    self._discard_locked(key)

    def _discard_locked(self, key: str) -> None:
        """Delete one incarnation's files, the lock file last (its lock held by the caller)."""
        paths = self._paths(key)
        for path in self.folder.glob(f"{key}.*"):
            if path != paths["lock"]:
                with contextlib.suppress(OSError):
                    path.unlink()
        with contextlib.suppress(OSError):
            paths["lock"].unlink()

    def discard_session(self, session_id: str) -> int:
        """Delete every file of the session, of every model and incarnation, found by the
        start of their names (no other session's file is read); how many keys went."""
        if not self.folder.is_dir():
            return 0
        prefix = self._prefix(session_id)
        keys = {path.name.split(".", 1)[0] for path in self.folder.glob(f"{prefix}*")}
        for key in sorted(keys):
            with self._locked(key):
                self._discard_locked(key)
        return len(keys)

    def prune(self, born_of: Callable[[str], int | None]) -> int:
        """Delete the files of sessions that are gone or were written again (``born_of``:
        the session's ``born`` now, ``None`` when it no longer exists). Returns how many
        sessions' files went."""
        if not self.folder.is_dir():
            return 0
        gone = 0
        for path in self.folder.glob("*.json"):
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
                session, model, born = meta["session"], meta["model"], int(meta["born"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            key = path.name.split(".", 1)[0]
            if key != self._key(session, model, born):
                # Named as before keys began with the session's own digest: never loaded.
                with self._locked(key):
                    self._discard_locked(key)
                gone += 1
            elif born_of(session) != born:
                self.discard(session, model, born)
                gone += 1
        return gone

    def load(
        self,
        session_id: str,
        model: str,
        born: int,
        check: Callable[[int], tuple[list[int], Matrix]],
        *,
        codes: bool = False,
    ) -> tuple[SessionVectors, list[int], Matrix] | None:
        """The session's entry mapped from its files, with the store's rows after them, or
        ``None`` (no files, or files that failed a check: then they are deleted).
        ``check(after)`` reads the store's vectors after seq ``after``; ``codes``: map the
        int8 copy too, when the files hold one that passes its check."""
        key = self._key(session_id, model, born)
        paths = self._paths(key)
        meta = self._meta(key)
        if meta is None:
            self.discard(session_id, model, keep=born)  # an older incarnation's files
            return None
        try:
            return self._load(meta, paths, session_id, model, born, check, codes)
        except Exception:  # perhaps a writer between its files: checked again under the lock
            pass
        with self._locked(key):
            meta = self._meta(key)
            try:
                if meta is None:
                    raise ValueError("no JSON file")
                return self._load(meta, paths, session_id, model, born, check, codes)
            except Exception as exc:  # a torn or foreign file: never trusted, rebuilt
                log.warning("vector files of session %r discarded: %s", session_id, exc)
                self._discard_locked(key)
                return None

    def _load(
        self,
        meta: dict[str, Any],
        paths: dict[str, Path],
        session_id: str,
        model: str,
        born: int,
        check: Callable[[int], tuple[list[int], Matrix]],
        codes: bool,
    ) -> tuple[SessionVectors, list[int], Matrix] | None:
        if (meta.get("session"), meta.get("model"), meta.get("born")) != (session_id, model, born):
            raise ValueError("the files belong to another session or embedder")
        rows, dim, indexed = int(meta["rows"]), int(meta["dim"]), int(meta.get("indexed", 0))
        if rows <= 0 or dim <= 0 or not 0 <= indexed <= rows:
            raise ValueError(f"bad counts {rows}, {dim}, {indexed}")
        if paths["f32"].stat().st_size < rows * dim * 4 or paths["seqs"].stat().st_size < rows * 8:
            raise ValueError("a file is shorter than its rows")
        base = np.memmap(paths["f32"], dtype=np.float32, mode="r", shape=(rows, dim))
        seqs = np.fromfile(paths["seqs"], dtype=np.int64, count=rows)
        if len(seqs) != rows or (rows > 1 and not bool(np.all(np.diff(seqs) > 0))):
            raise ValueError("seqs are not increasing")
        # The last rows must be the store's vectors for the same seqs; the store's rows after
        # them come back in the same read.
        first = max(0, rows - _CHECK_ROWS)
        after = int(seqs[first - 1]) if first else 0
        store_seqs, store_rows = check(after)
        n = rows - first
        if store_seqs[:n] != seqs[first:].tolist() or not np.array_equal(
            store_rows[:n], base[first:]
        ):
            raise ValueError("the last rows differ from the store's")
        entry = SessionVectors(born, base=base, seqs=seqs.tolist())
        entry.saved_rows = rows
        if codes:
            self._load_codes(meta, paths, entry, base)
        if indexed and ann_available():  # without usearch the rows serve, the index waits
            with contextlib.suppress(ImportError):
                import onnxruntime  # noqa: F401  (before usearch: see ``_new_index``)
            from usearch.index import Index

            info = Index.metadata(str(paths["usearch"]))
            # ``save_index`` renames the index in, then writes the JSON: an index holding
            # more entries than the JSON counts (none past the rows) is the newer, whole one.
            if (
                info is None
                or int(info["dimensions"]) != dim
                or not indexed <= int(info["count_present"]) <= rows
                or int(info["count_deleted"]) != 0
            ):
                raise ValueError("the index file does not match its rows")
            indexed = int(info["count_present"])
            index = Index.restore(str(paths["usearch"]), view=True)
            if index is None or len(index) != indexed:
                raise ValueError("the index file does not load")
            probe = int(seqs[indexed - 1])
            got = np.asarray(index.get(probe), dtype=np.float32).reshape(-1)
            if not np.array_equal(got, np.asarray(base[indexed - 1])):
                raise ValueError("the index's last vector differs from its row")
            entry.index, entry.indexed, entry.index_is_view = index, indexed, True
            entry.saved_indexed = indexed
        new_seqs = store_seqs[n:]
        new_rows = store_rows[n:] if new_seqs else np.zeros((0, dim), np.float32)
        return entry, new_seqs, new_rows

    @staticmethod
    def _load_codes(
        meta: dict[str, Any], paths: dict[str, Path], entry: SessionVectors, base: Matrix
    ) -> None:
        """Map the files' int8 copy into ``entry`` when it is whole and its last rows are
        the rows' own codes (``quantize`` of the same rows gives the same bytes); else leave
        the entry without one (the worker makes it again)."""
        coded, dim = int(meta.get("coded", 0)), base.shape[1]
        if not 0 < coded <= len(base):
            return
        try:
            if not VectorFiles._holds(paths, coded, dim, codes=True):
                raise ValueError("a file is shorter than its rows")
            codes = np.memmap(paths["i8"], dtype=np.int8, mode="r", shape=(coded, dim))
            scales = np.fromfile(paths["scales"], dtype=np.float32, count=coded)
            first = max(0, coded - _CHECK_ROWS)
            want, want_scales = quantize(np.asarray(base[first:coded]))
            if not (
                np.array_equal(codes[first:], want) and np.array_equal(scales[first:], want_scales)
            ):
                raise ValueError("the last codes are not their rows'")
        except (OSError, ValueError) as exc:
            log.warning("int8 copy of session vectors not used (%s): made again", exc)
            entry.codes_rejected = True
            return
        entry._codes, entry._scales = codes, scales
        entry.coded = entry.saved_coded = coded

    def _save_codes(
        self, paths: dict[str, Path], entry: SessionVectors, have: int, rows: int
    ) -> int:
        """Append the entry's int8 copy past the ``have`` rows the files hold (all of it when
        ``have`` is 0), up to the ``rows`` written; the coded rows the files hold after."""
        coded = min(entry.coded, rows)  # first, then the arrays (see ``SessionVectors.code``)
        codes, scales = entry._codes, entry._scales
        # (slices of a mapped copy are views of its file: they go only into a new file renamed
        # over it, or past the end of the file cut back to the JSON's count, never over
        # bytes they are read from)
        if coded <= have:
            return have
        for path, data in (
            (paths["i8"], np.ascontiguousarray(codes[have:coded])),
            (paths["scales"], np.ascontiguousarray(scales[have:coded])),
        ):
            _write_tail(path, data, have)
        return coded

    def save_rows(
        self,
        session_id: str,
        model: str,
        entry: SessionVectors,
        *,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        """Append the entry's rows not in the files yet (the files are started when there are
        none, or when they do not hold the rows this entry starts from). ``alive`` is asked
        under the session's lock: when it says the incarnation is gone (deleted meanwhile:
        ``discard`` waits on the same lock), nothing is written."""
        key = self._key(session_id, model, entry.born)
        paths = self._paths(key)
        with self._locked(key):
            if alive is not None and not alive():
                return
            meta = self._meta(key)
            have = int(meta["rows"]) if meta and meta.get("born") == entry.born else 0
            # Rows up to ``n`` only: recalls append to the entry meanwhile, and the rows, the
            # seqs and the JSON must all say the same count.
            n = len(entry)
            if have > n:
                # Another process wrote further. Its rows hold this entry's, so the int8 copy
                # of them is still this entry's to add where the files' copy is shorter (that
                # process may not quantize, or may have coded less).
                written = self._save_codes(paths, entry, self._coded(meta, paths, entry), n)
                if meta is not None and written != int(meta.get("coded", 0)):
                    self._write_meta(key, {**meta, "coded": written})
                entry.saved_rows, entry.saved_coded = n, written
                entry.codes_rejected = False
                return
            start = have
            if start and (
                meta is None
                or meta.get("dim") != entry.dim
                or not self._holds(paths, start, entry.dim)
            ):
                # The files lack rows the JSON counts (deleted, cut short): appending would
                # leave a gap (zeros the checks of the last rows never see). Rewritten whole.
                start = 0
            rows = np.ascontiguousarray(entry.rows(start, n), dtype=np.float32)
            seqs = np.asarray(entry.seqs[start:n], dtype=np.int64)
            for path, data in ((paths["f32"], rows), (paths["seqs"], seqs)):
                _write_tail(path, data, start)
            # The int8 copy's rows in the files stay valid while the rows do (appended only).
            have = self._coded(meta, paths, entry) if start else 0
            coded = self._save_codes(paths, entry, have, n)
            indexed = int(meta.get("indexed", 0)) if meta and start else 0
            if not start:
                entry.saved_indexed = 0  # the JSON counts no index entries now
            self._write_meta(
                key,
                {
                    "session": session_id,
                    "model": model,
                    "born": entry.born,
                    "dim": entry.dim,
                    "rows": n,
                    "coded": coded,
                    "indexed": indexed,
                },
            )
            entry.saved_rows = n
            entry.saved_coded = coded
            entry.codes_rejected = False

    def _coded(
        self, meta: dict[str, Any] | None, paths: dict[str, Path], entry: SessionVectors
    ) -> int:
        """The int8 copy's rows the files hold whole (the JSON's count, when the files are
        that long and the copy was not rejected at load), or 0."""
        coded = int(meta.get("coded", 0)) if meta and not entry.codes_rejected else 0
        return coded if coded and self._holds(paths, coded, entry.dim, codes=True) else 0

    @staticmethod
    def _holds(paths: dict[str, Path], rows: int, dim: int, *, codes: bool = False) -> bool:
        """Whether the row and seq files (``codes``: the int8 copy's and its scales') hold at
        least ``rows`` whole rows."""
        if codes:
            sizes = {"i8": rows * dim, "scales": rows * 4}
        else:
            sizes = {"f32": rows * dim * 4, "seqs": rows * 8}
        try:
            return all(paths[name].stat().st_size >= size for name, size in sizes.items())
        except OSError:
            return False

    def save_index(self, session_id: str, model: str, entry: SessionVectors) -> None:
        """Write the entry's index (to a temporary file, then renamed over the old one)."""
        key = self._key(session_id, model, entry.born)
        paths = self._paths(key)
        with self._locked(key):
            meta = self._meta(key)
            if not meta or meta.get("born") != entry.born or int(meta["rows"]) < entry.indexed:
                return
            with entry.lock:
                index, indexed = entry.index, entry.indexed
                tmp = paths["usearch"].with_name(f"{key}.usearch.{os.getpid()}.tmp")
                index.save(str(tmp))
            with tmp.open("rb") as handle:
                os.fsync(handle.fileno())
            tmp.replace(paths["usearch"])
            self._write_meta(key, {**meta, "indexed": indexed})
            entry.saved_indexed = indexed


_WORKERS: weakref.WeakSet[IndexWorker] = weakref.WeakSet()


@atexit.register
def _stop_workers() -> None:
    # A daemon thread inside usearch when the interpreter exits aborts the process: stop them
    # between chunks first.
    for worker in list(_WORKERS):
        worker.stopping.set()
        worker.close()


class IndexWorker:
    """One daemon thread that grows sessions' indexes and writes their files, so a recall
    never waits for either. ``wait()`` returns when the queued work is done (tests, close)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self.stopping = threading.Event()  # set at exit: jobs stop between chunks
        _WORKERS.add(self)

    def submit(self, job: Callable[[], None]) -> None:
        with self._guard:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="contextfold-turn-index", daemon=True
                )
                self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if not self.stopping.is_set():
                    job()
            except Exception:  # the exact scan keeps answering; the next recall retries
                log.exception("turn index work failed")
            finally:
                self._jobs.task_done()

    def wait(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        with self._guard:
            thread = self._thread
            self._thread = None
        if thread is not None and thread.is_alive():
            self._jobs.put(None)
            thread.join()


def grow_index(
    entry: SessionVectors, settings: dict[str, int], stopping: Sequence[threading.Event] = ()
) -> bool:
    """Add the entry's rows after ``indexed`` to its index (made when there is none; a
    mapped view is first copied into memory), a chunk at a time (any of ``stopping`` set ends
    it between chunks). Returns whether every row was added."""

    def stop() -> bool:
        return any(event.is_set() for event in stopping)

    total = len(entry)
    start = entry.indexed
    if start >= total:
        return False
    if entry.index is None or entry.index_is_view:
        # (A view is read-only: it is copied.)
        fresh = _new_index(entry.dim, **settings) if entry.index is None else entry.index.copy()
        # Built aside: searches go on (exactly, or with the old view) meanwhile.
        for at in range(start, total, 16 * _ADD_CHUNK):
            if stop():
                return False
            end = min(total, at + 16 * _ADD_CHUNK)
            rows = np.ascontiguousarray(entry.rows(at, end))
            fresh.add(np.asarray(entry.seqs[at:end], dtype=np.uint64), rows, threads=1)
        with entry.lock:
            entry.index, entry.indexed, entry.index_is_view = fresh, total, False
        return True
    for at in range(start, total, _ADD_CHUNK):
        if stop():
            return False
        end = min(total, at + _ADD_CHUNK)
        rows = np.ascontiguousarray(entry.rows(at, end))
        keys = np.asarray(entry.seqs[at:end], dtype=np.uint64)
        with entry.lock:
            entry.index.add(keys, rows, threads=1)
            entry.indexed = end
    return True
