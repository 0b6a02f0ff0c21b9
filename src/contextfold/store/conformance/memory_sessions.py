"""Conformance: sessions, append-only raw turns, content hashes, atomic writes (``batch``),
principals and the match keys a resent history is recognised by. Runs on every backend."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import numpy as np
import pytest

from contextfold.errors import ConfigError
from contextfold.items import Message
from contextfold.memory.turnkeys import TurnKeys, key_of
from contextfold.store.conformance.memory_support import (
    TOPICS,
    StoreFactory,
    exchange,
    filled,
    messages,
    msg,
    stored,
    tool_exchange,
)
from contextfold.store.models import NewSegment, _message_json, match_key
from contextfold.store.protocols import MemoryStorage
from contextfold.tokens import CharCounter, TiktokenCounter


def test_every_backend_implements_the_protocol(memory_store: MemoryStorage) -> None:
    assert isinstance(memory_store, MemoryStorage)
    assert memory_store.sessions() == [] and memory_store.jobs.job_counts() == {}


# -- sessions -------------------------------------------------------------------------------------


def test_sessions_are_created_once_and_read_back(memory_store: MemoryStorage) -> None:
    store = memory_store
    assert store.create_session("s1", {"user": "ada", "n": [1, 2]}, principal="p") == "s1"
    record = store.session("s1")
    assert (record.id, record.principal) == ("s1", "p")
    assert record.metadata == {"user": "ada", "n": [1, 2]}
    assert (record.compaction_watermark, record.parent_id, record.fork_seq) == (0, None, None)
    assert record.derived_seq == 0 and record.created_at.tzinfo is not None
    with pytest.raises(ConfigError, match="already exists"):
        store.create_session("s1")
    assert store.session("s1").principal == "p"  # the refused create changed nothing
    random_ids = {store.create_session() for _ in range(5)}
    assert len(random_ids) == 5 and "s1" not in random_ids
    assert set(store.sessions()) == {"s1", *random_ids}
    assert store.principal_of("s1") == "p" and store.principal_of("nope") is None


def test_an_unknown_session_is_a_config_error(memory_store: MemoryStorage) -> None:
    # The Protocol's docstring says KeyError; the SQLite store raises ConfigError and the
    # engine catches ConfigError (``MemoryEngine._session``): ConfigError is the contract.
    with pytest.raises(ConfigError, match="unknown session"):
        memory_store.session("nope")
    assert memory_store.last_seq("nope") == 0 and memory_store.turns("nope") == []
    with pytest.raises(ConfigError, match="unknown session"):
        memory_store.commit_exchange("nope", messages(["x"]))
    assert memory_store.sessions() == []


def test_delete_session_removes_the_session_and_nothing_else(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.create_session("s2")
    store.append_turns("s2", messages(["kubernetes elsewhere"]))
    store.tag_turn("s1", 1, "deploy")
    store.tag_turn("s2", 1, "kubernetes")
    store.compact(
        "s1", [NewSegment(first_seq=1, last_seq=3, summary="kubernetes", full_text="")], 4
    )
    store.costs.log_cost("s1", "tagging", "m", 1, 1, 0.5)
    assert store.delete_session("s1") is True
    assert store.sessions() == ["s2"] and store.turns("s1") == [] and store.segments("s1") == []
    assert [t.seq for t, _ in store.search_turns("s2", "kubernetes")] == [1]
    assert store.tag_counts("s1") == {} and store.tag_counts("s2") == {"kubernetes": 1}
    assert store.costs.cost_report().cost_usd == 0.5  # the cost log outlives its session
    assert store.delete_session("s1") is False
    assert [t.seq for t in store.turns("s2")] == [1]


def test_a_deleted_session_id_can_be_created_again_as_a_new_empty_session(
    memory_store: MemoryStorage,
) -> None:
    """What the stores do (and ``turn_keys`` relies on): ``delete_session`` frees its id, and
    a session created again under it starts empty — nothing of the old one shows through."""
    store = filled(memory_store)
    store.set_tags_many("s1", {1: ({"deploy": 1.0}, ["ops"]), 2: ({"db": 1.0}, [])})
    store.add_turn_vectors("s1", "m", [1, 2], np.eye(2, dtype=np.float32))
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="")], 3)
    store.paging.upsert_tag_summary("s1", "deploy", "Deploy Friday.", 2)
    store.paging.set_working_set("s1", "deploy", "summary", 10)
    store.mark_derived("s1", 6)
    store.jobs.enqueue_job("s1")
    assert store.delete_session("s1")
    assert store.jobs.job_counts() == {}  # the session's jobs went with it
    store.create_session("s1", principal="p2")
    record = store.session("s1")
    assert (record.compaction_watermark, record.derived_seq, record.metadata) == (0, 0, {})
    assert record.principal == "p2"
    assert store.turns("s1") == [] and store.last_seq("s1") == 0
    assert store.segments("s1") == [] and store.paging.tag_summaries("s1") == {}
    assert store.paging.working_set("s1") == {} and store.tag_counts("s1") == {}
    assert store.turn_vectors("s1", "m")[0] == [] and store.last_vector_seq("s1", "m") == 0
    assert store.search_turns("s1", "kubernetes") == []
    assert store.search_segments("s1", "deploy") == []
    assert store.append_turns("s1", messages(["fresh start"])) == [1]
    [turn] = store.turns("s1")
    assert turn.tags == {} and store.active_tokens("s1") == turn.token_count


def test_reopening_the_store_keeps_everything(open_store: StoreFactory) -> None:
    store = filled(open_store())
    store.tag_turn("s1", 1, "deploy", 0.9)
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="x")], 3)
    store.paging.upsert_tag_summary("s1", "deploy", "Deploy on Friday.", 1)
    store.vocab.set_alias("k8s", "kubernetes")
    store.paging.set_working_set("s1", "deploy", "summary", 12)
    store.costs.log_cost("s1", "summary", "gpt-4o-mini", 100, 20, 0.002)
    before = (store.turns("s1"), store.segments("s1"), store.paging.tag_summaries("s1"))
    store.close()
    again = open_store()
    assert (again.turns("s1"), again.segments("s1"), again.paging.tag_summaries("s1")) == before
    assert again.session("s1").metadata == {"user": "ada"}
    assert again.session("s1").compaction_watermark == 3
    assert again.vocab.aliases() == {"k8s": "kubernetes"}
    assert again.paging.working_set("s1")["deploy"].depth == "summary"
    assert again.costs.cost_report("s1").calls == 1


# -- raw turns ------------------------------------------------------------------------------------


def test_tool_call_messages_round_trip_exactly(open_store: StoreFactory) -> None:
    store = open_store()
    store.create_session("s1")
    sent = tool_exchange()
    stamps = [datetime(2026, 1, 1, 12, i, tzinfo=UTC) for i in range(4)]
    assert store.append_turns("s1", sent, timestamps=stamps) == [1, 2, 3, 4]
    store.close()
    turns = open_store().turns("s1")
    assert [t.message for t in turns] == sent
    assert [t.created_at for t in turns] == stamps
    assert turns[1].message.tool_use_ids == ("call_1",)
    assert turns[2].message.tool_result_ids == ("call_1",)
    assert len({t.content_hash for t in turns}) == 4 and all(
        len(t.content_hash) == 64 for t in turns
    )


def test_content_hash_is_the_sha256_of_the_canonical_json(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s1")
    sent = [*tool_exchange(), Message(role="user", content="naïve café ✓ — 日本語")]
    store.append_turns("s1", sent)
    expected = [hashlib.sha256(_message_json(m).encode("utf-8")).hexdigest() for m in sent]
    assert [t.content_hash for t in store.turns("s1")] == expected
    assert [store.turn_hash("s1", seq) for seq in range(1, 6)] == expected
    assert store.turn_hash("s1", 6) is None and store.turn_hash("nope", 1) is None
    assert [row[3] for row in store.turn_texts_after("s1", 0)] == expected
    # The same message stored twice has one hash, whichever session holds it.
    store.create_session("s2")
    store.append_turns("s2", sent[:1])
    assert store.turn_hash("s2", 1) == expected[0]


def test_token_counts_come_from_the_counter_once_per_turn(store_factory: StoreFactory) -> None:
    counter = TiktokenCounter("cl100k_base")
    store = store_factory(counter=counter)
    store.create_session("s1")
    store.append_turns("s1", tool_exchange())
    turns = store.turns("s1")
    assert [t.token_count for t in turns] == [counter.count(t.message.text()) for t in turns]
    assert all(t.token_count > 0 for t in turns)
    assert store.turn_token_counts("s1", [1, 2, 3, 4, 9]) == {t.seq: t.token_count for t in turns}


def test_seqs_continue_per_session_and_turns_slice(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.create_session("s2")
    assert store.append_turns("s2", messages(["a b", "c d"])) == [1, 2]
    assert store.append_turns("s1", messages(["more"])) == [7]
    assert [t.seq for t in store.turns("s1", start=2, end=4)] == [2, 3, 4]
    assert [t.seq for t in store.turns("s1", start=6)] == [6, 7]
    assert [t.seq for t in store.turns("s1", end=2)] == [1, 2]
    with pytest.raises(ConfigError, match="unknown session"):
        store.append_turns("nope", messages(["x"]))
    with pytest.raises(ConfigError, match="timestamps"):
        store.append_turns("s1", messages(["x"]), timestamps=[])
    assert store.last_seq("s1") == 7 and store.last_seq("s2") == 2  # refused: nothing stored


def test_seqs_have_no_gaps_across_appends_exchanges_and_refusals(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    store.create_session("s1")
    got = store.append_turns("s1", messages(["a"]))
    got += store.commit_exchange("s1", messages(["b", "c"]))
    with pytest.raises(ConfigError):
        store.commit_exchange("s1", messages(["lost"]), expect_last=1)  # BranchMoved
    got += store.commit_exchange("s1", messages(["d"]), expect_last=3)
    assert store.append_turns("s1", []) == [] and store.commit_exchange("s1", []) == []
    got += store.append_turns("s1", messages(["e", "f", "g"]))
    assert got == [1, 2, 3, 4, 5, 6, 7] == [t.seq for t in store.turns("s1")]
    assert store.last_seq("s1") == 7
    assert [t.message.text() for t in store.turns("s1")] == list("abcdefg")


def test_turn_reads_agree_and_leave_out_missing_seqs(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s1")
    stamps = [datetime(2026, 3, 1, 9, i, tzinfo=UTC) for i in range(3)]
    store.append_turns(
        "s1",
        messages(["one two", "three", "four five six"]),
        timestamps=stamps,
        partial=[False, True, False],
    )
    turns = store.turns("s1")
    assert [t.partial for t in turns] == [False, True, False]
    rows = store.turn_rows("s1", [3, 1, 99])
    assert sorted(rows) == [1, 3]
    assert rows[3] == (3, "user", "four five six", stamps[2], turns[2].token_count)
    assert rows[1].role == "user" and rows[1].text == "one two"
    assert store.turn_times("s1", [2, 3, 7]) == {2: stamps[1], 3: stamps[2]}
    assert store.turn_token_counts("s1", []) == {} and store.turn_rows("s1", []) == {}
    assert store.turn_texts_after("s1", 1) == [
        (2, "assistant", "three", turns[1].content_hash),
        (3, "user", "four five six", turns[2].content_hash),
    ]
    assert store.turn_texts_after("s1", 3) == [] and store.turn_texts_after("nope", 0) == []


def test_naive_timestamps_are_taken_as_utc(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s1")
    store.append_turns("s1", messages(["x"]), timestamps=[datetime(2026, 1, 2, 3, 4, 5)])
    assert store.turns("s1")[0].created_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_active_tokens_count_the_turns_at_or_above_the_watermark(
    memory_store: MemoryStorage,
) -> None:
    store = filled(memory_store)
    counts = [t.token_count for t in store.turns("s1")]
    assert store.active_tokens("s1") == sum(counts) == sum(CharCounter().count(t) for t in TOPICS)
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="x", full_text="")], 3)
    assert store.active_tokens("s1") == sum(counts[2:])
    assert store.active_tokens("nope") == 0


# -- batch ----------------------------------------------------------------------------------------


def test_a_batch_commits_its_writes_together(memory_store: MemoryStorage) -> None:
    store = memory_store
    with store.batch():
        store.create_session("s1")
        store.append_turns("s1", messages(["a", "b"]))
        store.tag_turn("s1", 1, "t")
        store.jobs.enqueue_job("s1")
    assert [t.seq for t in store.turns("s1")] == [1, 2]
    assert store.tag_counts("s1") == {"t": 1} and store.jobs.job_counts() == {"pending": 1}


def test_an_exception_inside_a_batch_rolls_back_every_write(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    before = (store.turns("s1"), store.session("s1"), store.sessions())
    with pytest.raises(RuntimeError, match="halfway"), store.batch():
        store.create_session("s2")
        store.append_turns("s2", messages(["kiln firing"]))
        store.append_turns("s1", messages(["seventh turn"]))
        store.set_tags_many("s1", {1: ({"deploy": 1.0}, [])})
        store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="kiln", full_text="")], 3)
        store.vocab.set_alias("k8s", "kubernetes")
        store.paging.set_working_set("s1", "deploy", "full", 5)
        store.paging.upsert_tag_summary("s1", "deploy", "x", 1)
        store.costs.log_cost("s1", "summary", "m", 1, 1, 1.0)
        store.jobs.enqueue_job("s1")
        store.add_turn_vectors("s1", "m", [1], np.ones((1, 2), dtype=np.float32))
        assert store.last_seq("s1") == 7  # the batch sees its own writes
        raise RuntimeError("halfway")
    assert (store.turns("s1"), store.session("s1"), store.sessions()) == before
    assert store.last_seq("s1") == 6 and store.tag_counts("s1") == {}
    assert store.segments("s1") == [] and store.search_segments("s1", "kiln") == []
    assert store.search_turns("s2", "kiln") == [] and store.vocab.aliases() == {}
    assert store.paging.working_set("s1") == {} and store.paging.tag_summaries("s1") == {}
    assert store.costs.cost_report().calls == 0 and store.jobs.job_counts() == {}
    assert store.turn_vectors("s1", "m")[0] == []
    # The store still works after the rollback.
    assert store.append_turns("s1", messages(["seventh turn"])) == [7]


# -- principals -----------------------------------------------------------------------------------


def test_lookups_by_content_never_cross_principals(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("a1", principal="alice")
    store.create_session("a2", principal="alice")
    store.create_session("b1", principal="bob")
    store.create_session("lib")  # the library's own: principal ''
    key = match_key("user", "hello there")
    store.append_turns("a1", [msg("user", "hello there"), msg("assistant", "hi")])
    store.append_turns("b1", [msg("user", "hello   there")])  # the same key, bob's
    store.append_turns("a2", [msg("assistant", "x"), msg("user", "hello there")])
    store.append_turns("lib", [msg("user", "hello there")])
    assert store.turns_with_key("alice", key) == [("a2", 2), ("a1", 1)]  # newest first
    assert store.turns_with_key("bob", key) == [("b1", 1)]
    assert store.turns_with_key("", key) == [("lib", 1)]
    assert store.turns_with_key("carol", key) == []
    assert store.turns_with_key("alice", key, session_id="a1") == [("a1", 1)]
    assert store.turns_with_key("alice", key, session_id="b1") == []  # bob's session
    assert store.turns_with_key("alice", key, limit=1) == [("a2", 2)]
    assert store.turns_with_key("alice", match_key("assistant", "hello there")) == []
    assert store.latest_session("alice") == ("a2", 2)
    assert store.latest_session("bob") == ("b1", 1)
    assert store.latest_session("") == ("lib", 1)
    assert store.latest_session("carol") is None
    store.append_turns("a1", [msg("user", "later")])
    store.append_turns("b1", [msg("user", "even later")])  # bob's write moves only bob's
    assert store.latest_session("alice") == ("a1", 3)
    store.create_session("a3", principal="alice")  # a session with no turn is no conversation
    assert store.latest_session("alice") == ("a1", 3)


def test_turns_with_key_orders_newest_first_within_a_session(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s", principal="p")
    store.append_turns("s", [msg("user", "again"), msg("assistant", "ok"), msg("user", "again")])
    store.append_turns("s", [msg("user", " again ")])
    key = match_key("user", "again")
    assert store.turns_with_key("p", key) == [("s", 4), ("s", 3), ("s", 1)]
    assert store.turn_keys("s", 1, 4) == {1: key, 2: match_key("assistant", "ok"), 3: key, 4: key}


# -- match keys -----------------------------------------------------------------------------------


def test_turn_keys_follow_appends_deletes_and_other_store_objects(
    open_store: StoreFactory,
) -> None:
    """``turn_keys`` must see turns appended here or by another process, and a session
    deleted and written again."""
    store, other = open_store(), open_store()
    sid = store.create_session("a")
    exchange(store, sid, 0)
    assert store.turn_keys(sid, 1, 9) == {
        1: match_key("user", "question 0"),
        2: match_key("assistant", "ok"),
    }
    exchange(other, sid, 1)  # another store object (process) appends
    assert store.turn_keys(sid, 3, 3) == {3: match_key("user", "question 1")}
    assert store.turn_keys(sid, 2, 4) == {
        2: match_key("assistant", "ok"),
        3: match_key("user", "question 1"),
        4: match_key("assistant", "ok"),
    }
    other.delete_session(sid)
    other.create_session("a")
    other.commit_exchange(
        sid, [Message(role="user", content="new"), Message(role="assistant", content="start")]
    )
    assert store.turn_keys(sid, 1, 9) == {
        1: match_key("user", "new"),
        2: match_key("assistant", "start"),
    }
    other.delete_session(sid)
    assert store.turn_keys(sid, 1, 9) == {}


def test_turn_keys_see_a_session_rewritten_with_the_same_last_turn(
    open_store: StoreFactory,
) -> None:
    """Deleted and written again by another process with as many turns and the same last
    turn: the earlier turns are new all the same."""
    store, other = open_store(), open_store()
    store.create_session("a")
    store.commit_exchange("a", [msg("user", "first"), msg("assistant", "ok")])
    assert store.turn_keys("a", 1, 2) == {
        1: match_key("user", "first"),
        2: match_key("assistant", "ok"),
    }
    other.delete_session("a")
    other.create_session("a")
    other.commit_exchange("a", [msg("user", "second"), msg("assistant", "ok")])
    assert store.turn_keys("a", 1, 2) == {
        1: match_key("user", "second"),
        2: match_key("assistant", "ok"),
    }


def test_turnkeys_follow_appends_and_match_by_role_and_text(memory_store: MemoryStorage) -> None:
    store = memory_store
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


def test_turnkeys_hold_a_history_resent_with_other_whitespace(memory_store: MemoryStorage) -> None:
    """A client that re-renders the history it resends (trailing spaces, blank lines around
    a reply, re-indented lines) still holds the stored turns; role and words still count."""
    store = memory_store
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


def test_turnkeys_read_a_session_deleted_and_written_again_afresh(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    stored(store, "s", "old one", "old two", "old three")
    keys = TurnKeys(store)
    assert len(keys.keys("s")) == 3
    store.delete_session("s")
    stored(store, "s", "new one", "new two", "new three", "new four")
    assert keys.seqs_matching("s", {key_of(msg("user", "old one"))}) == set()
    assert keys.seqs_matching("s", {key_of(msg("user", "new one"))}) == {1}
    assert len(keys.keys("s")) == 4


def test_turnkeys_read_a_session_rewritten_with_the_same_last_turn_afresh(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    stored(store, "s", "first", "ok")
    keys = TurnKeys(store)
    assert keys.keys("s")[0] == key_of(msg("user", "first"))
    store.delete_session("s")
    stored(store, "s", "second", "ok")
    assert keys.keys("s")[0] == key_of(msg("user", "second"))


def test_turnkeys_see_another_store_object_writing_the_same_store(
    open_store: StoreFactory,
) -> None:
    writer, reader = open_store(), open_store()
    stored(writer, "s", "first", "second")
    keys = TurnKeys(reader)
    assert keys.seqs_matching("s", {key_of(msg("assistant", "second"))}) == {2}
    stored(writer, "s", "third")
    assert keys.seqs_matching("s", {key_of(msg("user", "third"))}) == {3}
    writer.delete_session("s")
    stored(writer, "s", "other")
    assert list(keys.keys("s")) == [key_of(msg("user", "other"))]


def test_turnkeys_keep_the_most_recent_sessions_and_read_the_others_again(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    for n in range(5):
        stored(store, f"s{n}", f"text {n}")
    keys = TurnKeys(store, sessions=2)
    for n in range(5):
        assert list(keys.keys(f"s{n}")) == [key_of(msg("user", f"text {n}"))]
    assert len(keys._sessions) == 2
    assert list(keys.keys("s0")) == [key_of(msg("user", "text 0"))]


def test_turn_texts_come_with_an_incarnation_new_at_each_creation(
    open_store: StoreFactory,
) -> None:
    """``turn_texts_with_incarnation``: the same turns as ``turn_texts_after``, and an
    incarnation that stays while turns are appended and changes, growing, when another
    store object (process) deletes the session and creates it again."""
    store, other = open_store(), open_store()
    assert store.turn_texts_with_incarnation("s", 0) == (None, [])
    stored(store, "s", "first", "ok")
    first, rows = store.turn_texts_with_incarnation("s", 0)
    assert first is not None and rows == store.turn_texts_after("s", 0) and len(rows) == 2
    stored(other, "s", "more")
    assert store.turn_texts_with_incarnation("s", 2) == (first, store.turn_texts_after("s", 2))
    assert store.turn_texts_with_incarnation("s", 3) == (first, [])
    other.delete_session("s")
    assert store.turn_texts_with_incarnation("s", 0) == (None, [])
    stored(other, "s", "first", "ok")
    second, rows = store.turn_texts_with_incarnation("s", 0)
    assert second is not None and second > first
    assert [row[1:3] for row in rows] == [("user", "first"), ("assistant", "ok")]
    other.fork("s", 1, session_id_new="t")
    third, _ = store.turn_texts_with_incarnation("t", 0)
    assert third is not None and third > second


def test_turn_openings_are_the_texts_first_characters_with_the_incarnation(
    open_store: StoreFactory,
) -> None:
    """``turn_openings_with_incarnation``: (seq, the first ``chars`` characters of the text)
    of the turns after a seq, in order, with the incarnation ``turn_texts_with_incarnation``
    gives (characters, not bytes: a text in other scripts is cut at the same place)."""
    store, other = open_store(), open_store()
    assert store.turn_openings_with_incarnation("s", 0, 8) == (None, [])
    stored(store, "s", "Ann: the kiln is hot", "Bo: ok", "Zoë: ça chauffe déjà beaucoup")
    born, texts = store.turn_texts_with_incarnation("s", 0)
    assert store.turn_openings_with_incarnation("s", 0, 8) == (
        born,
        [(seq, text[:8]) for seq, _, text, _ in texts],
    )
    assert store.turn_openings_with_incarnation("s", 2, 100) == (born, [(3, texts[2][2])])
    other.delete_session("s")
    stored(other, "s", "Cy: again")
    again, rows = store.turn_openings_with_incarnation("s", 0, 3)
    assert again is not None and born is not None and again > born and rows == [(1, "Cy:")]


def test_the_given_turns_openings_are_their_texts_first_characters(
    store_factory: StoreFactory,
) -> None:
    """``turn_openings``: the first ``chars`` characters of the given turns' texts (a
    recall's candidates), seqs not stored left out, another session's never given."""
    store = store_factory()
    assert store.turn_openings("s", [1, 2], 8) == {}
    stored(store, "s", "Ann: the kiln is hot", "Bo: ok", "Zoë: ça chauffe déjà beaucoup")
    stored(store, "t", "Cy: another session's first turn")
    assert store.turn_openings("s", [3, 1, 9, 0, -1], 8) == {1: "Ann: the", 3: "Zoë: ça "}
    assert store.turn_openings("s", [2], 100) == {2: "Bo: ok"}
    assert store.turn_openings("s", [], 8) == {}
    many = store.turn_openings("s", [*range(1, 1200), 2], 4)  # past one query's seqs
    assert many == {1: "Ann:", 2: "Bo: ", 3: "Zoë:"}


def test_token_counts_after_a_seq_come_with_the_incarnation(open_store: StoreFactory) -> None:
    """``turn_token_counts_after``: (seq, token count) of the turns after a seq, in order, as
    ``turn_token_counts`` has them, with the session's incarnation; a session deleted and
    written again by another store object gives its new turns and a new incarnation."""
    store, other = open_store(), open_store()
    assert store.turn_token_counts_after("s", 0) == (None, [])
    stored(store, "s", "first words", "ok")
    stored(other, "s", "a much longer third turn with many more words in it")
    born, rows = store.turn_token_counts_after("s", 0)
    version = store.session_version("s")
    assert born is not None and version is not None and born == version[0]
    assert rows == sorted(store.turn_token_counts("s", [1, 2, 3, 4]).items())
    assert [seq for seq, _ in rows] == [1, 2, 3] and rows[2][1] > rows[1][1] > 0
    assert store.turn_token_counts_after("s", 2) == (born, rows[2:])
    assert store.turn_token_counts_after("s", 3) == (born, [])
    other.delete_session("s")
    assert store.turn_token_counts_after("s", 0) == (None, [])
    stored(other, "s", "new")
    again, rows = store.turn_token_counts_after("s", 0)
    assert again is not None and again > born
    assert rows == [(1, store.turn_token_counts("s", [1])[1])]


def test_turnkeys_see_another_store_object_rewrite_a_session_ending_alike(
    open_store: StoreFactory,
) -> None:
    writer, reader = open_store(), open_store()
    stored(writer, "s", "first", "ok")
    keys = TurnKeys(reader)
    assert keys.seqs_matching("s", {key_of(msg("user", "first"))}) == {1}
    writer.delete_session("s")
    stored(writer, "s", "second", "ok")
    assert keys.seqs_matching("s", {key_of(msg("user", "first"))}) == set()
    assert list(keys.keys("s")) == [key_of(msg("user", "second")), key_of(msg("assistant", "ok"))]
