"""Conformance: a derive done in line (``begin_derive`` then ``write_derived``, one round trip
each on a database server) and the live tokens it reads (``active_tokens``), kept right by
every write that adds turns or moves the watermark."""

from __future__ import annotations

import pytest

from contextfold.errors import ConfigError
from contextfold.store.conformance.memory_support import (
    TOPICS,
    StoreFactory,
    exchange,
    filled,
    messages,
)
from contextfold.store.models import NewSegment
from contextfold.store.protocols import MemoryStorage


def _live(store: MemoryStorage, sid: str) -> int:
    """The live tokens counted from the turns themselves."""
    watermark = store.session(sid).compaction_watermark
    return sum(t.token_count for t in store.turns(sid) if t.seq >= watermark)


def test_begin_derive_drops_the_job_and_reads_what_the_derive_needs(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    sid = store.create_session("a", {"user": "ada"})
    for n in range(3):
        exchange(store, sid, n)  # turns 1..6, one pending derive job
    store.jobs.enqueue_job(sid, "summaries")  # another kind: kept
    store.mark_derived(sid, 4)
    pending = store.begin_derive(sid, context=2)
    assert pending.record == store.session(sid) and pending.record.derived_seq == 4
    assert pending.live_tokens == store.active_tokens(sid) == _live(store, sid) > 0
    assert pending.turns == store.turn_texts_after(sid, 2)  # 2 derived turns of context
    assert [seq for seq, *_ in pending.turns] == [3, 4, 5, 6]
    assert store.jobs.job_counts() == {"pending": 1}
    job = store.jobs.claim_job("w")
    assert job is not None and job.kind == "summaries"
    # No context, nothing new: nothing to read; context beyond the first turn: from turn 1.
    store.mark_derived(sid, 6)
    assert store.begin_derive(sid).turns == []
    assert [seq for seq, *_ in store.begin_derive(sid, context=10).turns] == list(range(1, 7))


def test_begin_derive_of_an_unknown_session_raises(memory_store: MemoryStorage) -> None:
    with pytest.raises(ConfigError, match="unknown session"):
        memory_store.begin_derive("nope", context=3)


def test_write_derived_writes_tags_and_derived_seq_between_two_generations(
    memory_store: MemoryStorage,
) -> None:
    store = filled(memory_store)
    store.set_turn_tags("s1", 2, {"old": 1.0}, ["older"])
    version = store.session_version("s1")
    assert version is not None
    before, after = store.write_derived(
        "s1",
        {1: ({"deploy": 1.0, "kubernetes": 0.9}, ["billing"]), 2: ({"migration": 1.0}, [])},
        2,
    )
    assert before == version[1] and after > before
    assert store.session_version("s1") == (version[0], after)
    assert store.session("s1").derived_seq == 2
    turns = store.turns("s1", 1, 2)
    assert (turns[0].tags, turns[0].related_tags) == (
        {"deploy": 1.0, "kubernetes": 0.9},
        ("billing",),
    )
    assert (turns[1].tags, turns[1].related_tags) == ({"migration": 1.0}, ())  # replaced
    assert store.tag_counts("s1") == {"deploy": 1, "kubernetes": 1, "migration": 1}
    # derived_seq only moves forward; an empty write still reports the generations.
    before, again = store.write_derived("s1", {}, 1)
    assert before == again == after and store.session("s1").derived_seq == 2


@pytest.mark.parametrize(
    ("session", "seq", "message"),
    [("s1", 7, "no turn 7"), ("s1", 0, "no turn 0"), ("nope", 1, "unknown session")],
)
def test_write_derived_of_a_missing_turn_or_session_writes_nothing(
    memory_store: MemoryStorage, session: str, seq: int, message: str
) -> None:
    store = filled(memory_store)
    version = store.session_version("s1")
    with pytest.raises(ConfigError, match=message):
        store.write_derived(session, {1: ({"deploy": 1.0}, []), seq: ({"x": 1.0}, [])}, 7)
    assert store.session_version("s1") == version
    assert store.session("s1").derived_seq == 0 and store.tag_counts("s1") == {}


def test_write_derived_joins_a_batch_and_rolls_back_with_it(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    with pytest.raises(RuntimeError), store.batch():
        store.write_derived("s1", {1: ({"deploy": 1.0}, [])}, 1)
        raise RuntimeError("crash before the commit")
    assert store.session("s1").derived_seq == 0 and store.tag_counts("s1") == {}


def test_live_tokens_follow_appends_compaction_forks_and_loads(
    memory_store: MemoryStorage,
) -> None:
    store = filled(memory_store)  # 6 turns
    assert store.active_tokens("s1") == _live(store, "s1")
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="x", full_text="")], 3)
    assert store.active_tokens("s1") == _live(store, "s1") < sum(len(t) for t in TOPICS)
    store.commit_exchange("s1", messages(["a later question", "its answer"]))
    store.append_turns("s1", messages(["one more"]))
    assert store.active_tokens("s1") == _live(store, "s1")
    assert store.begin_derive("s1").live_tokens == _live(store, "s1")
    for upto in (1, 4, 9):  # before, across and after the segment
        branch = store.fork("s1", upto)
        assert store.active_tokens(branch) == _live(store, branch)
        store.append_turns(branch, messages(["on the branch"]))
        assert store.active_tokens(branch) == _live(store, branch)
    dump = store.transfer.dump_session("s1")
    store.delete_session("s1")
    assert store.active_tokens("s1") == 0
    store.transfer.load_session(dump)
    assert store.active_tokens("s1") == _live(store, "s1") > 0


def test_another_store_objects_derive_moves_the_generation_this_one_sees(
    open_store: StoreFactory,
) -> None:
    store, other = open_store(), open_store()
    filled(store)
    version = store.session_version("s1")
    assert version is not None
    before, after = other.write_derived("s1", {3: ({"lunch": 1.0}, [])}, 3)
    assert before == version[1] and store.session_version("s1") == (version[0], after)
    pending = store.begin_derive("s1", context=1)
    assert pending.record.derived_seq == 3 and [s for s, *_ in pending.turns] == [3, 4, 5, 6]
