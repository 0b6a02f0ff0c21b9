"""Conformance: the tag counts a store keeps on write (``tag_counts`` without bounds,
``topic_counts`` and ``vocab.related_tag_counts``) always equal a count of the tag rows
themselves, through every write that touches tags, segments or the watermark: tags set,
replaced, re-weighted and turned into related tags, compaction, a fork, a dump loaded back
and a session deleted and written again.
"""

from __future__ import annotations

from collections import Counter

from contextfold.store.conformance.memory_support import filled
from contextfold.store.models import NewSegment
from contextfold.store.protocols import MemoryStorage


def _counted(store: MemoryStorage, sid: str) -> tuple[dict[str, int], int, dict[str, int]]:
    """From the rows: every tag's turns, the watermark, and the topic counts (compacted turns
    per tag, for the tags some segment carries)."""
    turns = store.turns(sid)
    watermark = store.session(sid).compaction_watermark
    in_segments = {tag for seg in store.segments(sid) for tag in seg.tags}
    every = Counter(tag for t in turns for tag in t.tags)
    compacted = Counter(tag for t in turns if t.seq < watermark for tag in t.tags)
    return dict(every), watermark, {t: n for t, n in compacted.items() if t in in_segments}


def _agrees(store: MemoryStorage, sid: str) -> None:
    every, watermark, topics = _counted(store, sid)
    assert store.tag_counts(sid) == every
    assert store.topic_counts(sid) == (watermark, topics)
    assert store.tag_counts(sid, before=watermark) == dict(
        Counter(tag for t in store.turns(sid) if t.seq < watermark for tag in t.tags)
    )
    related = Counter(tag for t in store.turns(sid) for tag in t.related_tags)
    assert store.vocab.related_tag_counts(sid) == dict(sorted(related.items()))


def test_kept_tag_counts_follow_every_write(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    assert store.tag_counts("s1") == {} and store.topic_counts("s1") == (0, {})
    store.set_tags_many(
        "s1",
        {
            1: ({"deploy": 1.0, "billing": 0.9}, ["release"]),
            2: ({"database": 1.0, "invoices": 0.9}, []),
            3: ({"billing": 1.0}, ["deploy"]),
            4: ({"lunch": 1.0}, []),
        },
    )
    _agrees(store, "s1")
    store.tag_turn("s1", 2, "database", 0.3)  # re-weighted: no new turn
    store.tag_turn("s1", 5, "billing")
    store.set_turn_tags("s1", 1, {"billing": 1.0}, related=["deploy"])  # deploy now related
    store.set_tags_many("s1", {4: ({}, ["lunch"]), 6: ({"deploy": 1.0}, [])})
    _agrees(store, "s1")
    segment = NewSegment(
        first_seq=1, last_seq=3, summary="s", full_text="", tags=("billing", "database")
    )
    store.compact("s1", [segment], 4)
    _agrees(store, "s1")
    assert store.topic_counts("s1") == (4, {"billing": 2, "database": 1})
    store.set_turn_tags("s1", 2, {"invoices": 1.0})  # a compacted turn re-tagged
    store.compact(
        "s1", [NewSegment(first_seq=4, last_seq=5, summary="t", full_text="", tags=("lunch",))], 6
    )
    _agrees(store, "s1")


def test_kept_tag_counts_of_forks_loads_and_rewritten_sessions(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.set_tags_many(
        "s1", {seq: ({"billing": 1.0, f"t{seq % 2}": 0.9}, ["x"]) for seq in range(1, 7)}
    )
    store.compact(
        "s1", [NewSegment(first_seq=1, last_seq=3, summary="s", full_text="", tags=("t1",))], 4
    )
    branch = store.fork("s1", 5)
    _agrees(store, branch)
    assert store.tag_counts(branch) == {"billing": 5, "t0": 2, "t1": 3}
    assert store.vocab.related_tag_counts(branch) == {"x": 5}
    _agrees(store, "s1")
    dump = store.transfer.dump_session("s1")
    assert store.delete_session("s1")
    store.transfer.load_session(dump)
    _agrees(store, "s1")
    assert store.topic_counts("s1") == (4, {"t1": 2})
    store.delete_session("s1")
    filled(store)  # the same id written again starts from nothing
    assert store.vocab.related_tag_counts("s1") == {}
    assert store.tag_counts("s1") == {} and store.topic_counts("s1") == (0, {})
    _agrees(store, branch)


def test_tag_summaries_of_some_tags(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.set_tags_many("s1", {1: ({"billing": 1.0}, []), 5: ({"billing": 1.0}, [])})
    for tag in ("billing", "deploy", "lunch"):
        store.paging.upsert_tag_summary("s1", tag, f"all about {tag}", 2)
    every = store.paging.tag_summaries("s1")
    some = store.paging.tag_summaries("s1", tags=["lunch", "billing", "nothing"])
    assert sorted(some) == ["billing", "lunch"]
    assert some == {tag: every[tag] for tag in ("billing", "lunch")}
    assert some["billing"].stale  # tagged on turn 5, after the summary's watermark 2
    assert store.paging.tag_summaries("s1", tags=[]) == {}
