"""Conformance: compaction (segments and watermark in one transaction, all or nothing, even
when the writer is killed), segments, tag summaries, ids that only grow."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

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
from contextfold.tokens import CharCounter


def _segment(first: int, last: int) -> NewSegment:
    return NewSegment(first_seq=first, last_seq=last, summary="x", full_text="")


_CHILD = """
import sys, time
from contextfold.store import open_memory_store
from contextfold.store.models import NewSegment
from contextfold.tokens import CharCounter

def hook():
    print("READY", flush=True)
    time.sleep(60)

store = open_memory_store(sys.argv[1], counter=CharCounter())
segment = NewSegment(first_seq=1, last_seq=4, summary="billing and kubernetes", full_text="...")
store.compact("s1", [segment], 5, _before_commit=hook)
print("COMMITTED", flush=True)
"""


def test_compaction_killed_mid_transaction_leaves_the_old_state(open_store: StoreFactory) -> None:
    store = filled(open_store())
    before = store.turns("s1")
    store.close()
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), open_store.location],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    with child.stdout:
        ready = child.stdout.readline().strip()  # segments inserted, watermark not moved
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    assert ready == "READY"
    after = open_store()
    assert after.turns("s1") == before
    assert after.segments("s1") == [] and after.session("s1").compaction_watermark == 0
    assert after.search_segments("s1", "kubernetes") == []
    after.compact("s1", [NewSegment(first_seq=1, last_seq=4, summary="s", full_text="")], 5)
    assert after.session("s1").compaction_watermark == 5


def test_an_exception_inside_compaction_rolls_everything_back(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)

    def boom() -> None:
        raise RuntimeError("summarizer crashed")

    segment = NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="")
    with pytest.raises(RuntimeError, match="summarizer crashed"):
        store.compact("s1", [segment], 3, _before_commit=boom)
    assert store.segments("s1") == [] and store.session("s1").compaction_watermark == 0
    assert store.search_segments("s1", "deploy") == []
    assert len(store.turns("s1")) == len(TOPICS)
    assert store.active_tokens("s1") == sum(t.token_count for t in store.turns("s1"))
    # The same compaction goes through afterwards, its segment covering exactly its turns.
    [segment_id] = store.compact("s1", [segment], 3)
    [stored] = store.segments("s1")
    assert (stored.id, stored.seqs) == (segment_id, (1, 2))
    assert store.session("s1").compaction_watermark == 3


def test_compaction_moves_the_watermark_with_its_segments(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    first = NewSegment(first_seq=1, last_seq=3, summary="a", full_text="t", tags=("deploy",))
    [segment_id] = store.compact("s1", [first], 4)
    assert store.session("s1").compaction_watermark == 4
    [stored] = store.segments("s1")
    assert (stored.id, stored.seqs, stored.tags) == (segment_id, (1, 2, 3), ("deploy",))
    store.compact("s1", [NewSegment(first_seq=4, last_seq=6, summary="b", full_text="")], 7)
    assert [s.first_seq for s in store.segments("s1")] == [1, 4]
    assert len(store.turns("s1")) == len(TOPICS)  # raw turns are never removed


def test_segments_are_stored_as_given(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    given = [
        NewSegment(
            first_seq=1,
            last_seq=2,
            summary="Deploy on Friday.",
            full_text="user: deploy\nassistant: ok",
            tags=("deploy", "billing"),
            related_tags=("release",),
            summary_tokens=7,
            full_tokens=11,
        ),
        NewSegment(first_seq=3, last_seq=3, summary="Pods restart.", full_text="full"),
    ]
    ids = store.compact("s1", given, 5)  # turn 4 compacted without a segment
    assert len(ids) == 2 and ids[0] < ids[1]
    first, second = store.segments("s1")
    assert (first.id, first.session_id, first.first_seq, first.last_seq) == (ids[0], "s1", 1, 2)
    assert (first.summary, first.full_text) == (given[0].summary, given[0].full_text)
    assert (first.tags, first.related_tags) == (("deploy", "billing"), ("release",))
    assert first.seqs == (1, 2)
    assert (first.summary_tokens, first.full_tokens) == (7, 11)
    counter = CharCounter()
    assert second.summary_tokens == counter.count("Pods restart.")
    assert second.full_tokens == counter.count("full")
    assert (second.id, second.seqs, second.tags) == (ids[1], (3,), ())
    assert first.created_at.tzinfo is not None
    assert store.compact("s1", [], 5) == [] and store.session("s1").compaction_watermark == 5
    with pytest.raises(ConfigError, match="unknown session"):
        store.compact("nope", [], 0)


@pytest.mark.parametrize(
    ("segments", "watermark", "message"),
    [
        ([], 8, "beyond the last turn"),
        ([], 2, "only moves forward"),
        ([NewSegment(first_seq=2, last_seq=5, summary="", full_text="")], 5, "not within"),
        ([NewSegment(first_seq=3, last_seq=4, summary="", full_text="")], 6, "not within"),
    ],
)
def test_compaction_refuses_an_invalid_watermark_or_segment(
    memory_store: MemoryStorage, segments: list[NewSegment], watermark: int, message: str
) -> None:
    store = filled(memory_store)
    store.compact("s1", [NewSegment(first_seq=1, last_seq=3, summary="", full_text="")], 4)
    with pytest.raises(ConfigError, match=message):
        store.compact("s1", segments, watermark)
    assert len(store.segments("s1")) == 1 and store.session("s1").compaction_watermark == 4


def test_a_refused_segment_refuses_the_whole_compaction(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    good = NewSegment(first_seq=1, last_seq=2, summary="kiln", full_text="")
    bad = NewSegment(first_seq=3, last_seq=9, summary="glaze", full_text="")
    with pytest.raises(ConfigError):
        store.compact("s1", [good, bad], 5)
    assert store.segments("s1") == [] and store.session("s1").compaction_watermark == 0
    assert store.search_segments("s1", "kiln") == []


def test_segment_ids_only_grow_also_after_deletes(memory_store: MemoryStorage) -> None:
    store = memory_store
    seen: list[int] = []
    for sid in ("a", "b"):
        store.create_session(sid)
        store.append_turns(sid, messages(["one", "two", "three"]))
        seen += store.compact(sid, [_segment(1, 2)], 3)
    assert seen == sorted(seen) and len(set(seen)) == 2
    store.delete_session("b")  # the newest segment goes with it
    store.create_session("c")
    store.append_turns("c", messages(["one", "two"]))
    [fresh] = store.compact("c", [_segment(1, 1)], 2)
    assert fresh > max(seen)


def test_job_ids_only_grow_also_after_deletes(memory_store: MemoryStorage) -> None:
    store = memory_store
    ids: list[int] = []
    for n in range(3):
        sid = store.create_session(f"s{n}")
        exchange(store, sid, n)
        job = store.jobs.claim_job("w")
        assert job is not None
        ids.append(job.id)
        assert store.jobs.finish_job(job.id, "w")  # the newest job's row is gone
    store.jobs.enqueue_job("s2")
    store.delete_session("s2")  # so is a pending one, with its session
    exchange(store, "s1", 9)
    job = store.jobs.claim_job("w")
    assert job is not None and ids == sorted(ids) and len(set(ids)) == 3
    assert job.id > max(ids) + 1  # past the deleted pending job's id too


# -- tag summaries --------------------------------------------------------------------------------


def test_tag_summary_becomes_stale_when_its_tag_gets_a_newer_turn(
    memory_store: MemoryStorage,
) -> None:
    store = filled(memory_store)
    for seq in (1, 3):
        store.tag_turn("s1", seq, "kubernetes")
    store.paging.upsert_tag_summary("s1", "kubernetes", "Deploy Friday; pods restart.", 3)
    assert store.paging.tag_summaries("s1")["kubernetes"].stale is False
    store.tag_turn("s1", 4, "lunch")  # another tag's turn does not matter
    assert store.paging.tag_summaries("s1")["kubernetes"].stale is False
    store.tag_turn("s1", 5, "kubernetes")
    assert store.paging.tag_summaries("s1")["kubernetes"].stale is True
    store.paging.upsert_tag_summary("s1", "kubernetes", "Updated.", 5, tokens=3)
    summary = store.paging.tag_summaries("s1")["kubernetes"]
    assert (summary.stale, summary.tokens, summary.summary) == (False, 3, "Updated.")


def test_tag_summaries_read_back_by_tag(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.set_tags_many("s1", {6: ({"ops": 1.0}, ["billing"])})
    store.paging.upsert_tag_summary("s1", "lunch", "Ramen or tacos.", 4)
    store.paging.upsert_tag_summary("s1", "billing", "Nightly cron.", 2)
    got = store.paging.tag_summaries("s1")
    assert list(got) == ["billing", "lunch"]
    billing = got["billing"]
    assert (billing.session_id, billing.tag, billing.summary) == ("s1", "billing", "Nightly cron.")
    assert billing.tokens == CharCounter().count("Nightly cron.")
    assert billing.source_watermark == 2
    assert billing.stale is False  # a related tag on a later turn does not make it stale
    assert store.paging.tag_summaries("other") == {}


def _since_summary_from_all(store: MemoryStorage, sid: str) -> dict[str, list[str]]:
    """``segments_since_summary`` worked out from every segment (the rule it keeps)."""
    current = store.paging.tag_summaries(sid)
    out: dict[str, list[str]] = {}
    for seg in store.segments(sid):
        for tag in seg.tags:
            if tag not in current or seg.last_seq > current[tag].source_watermark:
                out.setdefault(tag, []).append(seg.summary)
    return out


def _since(store: MemoryStorage, sid: str, tags: list[str] | None = None) -> dict[str, list[str]]:
    """``segments_since_summary``'s segment summaries by tag."""
    read = store.paging.segments_since_summary(sid, tags)
    assert all(r.tag == tag and r.segments for tag, r in read.items())
    return {tag: list(r.segments) for tag, r in read.items()}


def test_segments_since_summary_reads_each_tags_segments_after_its_summary(
    memory_store: MemoryStorage,
) -> None:
    """The input of a tag summary's roll-forward, read per tag: the summaries of the tag's
    segments compacted after its summary's watermark (all of them for a tag with no summary),
    earliest first; the same as working it out from every segment, at every step."""
    store = filled(memory_store)
    store.append_turns("s1", messages(TOPICS))  # 12 turns
    paging = store.paging
    assert _since(store, "s1") == {}
    store.compact(
        "s1",
        [
            NewSegment(first_seq=1, last_seq=2, summary="a", full_text="", tags=("k8s", "ops")),
            NewSegment(first_seq=3, last_seq=4, summary="b", full_text="", tags=("lunch",)),
        ],
        5,
    )
    assert _since(store, "s1") == {"k8s": ["a"], "ops": ["a"], "lunch": ["b"]}
    assert _since(store, "s1") == _since_summary_from_all(store, "s1")
    for tag in ("k8s", "ops", "lunch"):
        paging.upsert_tag_summary("s1", tag, f"{tag} so far", 4)
    assert _since(store, "s1") == {}
    store.compact(
        "s1",
        [
            NewSegment(first_seq=5, last_seq=7, summary="c", full_text="", tags=("k8s", "new")),
            NewSegment(first_seq=8, last_seq=9, summary="d", full_text="", tags=("k8s",)),
        ],
        10,
    )
    expected = {"k8s": ["c", "d"], "new": ["c"]}
    assert _since(store, "s1") == expected
    assert _since(store, "s1") == _since_summary_from_all(store, "s1")
    assert _since(store, "s1", ["new", "lunch", "absent"]) == {"new": ["c"]}
    assert _since(store, "s1", []) == {}
    paging.upsert_tag_summary("s1", "k8s", "k8s later", 7)  # covers segment c, not d
    assert _since(store, "s1", ["k8s"]) == {"k8s": ["d"]}
    assert _since(store, "s1") == _since_summary_from_all(store, "s1")
    assert _since(store, "other") == {}


def test_segments_since_summary_finds_an_old_segment_of_a_tag_never_summarised(
    memory_store: MemoryStorage,
) -> None:
    """A tag whose segments are all older than every other summary's watermark, and that has
    no summary of its own, still gets all of them."""
    store = filled(memory_store)
    store.compact(
        "s1", [NewSegment(first_seq=1, last_seq=2, summary="a", full_text="", tags=("old",))], 3
    )
    store.compact(
        "s1", [NewSegment(first_seq=3, last_seq=4, summary="b", full_text="", tags=("k8s",))], 5
    )
    store.paging.upsert_tag_summary("s1", "k8s", "k8s so far", 4)
    assert _since(store, "s1") == {"old": ["a"]}
    assert _since(store, "s1", ["old"]) == {"old": ["a"]}
    assert _since(store, "s1", ["k8s"]) == {}


def test_segments_since_summary_reads_the_summary_with_its_segments(
    memory_store: MemoryStorage,
) -> None:
    """Per tag, the summary as stored (none for a tag never summarised), the segments past
    its watermark and the largest ``last_seq`` among them: the watermark a summary rolled
    forward from exactly these covers (not the session's watermark, which may have moved on
    past segments not read)."""
    store = filled(memory_store)
    store.append_turns("s1", messages(TOPICS))
    seg = NewSegment
    store.compact("s1", [seg(first_seq=1, last_seq=2, summary="a", full_text="", tags=("k8s",))], 3)
    store.paging.upsert_tag_summary("s1", "k8s", "k8s so far", 2)
    store.compact(
        "s1",
        [
            seg(first_seq=3, last_seq=4, summary="b", full_text="", tags=("k8s", "new")),
            seg(first_seq=5, last_seq=6, summary="c", full_text="", tags=("new",)),
            seg(first_seq=7, last_seq=9, summary="d", full_text="", tags=("lunch",)),
        ],
        10,
    )
    read = store.paging.segments_since_summary("s1")
    assert sorted(read) == ["k8s", "lunch", "new"]
    k8s, new = read["k8s"], read["new"]
    assert (k8s.summary, k8s.source_watermark, k8s.segments, k8s.last_seq) == (
        "k8s so far",
        2,
        ("b",),
        4,
    )
    assert (new.summary, new.source_watermark, new.segments, new.last_seq) == (
        None,
        None,
        ("b", "c"),
        6,
    )
    assert read["lunch"].last_seq == 9
    # A summary at the newest segment's last_seq is current: nothing to read for it.
    assert store.paging.upsert_tag_summary("s1", "new", "new so far", 6, replaces=None)
    assert sorted(store.paging.segments_since_summary("s1")) == ["k8s", "lunch"]
    assert store.paging.segments_since_summary("s1", ["new"]) == {}


def test_upsert_tag_summary_is_a_compare_and_set_with_replaces(
    memory_store: MemoryStorage,
) -> None:
    """With ``replaces`` the write happens only while the stored summary is the one read
    (its watermark; ``None``: no summary yet), and says whether it did; without, it always
    writes."""
    store = filled(memory_store)
    paging = store.paging
    assert paging.upsert_tag_summary("s1", "k8s", "first", 2, replaces=None) is True
    assert paging.upsert_tag_summary("s1", "k8s", "lost", 3, replaces=None) is False
    assert paging.upsert_tag_summary("s1", "k8s", "stale read", 4, replaces=1) is False
    assert paging.tag_summaries("s1")["k8s"].summary == "first"
    assert paging.upsert_tag_summary("s1", "k8s", "second", 4, replaces=2) is True
    assert paging.upsert_tag_summary("s1", "k8s", "late", 3, replaces=2) is False
    got = paging.tag_summaries("s1")["k8s"]
    assert (got.summary, got.source_watermark) == ("second", 4)
    assert got.tokens == CharCounter().count("second")
    assert paging.upsert_tag_summary("s1", "k8s", "forced", 1) is True
    assert paging.tag_summaries("s1")["k8s"].source_watermark == 1


def test_segments_since_summary_sees_segments_written_after_a_summary_newer_than_them(
    memory_store: MemoryStorage,
) -> None:
    """The per-tag check follows every segment write: a summary stored past a tag's segments,
    then a new segment of that tag (also on a fork, whose segments are copies), is read."""
    store = filled(memory_store)
    store.append_turns("s1", messages(TOPICS))
    seg = NewSegment
    store.compact("s1", [seg(first_seq=1, last_seq=2, summary="a", full_text="", tags=("k8s",))], 3)
    store.paging.upsert_tag_summary("s1", "k8s", "ahead", 5)
    assert _since(store, "s1") == {}
    store.compact("s1", [seg(first_seq=3, last_seq=5, summary="b", full_text="", tags=("k8s",))], 6)
    assert _since(store, "s1") == {}  # ends at the summary's watermark: taken in
    store.compact("s1", [seg(first_seq=6, last_seq=7, summary="c", full_text="", tags=("k8s",))], 8)
    assert _since(store, "s1") == {"k8s": ["c"]}
    store.fork("s1", 9, session_id_new="f")
    assert _since(store, "f") == {"k8s": ["a", "b", "c"]}
    store.paging.upsert_tag_summary("f", "k8s", "fork", 7)
    assert _since(store, "f") == {}
    assert _since(store, "s1") == _since_summary_from_all(store, "s1")


def test_segments_read_by_tag_and_without_their_full_text(memory_store: MemoryStorage) -> None:
    """``segments(tag=)`` is the segments carrying the tag, as filtering all of them gives,
    with their source turns; ``full_text=False`` leaves only the full text out."""
    store = filled(memory_store)
    store.compact(
        "s1",
        [
            NewSegment(first_seq=1, last_seq=2, summary="a", full_text="A A", tags=("k8s",)),
            NewSegment(first_seq=3, last_seq=4, summary="b", full_text="B B", tags=("lunch",)),
            NewSegment(first_seq=5, last_seq=5, summary="c", full_text="C", tags=("lunch", "k8s")),
        ],
        6,
    )
    every = store.segments("s1")
    for tag in ("k8s", "lunch"):
        assert store.segments("s1", tag=tag) == [s for s in every if tag in s.tags]
    assert [s.seqs for s in store.segments("s1", tag="k8s")] == [(1, 2), (5,)]
    assert store.segments("s1", tag="absent") == [] and store.segments("other", tag="k8s") == []
    light = store.segments("s1", full_text=False)
    assert [s.full_text for s in light] == ["", "", ""]
    assert [s.model_copy(update={"full_text": ""}) for s in every] == light
    assert [s.full_tokens for s in light] == [s.full_tokens for s in every] != [0, 0, 0]
    assert [s.id for s in store.segments("s1", tag="lunch", full_text=False)] == [
        every[1].id,
        every[2].id,
    ]


def test_segments_since_summary_agrees_with_every_segment_through_random_writes(
    memory_store: MemoryStorage,
) -> None:
    """Differential: over random compactions, forks and summary writes at any watermark, with
    and without a tag filter, the per-tag check (kept counters) and the read agree with the
    rule worked out from every segment."""
    import random

    store, rng, sessions, n = memory_store, random.Random(7), ["s0"], 0
    every = ["a", "b", "c", "d", "e"]
    store.create_session("s0")
    store.append_turns("s0", messages([f"t{i}" for i in range(120)]))
    for step in range(40):
        sid, op = rng.choice(sessions), rng.random()
        watermark, last = store.session(sid).compaction_watermark, store.last_seq(sid)
        if op < 0.45 and watermark < last:
            lo = max(watermark, 1)
            hi = min(last, lo + rng.randint(0, 6))
            tags = tuple(rng.sample(every, rng.randint(0, 3)))
            n += 1
            segment = NewSegment(
                first_seq=lo, last_seq=hi, summary=f"x{n}", full_text="", tags=tags
            )
            store.compact(sid, [segment], hi + 1)
        elif op < 0.75:
            mark = rng.randint(-1, max(watermark, 0) + 3)
            store.paging.upsert_tag_summary(sid, rng.choice(every), f"sum{step}", mark)
        elif op < 0.85 and last > 2:
            sessions.append(f"s{len(sessions)}")
            store.fork(sid, rng.randint(1, last), session_id_new=sessions[-1])
        for s in sessions:
            assert _since(store, s) == _since_summary_from_all(store, s), (step, s)
            sub = rng.sample(every, 2)
            expected = {t: v for t, v in _since_summary_from_all(store, s).items() if t in sub}
            assert _since(store, s, sub) == expected, (step, s, sub)
