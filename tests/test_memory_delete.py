"""Deleting a session through the engine (what the CLI, the LangChain and LlamaIndex adapters
and the LoCoMo runner call) removes everything derived from it: its rows in the store and its
vector files beside a SQLite database, at once, not when an engine next closes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import CharCounter


def _engine(path: Path, *, embedder: bool = True) -> MemoryEngine:
    return MemoryEngine(
        MemoryConfig(),
        store=MemoryStore(path, counter=CharCounter()),
        embedder=HashEmbedder(dim=16) if embedder else None,
        counter=CharCounter(),
    )


def _with_files(engine: MemoryEngine, sid: str, turns: int = 40) -> None:
    """``sid`` stored, embedded and its vectors written to files (the threshold lowered)."""
    engine.recaller.files_min_turns = 10
    engine.store_turns(
        sid, [Message(role="user", content=f"kiln firing {i}") for i in range(turns)]
    )
    engine.derive(sid)
    engine.recaller.ensure_vectors(sid)
    engine.on_message_inbound("kiln firing 3", session_id=sid)  # caches the session's vectors
    engine.recaller.settle()


def _files(path: Path) -> list[str]:
    folder = Path(f"{path}.vectors")
    return (
        sorted(p.name for p in folder.iterdir() if p.suffix != ".lock") if folder.is_dir() else []
    )


def _files_of(engine: MemoryEngine, sid: str) -> list[str]:
    """The names of ``sid``'s files, from their own metadata (what they say they hold)."""
    folder = engine.recaller.files.folder if engine.recaller.files is not None else None
    assert folder is not None
    keys = {
        p.name.split(".", 1)[0]
        for p in folder.glob("*.json")
        if json.loads(p.read_text(encoding="utf-8"))["session"] == sid
    }
    return sorted(
        p.name for p in folder.iterdir() if p.suffix != ".lock" and p.name.split(".", 1)[0] in keys
    )


def test_deleting_a_session_removes_its_vector_files_at_once(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    engine = _engine(path)
    _with_files(engine, "gone")
    _with_files(engine, "kept")
    both = _files(path)
    assert len(both) >= 4  # rows and their metadata, for each session
    kept = _files_of(engine, "kept")
    assert kept and set(kept) < set(both)
    assert engine.delete_session("gone") is True
    left = _files(path)
    assert left == kept  # exactly the kept session's files
    assert engine.store.session_version("gone") is None
    assert engine.on_message_inbound("kiln firing 3", session_id="kept").recalled
    assert engine.delete_session("gone") is False  # nothing left to delete
    assert _files(path) == left
    engine.close()
    assert _files(path) == left  # closing finds nothing more to remove


def test_an_engine_without_an_embedder_deletes_the_files_another_engine_wrote(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.db"
    writer = _engine(path)
    _with_files(writer, "gone")
    writer.close()
    assert _files(path)
    keyword_only = _engine(path, embedder=False)
    assert keyword_only.delete_session("gone") is True
    assert _files(path) == []
    keyword_only.close()


@pytest.mark.parametrize("adapter", ["langchain", "llamaindex"])
def test_the_adapters_clear_deletes_the_vector_files(tmp_path: Path, adapter: str) -> None:
    path = tmp_path / "m.db"
    engine = _engine(path)
    _with_files(engine, "chat")
    assert _files(path)
    if adapter == "langchain":
        from contextfold.integrations.langchain import ContextfoldChatHistory

        ContextfoldChatHistory(engine, session_id="chat").clear()
    else:
        from contextfold.integrations.llamaindex import ContextfoldMemory

        ContextfoldMemory(engine=engine, session_id="chat").reset()
    assert _files(path) == []
    assert engine.store.session_version("chat") is None
    engine.close()


def test_delete_session_leaves_no_files_written_by_a_queued_worker_job(tmp_path: Path) -> None:
    """``delete_session`` while the recaller's worker still has the session's file write
    queued: the write, run after the delete returned, writes nothing (the worker asks whether
    the session is still the one it read, under the file lock the delete takes)."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.recaller.files_min_turns = 10
    engine.store_turns(
        "gone", [Message(role="user", content=f"kiln firing {i}") for i in range(40)]
    )
    engine.derive("gone")
    engine.recaller.ensure_vectors("gone")
    gate = threading.Event()
    engine.recaller._worker.submit(gate.wait)  # the worker busy with another session's job
    engine.on_message_inbound("kiln firing 3", session_id="gone")  # queues the file write
    assert engine.delete_session("gone") is True
    gate.set()
    engine.recaller.settle()
    try:
        assert _files(path) == [], "the deleted session's vector files were written again"
    finally:
        engine.close()


def test_delete_session_reads_no_other_sessions_files_nor_asks_the_store_about_them(
    tmp_path: Path,
) -> None:
    """Deleting one session finds its files by name: the other sessions' files are not read
    and the store is not asked about them (deleting N sessions was N² store reads)."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    for sid in ("a", "b", "c", "gone"):
        _with_files(engine, sid)
    before = {sid: _files_of(engine, sid) for sid in ("a", "b", "c")}
    asked: list[str] = []
    version = engine.store.session_version

    def counted(session_id: str) -> tuple[int, int] | None:
        asked.append(session_id)
        return version(session_id)

    engine.store.session_version = counted  # type: ignore[method-assign]
    assert engine.delete_session("gone") is True
    engine.store.session_version = version  # type: ignore[method-assign]
    assert [s for s in asked if s != "gone"] == []
    assert _files(path) == sorted(f for files in before.values() for f in files)
    engine.close()


def test_files_named_the_old_way_are_removed_when_an_engine_closes(tmp_path: Path) -> None:
    """Files written before keys began with the session's digest are never loaded again: the
    prune on close removes them (and keeps the current ones)."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    _with_files(engine, "s")
    files = engine.recaller.files
    assert files is not None
    current = _files(path)
    for name in current:  # the same files under an old-style name
        old = files.folder / name.replace(name.split(".", 1)[0], "0" * 24 + "-1", 1)
        old.write_bytes((files.folder / name).read_bytes())
    assert len(_files(path)) == 2 * len(current)
    engine.close()
    assert _files(path) == current
