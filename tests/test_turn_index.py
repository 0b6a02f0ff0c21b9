"""The dense path's session vectors (memory/turn_index.py): the HNSW index above
``ann_min_turns`` answers as the exact scan does, grows as vectors land, sees another store
object's writes, and a restart maps the files beside the database instead of reading every
vector back — never trusting a torn or foreign file. Speed is measured by
benchmarks/bench_turn_ann.py, not here."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from contextfold.items import Message
from contextfold.memory import turn_index
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.recall import Recaller
from contextfold.memory.turn_index import SessionVectors, _top
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import CharCounter

DIM = 32
N = 3000
LIMIT = 50


class Vectors:
    """Seeded clustered unit vectors; ``embed`` answers ``"q <n>"`` with query ``n`` and
    ``"row <seq>"`` with the stored vector of that seq (an exact match)."""

    name = "synthetic"

    def __init__(self, seed: int = 7) -> None:
        self.rng = np.random.default_rng(seed)
        self.centres = self.rng.standard_normal((40, DIM))
        self.queries = self.draw(40)
        self.rows: dict[int, npt.NDArray[np.float32]] = {}

    def draw(self, count: int) -> npt.NDArray[np.float32]:
        rows = self.centres[self.rng.integers(0, len(self.centres), count)]
        rows = rows + 0.7 * self.rng.standard_normal((count, DIM))
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = []
        for text in texts:
            kind, n = text.split()
            out.append(self.queries[int(n)] if kind == "q" else self.rows[int(n)])
        return np.stack(out)


def fill(store: MemoryStore, vectors: Vectors, count: int, sid: str = "s") -> None:
    if store.session_version(sid) is None:
        store.create_session(sid)
    start = store.last_seq(sid)
    store.append_turns(sid, [Message(role="user", content=f"t{i}") for i in range(count)])
    seqs = list(range(start + 1, start + count + 1))
    rows = vectors.draw(count)
    vectors.rows.update(zip(seqs, rows, strict=True))
    store.add_turn_vectors(sid, vectors.name, seqs, rows)


def recaller(store: MemoryStore, vectors: Vectors, **kw: Any) -> Recaller:
    return Recaller(store, embedder=vectors, fts_limit=LIMIT, **kw)


def top(r: Recaller, text: str, sid: str = "s") -> list[tuple[int, float]]:
    return r._dense(sid, [text], LIMIT)[0]


def reads(store: MemoryStore) -> list[int]:
    """The ``after`` of every ``turn_vectors`` call from now on."""
    calls: list[int] = []
    original = store.turn_vectors

    def spy(session_id: str, model: str, *, after: int = 0) -> Any:
        calls.append(after)
        return original(session_id, model, after=after)

    store.turn_vectors = spy  # type: ignore[method-assign]
    return calls


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Vectors]:
    """A database with one session of N vectors, its files written by a closed recaller."""
    path = tmp_path_factory.mktemp("ann") / "m.db"
    vectors = Vectors()
    store = MemoryStore(path, counter=CharCounter())
    fill(store, vectors, N)
    r = recaller(store, vectors, ann_min_turns=1000, vector_dir=f"{path}.vectors")
    top(r, "q 0")
    r.settle()  # the index built (``close`` alone stops a build between chunks)
    r.close()
    return path, vectors


def copy_db(filled: tuple[Path, Vectors], into: Path) -> Path:
    import shutil

    path, _ = filled
    for name in (path.name, f"{path.name}-wal", f"{path.name}-shm"):
        if (path.parent / name).exists():
            shutil.copy(path.parent / name, into / name)
    shutil.copytree(f"{path}.vectors", into / f"{path.name}.vectors")
    return into / path.name


def test_above_the_threshold_the_index_answers_with_the_exact_top_k(
    filled: tuple[Path, Vectors],
) -> None:
    path, vectors = filled
    store = MemoryStore(path, counter=CharCounter())
    exact = recaller(store, vectors, ann_min_turns=None)
    ann = recaller(store, vectors, ann_min_turns=1000)
    top(ann, "q 0")  # the first recall scans exactly and starts the build
    ann.settle()
    recall = []
    for n in range(20):
        got, want = top(ann, f"q {n}"), top(exact, f"q {n}")
        assert ann.last_dense["ann"] is True and exact.last_dense["ann"] is False
        recall.append(len({s for s, _ in got} & {s for s, _ in want}) / LIMIT)
        assert got[0] == pytest.approx(want[0])  # the best turn and its cosine
    assert np.mean(recall) >= 0.99
    below = recaller(store, vectors, ann_min_turns=N + 1)  # below it: the exact scan itself
    assert top(below, "q 3") == top(exact, "q 3") and below.last_dense["ann"] is False


def test_vectors_that_land_are_seen_by_the_next_query_then_join_the_index(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    vectors = filled[1]
    store = MemoryStore(path, counter=CharCounter())
    ann = recaller(store, vectors, ann_min_turns=1000)
    ann.ann_tail = 1
    top(ann, "q 0")
    ann.settle()
    entry = ann._vectors["s"]
    before = entry.indexed
    fill(store, vectors, 5)
    new = store.last_seq("s")
    hits = top(ann, f"row {new}")  # the tail is scanned exactly beside the index
    assert hits[0][0] == new and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    ann.settle()
    assert entry.indexed == before + 5 == len(entry)  # added, not rebuilt
    assert top(ann, f"row {new}")[0][0] == new and ann.last_dense["ann"] is True


def test_a_restart_maps_the_files_and_reads_only_their_last_rows(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    vectors = filled[1]
    store = MemoryStore(path, counter=CharCounter())
    calls = reads(store)
    again = recaller(store, vectors, ann_min_turns=1000, vector_dir=f"{path}.vectors")
    hits = top(again, "q 4")
    assert calls == [N - 8]  # the 8 rows checked against the store, and nothing before them
    assert again.last_dense["ann"] is True and again._vectors["s"].index_is_view
    exact = recaller(MemoryStore(path, counter=CharCounter()), vectors, ann_min_turns=None)
    want = top(exact, "q 4")
    assert len({s for s, _ in hits} & {s for s, _ in want}) >= 0.98 * LIMIT


def test_another_store_objects_writes_are_seen_after_the_files(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    vectors = filled[1]
    writer = MemoryStore(path, counter=CharCounter())
    fill(writer, vectors, 3)  # after the files were written
    reader = recaller(
        MemoryStore(path, counter=CharCounter()),
        vectors,
        ann_min_turns=1000,
        vector_dir=f"{path}.vectors",
    )
    assert top(reader, f"row {N + 3}")[0][0] == N + 3
    fill(writer, vectors, 2)  # while the reader holds the session
    assert top(reader, f"row {N + 5}")[0][0] == N + 5


def _truncate_rows(path: Path) -> None:
    (f32,) = Path(f"{path}.vectors").glob("*.f32")
    with f32.open("r+b") as f:
        f.truncate(f32.stat().st_size - 4 * DIM)


def _flip_last_row(path: Path) -> None:
    (f32,) = Path(f"{path}.vectors").glob("*.f32")
    data = bytearray(f32.read_bytes())
    data[-8:] = bytes(8)
    f32.write_bytes(bytes(data))


def _tear_index(path: Path) -> None:
    (index,) = Path(f"{path}.vectors").glob("*.usearch")
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])


def _garbage_meta(path: Path) -> None:
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    meta.write_text('{"rows": 3', encoding="utf-8")


def _foreign_meta(path: Path) -> None:
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    meta.write_text(meta.read_text(encoding="utf-8").replace('"s"', '"other"'), "utf-8")


@pytest.mark.parametrize(
    "damage", [_truncate_rows, _flip_last_row, _tear_index, _garbage_meta, _foreign_meta]
)
def test_a_torn_or_foreign_file_is_rebuilt_never_trusted(
    filled: tuple[Path, Vectors], tmp_path: Path, damage: Any
) -> None:
    path = copy_db(filled, tmp_path)
    vectors = filled[1]
    damage(path)
    store = MemoryStore(path, counter=CharCounter())
    calls = reads(store)
    again = recaller(store, vectors, ann_min_turns=None, vector_dir=f"{path}.vectors")
    exact = recaller(MemoryStore(path, counter=CharCounter()), vectors, ann_min_turns=None)
    assert top(again, "q 5") == top(exact, "q 5")
    assert calls[-1] == 0  # every vector read from the store
    again.close()  # the files are written again, whole
    store = MemoryStore(path, counter=CharCounter())
    calls = reads(store)
    third = recaller(store, vectors, ann_min_turns=None, vector_dir=f"{path}.vectors")
    assert top(third, "q 5") == top(exact, "q 5") and calls == [N - 8]


def test_a_session_written_again_never_gets_its_old_vectors(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    store = MemoryStore(path, counter=CharCounter())
    store.delete_session("s")
    fresh = Vectors(seed=99)
    fill(store, fresh, 2500)
    again = recaller(store, fresh, ann_min_turns=1000, vector_dir=f"{path}.vectors")
    exact = recaller(MemoryStore(path, counter=CharCounter()), fresh, ann_min_turns=None)
    assert top(again, "q 1") == top(exact, "q 1")
    assert all(seq <= 2500 for seq, _ in top(again, "q 2"))
    old = [p for p in Path(f"{path}.vectors").iterdir() if p.name.endswith("-1.f32")]
    assert old == []  # the old incarnation's files are gone


def test_closing_deletes_the_files_of_a_deleted_session(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    store = MemoryStore(path, counter=CharCounter())
    folder = Path(f"{path}.vectors")
    assert list(folder.glob("*.f32"))
    store.delete_session("s")
    recaller(store, filled[1], vector_dir=folder).close()
    assert list(folder.glob("*.f32")) == [] and list(folder.glob("*.usearch")) == []


def test_the_vector_cache_counts_the_index_and_holds_its_limit() -> None:
    store = MemoryStore(counter=CharCounter())
    vectors = Vectors()
    for sid in ("a", "b", "c"):
        fill(store, vectors, 1500, sid)
    rows = 1500 * DIM * 4
    unbounded = recaller(store, vectors, ann_min_turns=1000)
    for sid in ("a", "b", "c"):
        top(unbounded, "q 1", sid)
    unbounded.settle()
    top(unbounded, "q 1", "a")
    indexed = unbounded._vectors["a"].charged
    assert indexed > rows + 8 * 1500  # the index's memory is counted
    limit = 2 * indexed + indexed // 2
    bounded = recaller(store, vectors, ann_min_turns=1000, vector_cache_bytes=limit)
    for _ in range(2):
        for sid in ("a", "b", "c"):
            assert top(bounded, "q 1", sid)[0][0] == top(unbounded, "q 1", sid)[0][0]
            bounded.settle()
            assert bounded.vector_cache_bytes() <= limit
    assert len(bounded._vectors) == 2


def test_the_engine_keeps_files_only_beside_a_sqlite_file(tmp_path: Path) -> None:
    cfg = MemoryConfig.model_validate({"recall": {"ann_min_turns": 5000}})
    assert MemoryConfig().recall.ann_min_turns is None  # exact by default (the benchmark)
    in_memory = MemoryEngine(cfg, store=MemoryStore(":memory:"), embedder=HashEmbedder(dim=16))
    assert in_memory.recaller.files is None
    on_file = MemoryEngine(cfg, store=tmp_path / "m.db", embedder=HashEmbedder(dim=16))
    assert on_file.recaller.files is not None
    assert on_file.recaller.files.folder == tmp_path / "m.db.vectors"
    assert on_file.recaller.ann_min_turns == 5000
    off = MemoryConfig.model_validate({"recall": {"vector_files": False, "ann_min_turns": None}})
    plain = MemoryEngine(off, store=tmp_path / "n.db", embedder=HashEmbedder(dim=16))
    assert plain.recaller.files is None and plain.recaller.ann_min_turns is None
    for engine in (in_memory, on_file, plain):
        engine.close()
    with pytest.raises(ValueError):
        MemoryConfig.model_validate({"recall": {"ann_min_turns": 10}})


def test_a_large_session_nothing_holds_is_read_by_the_worker_and_the_recall_says_so() -> None:
    store = MemoryStore(counter=CharCounter())  # no files: as PostgreSQL
    vectors = Vectors()
    fill(store, vectors, 300)
    r = recaller(store, vectors)
    r.read_later_min = 200
    calls = reads(store)
    gate = threading.Event()
    r._worker.submit(lambda: gate.wait(10))  # the worker waits until the recalls answered
    assert top(r, "q 1") == []  # no dense signal yet, the read started
    assert r.pending_vectors("s") == 300  # every turn waits for it
    assert top(r, "q 1") == []
    reads_queued = [j for j in r._worker._jobs.queue if getattr(j, "func", None) == r._read]
    assert len(reads_queued) == 1  # started once
    gate.set()
    r.settle()
    assert calls == [0]  # read once, by the worker
    exact = recaller(MemoryStore(counter=CharCounter()), vectors)
    fill(exact.store, Vectors(), 300)  # the same seeded vectors
    assert top(r, "q 1") == top(exact, "q 1") and r.pending_vectors("s") == 0
    small = recaller(store, vectors)
    small.read_later_min = 301  # below it the recall reads them itself
    assert top(small, "q 1") == top(exact, "q 1")


def test_recalls_from_several_threads_while_the_index_grows(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    vectors = filled[1]
    store = MemoryStore(path, counter=CharCounter())
    ann = recaller(store, vectors, ann_min_turns=1000)
    ann.ann_tail = 1
    top(ann, "q 0")
    ann.settle()
    errors: list[BaseException] = []

    def ask(n: int) -> None:
        try:
            for i in range(15):
                assert len(top(ann, f"q {(n + i) % 40}")) == LIMIT
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(3):  # vectors land, the worker adds them, while the threads search
        fill(store, vectors, 20)
        top(ann, "q 1")
    for thread in threads:
        thread.join()
    ann.settle()
    assert errors == []
    newest = store.last_seq("s")
    assert top(ann, f"row {newest}")[0][0] == newest
    assert ann._vectors["s"].indexed == newest == N + 60


def test_a_large_session_the_cache_cannot_hold_is_not_read_again_at_every_recall() -> None:
    store = MemoryStore(counter=CharCounter())  # no files: as PostgreSQL
    vectors = Vectors()
    fill(store, vectors, 400)
    r = recaller(store, vectors, vector_cache_bytes=10_000)  # 400 x 32 x 4 bytes do not fit
    r.read_later_min = 200
    calls = reads(store)
    for _ in range(4):
        assert top(r, "q 1") == []  # recall never waits for the read, nor does it
        r.settle()
        assert r.pending_vectors("s") == 400  # and it says every turn went without dense
    assert calls == [0]  # read once: then known not to fit, not read again
    assert r.vector_cache_bytes() == 0
    fill(store, vectors, 10)  # more vectors do not make it fit
    assert top(r, "q 1") == [] and r.pending_vectors("s") == 410
    r.settle()
    assert calls == [0]
    r.vector_cache_limit = 10**7  # a limit that holds it: read (once more) and kept
    assert top(r, "q 1") == []
    r.settle()
    exact = recaller(store, vectors, vector_cache_bytes=10**7)
    exact.read_later_min = None
    assert top(r, "q 1") == top(exact, "q 1") != [] and r.pending_vectors("s") == 0
    assert calls.count(0) == 3  # the worker's read, then ``exact``'s own (whole reads)
    store.delete_session("s")  # a session written again is judged again
    fill(store, vectors, 300)
    r.vector_cache_limit = 10_000
    assert top(r, "q 1") == []
    r.settle()
    assert r.pending_vectors("s") == 300 and calls.count(0) == 4
    assert top(r, "q 1") == [] and calls.count(0) == 4
    r.close()


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_rows_are_never_appended_after_a_gap_in_a_missing_or_short_file(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "m.db"
    store = MemoryStore(path, counter=CharCounter())
    vectors = Vectors()
    fill(store, vectors, 1200)
    r = recaller(store, vectors, vector_dir=f"{path}.vectors")
    top(r, "q 1")
    r.settle()
    (f32,) = (tmp_path / "m.db.vectors").glob("*.f32")
    if damage == "missing":
        f32.unlink()
    else:
        with f32.open("r+b") as handle:
            handle.truncate(500 * DIM * 4)
    fill(store, vectors, 600)  # the JSON says 1,200 rows are whole: these 600 follow them
    top(r, "q 1")
    r.settle()
    r.close()
    again = recaller(store, vectors, vector_dir=f"{path}.vectors")
    entry = again._session_vectors("s")
    rows = entry.rows(0, len(entry))
    assert len(entry) == 1800
    assert np.array_equal(rows, np.stack([vectors.rows[s] for s in range(1, 1801)]))
    assert f32.stat().st_size == 1800 * DIM * 4
    assert top(again, "row 5")[0][0] == 5
    again.close()


def test_an_index_renamed_in_before_its_json_is_rewritten_is_used_not_deleted(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    # ``save_index`` renames the new index into place, then rewrites the JSON: a loader in
    # between sees the new index with the old count.
    import json

    path = copy_db(filled, tmp_path)
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    data = json.loads(meta.read_text(encoding="utf-8"))
    assert data["indexed"] == N
    meta.write_text(json.dumps({**data, "indexed": N - 700}), encoding="utf-8")
    store = MemoryStore(path, counter=CharCounter())
    calls = reads(store)
    again = recaller(store, filled[1], ann_min_turns=1000, vector_dir=f"{path}.vectors")
    entry = again._session_vectors("s")
    assert calls == [N - 8] and entry.indexed == N  # the whole index serves
    assert len(list(Path(f"{path}.vectors").glob("*.usearch"))) == 1
    again.close()


def test_files_are_deleted_under_the_sessions_lock_and_the_lock_stays_whole(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    path = copy_db(filled, tmp_path)
    store = MemoryStore(path, counter=CharCounter())
    r = recaller(store, filled[1], vector_dir=f"{path}.vectors")
    files = r.files
    assert files is not None
    key = files._key("s", filled[1].name, r._born("s") or 0)
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with files._locked(key):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=writer)
    holder.start()
    assert held.wait(10)
    deleting = threading.Thread(target=files.discard, args=("s", filled[1].name))
    deleting.start()
    deleting.join(0.3)
    assert deleting.is_alive()  # it waits for the writer
    assert len(list(Path(f"{path}.vectors").glob(f"{key}.*"))) == 5
    release.set()
    holder.join()
    deleting.join(10)
    assert list(Path(f"{path}.vectors").glob(f"{key}.*")) == []
    r.close()


def test_a_writer_waiting_on_a_lock_file_that_was_deleted_takes_the_new_one(
    tmp_path: Path,
) -> None:
    from contextfold.memory.turn_index import VectorFiles

    files = VectorFiles(tmp_path)
    key = files._key("s", "m", 1)
    first_in, first_out = threading.Event(), threading.Event()
    go, gone = threading.Event(), threading.Event()
    waiter_in, waiter_out = threading.Event(), threading.Event()

    def first() -> None:
        with files._locked(key):
            first_in.set()
            go.wait(10)
            files._discard_locked(key)  # the session's files go, its lock file too
            gone.set()
            first_out.wait(10)

    def waiter() -> None:
        with files._locked(key):  # opens the lock file now, gets it once ``first`` is done
            waiter_in.set()
            waiter_out.wait(10)

    one = threading.Thread(target=first)
    one.start()
    assert first_in.wait(10)
    two = threading.Thread(target=waiter)
    two.start()
    two.join(0.3)  # it waits on the lock file ``first`` holds
    go.set()
    assert gone.wait(10)
    with files._locked(key):  # a new lock file: this later writer holds the lock...
        first_out.set()
        one.join(10)
        assert not waiter_in.wait(0.3)  # ...and the waiter does not hold it at the same time
    assert waiter_in.wait(10)
    waiter_out.set()
    two.join(10)


def test_the_index_the_worker_builds_is_charged_to_the_cache_within_its_limit() -> None:
    store = MemoryStore(counter=CharCounter())
    vectors = Vectors()
    for sid in ("a", "b"):
        fill(store, vectors, 3000, sid)
    rows = 3000 * DIM * 4 + 8 * 3000  # one session's rows and seqs
    small = recaller(store, vectors, ann_min_turns=1000, vector_cache_bytes=3 * rows)
    top(small, "q 1", "a")
    small.settle()  # the index would pass the limit: the rows stay, scanned exactly
    entry = small._vectors["a"]
    assert entry.index is None and small.vector_cache_bytes() == entry.nbytes == entry.charged
    assert small.vector_cache_bytes() <= 3 * rows
    top(small, "q 1", "a")
    small.settle()
    assert small._vectors["a"].index is None  # not built again at the next recall
    exact = recaller(store, vectors, ann_min_turns=None)
    assert top(small, "q 1", "a") == top(exact, "q 1", "a")
    unbounded = recaller(store, vectors, ann_min_turns=1000)
    top(unbounded, "q 1", "a")
    unbounded.settle()
    indexed = unbounded._vectors["a"].nbytes
    assert indexed > 3 * rows
    two = recaller(store, vectors, ann_min_turns=1000, vector_cache_bytes=indexed + rows)
    top(two, "q 1", "b")  # b's rows are cached
    two.settle()  # b's index makes room only for itself
    top(two, "q 1", "a")
    two.settle()  # a's index needs the room b holds: b goes
    assert list(two._vectors) == ["a"] and two._vectors["a"].index is not None
    assert two.vector_cache_bytes() == two._vectors["a"].nbytes <= indexed + rows
    for r in (small, exact, unbounded, two):
        r.close()


def test_close_stops_an_index_build_between_chunks_and_still_writes_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close`` does not wait for an HNSW build (minutes for 100k vectors): the build stops
    between chunks, the session's rows still reach the files, and the next recaller builds the
    index again (the exact scan answering meanwhile)."""
    import time

    from contextfold.memory import turn_index

    path = tmp_path / "m.db"
    vectors = Vectors()
    store = MemoryStore(path, counter=CharCounter())
    fill(store, vectors, 2000)  # 8 chunks of 256 rows for a fresh index
    started = threading.Event()
    adds: list[int] = []
    real = turn_index._new_index

    class Slow:
        """A real index whose ``add`` takes 0.2 s a chunk."""

        def __init__(self, index: Any) -> None:
            self.index = index

        def add(self, keys: Any, rows: Any, **kw: Any) -> Any:
            adds.append(len(keys))
            started.set()
            time.sleep(0.2)
            return self.index.add(keys, rows, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.index, name)

    monkeypatch.setattr(turn_index, "_new_index", lambda *a, **kw: Slow(real(*a, **kw)))
    r = recaller(store, vectors, ann_min_turns=1000, vector_dir=f"{path}.vectors")
    assert top(r, "row 7")[0][0] == 7  # the exact scan answers; the build is queued
    assert started.wait(10)
    r.close()
    assert 1 <= len(adds) <= 2  # stopped between chunks, not after all 8
    folder = Path(f"{path}.vectors")
    assert len(list(folder.glob("*.f32"))) == 1 and not list(folder.glob("*.usearch"))
    monkeypatch.setattr(turn_index, "_new_index", real)
    again = recaller(
        MemoryStore(path, counter=CharCounter()),
        vectors,
        ann_min_turns=1000,
        vector_dir=f"{path}.vectors",
    )
    assert top(again, "row 1999")[0][0] == 1999
    again.settle()
    again.close()
    assert len(list(folder.glob("*.usearch"))) == 1  # built whole this time


def _best_by_numpy(matrix: npt.NDArray[np.float32], query: Any, k: int) -> list[int]:
    """Positions of the ``k`` best rows by float64 products, ties by position."""
    scores = matrix.astype(np.float64) @ np.asarray(query, np.float64)
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


@pytest.mark.parametrize("split", [0, 700, 2600])  # rows read whole, or part read, part appended
def test_one_scan_for_several_queries_answers_as_one_scan_each(split: int) -> None:
    """The exact scan scores every row against all the recall's queries in one pass over
    blocks of rows: each query's list is the one it gets alone, its cosines those of a
    float64 product, whatever the block boundaries and the base/buffer split."""
    vectors = Vectors(seed=11)
    rows = vectors.draw(2600)  # more than two blocks, not a multiple of one
    entry = SessionVectors(born=1)
    seqs = list(range(1, len(rows) + 1))
    if split:
        entry.append(seqs[:split], rows[:split].copy())
    for start in range(split, len(rows), 900):
        entry.append(seqs[start : start + 900], rows[start : start + 900])
    queries = vectors.queries[:5]
    together, ann = entry.search(queries, LIMIT, 16, ann=False)
    assert ann is False and len(together) == len(queries)
    for query, hits in zip(queries, together, strict=True):
        assert entry.search(query[None], LIMIT, 16, ann=False)[0] == [hits]
        assert [seq - 1 for seq, _ in hits] == _best_by_numpy(rows, query, LIMIT)
        for seq, cosine in hits:
            assert cosine == pytest.approx(float(rows[seq - 1] @ query), abs=1e-6)


def test_a_recall_with_parts_reads_the_vectors_once_for_all_of_them() -> None:
    """A message ranked in parts (``decompose``) embeds the parts in one batch and scans the
    session's vectors once; each part's dense list is the one it gets asked alone."""
    store = MemoryStore(":memory:", counter=CharCounter())
    vectors = Vectors()
    fill(store, vectors, 1200)
    r = recaller(store, vectors, ann_min_turns=None)
    top(r, "q 0")  # the session's vectors read
    entry = r._session_vectors("s")
    scans: list[int] = []
    original = entry.scores

    def counted(queries: Any, start: int = 0, threads: int = 1) -> Any:
        scans.append(len(queries))
        return original(queries, start, threads)

    entry.scores = counted  # type: ignore[method-assign]
    texts = ["q 1", "q 2", "  ", "q 3"]
    lists = r._dense("s", texts, LIMIT)
    assert scans == [3]  # one pass, three queries (the blank text asks nothing)
    assert lists[2] == []
    for text, hits in zip(texts, lists, strict=True):
        if text.strip():
            assert hits == top(r, text) and len(hits) == LIMIT


def _reference_top(scores: npt.NDArray[np.float32], limit: int) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:limit]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(-40, 40), min_size=1, max_size=3000),
    limit=st.integers(1, 40),
    sample=st.sampled_from([8, 64, 4096]),
)
def test_the_top_positions_are_the_best_scores_ties_by_position(
    values: list[int], limit: int, sample: int
) -> None:
    """``_top`` (a floor sampled from the scores when they are many, else one partition)
    keeps the stated order: the best ``limit``, ties by position, many ties included;
    ``sample`` (the scores sampled) is made small so short arrays are sampled sparsely."""
    scores = np.asarray(values, np.float32) / 8
    with mock.patch.object(turn_index, "_SAMPLE", sample):
        assert _top(scores, limit).tolist() == _reference_top(scores, limit)


def test_a_sampled_floor_too_high_falls_back_to_the_whole_partition() -> None:
    """The sampled scores are the highest ones: fewer than ``limit`` reach their floor, and
    the whole array is partitioned (the answer is the same)."""
    limit, n = 50, 4096 * 40
    scores = np.zeros(n, np.float32)
    stride = n // 4096
    scores[::stride] = np.linspace(1, 2, len(scores[::stride]), dtype=np.float32)
    scores[1::stride] = 0.5  # the next best: ties by position
    got = _top(scores, limit).tolist()
    assert got == _reference_top(scores, limit)
    assert len({i for i in got if i % stride == 0}) == limit  # all from the sample
    assert _top(scores, 5000).tolist() == _reference_top(scores, 5000)  # sample and more


def test_the_index_answers_several_queries_as_it_answers_each_alone(
    filled: tuple[Path, Vectors], tmp_path: Path
) -> None:
    """Through the HNSW index, with rows stored since it last grew (the tail, scanned
    exactly): each query of a batch gets the list it gets alone, its own index hits and its
    own tail scores (a row of the tail is each query's own best match)."""
    path = copy_db(filled, tmp_path)
    vectors = filled[1]
    store = MemoryStore(path, counter=CharCounter())
    ann = recaller(store, vectors, ann_min_turns=1000)
    ann.ann_tail = 1_000_000  # the rows stored below stay in the tail
    top(ann, "q 0")
    ann.settle()
    fill(store, vectors, 3)
    last = store.last_seq("s")
    tail = [f"row {seq}" for seq in range(last - 2, last + 1)]
    texts = ["q 1", tail[0], "q 2", tail[2], tail[1]]
    lists = ann._dense("s", texts, LIMIT)
    assert ann.last_dense["ann"] is True
    entry = ann._vectors["s"]
    assert 0 < entry.indexed <= last - 3  # the new rows are not in the index
    for text, hits in zip(texts, lists, strict=True):
        assert hits == top(ann, text)
    for text, hits in zip(texts[1::2] + texts[4:], [lists[1], lists[3], lists[4]], strict=True):
        assert hits[0][0] == int(text.split()[1]) and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert lists[0] != lists[2]  # (two queries, two lists)


def test_each_part_of_a_message_is_fused_with_its_own_dense_list() -> None:
    """``_rank`` hands each text (the message, each part) the dense list of that text."""
    store = MemoryStore(":memory:", counter=CharCounter())
    store.create_session("s")
    names = ["Melanie", "Caroline", "Jon"]
    places = ["lake", "museum", "park", "bakery", "garage"]
    store.append_turns(
        "s",
        [
            Message(
                role="user", content=f"{names[i % 3]}: we went to the {places[i % 5]} on day {i}"
            )
            for i in range(120)
        ],
    )
    r = Recaller(store, embedder=HashEmbedder(), fts_limit=LIMIT, decompose=True)
    r.ensure_vectors("s")
    text = "What did Melanie and Caroline do at the lake and the museum?"
    seen: list[tuple[str, list[tuple[int, float]]]] = []
    original = r._rank_text

    def spy(session_id: str, t: str, tags: Any, fts: Any, dense: Any, **kw: Any) -> Any:
        seen.append((t, dense))
        return original(session_id, t, tags, fts, dense, **kw)

    r._rank_text = spy  # type: ignore[method-assign]
    r.rank("s", text)
    assert len(seen) >= 3 and seen[0][0] == text  # the message and at least two parts
    for t, dense in seen:
        assert dense == r._dense("s", [t], LIMIT)[0] and dense
    assert len({tuple(dense) for _, dense in seen}) == len(seen)


class _AppendsMidScan(SessionVectors):
    """Runs an append that grows the buffer at the moment a scan reads ``_buffer``: the
    interleaving a writer thread can produce (rows only appended, the scan takes no lock)."""

    armed = False

    def __getattribute__(self, name: str) -> Any:
        if name == "_buffer" and object.__getattribute__(self, "armed"):
            object.__setattr__(self, "armed", False)
            rows = np.ones((30, 4), np.float32)
            SessionVectors.append(self, list(range(200, 230)), rows)
        return object.__getattribute__(self, name)


def test_a_scan_beside_an_append_that_grows_the_buffer_scores_only_whole_rows() -> None:
    entry = _AppendsMidScan(born=1)
    entry.append(list(range(1, 101)), np.full((101, 4), 0.5, np.float32)[:100])  # a copy
    entry.append([101], np.full((1, 4), 0.5, np.float32))  # buffer: 101 rows of 125
    entry._buffer[entry._count :] = np.nan  # the spare rows: never written
    entry.armed = True
    hits, ann = entry.search(np.ones((1, 4), np.float32), 20, 16, ann=False)
    assert ann is False and not entry.armed  # the append ran inside the scan
    assert len(hits[0]) == 20 and all(score == 2.0 for _, score in hits[0])
    assert [seq for seq, _ in hits[0]] == list(range(1, 21))  # rows the scan counted, in order
    assert len(entry) == 131 and entry.search(np.ones((1, 4), np.float32), 1, 16, ann=False)[0] == [
        [(200, 4.0)]
    ]


@pytest.mark.parametrize("threads", [2, 3])
def test_a_scan_split_between_threads_gives_each_row_the_score_it_gets_in_one(
    threads: int,
) -> None:
    """From ``_SPLIT_ROWS`` rows a scan is cut between threads: every row's score is the one
    the single-threaded scan gives (same dots, same order), the top lists the same; with the
    pool's threads all busy, the recall's own thread scans the parts none started."""
    vectors = Vectors(seed=3)
    rows = vectors.draw(turn_index._SPLIT_ROWS + 1500)  # not a multiple of a block
    queries = vectors.queries[:3]
    one = turn_index._dots(rows, queries)
    assert np.array_equal(turn_index._dots(rows, queries, threads), one)
    entry = SessionVectors(born=1)
    entry.append(list(range(1, len(rows) + 1)), rows)
    want = entry.search(queries, LIMIT, 16, ann=False)
    assert entry.search(queries, LIMIT, 16, ann=False, threads=threads) == want
    release = threading.Event()
    pool = turn_index._scan_pool(threads - 1)
    blockers = [pool.submit(release.wait, 30) for _ in range(threads - 1)]
    try:  # every pool thread busy: the parts are taken back, not waited for
        assert np.array_equal(turn_index._dots(rows, queries, threads), one)
    finally:
        release.set()
    assert all(b.result() for b in blockers)


# -- the quantized scan (``quantize_min_turns``) -------------------------------------------------


def test_quantize_keeps_each_row_within_half_a_step_and_a_zero_row_zero() -> None:
    rows = Vectors().draw(200)
    rows[7] = 0.0
    codes, scales = turn_index.quantize(rows)
    assert codes.dtype == np.int8 and scales.dtype == np.float32
    assert np.abs(codes).max() == 127  # each row's largest value maps to ±127
    error = np.abs(codes * scales[:, None] - rows)
    assert (error <= scales[:, None] / 2 + 1e-7).all()
    assert not codes[7].any() and np.isfinite(scales).all()


needs_simsimd = pytest.mark.skipif(
    not turn_index.quantized_available(), reason="simsimd is a dependency"
)


def _int8_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every int8 product the quantized scan asks simsimd for from now on."""
    calls: list[int] = []
    cdist = turn_index.simsimd.cdist

    def spy(a: Any, b: Any, **kw: Any) -> Any:
        calls.append(len(a))  # (the rows first: each read once for every query)
        return cdist(a, b, **kw)

    monkeypatch.setattr(turn_index.simsimd, "cdist", spy)
    return calls


def _pair(vectors: Vectors, count: int, later: int) -> tuple[SessionVectors, SessionVectors]:
    """The same rows twice (``count`` as the base, ``later`` appended to the buffer): one
    entry to scan in float32, one to code."""
    rows, more = vectors.draw(count), vectors.draw(later)
    entries = SessionVectors(), SessionVectors()
    for entry in entries:
        entry.append(list(range(1, count + 1)), rows)
        entry.append(list(range(count + 1, count + later + 1)), more)
    return entries


@needs_simsimd
@pytest.mark.parametrize("split", [False, True])
def test_the_quantized_scan_answers_as_the_exact_scan_with_its_float32_scores(
    split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if split:  # the int8 pass cut between two threads, as from 32,768 rows
        monkeypatch.setattr(turn_index, "_SPLIT_ROWS", 1000)
    threads = 2 if split else 1
    vectors = Vectors(seed=11)
    exact, coded = _pair(vectors, N, 300)
    assert coded.code(N + 100) == N + 100  # base and buffer rows; the last 200 not coded
    assert coded.coded == N + 100 and coded.nbytes == exact.nbytes + (N + 100) * (DIM + 4)
    # The queries: drawn ones, and the rows on each side of the base/buffer boundary and the
    # coded/uncoded one (each the best match for itself).
    edges = [N - 1, N, N + 99, N + 100]
    queries = np.vstack([vectors.draw(30), *(exact.rows(i, i + 1) for i in edges)])
    calls = _int8_calls(monkeypatch)
    want, _ = exact.search(queries, LIMIT, 0, ann=False, threads=threads)
    assert not calls  # (the float32 entry has no copy)
    got, _ = coded.search(queries, LIMIT, 0, ann=False, threads=threads)
    assert sum(calls) == N + 100 and len(calls) == (2 if split else 1)
    # The same turns in the same order, with the float32 scores bit for bit: the int8 scores
    # only pick the 2 x LIMIT candidates.
    assert got == want
    for hits, i in zip(got[-len(edges) :], edges, strict=True):
        assert hits[0][0] == i + 1
    assert coded.search(queries[:0], LIMIT, 0, ann=False) == ([], False)


@needs_simsimd
def test_a_copy_extended_and_reallocated_in_steps_answers_as_the_exact_scan() -> None:
    vectors = Vectors(seed=3)
    exact, coded = _pair(vectors, 1000, 0)
    queries = vectors.draw(12)
    for step in range(6):
        rows = vectors.draw(700)
        seqs = list(range(len(exact) + 1, len(exact) + 701))
        exact.append(seqs, rows)
        coded.append(seqs, rows)
        coded.code(len(coded) - (0 if step % 2 else 100))  # some steps leave a tail
        assert coded.search(queries, LIMIT, 0, ann=False) == exact.search(
            queries, LIMIT, 0, ann=False
        )
    assert coded.coded == len(coded)  # (the last step coded every row)


@needs_simsimd
def test_a_scan_while_the_copy_grows_reads_whole_rows() -> None:
    vectors = Vectors(seed=5)
    rows = vectors.draw(12_000)
    entry = SessionVectors()
    entry.append(list(range(1, 2001)), rows[:2000])
    reference = SessionVectors()
    reference.append(list(range(1, 12_001)), rows)
    queries = vectors.draw(4)
    stop = threading.Event()
    errors: list[BaseException] = []

    def grow() -> None:  # the worker: rows land, the copy follows (and is reallocated)
        try:
            for start in range(2000, 12_000, 500):
                entry.append(list(range(start + 1, start + 501)), rows[start : start + 500])
                entry.code()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=grow)
    thread.start()
    while not stop.is_set():
        got, _ = entry.search(queries, LIMIT, 0, ann=False)
        for j, hits in enumerate(got):
            for seq, score in hits:  # every score is its row's own float32 cosine
                row = reference.rows(seq - 1, seq)[0]
                assert score == pytest.approx(float(row @ queries[j]), abs=1e-5)
    thread.join()
    assert not errors and entry.coded == 12_000
    assert entry.search(queries, LIMIT, 0, ann=False) == reference.search(
        queries, LIMIT, 0, ann=False
    )


@needs_simsimd
def test_the_worker_keeps_the_copy_and_the_cache_counts_it_within_its_limit() -> None:
    store = MemoryStore(counter=CharCounter())
    vectors = Vectors()
    fill(store, vectors, 1500)
    plain = recaller(store, vectors)
    quantized = recaller(store, vectors, quantize_min_turns=1000)
    top(quantized, "q 2")  # the first recall scans float32 and queues the copy
    quantized.settle()
    entry = quantized._vectors["s"]
    assert entry.coded == 1500 and quantized.vector_cache_bytes() == entry.nbytes
    for n in range(10):
        assert top(quantized, f"q {n}") == top(plain, f"q {n}")
    fill(store, vectors, 100)  # fewer than ``ann_tail``: scanned in float32 beside the copy
    assert top(quantized, "q 3") == top(plain, "q 3")
    quantized.settle()
    assert entry.coded == 1500
    # A copy the cache cannot hold beside the rows is not made: the rows stay cached.
    tight = recaller(store, vectors, quantize_min_turns=1000, vector_cache_bytes=plain_bytes(plain))
    top(tight, "q 2")
    tight.settle()
    assert tight._vectors["s"].coded == 0 and top(tight, "q 4") == top(plain, "q 4")
    below = recaller(store, vectors, quantize_min_turns=5000)  # below the threshold: none
    top(below, "q 2")
    below.settle()
    assert below._vectors["s"].coded == 0


@needs_simsimd
def test_a_copy_is_extended_only_when_its_new_room_fits_so_the_rows_stay_cached() -> None:
    """Extending the copy allocates room for a quarter more rows: a cache that holds the
    rows and the copy as it is, but not that room, keeps both and scans the new rows in
    float32 (it evicted the session's vectors, read back whole at the next recall)."""
    store = MemoryStore(counter=CharCounter())
    vectors = Vectors()
    fill(store, vectors, 4000)
    probe = recaller(store, vectors, quantize_min_turns=1000)
    top(probe, "q 1")
    probe.settle()
    # The next 600 rows and their copy, not the room a copy grown by a quarter takes (1,000).
    limit = probe._vectors["s"].nbytes + 600 * (DIM * 4 + 8) + 600 * (DIM + 4)
    r = recaller(store, vectors, quantize_min_turns=1000, vector_cache_bytes=limit)
    top(r, "q 1")
    r.settle()
    entry = r._vectors["s"]
    assert entry.coded == 4000
    fill(store, vectors, 600)
    read = reads(store)
    for n in range(3):
        top(r, f"q {n}")
        r.settle()
    assert r._vectors.get("s") is entry and 0 not in read  # never read again whole
    assert entry.coded == 4000 and r.vector_cache_bytes() <= limit
    assert top(r, "q 5") == top(recaller(store, vectors), "q 5")


@needs_simsimd
def test_the_copy_is_freed_once_the_index_answers() -> None:
    store = MemoryStore(counter=CharCounter())
    vectors = Vectors()
    fill(store, vectors, 1500)
    r = recaller(store, vectors, quantize_min_turns=1000, ann_min_turns=2000)
    top(r, "q 1")
    r.settle()
    entry = r._vectors["s"]
    assert entry.coded == 1500
    fill(store, vectors, 1000)
    top(r, "q 1")
    r.settle()
    assert entry.coded == 0 and entry.indexed == 2500
    assert r.vector_cache_bytes() == entry.nbytes  # (the copy's bytes no longer counted)


def plain_bytes(r: Recaller) -> int:
    top(r, "q 0")
    return r.vector_cache_bytes() + 1000


def test_quantize_min_turns_is_validated_and_on_by_default() -> None:
    assert MemoryConfig().recall.quantize_min_turns == 10_000
    assert (
        MemoryConfig.model_validate(
            {"recall": {"quantize_min_turns": None}}
        ).recall.quantize_min_turns
        is None
    )
    with pytest.raises(ValidationError, match="quantize_min_turns"):
        MemoryConfig.model_validate({"recall": {"quantize_min_turns": 10}})


# -- the int8 copy in the files -----------------------------------------------------------------


def _coded_store(
    tmp_path: Path, count: int = 1500
) -> tuple[Path, Vectors, list[tuple[int, float]]]:
    """A file store of ``count`` vectors whose recaller made the int8 copy and wrote it to the
    files at ``close``; the exact top of ``"q 2"`` for reference."""
    path = tmp_path / "m.db"
    vectors = Vectors()
    store = MemoryStore(path, counter=CharCounter())
    fill(store, vectors, count)
    r = recaller(store, vectors, quantize_min_turns=1000, vector_dir=f"{path}.vectors")
    top(r, "q 1")
    r.settle()
    assert r._vectors["s"].coded == count
    r.close()
    exact = top(recaller(MemoryStore(path, counter=CharCounter()), vectors), "q 2")
    return path, vectors, exact


def _opened(path: Path, vectors: Vectors) -> Recaller:
    return recaller(
        MemoryStore(path, counter=CharCounter()),
        vectors,
        quantize_min_turns=1000,
        vector_dir=f"{path}.vectors",
    )


@needs_simsimd
def test_a_restart_maps_the_int8_copy_and_scans_it_from_the_first_recall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, vectors, exact = _coded_store(tmp_path)
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    assert json.loads(meta.read_text(encoding="utf-8"))["coded"] == 1500
    calls = _int8_calls(monkeypatch)
    again = _opened(path, vectors)
    assert top(again, "q 2") == exact  # the first recall, before the worker did anything
    entry = again._vectors["s"]
    assert calls == [1500] and entry.coded == 1500 and not entry._codes.flags.writeable
    # Rows stored after the restart: scanned in float32 beside the mapped copy, then coded
    # into a copy in memory (the mapped one is read-only), and that copy written at close.
    fill(again.store, vectors, 600)  # type: ignore[arg-type]
    plain = recaller(MemoryStore(path, counter=CharCounter()), vectors)
    assert top(again, "q 3") == top(plain, "q 3")
    again.settle()
    assert entry.coded == 2100 and entry._codes.flags.writeable
    assert top(again, "q 4") == top(plain, "q 4")
    again.close()
    assert json.loads(meta.read_text(encoding="utf-8"))["coded"] == 2100
    calls.clear()
    third = _opened(path, vectors)
    assert top(third, "q 4") == top(plain, "q 4") and third._vectors["s"].coded == 2100
    assert calls == [2100]


def _embedded_only(tmp_path: Path, turns: int) -> tuple[Path, Recaller]:
    """A file store whose session of ``turns`` turns was embedded (``ensure_vectors``, as a
    bulk ingest's derives do) and never recalled, by a recaller closed at once."""
    path = tmp_path / "m.db"
    store = MemoryStore(path, counter=CharCounter())
    store.create_session("s")
    texts = [f"kiln firing {i} at the studio" for i in range(turns)]
    store.append_turns("s", [Message(role="user", content=t) for t in texts])
    r = Recaller(
        store,
        embedder=HashEmbedder(dim=16),
        fts_limit=LIMIT,
        quantize_min_turns=1000,
        vector_dir=f"{path}.vectors",
    )
    assert r.ensure_vectors("s") == turns and not r._vectors  # nothing cached
    return path, r


@needs_simsimd
def test_a_session_embedded_and_never_recalled_has_its_files_written_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Close writes the files of a session this process embedded and no recall cached, with
    the int8 copy a recall would scan: a restart maps them, reads only the rows stored since
    (none), and scans the copy from its first recall, as a reader of the store alone would
    rank."""
    path, first = _embedded_only(tmp_path, 1200)
    first.close()
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    saved = json.loads(meta.read_text(encoding="utf-8"))
    assert (saved["rows"], saved["coded"]) == (1200, 1200)
    store = MemoryStore(path, counter=CharCounter())
    calls = reads(store)
    int8 = _int8_calls(monkeypatch)
    again = Recaller(
        store, embedder=HashEmbedder(dim=16), fts_limit=LIMIT, quantize_min_turns=1000,
        vector_dir=f"{path}.vectors",
    )  # fmt: skip
    got = again._dense("s", ["kiln firing 7"], LIMIT)[0]
    # mapped (the store read only for the files' last rows, their check), the copy scanned
    assert calls and min(calls) >= 1200 - 8 and int8 == [1200]
    plain = Recaller(MemoryStore(path, counter=CharCounter()), embedder=HashEmbedder(dim=16))
    want = plain._dense("s", ["kiln firing 7"], LIMIT)[0]
    assert [seq for seq, _ in got] == [seq for seq, _ in want]
    assert np.allclose([v for _, v in got], [v for _, v in want])
    again.close()
    plain.close()


def test_close_brings_a_recalled_sessions_lagging_files_up_to_the_store(tmp_path: Path) -> None:
    """Recalled at 1,200 turns (its files written then), then 600 more embedded and never
    recalled: close writes them too, the int8 copy with them."""
    path, r = _embedded_only(tmp_path, 1200)
    r._dense("s", ["kiln firing 7"], LIMIT)
    r.settle()  # the worker's job: the files at 1,200 rows, coded
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    assert (json.loads(meta.read_text(encoding="utf-8"))["rows"]) == 1200
    more = [f"glaze test {i} in the kiln" for i in range(600)]
    r.store.append_turns("s", [Message(role="user", content=t) for t in more])
    assert r.ensure_vectors("s") == 600
    assert r.ensure_vectors("s") == 0  # (nothing more: nothing recorded either)
    r.close()
    saved = json.loads(meta.read_text(encoding="utf-8"))
    assert (saved["rows"], saved["coded"]) == (1800, 1800)


def test_close_writes_no_files_below_files_min_turns_nor_for_a_deleted_session(
    tmp_path: Path,
) -> None:
    path, small = _embedded_only(tmp_path, 300)  # under ``files_min_turns`` (1,000)
    small.close()
    assert not list(Path(f"{path}.vectors").glob("*.json"))
    other = tmp_path / "other"
    other.mkdir()
    path, gone = _embedded_only(other, 1200)
    gone.store.delete_session("s")  # after its vectors were embedded: nothing to write
    gone.close()
    assert not list(Path(f"{path}.vectors").glob("*.json"))


def test_ensure_vectors_records_only_sessions_it_embedded(tmp_path: Path) -> None:
    _, r = _embedded_only(tmp_path, 20)
    assert r._embedded == {"s"}
    r._embedded.clear()
    assert r.ensure_vectors("s") == 0 and r._embedded == set()
    r.close()


def _flip_a_code(path: Path) -> None:
    (codes,) = Path(f"{path}.vectors").glob("*.i8")
    data = bytearray(codes.read_bytes())
    data[-3] = (data[-3] + 1) % 256
    codes.write_bytes(bytes(data))


def _cut_the_scales(path: Path) -> None:
    (scales,) = Path(f"{path}.vectors").glob("*.scales")
    with scales.open("r+b") as handle:
        handle.truncate(scales.stat().st_size - 4)


@needs_simsimd
@pytest.mark.parametrize("damage", [_flip_a_code, _cut_the_scales])
def test_a_damaged_int8_copy_is_never_scanned_and_is_made_and_written_again(
    tmp_path: Path, damage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, vectors, exact = _coded_store(tmp_path)
    damage(path)
    calls = reads(store := MemoryStore(path, counter=CharCounter()))
    again = recaller(store, vectors, quantize_min_turns=1000, vector_dir=f"{path}.vectors")
    int8 = _int8_calls(monkeypatch)
    assert top(again, "q 2") == exact
    # Not trusted: the rows answered (the worker may be making the copy again already, so
    # the entry's ``coded`` is no witness; no int8 product was asked for is).
    assert int8 == []
    assert calls == [1500 - 8]  # the rows themselves were mapped, not read again
    again.settle()
    assert again._vectors["s"].coded == 1500
    again.close()  # the copy written again, whole
    third = _opened(path, vectors)
    assert top(third, "q 2") == exact and third._vectors["s"].coded == 1500


@needs_simsimd
@pytest.mark.parametrize(
    "reason", ["off", "below the threshold", "no room in the cache", "the index answers"]
)
def test_a_copy_in_the_files_is_mapped_only_where_the_worker_would_keep_one(
    tmp_path: Path, reason: str
) -> None:
    """``quantize_min_turns`` off or above the session, or a cache with room for the rows
    but not the copy: the rows are mapped and cached, the copy is not scanned, and the next
    recall reads nothing again (before, the whole entry was left uncached and every recall
    mapped the files and read the store again)."""
    path, vectors, exact = _coded_store(tmp_path)
    settings: dict[str, Any] = {"quantize_min_turns": 1000}
    if reason == "off":
        settings = {}
    elif reason == "below the threshold":
        settings = {"quantize_min_turns": 10_000}
    elif reason == "the index answers":
        if not turn_index.ann_available():
            pytest.skip("usearch is a dependency")
        settings["ann_min_turns"] = 1000
    else:
        rows = 1500 * DIM * 4 + 1500 * 8
        settings["vector_cache_bytes"] = rows + 1500 * (DIM + 4) // 2
    store = MemoryStore(path, counter=CharCounter())
    calls = reads(store)
    r = recaller(store, vectors, vector_dir=f"{path}.vectors", **settings)
    assert top(r, "q 2") == exact
    assert "s" in r._vectors and r._vectors["s"].coded == 0
    assert top(r, "q 3")[0][1] > 0 and calls == [1500 - 8, 1500]  # then only rows after 1500


@needs_simsimd
def test_rows_appended_while_the_files_are_written_are_left_for_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall appends to the entry while the worker writes its files: the rows, the seqs
    and the JSON all count the rows the write began with, and the files load whole."""
    path = tmp_path / "m.db"
    vectors = Vectors()
    store = MemoryStore(path, counter=CharCounter())
    fill(store, vectors, 1500)
    r = recaller(store, vectors, quantize_min_turns=1000, vector_dir=f"{path}.vectors")
    top(r, "q 1")
    r.settle()
    entry = r._vectors["s"]
    fill(store, vectors, 2)
    files = r.files
    assert files is not None
    real = files._holds
    appended: list[bool] = []

    def racing(paths: Any, rows: int, dim: int, **kw: Any) -> bool:
        if not appended:  # after the write took its count, before it slices the rows
            appended.append(True)
            entry.append([1501, 1502], np.stack([vectors.rows[1501], vectors.rows[1502]]))
        return real(paths, rows, dim, **kw)

    monkeypatch.setattr(files, "_holds", racing)
    files.save_rows("s", vectors.name, entry)
    assert appended
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    (f32,) = Path(f"{path}.vectors").glob("*.f32")
    saved = json.loads(meta.read_text(encoding="utf-8"))
    assert saved["rows"] == 1500 == f32.stat().st_size // (4 * DIM) and entry.saved_rows == 1500
    monkeypatch.setattr(files, "_holds", real)
    calls = reads(store := MemoryStore(path, counter=CharCounter()))
    again = recaller(store, vectors, quantize_min_turns=1000, vector_dir=f"{path}.vectors")
    assert top(again, "row 1502")[0][0] == 1502 and calls == [1500 - 8]
    assert again._vectors["s"].coded == 1500


@needs_simsimd
def test_a_process_behind_the_files_adds_its_int8_copy_of_their_rows(tmp_path: Path) -> None:
    """Another process wrote 1,600 rows and no copy; this one, at 1,500 rows with its copy
    made, writes that copy for the rows the files hold, and a restart maps it."""
    path = tmp_path / "m.db"
    vectors = Vectors()
    store = MemoryStore(path, counter=CharCounter())
    fill(store, vectors, 1500)
    ahead = recaller(store, vectors, vector_dir=f"{path}.vectors")  # quantizes nothing
    behind = recaller(store, vectors, quantize_min_turns=1000, vector_dir=f"{path}.vectors")
    top(behind, "q 1")
    behind.settle()
    entry = behind._vectors["s"]
    assert entry.coded == 1500
    fill(store, vectors, 100)
    top(ahead, "q 1")
    ahead.close()  # the files: 1,600 rows, no copy
    (meta,) = Path(f"{path}.vectors").glob("*.json")
    meta.write_text(meta.read_text(encoding="utf-8").replace('"coded": 1500', '"coded": 0'))
    saved = json.loads(meta.read_text(encoding="utf-8"))
    assert (saved["rows"], saved["coded"]) == (1600, 0)
    entry.saved_coded = 0
    assert behind.files is not None
    behind.files.save_rows("s", vectors.name, entry)
    saved = json.loads(meta.read_text(encoding="utf-8"))
    assert (saved["rows"], saved["coded"]) == (1600, 1500) and entry.saved_coded == 1500
    again = _opened(path, vectors)
    plain = recaller(MemoryStore(path, counter=CharCounter()), vectors)
    assert top(again, "q 3") == top(plain, "q 3") and again._vectors["s"].coded == 1500
