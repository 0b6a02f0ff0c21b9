"""A saved BM25 folder (``<db>.bm25/``) belongs to one document database: a database deleted
and created again on the same path (its version starting again at 0) never loads the old
corpus's BM25 index, and its saves replace it. Each document store has a random corpus id,
kept across reopening and different for every database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextfold.retrieval.index import DocumentIndex
from contextfold.store import open_document_store


def _open(path: Path) -> DocumentIndex:
    return DocumentIndex(path, embedder=False, relevance_floor=False)


def _found(path: Path, query: str) -> set[str]:
    with _open(path) as index:
        return {h.metadata["doc_id"] for h in index.search(query, k=20, mode="bm25")}


def test_a_database_deleted_and_recreated_never_loads_the_old_corpus_bm25(
    tmp_path: Path,
) -> None:
    """The reviewer's repro: 5 docs saved; documents.db deleted (the .bm25 folder stays);
    5 other docs added with a save after each; reopened, a search finds the new docs."""
    path = tmp_path / "docs.db"
    with _open(path) as old:
        for i in range(5):
            old.add_document(f"old corpus apples number {i}", doc_id=f"old{i}")
        old.save()
    assert _found(path, "apples") == {f"old{i}" for i in range(5)}
    path.unlink()  # start over: the database only
    for extra in ("-wal", "-shm"):
        path.with_name(path.name + extra).unlink(missing_ok=True)
    assert (tmp_path / "docs.db.bm25" / "CURRENT").exists()

    with _open(path) as new:
        for i in range(5):
            new.add_document(f"new corpus bananas number {i}", doc_id=f"new{i}")
            new.save()
            # every save of the new database replaces the old corpus's folder
            assert _found(path, "bananas") == {f"new{j}" for j in range(i + 1)}
    assert _found(path, "bananas") == {f"new{i}" for i in range(5)}
    assert _found(path, "apples") == set()
    store = open_document_store(path)
    try:
        corpus = store.corpus_id
    finally:
        store.close()
    current = json.loads((tmp_path / "docs.db.bm25" / "CURRENT").read_text(encoding="utf-8"))
    assert current["corpus"] == corpus and current["version"] == 5


def test_a_recreated_database_without_saves_reaching_the_old_version_rebuilds(
    tmp_path: Path,
) -> None:
    """The new database reaches the old saved version without saving: it is not loaded."""
    path = tmp_path / "docs.db"
    with _open(path) as old:
        for i in range(3):
            old.add_document(f"old corpus apples number {i}", doc_id=f"old{i}")
        old.save()
    path.unlink()
    with _open(path) as new:
        for i in range(3):
            new.add_document(f"new corpus bananas number {i}", doc_id=f"new{i}")
        assert new.version == 3
    assert _found(path, "bananas") == {f"new{i}" for i in range(3)}
    assert _found(path, "apples") == set()


def test_two_databases_saved_one_after_the_other_on_one_path(tmp_path: Path) -> None:
    """Database A saved at version 2, then database B on the same path saved at versions 1
    and 2, then A put back: each one finds its own documents, never the other's folder."""
    path = tmp_path / "docs.db"
    with _open(path) as a:
        a.add_document("alpha apples", doc_id="a1")
        a.add_document("alpha apples again", doc_id="a2")
        a.save()
    kept = tmp_path / "a.db"
    path.rename(kept)
    with _open(path) as b:
        b.add_document("beta bananas apples", doc_id="b1")
        b.save()  # version 1 < the saved 2, but another database: replaces it
        assert _saved_corpus(tmp_path) == b.store.corpus_id
        assert _found(path, "apples") == {"b1"}
        b.add_document("beta bananas apples too", doc_id="b2")
        b.save()
    assert _found(path, "apples") == {"b1", "b2"}
    path.rename(tmp_path / "b.db")
    kept.rename(path)
    assert _found(path, "apples") == {"a1", "a2"}  # B's folder, same version: not A's
    with _open(path) as a:
        a.save()
        assert _saved_corpus(tmp_path) == a.store.corpus_id
    assert _found(path, "apples") == {"a1", "a2"}


def _saved_corpus(tmp_path: Path) -> object:
    current = tmp_path / "docs.db.bm25" / "CURRENT"
    return json.loads(current.read_text(encoding="utf-8")).get("corpus")


def test_a_folder_saved_without_a_corpus_id_is_rebuilt_once(tmp_path: Path) -> None:
    """A folder of the versioned layout from before corpus ids does not match any database:
    the index rebuilds from the store, and its next save replaces it."""
    path = tmp_path / "docs.db"
    with _open(path) as index:
        index.add_document("refunds take fourteen days", doc_id="one")
        index.save()
    current = tmp_path / "docs.db.bm25" / "CURRENT"
    pointer = json.loads(current.read_text(encoding="utf-8"))
    del pointer["corpus"]
    current.write_text(json.dumps(pointer), encoding="utf-8")
    with _open(path) as index:
        assert index._load_saved(index.version) is None
        assert [h.metadata["doc_id"] for h in index.search("refunds", mode="bm25")] == ["one"]
        index.save()
        assert index._load_saved(index.version) is not None
    assert "corpus" in json.loads(current.read_text(encoding="utf-8"))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_document_database_has_its_own_corpus_id(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        first, second = str(tmp_path / "one.db"), str(tmp_path / "two.db")
    else:
        server = request.getfixturevalue("postgres_server")
        first, second = server.new_database(), server.new_database()
    one, two = open_document_store(first), open_document_store(second)
    again = open_document_store(first)
    try:
        corpus = one.corpus_id
        assert isinstance(corpus, str) and corpus
        assert corpus != two.corpus_id
        assert again.corpus_id == corpus
    finally:
        for store in (one, two, again):
            store.close()
    reopened = open_document_store(first)
    try:
        assert reopened.corpus_id == corpus
    finally:
        reopened.close()
    if backend == "sqlite":  # deleted and created again on the same path: another database
        Path(first).unlink()
        recreated = open_document_store(first)
        try:
            assert recreated.version == 0 and recreated.corpus_id != corpus
        finally:
            recreated.close()
