"""DocumentIndex shared between threads, and one index file saved by several processes or
instances at once: nothing is lost, no search or save fails, a reader never sees a half-swapped
BM25 folder."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contextfold.retrieval.index import DocumentIndex
from contextfold.testing import HashEmbedder


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads far more often than the default 5 ms, so the interleavings a race
    needs happen within a short test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _run_together(workers: list[Callable[[], None]], readers: list[Callable[[], None]]) -> None:
    """Start every thread at once (a barrier); readers loop until the writers are done."""
    barrier = threading.Barrier(len(workers) + len(readers))
    done = threading.Event()

    def write(fn: Callable[[], None]) -> None:
        barrier.wait()
        fn()

    def read(fn: Callable[[], None]) -> None:
        barrier.wait()
        while not done.is_set():
            fn()

    writers = [threading.Thread(target=write, args=(fn,)) for fn in workers]
    reading = [threading.Thread(target=read, args=(fn,)) for fn in readers]
    for thread in writers + reading:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    for thread in reading:
        thread.join()


@pytest.mark.parametrize("embedder", [False, HashEmbedder()], ids=["bm25-only", "hybrid"])
@pytest.mark.usefixtures("busy_switching")
def test_threads_adding_removing_and_searching_leave_every_document_findable(
    embedder: HashEmbedder | bool,
) -> None:
    for _trial in range(3):
        index = DocumentIndex(embedder=embedder, relevance_floor=False)  # type: ignore[arg-type]
        for i in range(30):
            index.add_document(f"seed document {i} about refunds number{i}", doc_id=f"seed{i}")
        errors: list[str] = []

        def writer(t: int, index: DocumentIndex = index, errors: list[str] = errors) -> None:
            try:
                for i in range(40):
                    index.add_document(
                        f"writer {t} doc {i} refunds term{t}x{i}", doc_id=f"w{t}-{i}"
                    )
                    if i % 2:
                        assert index.remove_document(f"w{t}-{i - 1}")
            except Exception as exc:  # every failure is the finding
                errors.append(repr(exc))

        def reader(index: DocumentIndex = index, errors: list[str] = errors) -> None:
            try:
                mode = "bm25" if embedder is False else "hybrid"
                index.search("refunds", k=20, mode=mode)
                index.search_documents("refunds", k=20, mode=mode)
            except Exception as exc:
                errors.append(repr(exc))

        _run_together([lambda t=t: writer(t) for t in range(3)], [reader] * 3)

        assert errors == []
        expected = {f"seed{i}" for i in range(30)} | {
            f"w{t}-{i}" for t in range(3) for i in range(1, 40, 2)
        }
        assert len(index) == len(expected)
        found = {h.metadata["doc_id"] for h in index.search("refunds", k=10_000, mode="bm25")}
        assert found == expected
        if embedder is not False:
            dense = {h.metadata["doc_id"] for h in index.search("refunds", k=10_000, mode="dense")}
            assert dense == expected


def test_a_hit_whose_document_went_meanwhile_is_skipped() -> None:
    """A chunk the BM25 index ranked but the store no longer holds (removed by another writer
    between ranking and reading the rows) is left out, never a KeyError."""
    index = DocumentIndex(embedder=False, relevance_floor=False)
    index.add_document("refunds take fourteen days", doc_id="kept")
    index.add_document("refunds need a receipt", doc_id="gone")
    ranked = index._bm25  # what a search that started before the removal ranks with
    index.store.remove("gone")  # the store moves on; the in-memory index has not yet
    index._ensure_loaded = lambda: None  # type: ignore[method-assign]
    assert index._bm25 is ranked
    assert [h.metadata["doc_id"] for h in index.search("refunds", mode="bm25")] == ["kept"]
    assert [d for d, _ in index.search_documents("refunds", mode="bm25")] == ["kept"]


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from contextfold.retrieval.index import DocumentIndex

    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    index = DocumentIndex(path, embedder=False, relevance_floor=False)
    errors = []
    # A barrier across processes: both start adding at once, not one after the other.
    Path(path + f".ready-{tag}").touch()
    go = Path(path + ".go")
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    for i in range(count):
        try:
            index.add_document(f"{tag} doc {i} about refunds", doc_id=f"{tag}{i}")
            index.save()
            index.search("refunds", k=5, mode="bm25")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    print("ERRORS", len(errors), errors[:3])
    sys.exit(1 if errors else 0)
    """
)


def _check_all_stored_and_found(path: Path, expected: set[str]) -> None:
    fresh = DocumentIndex(path, embedder=False, relevance_floor=False)
    assert {d.id for d in fresh.store.documents()} == expected
    found = {h.metadata["doc_id"] for h in fresh.search("refunds", k=10_000, mode="bm25")}
    assert found == expected


def test_two_processes_adding_and_saving_one_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "docs.db"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    count = 40
    children = [
        subprocess.Popen(
            [sys.executable, str(script), str(path), tag, str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for tag in "AB"
    ]
    ready = [tmp_path / f"docs.db.ready-{tag}" for tag in "AB"]
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in ready) and time.monotonic() < deadline:
        time.sleep(0.005)
    (tmp_path / "docs.db.go").touch()
    outputs = [child.communicate(timeout=300)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    expected = {f"{tag}{i}" for tag in "AB" for i in range(count)}
    _check_all_stored_and_found(path, expected)
    # Only the current saved version is kept, inside the one folder next to the database.
    saved = sorted(p.name for p in tmp_path.iterdir() if "bm25" in p.name)
    assert saved == ["docs.db.bm25"]
    # The last save is of the final corpus, and a fresh index loads it instead of re-indexing.
    versions = [p.name for p in (tmp_path / "docs.db.bm25").iterdir() if p.is_dir()]
    assert len(versions) == 1
    fresh = DocumentIndex(path, embedder=False, relevance_floor=False)
    assert len(fresh.search("refunds", k=10_000, mode="bm25")) == len(expected)
    assert not fresh._bm25.has_texts  # memory-mapped from the saved folder


@pytest.mark.usefixtures("busy_switching")
def test_two_instances_in_one_process_saving_one_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "docs.db"
    first = DocumentIndex(path, embedder=False, relevance_floor=False)
    second = DocumentIndex(path, embedder=False, relevance_floor=False)
    errors: list[str] = []

    def work(index: DocumentIndex, tag: str) -> None:
        for i in range(25):
            try:
                index.add_document(f"{tag} doc {i} refunds", doc_id=f"{tag}{i}")
                index.save()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    _run_together([lambda: work(first, "A"), lambda: work(second, "B")], [])
    assert errors == []
    _check_all_stored_and_found(path, {f"{tag}{i}" for tag in "AB" for i in range(25)})


def test_a_saved_folder_that_vanished_or_does_not_match_is_rebuilt_from_the_store(
    tmp_path: Path,
) -> None:
    """The store is the source of truth: a saved BM25 index that cannot be read, or whose ids
    are not the store's, makes the index rebuild from the store instead of failing."""
    path = tmp_path / "docs.db"
    index = DocumentIndex(path, embedder=False, relevance_floor=False)
    index.add_document("refunds take fourteen days", doc_id="one")
    index.save()
    for saved in (tmp_path / "docs.db.bm25").rglob("*.npy"):
        saved.unlink()  # a folder half gone (another process's clean-up, a crash)
    reader = DocumentIndex(path, embedder=False, relevance_floor=False)
    assert [h.metadata["doc_id"] for h in reader.search("refunds", mode="bm25")] == ["one"]
    reader.add_document("refunds need a receipt", doc_id="two")
    assert {h.metadata["doc_id"] for h in reader.search("refunds", mode="bm25")} == {"one", "two"}


def test_searches_read_the_vector_index_side_by_side_and_a_write_waits_for_them() -> None:
    """Two readers hold the vector index's lock at once (dense searches of a shared index run
    side by side: they took turns behind one lock); a writer waits until both are done, and
    while it waits no new reader comes in (searches never starve a write)."""
    from contextfold.retrieval.index import _ReadWriteLock

    lock = _ReadWriteLock()
    first_in, release = threading.Event(), threading.Event()
    order: list[str] = []

    def reader(name: str, entered: threading.Event | None = None) -> None:
        with lock.reading():
            order.append(f"{name} in")
            if entered is not None:
                entered.set()
            release.wait(10)
            order.append(f"{name} out")

    a = threading.Thread(target=reader, args=("a", first_in))
    a.start()
    assert first_in.wait(10)
    second_in = threading.Event()
    b = threading.Thread(target=reader, args=("b", second_in))
    b.start()
    assert second_in.wait(10), "a second reader waited for the first"

    def writer() -> None:
        with lock.writing():
            order.append("writer")

    w = threading.Thread(target=writer)
    w.start()
    w.join(0.2)
    assert w.is_alive() and "writer" not in order  # readers inside: the write waits
    late = threading.Thread(target=lambda: reader("late"))
    late.start()
    late.join(0.2)
    assert "late in" not in order  # a writer waits: no new reader
    release.set()
    for t in (a, b, w, late):
        t.join(10)
    assert order.index("writer") > max(order.index("a out"), order.index("b out"))
    assert order.index("late in") > order.index("writer")
