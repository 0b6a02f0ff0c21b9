"""``contextfold ingest`` / ``search`` / ``ask`` keep tenants apart, name each source by its path
under the ingested folder, and replace a re-ingested file's earlier version (through typer's
``CliRunner``, BM25 only: no embedding model is loaded)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from typer.testing import CliRunner, Result

from contextfold.cli import app
from contextfold.retrieval.index import DocumentIndex

pytestmark = pytest.mark.integration


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def ingest(db: Path, *args: str) -> Result:
    result = invoke("ingest", *args, "--db", str(db), "--no-embed")
    assert result.exit_code == 0, result.output
    return result


def search(db: Path, query: str, *args: str) -> list[dict]:
    result = invoke("search", query, "--db", str(db), "--mode", "bm25", "--json", *args)
    assert result.exit_code == 0, result.output
    hits: list[dict] = json.loads(result.stdout)
    return hits


def ask_sources(db: Path, query: str, *args: str) -> list[dict]:
    result = invoke("ask", query, "--db", str(db), "--mode", "bm25", "--json", *args)
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["window"]["items"]
    return [i for i in items if i["source"] == "retrieval"]


@pytest.fixture
def two_tenants(tmp_path: Path) -> Path:
    """Two tenants whose policies share a file name: acme's at the top of its folder, globex's
    one folder down."""
    (tmp_path / "ta").mkdir()
    (tmp_path / "tb" / "x").mkdir(parents=True)
    (tmp_path / "ta" / "policy.txt").write_text("Acme hotel cap is EUR 999 per night.\n")
    (tmp_path / "tb" / "x" / "policy.txt").write_text("Globex hotel cap is EUR 111 per night.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(tmp_path / "ta"), "--tenant", "acme")
    ingest(db, str(tmp_path / "tb"), "--tenant", "globex")
    return db


def test_ask_answers_from_the_given_tenant_only(two_tenants: Path) -> None:
    for tenant, cap, other in [("acme", "999", "111"), ("globex", "111", "999")]:
        chunks = ask_sources(two_tenants, "hotel cap per night", "--tenant", tenant)
        text = " ".join(c["content"] for c in chunks)
        assert cap in text and other not in text, tenant
    both = ask_sources(two_tenants, "hotel cap", "--tenant", "acme", "--tenant", "globex")
    assert len(both) == 2  # repeatable, as for search


@pytest.mark.parametrize("command", ["search", "ask"])
def test_without_tenant_only_the_default_tenant_is_searched(
    two_tenants: Path, tmp_path: Path, command: str
) -> None:
    """No --tenant is the tenant ``ingest`` writes without one: never every tenant at once."""
    result = invoke(command, "hotel cap per night", "--db", str(two_tenants), "--mode", "bm25")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert "tenant 'default' holds no documents" in result.stderr
    assert "--tenant" in result.stderr
    assert "999" not in result.output and "111" not in result.output
    (tmp_path / "td").mkdir()
    (tmp_path / "td" / "policy.txt").write_text("Default hotel cap is EUR 555 per night.\n")
    ingest(two_tenants, str(tmp_path / "td"))
    again = invoke(command, "hotel cap per night", "--db", str(two_tenants), "--mode", "bm25")
    assert again.exit_code == 0, again.output
    assert "555" in again.stdout
    assert "999" not in again.stdout and "111" not in again.stdout


@pytest.mark.parametrize("command", ["search", "ask"])
def test_an_empty_tenant_name_is_an_error(two_tenants: Path, command: str) -> None:
    result = invoke(command, "hotel", "--db", str(two_tenants), "--tenant", "")
    assert result.exit_code == 2, result.output
    assert "--tenant" in result.stderr and "Traceback" not in result.output


def test_a_source_is_named_by_its_path_under_the_ingested_folder(two_tenants: Path) -> None:
    hits = search(two_tenants, "hotel cap", "--tenant", "acme", "--tenant", "globex")
    assert sorted(h["metadata"]["source"] for h in hits) == ["policy.txt", "x/policy.txt"]
    result = invoke(
        "ask",
        "hotel cap per night",
        "--db",
        str(two_tenants),
        "--mode",
        "bm25",
        "--tenant",
        "globex",
        "--show",
        "sources",
    )
    assert result.exit_code == 0, result.output
    assert "[Source 1] x/policy.txt chunk 1" in result.stdout
    assert "│ x/policy.txt" in result.stdout  # the sources table


def test_a_top_level_file_keeps_its_bare_name(tmp_path: Path) -> None:
    """A file at the top of the ingested folder, or given by itself, is named as before."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Alpha refunds take 14 days.\n")
    (tmp_path / "b.txt").write_text("Beta refunds take 30 days.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(tmp_path / "docs"), str(tmp_path / "b.txt"))
    hits = search(db, "refunds days")
    assert sorted(h["metadata"]["source"] for h in hits) == ["a.txt", "b.txt"]


def test_reingesting_an_edited_file_replaces_its_earlier_version(tmp_path: Path) -> None:
    folder = tmp_path / "upd"
    (folder / "sub").mkdir(parents=True)
    paris = folder / "paris.txt"
    paris.write_text("The hotel cap in Paris is EUR 180 per night.\n")
    (folder / "sub" / "paris.txt").write_text("Paris office opens at 9.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    paris.write_text("The hotel cap in Paris is EUR 250 per night.\n")
    result = ingest(db, str(folder))
    assert "ingested 1 new document(s)" in result.stdout
    assert "replaced 1 earlier version(s)" in result.stdout
    assert "corpus: 2 documents" in result.stdout  # the other paris.txt is kept
    texts = [h["text"] for h in search(db, "hotel cap Paris")]
    assert any("250" in t for t in texts) and not any("180" in t for t in texts)
    with sqlite3.connect(db) as conn:  # the old chunks and vectors went with it
        chunks = [r[0] for r in conn.execute("SELECT text FROM chunks")]
        orphans = conn.execute(
            "SELECT COUNT(*) FROM chunk_vectors WHERE chunk_id NOT IN (SELECT id FROM chunks)"
        ).fetchone()[0]
    assert not any("180" in c for c in chunks) and orphans == 0


def test_reingesting_an_unchanged_folder_is_a_no_op(tmp_path: Path) -> None:
    folder = tmp_path / "same"
    folder.mkdir()
    (folder / "rules.jsonl").write_text('{"text": "Rule one."}\n{"text": "Rule two."}\n')
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    version = DocumentIndex(db, embedder=False).store.version
    again = ingest(db, str(folder))
    assert "ingested 0 new document(s) (0 chunks), skipped 2 already stored" in again.stdout
    assert "replaced" not in again.stdout
    assert DocumentIndex(db, embedder=False).store.version == version


def test_a_file_with_many_documents_keeps_the_unchanged_ones(tmp_path: Path) -> None:
    folder = tmp_path / "faq"
    folder.mkdir()
    faq = folder / "faq.jsonl"
    faq.write_text('{"text": "Taxis are fine at night."}\n{"text": "Meals cap EUR 40."}\n')
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    faq.write_text('{"text": "Taxis are fine at night."}\n{"text": "Meals cap EUR 55."}\n')
    result = ingest(db, str(folder))
    assert "ingested 1 new document(s)" in result.stdout
    assert "skipped 1 already stored" in result.stdout
    assert "replaced 1 earlier version(s)" in result.stdout
    texts = sorted(h["text"] for h in search(db, "taxis meals cap night", "-k", "10"))
    assert texts == ["Meals cap EUR 55.", "Taxis are fine at night."]


def test_text_another_file_shares_survives_the_first_file_changing(tmp_path: Path) -> None:
    """The same text in two files is stored once; when the first file changes, in the same
    run or a later one given only that file, the text stays: the other file still holds it."""
    folder = tmp_path / "dup"
    folder.mkdir()
    (folder / "b.txt").write_text("Shared text about visas.\n")
    (folder / "c.txt").write_text("Shared text about visas.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    (folder / "b.txt").write_text("Visa fees are reimbursed.\n")
    ingest(db, str(folder))
    texts = sorted(h["text"] for h in search(db, "shared visas text fees", "-k", "10"))
    assert texts == ["Shared text about visas.", "Visa fees are reimbursed."]
    (folder / "c.txt").write_text("Visas take ten days.\n")  # now no file holds it
    ingest(db, str(folder))
    texts = sorted(h["text"] for h in search(db, "shared visas text fees days", "-k", "10"))
    assert texts == ["Visa fees are reimbursed.", "Visas take ten days."]


def test_a_file_changed_alone_keeps_the_text_another_file_holds(tmp_path: Path) -> None:
    """A cold review's case: a.txt and b.txt hold one text; a.txt is edited and ingested by
    itself in a later run. b.txt's text (never a document of its own) must stay."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("The refund window is thirty days.\n")
    (folder / "b.txt").write_text("The refund window is thirty days.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    (folder / "a.txt").write_text("The refund window is sixty days now.\n")
    ingest(db, str(folder / "a.txt"))
    texts = sorted(h["text"] for h in search(db, "refund window days", "-k", "10"))
    assert texts == ["The refund window is sixty days now.", "The refund window is thirty days."]


def test_replacement_is_one_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while the old version is removed rolls the new one back too: never both,
    never neither."""
    folder = tmp_path / "tx"
    folder.mkdir()
    doc = folder / "paris.txt"
    doc.write_text("The hotel cap in Paris is EUR 180 per night.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    doc.write_text("The hotel cap in Paris is EUR 250 per night.\n")

    def broken(self: DocumentIndex, doc_id: str) -> bool:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(DocumentIndex, "remove_document", broken)
    result = invoke("ingest", str(folder), "--db", str(db), "--no-embed")
    assert result.exit_code != 0
    monkeypatch.undo()
    texts = [h["text"] for h in search(db, "hotel cap Paris")]
    assert texts == ["The hotel cap in Paris is EUR 180 per night."]


def test_the_same_file_given_another_way_is_still_the_same_file(tmp_path: Path) -> None:
    folder = tmp_path / "upd"
    folder.mkdir()
    paris = folder / "paris.txt"
    paris.write_text("The hotel cap in Paris is EUR 180 per night.\n")
    db = tmp_path / "docs.db"
    ingest(db, str(folder))
    paris.write_text("The hotel cap in Paris is EUR 250 per night.\n")
    result = ingest(db, str(paris))
    assert "replaced 1 earlier version(s); corpus: 1 documents" in result.stdout
    [hit] = search(db, "hotel cap Paris")
    assert hit["metadata"]["ingested_from"] == str(paris.resolve())


def test_documents_stored_before_paths_were_kept_are_left_alone(tmp_path: Path) -> None:
    """A corpus written before paths were kept names a source by its bare name only, which
    several folders' files may share (x/policy.txt, y/policy.txt): nothing tells which file
    stored it, so a changed file adds its new version and removes none of them."""
    db = tmp_path / "docs.db"
    old = DocumentIndex(db, embedder=False)
    for text in ("Parking at X is EUR 5.", "Parking at Y is free."):
        old.add_documents([(text, {"source": "policy.txt", "format": "txt"})], source="policy.txt")
    old.save()
    old.store.close()
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "policy.txt").write_text("Parking at X is EUR 7.")
    result = ingest(db, str(tmp_path / "x" / "policy.txt"))
    assert "replaced" not in result.stdout
    texts = sorted(h["text"] for h in search(db, "parking free EUR", "-k", "10"))
    assert texts == ["Parking at X is EUR 5.", "Parking at X is EUR 7.", "Parking at Y is free."]


def test_ingest_embeds_outside_the_write_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's chunks are embedded before its transaction opens: another writer of the same
    corpus (a second ingest, a server) is not locked out while a large file embeds (with the
    write lock held, one of a few thousand chunks kept it for minutes, past SQLite's 5 s busy
    timeout: "database is locked")."""
    from contextfold.cli import corpus

    db = tmp_path / "docs.db"
    DocumentIndex(db, embedder=False).store.close()  # the schema, before the probe looks
    locked: list[bool] = []

    class ProbingEmbedder:
        """Tries to take the database's write lock (not waiting) while it embeds."""

        name = "probe"
        dim = 4

        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            other = sqlite3.connect(db, timeout=0, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
                locked.append(False)
            except sqlite3.OperationalError:
                locked.append(True)
            finally:
                other.close()
            return np.ones((len(texts), self.dim), dtype=np.float32) / 2

    monkeypatch.setattr(
        corpus, "open_index", lambda db, **_: DocumentIndex(db, embedder=ProbingEmbedder())
    )
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "a.txt").write_text("Hotels in Paris cost EUR 180. " * 300)
    (folder / "b.txt").write_text("Taxis in Rome need receipts. " * 20)
    result = invoke("ingest", str(folder), "--db", str(db))
    assert result.exit_code == 0, result.output
    assert locked and not any(locked), f"write lock held while embedding: {locked}"
    (folder / "b.txt").write_text("Taxis in Rome need receipts now. " * 20)
    result = invoke("ingest", str(folder), "--db", str(db))  # a replacement too
    assert result.exit_code == 0, result.output
    assert not any(locked), f"write lock held while embedding: {locked}"
    assert [h["text"][:30] for h in search(db, "taxis Rome receipts", "-k", "1")] == [
        "Taxis in Rome need receipts no"
    ]
