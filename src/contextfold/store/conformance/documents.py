"""The document store's contract (``DocumentStorage``), run unchanged on SQLite and
PostgreSQL: atomic writes, the shared corpus version, content addressing and aliases, tenant
scoping, filters, insertion order and exact vectors — and a ``DocumentIndex`` on either
noticing what another store object (another process) added or removed."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from contextfold.errors import ConfigError
from contextfold.retrieval.index import DocumentIndex
from contextfold.store.conformance.documents_support import Opener, chunks, doc
from contextfold.store.protocols import DocumentStorage


@pytest.fixture
def store(docs_opener: Opener) -> DocumentStorage:
    opened: DocumentStorage = docs_opener()
    return opened


def test_every_backend_implements_the_protocol(store: DocumentStorage) -> None:
    assert isinstance(store, DocumentStorage)
    assert store.version == 0 and store.count() == (0, 0)


def test_add_stores_document_chunks_and_vectors_and_bumps_version(store: DocumentStorage) -> None:
    record = doc("alpha beta. gamma delta.")
    store.add(
        record,
        chunks(record, ["alpha beta.", "gamma delta."]),
        np.eye(2, 3, dtype=np.float32),
        model="m",
    )
    assert store.count() == (1, 2)
    assert store.version == 1
    ids, matrix = store.vectors("m")
    assert ids == [c.id for c in chunks(record, ["alpha beta.", "gamma delta."])]
    assert matrix.dtype == np.float32 and matrix.shape == (2, 3)
    assert store.find("t1", record.content_hash) == record.id
    assert store.find("t2", record.content_hash) is None  # content addressing is per tenant


def test_a_failed_add_stores_nothing(docs_opener: Opener, store: DocumentStorage) -> None:
    record = doc("one. two.")
    chunk = chunks(record, ["one."])[0]
    with pytest.raises(docs_opener.integrity_error):
        store.add(record, [chunk, chunk])  # a duplicate chunk id fails half-way
    assert store.count() == (0, 0)
    assert store.version == 0
    assert store.documents() == [] and list(store.chunk_texts()) == []


def test_vectors_need_a_model_and_matching_rows(store: DocumentStorage) -> None:
    record = doc("x y")
    with pytest.raises(ConfigError, match=r"2 chunks of document \w+ need as many vectors"):
        store.add(record, chunks(record, ["x", "y"]), np.zeros((1, 3), np.float32), model="m")
    with pytest.raises(ConfigError, match="model"):
        store.add(record, chunks(record, ["x", "y"]), np.zeros((2, 3), np.float32))
    assert store.count() == (0, 0) and store.version == 0


def test_remove_cascades_to_chunks_and_vectors(store: DocumentStorage) -> None:
    record = doc("a b")
    parts = chunks(record, ["a", "b"])
    store.add(record, parts, np.ones((2, 2), np.float32), model="m")
    assert sorted(store.remove(record.id)) == sorted(c.id for c in parts)
    assert store.count() == (0, 0)
    assert store.vectors("m")[0] == []
    assert store.resolve(record.id) is None and store.find("t1", record.content_hash) is None


def test_matching_chunks_filters_by_tenant_and_metadata(store: DocumentStorage) -> None:
    d1 = doc("first", tenant="t1", region="eu", n=1, nested={"level": "deep"}, gone=None, ok=True)
    d2 = doc("second", tenant="t2", region="us", n=2.0, gone="doc")
    store.add(d1, chunks(d1, ["first"]))
    store.add(d2, chunks(d2, ["second"]))
    c1, c2 = chunks(d1, ["first"])[0].id, chunks(d2, ["second"])[0].id
    assert store.matching_chunks(tenants=["t1"]) == {c1}
    assert store.matching_chunks(tenants=[]) == set()
    assert store.matching_chunks() == {c1, c2}
    assert store.matching_chunks(filters={"region": "us"}) == {c2}
    assert store.matching_chunks(filters={"region": ["us", "eu"]}) == {c1, c2}
    assert store.matching_chunks(filters={"part": 0}, tenants=["t2"]) == {c2}  # chunk metadata
    assert store.matching_chunks(filters={"n": 2}) == {c2}  # numbers compare as numbers
    assert store.matching_chunks(filters={"n": "1"}) == set()  # a string is not a number
    assert store.matching_chunks(filters={"nested.level": "deep"}) == {c1}
    assert store.matching_chunks(filters={"gone": "doc"}) == {c2}
    assert store.matching_chunks(filters={"missing": "x"}) == set()
    assert store.matching_chunks(filters={"ok": True}) == {c1}
    with pytest.raises(ConfigError, match="plain names"):
        store.matching_chunks(filters={"x') OR 1=1 --": 1})


def test_chunks_join_document_metadata_under_chunk_metadata(store: DocumentStorage) -> None:
    record = doc("text", part="document-level", title="T")
    chunk = chunks(record, ["text"])[0]
    store.add(record, [chunk])
    row = store.chunks([chunk.id, "unknown"])[chunk.id]
    assert row == {
        "doc_id": record.id,
        "doc_ids": [record.id],
        "index": 0,
        "text": "text",
        "start": 0,
        "end": 4,
        "token_count": 1,
        "tenant": "t1",
        "source": None,
        "metadata": {"part": 0, "title": "T"},
    }
    assert store.chunks(["unknown"]) == {}


def test_reopening_keeps_everything(docs_opener: Opener, store: DocumentStorage) -> None:
    record = doc("persist me", kind="note", order=[3, 1, 2])
    store.add(record, chunks(record, ["persist me"]), np.full((1, 2), 0.5, np.float32), model="m")
    store.close()
    docs_opener.opened.remove(store)
    again: DocumentStorage = docs_opener()
    assert again.count() == (1, 1) and again.version == 1
    assert again.documents() == [record]
    assert list(again.documents()[0].metadata) == ["kind", "order"]  # key order as written
    assert again.vectors("m")[1].tolist() == [[0.5, 0.5]]


def test_add_many_is_one_all_or_nothing_transaction(
    docs_opener: Opener, store: DocumentStorage
) -> None:
    good, bad = doc("first"), doc("second")
    bad_chunk = chunks(bad, ["second"])[0]
    with pytest.raises(docs_opener.integrity_error):
        store.add_many([(good, chunks(good, ["first"]), None), (bad, [bad_chunk, bad_chunk], None)])
    assert store.count() == (0, 0) and store.version == 0
    store.add_many([(good, chunks(good, ["first"]), None), (bad, [bad_chunk], None)])
    assert store.count() == (2, 2) and store.version == 1


def test_atomic_commits_every_write_inside_together_or_none(
    docs_opener: Opener, store: DocumentStorage
) -> None:
    old, new = doc("old text"), doc("new text")
    store.add_many([(old, chunks(old, ["old text"]), None)])
    with pytest.raises(RuntimeError), store.atomic():  # a re-ingest interrupted half-way
        store.add_many([(new, chunks(new, ["new text"]), None)])
        assert store.find("t1", new.content_hash) == new.id  # reads see the writes
        store.remove(old.id)
        raise RuntimeError("interrupted")
    assert [d.id for d in store.documents()] == [old.id] and store.version == 1
    other: DocumentStorage = docs_opener()  # another process sees the commit, not before
    with store.atomic(), store.atomic():  # nested: joins the open transaction
        store.add_many([(new, chunks(new, ["new text"]), None)])
        store.remove(old.id)
        assert [d.id for d in other.documents()] == [old.id]
    assert [d.id for d in other.documents()] == [new.id] and other.version == 3


def test_aliases_name_one_document_and_it_goes_with_its_last_id(
    docs_opener: Opener, store: DocumentStorage
) -> None:
    record = doc("shared text", id="first")
    parts = chunks(record, ["shared", "text"])
    store.add_many([(record, parts, None)], aliases=[("second", "first")])
    store.add_many([], aliases=[("third", "first")])
    assert store.resolve("second") == "first" and store.resolve("nope") is None
    assert store.ids_of(["first", "unknown"]) == {"first": ["first", "second", "third"]}
    assert store.count() == (3, 2)
    assert [d.id for d in store.documents()] == ["first", "second", "third"]
    assert store.chunks([parts[0].id])[parts[0].id]["doc_ids"] == ["first", "second", "third"]
    with pytest.raises(docs_opener.integrity_error):  # an id names one document only
        store.add_many([], aliases=[("second", "first")])
    assert store.remove("first") == []  # the others still name it
    assert store.ids_of(["first"]) == {"first": ["second", "third"]}
    assert store.chunks([parts[0].id])[parts[0].id]["doc_id"] == "second"
    assert store.remove("second") == []
    assert sorted(store.remove("third")) == sorted(c.id for c in parts)
    assert store.count() == (0, 0)


def test_the_version_moves_on_every_write_and_every_object_sees_it(
    docs_opener: Opener, store: DocumentStorage
) -> None:
    other: DocumentStorage = docs_opener()  # another process's view of the same store
    record = doc("versioned")
    parts = chunks(record, ["versioned"])
    steps: list[Callable[[], object]] = [
        lambda: store.add(record, parts),
        lambda: store.add_many([], aliases=[("alias", record.id)]),
        lambda: store.add_vectors([parts[0].id], np.ones((1, 2), np.float32), "m"),
        lambda: store.remove("alias"),
        lambda: store.clear(),
    ]
    for n, step in enumerate(steps, 1):
        step()
        assert store.version == other.version == n
    store.count(), store.documents(), list(store.chunk_texts()), store.matching_chunks()
    assert other.version == len(steps)  # reads never move it


def test_the_corpus_id_is_the_databases_for_its_life(
    docs_opener: Opener, store: DocumentStorage
) -> None:
    """One random id per database: every store object on it reads it, writes (``clear``
    too) keep it, reopening keeps it; it is a version-independent identity (a database
    created again on the same location has another — the backends' own tests check that)."""
    corpus = store.corpus_id
    assert isinstance(corpus, str) and corpus
    other: DocumentStorage = docs_opener()
    assert other.corpus_id == corpus
    record = doc("identity")
    store.add(record, chunks(record, ["identity"]))
    store.clear()
    assert store.corpus_id == other.corpus_id == corpus
    for opened in (store, other):
        opened.close()
        docs_opener.opened.remove(opened)
    again: DocumentStorage = docs_opener()
    assert again.corpus_id == corpus and again.version == 2


def test_insertion_order_is_kept_and_a_re_stored_vector_moves_last(store: DocumentStorage) -> None:
    a, b = doc("zeta text", id="z"), doc("alpha text", id="a")
    pa, pb = chunks(a, ["zeta", "text"]), chunks(b, ["alpha"])
    store.add(a, pa)
    store.add(b, pb)
    order = [pa[0].id, pa[1].id, pb[0].id]
    assert [i for i, _ in store.chunk_texts()] == order
    assert [i for i, _ in store.chunks_without_vectors("m")] == order
    store.add_vectors(order, np.arange(6, dtype=np.float32).reshape(3, 2), "m")
    store.add_vectors([order[0]], np.array([[9.0, 9.5]], np.float32), "m")
    ids, matrix = store.vectors("m")
    assert ids == [order[1], order[2], order[0]]
    assert matrix.tolist() == [[2.0, 3.0], [4.0, 5.0], [9.0, 9.5]]
    assert store.chunks_without_vectors("m") == [] and store.vectors("other")[0] == []
    assert store.chunk_ids("z") == [pa[0].id, pa[1].id]


def test_documents_order_by_time_then_id_bytes_and_scope_by_tenant(
    store: DocumentStorage,
) -> None:
    records = [
        doc("lower", id="a", tenant="t1"),
        doc("upper", id="B", tenant="t2"),
        doc("later", id="0").model_copy(update={"created_at": "2026-02-01T00:00:00"}),
    ]
    for record in records:
        store.add(record, chunks(record, [record.text]))
    assert [d.id for d in store.documents()] == ["B", "a", "0"]  # "B" < "a" in byte order
    assert [d.id for d in store.documents("t2")] == ["B"]
    assert store.documents("nobody") == []


def test_vectors_round_trip_exactly(store: DocumentStorage) -> None:
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((5, 17)).astype(np.float32)
    matrix[0, 0] = np.float32(1e-38)
    record = doc("exact vectors")
    parts = chunks(record, [f"part {i}" for i in range(5)])
    store.add(record, parts, matrix, model="m")
    ids, back = store.vectors("m")
    assert ids == [c.id for c in parts]
    assert back.dtype == np.float32 and back.flags.writeable
    np.testing.assert_array_equal(back, matrix)


def test_concurrent_writers_each_bump_the_version_once(docs_opener: Opener) -> None:
    stores: list[DocumentStorage] = [docs_opener() for _ in range(4)]
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for k in range(5):
                record = doc(f"writer {n} document {k}")
                stores[n].add(record, chunks(record, [record.text]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert stores[0].version == 20 and stores[0].count() == (20, 20)


# -- the index on a shared store -----------------------------------------------------------


def test_an_index_notices_documents_another_index_added_and_removed(
    docs_opener: Opener,
) -> None:
    where = docs_opener.location
    writer = DocumentIndex(where, embedder=False, relevance_floor=False)
    reader = DocumentIndex(where, embedder=False, relevance_floor=False)
    try:
        writer.add_document("Refunds take fourteen days.", doc_id="refunds")
        assert [h.metadata["doc_id"] for h in reader.search("refunds", mode="bm25")] == ["refunds"]
        synced = reader.version
        writer.add_document("Hotel caps are two hundred euros.", doc_id="hotels")
        assert reader.version == synced + 1  # one cheap read tells the reader to rebuild
        assert [h.metadata["doc_id"] for h in reader.search("hotel caps", mode="bm25")] == [
            "hotels"
        ]
        assert writer.remove_document("refunds")
        assert reader.search("refunds", mode="bm25") == []
        assert len(reader) == 1
        # The reader's own write keeps it in sync; the writer notices it as well.
        reader.add_document("Parking is free on weekends.", doc_id="parking")
        assert [h.metadata["doc_id"] for h in writer.search("parking", mode="bm25")] == ["parking"]
    finally:
        writer.close()
        reader.close()


def test_an_index_rebuilds_when_another_writer_wrote_between_its_own_writes(
    docs_opener: Opener,
) -> None:
    where = docs_opener.location
    mine = DocumentIndex(where, embedder=False, relevance_floor=False)
    theirs: DocumentStorage = docs_opener()
    try:
        mine.add_document("Alpha policy text.", doc_id="alpha")
        record = doc("Gamma procedures apply.", tenant="default", id="gamma")
        theirs.add(record, chunks(record, [record.text]))
        mine.add_document("Beta policy text.", doc_id="beta")  # after theirs: not in sync
        found = {h.metadata["doc_id"] for h in mine.search("gamma procedures", mode="bm25")}
        assert found == {"gamma"}
    finally:
        mine.close()
