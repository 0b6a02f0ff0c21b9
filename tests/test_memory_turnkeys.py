"""TurnKeys: the per-session index of stored turns' (role, text) that the engine matches a
client's resent history against, kept in step with an append-only store."""

from __future__ import annotations

from pathlib import Path

from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.turnkeys import TurnKeys, key_of
from contextfold.store.sqlite.memory import MemoryStore


def msg(role: str, text: str) -> Message:
    return Message(role=role, content=text)  # type: ignore[arg-type]


def stored(store: MemoryStore, sid: str, *texts: str) -> None:
    if sid not in store.sessions():
        store.create_session(sid)
    roles = ["user", "assistant"]
    store.append_turns(sid, [msg(roles[i % 2], t) for i, t in enumerate(texts)])


def test_keys_follow_appends_and_match_by_role_and_text() -> None:
    store = MemoryStore()
    stored(store, "s", "hello", "hi there")
    keys = TurnKeys(store)
    assert keys.seqs_matching("s", {key_of(msg("assistant", "hi there"))}) == {2}
    assert keys.seqs_matching("s", {key_of(msg("user", "hi there"))}) == set()  # role counts
    stored(store, "s", "tell me more", "more")
    found = keys.seqs_matching(
        "s", {key_of(msg("user", "tell me more")), key_of(msg("user", "hello"))}
    )
    assert found == {1, 3}
    assert len(keys.keys("s")) == 4


def test_a_history_resent_with_other_whitespace_holds_its_turns() -> None:
    """A client that re-renders the history it resends (trailing spaces, blank lines around
    a reply, re-indented lines) still holds the stored turns; role and words still count."""
    store = MemoryStore()
    stored(store, "s", "Create hello.py.", "hello.py\n```python\nprint(1)\n```\n", "Run it.")
    keys = TurnKeys(store)
    resent = [
        msg("user", "Create hello.py.  \n"),
        msg("assistant", "\nhello.py\n```python\nprint(1)\n```\n\n"),
        msg("assistant", "Run it."),  # another role
    ]
    assert keys.seqs_held("s", resent) == {1, 2}
    assert keys.seqs_held("s", [msg("user", "Create  hello.py!")]) == set()
    stored(store, "s", "Done.")  # appended turns (a user one here) get both keys too
    assert keys.seqs_held("s", [msg("user", " Done. ")]) == {4}


def test_a_session_deleted_and_written_again_is_read_afresh() -> None:
    store = MemoryStore()
    stored(store, "s", "old one", "old two", "old three")
    keys = TurnKeys(store)
    assert len(keys.keys("s")) == 3
    store.delete_session("s")
    stored(store, "s", "new one", "new two", "new three", "new four")
    assert keys.seqs_matching("s", {key_of(msg("user", "old one"))}) == set()
    assert keys.seqs_matching("s", {key_of(msg("user", "new one"))}) == {1}
    assert len(keys.keys("s")) == 4


def test_another_connection_writing_the_same_file_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    writer, reader = MemoryStore(path), MemoryStore(path)
    stored(writer, "s", "first", "second")
    keys = TurnKeys(reader)
    assert keys.seqs_matching("s", {key_of(msg("assistant", "second"))}) == {2}
    stored(writer, "s", "third")
    assert keys.seqs_matching("s", {key_of(msg("user", "third"))}) == {3}
    writer.delete_session("s")
    stored(writer, "s", "other")
    assert keys.keys("s") == [key_of(msg("user", "other"))]


def test_only_the_most_recent_sessions_are_kept_and_the_others_are_read_again() -> None:
    store = MemoryStore()
    for n in range(5):
        stored(store, f"s{n}", f"text {n}")
    keys = TurnKeys(store, sessions=2)
    for n in range(5):
        assert keys.keys(f"s{n}") == [key_of(msg("user", f"text {n}"))]
    assert len(keys._sessions) == 2
    assert keys.keys("s0") == [key_of(msg("user", "text 0"))]


def test_engine_filters_nothing_before_the_first_compaction() -> None:
    # No compaction yet (watermark 0): every history message is live (more of them than the
    # protected recent turns), none is dropped, and none comes back as recalled memory.
    eng = MemoryEngine(MemoryConfig(), store=MemoryStore(), embedder=None)
    history = [{"role": "user", "content": "The Henninger filing is due March 3."}]
    history.append({"role": "assistant", "content": "Noted: Henninger, March 3."})
    for n in range(5):
        history.append({"role": "user", "content": f"Plant {n} tomato seedlings today."})
        history.append({"role": "assistant", "content": f"Noted: {n} seedlings."})
    eng.on_turn_complete(history)
    assert eng.store.session("default").compaction_watermark == 0
    assembled = eng.on_message_inbound("When is the Henninger filing due?", history)
    assert assembled.history is not None
    assert assembled.history.removed == []
    assert len(assembled.history.messages) == len(history)
    assert "March 3" not in assembled.prepend_text
    # Without the history, the same turns are recalled.
    assert "March 3" in eng.on_message_inbound("When is the Henninger filing due?").prepend_text
