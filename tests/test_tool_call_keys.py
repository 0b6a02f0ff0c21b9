"""A tool call's match key leaves out the arguments set to false or null (``message_key``):
a client that resends a call with the tool's unset options filled in (Claude Code adds
``"replace_all": false`` to every Edit call) resends the same call, and the stores' migrations
make the keys of calls stored before that again (SQLite ``m015``, PostgreSQL ``m011``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from contextfold.items import Message, TextBlock, ToolUseBlock
from contextfold.store import open_memory_store
from contextfold.store.models import match_key, message_key

EDIT = {"file_path": "hello.py", "old_string": "a", "new_string": "b"}


def call(**extra: object) -> Message:
    block = ToolUseBlock(id="toolu_1", name="Edit", input={**EDIT, **extra})
    return Message(role="assistant", content=[TextBlock(text="Editing."), block])


@pytest.mark.parametrize(
    ("resent", "same"),
    [
        (call(replace_all=False), True),
        (call(replace_all=None), True),
        (call(replace_all=True), False),  # an option set is another call
        (call(replace_all=0), False),  # only false and null are unset
        (call(new_string="c"), False),
    ],
)
def test_a_call_resent_with_unset_options_has_the_stored_calls_key(
    resent: Message, same: bool
) -> None:
    assert (message_key(resent) == message_key(call())) is same


def test_messages_without_tool_calls_keep_their_key() -> None:
    for message in (
        Message(role="user", content="Hello  there.\n"),
        Message(role="assistant", content="Sure: replace_all false"),
        call(),  # a call with no unset option: the text's key, as before
    ):
        assert message_key(message) == match_key(message.role, message.text())


def _old_keys(location: str) -> None:
    """Give the stored calls the key made before ``message_key`` (from their text), and
    forget the migration that makes them again: a store as the version before left it."""
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("ALTER TABLE turns DISABLE TRIGGER turns_append_only")
            conn.execute(
                "UPDATE turns SET match_key = %s WHERE role = 'assistant'",
                (match_key("assistant", call(replace_all=False).text()),),
            )
            conn.execute("ALTER TABLE turns ENABLE TRIGGER turns_append_only")
            conn.execute("DELETE FROM schema_migrations WHERE name = 'm011_tool_call_keys'")
        return
    conn = sqlite3.connect(location, isolation_level=None)
    conn.execute("DROP TRIGGER turns_no_update")
    conn.execute(
        "UPDATE turns SET match_key = ? WHERE role = 'assistant'",
        (match_key("assistant", call(replace_all=False).text()),),
    )
    conn.execute("CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns BEGIN SELECT 1; END")
    conn.execute("DELETE FROM schema_migrations WHERE name = 'm015_tool_call_keys'")
    conn.close()


def _check_migration(location: str) -> None:
    store = open_memory_store(location)
    sid = store.create_session(principal="p")
    store.append_turns(sid, [Message(role="user", content="Edit it."), call(replace_all=False)])
    store.close()
    _old_keys(location)
    store = open_memory_store(location)
    try:
        assert store.turns_with_key("p", message_key(call())) == [(sid, 2)]
        assert store.turn_keys(sid, 1, 2)[2] == message_key(call(replace_all=False))
        with pytest.raises(Exception, match=r"append-only|never updated"):  # the guard is back
            if location.startswith("postgresql://"):
                import psycopg

                with psycopg.connect(location) as conn:
                    conn.execute("UPDATE turns SET match_key = 'x'")
            else:
                with sqlite3.connect(location) as conn:
                    conn.execute("UPDATE turns SET match_key = 'x'")
    finally:
        store.close()


def test_the_sqlite_migration_makes_stored_calls_keys_again(tmp_path: Path) -> None:
    _check_migration(str(tmp_path / "memory.db"))


@pytest.mark.integration
def test_the_postgres_migration_makes_stored_calls_keys_again(postgres_url: str) -> None:
    _check_migration(postgres_url)
