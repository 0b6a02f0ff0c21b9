"""Deleting a session through the engine (what the CLI, the LangChain and LlamaIndex adapters
and the LoCoMo runner call) removes everything derived from it: its rows in the store and its
vector files beside a SQLite database, at once, not when an engine next closes."""

from __future__ import annotations

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


def test_deleting_a_session_removes_its_vector_files_at_once(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    engine = _engine(path)
    _with_files(engine, "gone")
    _with_files(engine, "kept")
    both = _files(path)
    assert len(both) >= 4  # rows and their metadata, for each session
    assert engine.delete_session("gone") is True
    left = _files(path)
    assert left and set(left) < set(both)
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
