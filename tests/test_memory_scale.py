"""Recall work bounded by what changed, not by the conversation's length (issue 22): what a
recall reads, and the bounds of its caches. Speed itself is measured by
benchmarks/bench_memory_scale.py, not here."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.recall import Recaller
from contextfold.memory.summarize import ExtractiveSummarizer
from contextfold.memory.turn_index import SessionVectors
from contextfold.store.conformance.memory_support import stored
from contextfold.store.models import NewSegment, TagRollForward, vector_matrix
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import CharCounter, TiktokenCounter


def _engine(store: MemoryStore | Path | None = None, **recall: object) -> MemoryEngine:
    cfg = MemoryConfig.model_validate({"recall": recall} if recall else {})
    if store is None or isinstance(store, Path):
        store = MemoryStore(store or ":memory:", counter=CharCounter())
    return MemoryEngine(cfg, store=store, embedder=HashEmbedder(dim=64), counter=CharCounter())


def _pairs(start: int, count: int) -> list[dict[str, str]]:
    out = []
    for i in range(start, start + count):
        out += [
            {"role": "user", "content": f"Shipment {i} of walnut veneer arrives at dock {i % 7}."},
            {"role": "assistant", "content": f"Logged shipment {i} for dock {i % 7}."},
        ]
    return out


def _spy(store: MemoryStore) -> list[int]:
    calls: list[int] = []
    original = store.turns_without_vectors

    def spy(session_id: str, model: str, *, after: int = 0) -> list[tuple[int, str]]:
        calls.append(after)
        return original(session_id, model, after=after)

    store.turns_without_vectors = spy  # type: ignore[method-assign]
    return calls


def test_recall_on_an_embedded_session_reads_no_turn_for_missing_vectors() -> None:
    engine = _engine()
    engine.on_turn_complete(_pairs(0, 20))  # derived: tagged and embedded
    calls = _spy(engine.store)
    assert engine.on_message_inbound("Which dock took the walnut veneer?").recalled
    assert calls == []  # nothing to embed: the scan over the session's turns is not run


def test_recall_never_embeds_stored_turns_and_says_how_many_wait_for_vectors() -> None:
    engine = _engine()
    engine.on_turn_complete(_pairs(0, 20))
    last = engine.store.last_seq("default")
    assert engine.on_message_inbound("walnut veneer").unembedded == 0
    engine.store_turns("default", [engine_message("Shipment 99 of teak arrives at dock 3.")])
    calls = _spy(engine.store)
    added = _count_calls(engine.store, "add_turn_vectors")
    assembled = engine.on_message_inbound("teak shipment 99")
    assert calls == [] and added == []  # no missing-vector scan, nothing embedded
    assert assembled.unembedded == 1
    new = [r for r in assembled.recalled if r.seq == last + 1]
    assert new and "fts" in new[0].ranks and "dense" not in new[0].ranks  # found by its text
    engine.derive()  # the derived work embeds it, from the last vector on
    assert calls == [last]
    assembled = engine.on_message_inbound("teak shipment 99")
    assert assembled.unembedded == 0
    assert any(r.seq == last + 1 and "dense" in r.ranks for r in assembled.recalled)


def engine_message(text: str) -> Any:
    from contextfold.items import Message

    return Message(role="user", content=text)


def test_an_engine_sees_the_vectors_another_engine_wrote_to_the_same_store(
    tmp_path: Path,
) -> None:
    reader = _engine(tmp_path / "m.db")  # it ranks by the vectors stored
    writer = _engine(tmp_path / "m.db")
    writer.on_turn_complete(_pairs(0, 10))
    assert reader.on_message_inbound("walnut veneer").recalled  # its cache now holds 20 turns
    writer.on_turn_complete(_pairs(10, 5))
    recalled = reader.on_message_inbound("Shipment 12 walnut dock 5").recalled
    dense = {r.seq for r in recalled if "dense" in r.ranks}
    assert dense and max(dense) > 20  # the new turns' vectors were read


def test_the_vector_cache_holds_its_limit_and_recalls_as_an_unbounded_one() -> None:
    store = MemoryStore(counter=CharCounter())
    # 64 floats x 4 bytes a turn: each session's 40 turns are 10 KiB; the cache holds 24 KiB.
    small = _engine(store, vector_cache_mb=24 / 1024)
    big = _engine(store)
    sessions = [f"s{n}" for n in range(5)]
    for sid in sessions:
        small.on_turn_complete(_pairs(0, 20), session_id=sid)
    for _ in range(2):
        for sid in sessions:
            a = small.on_message_inbound("walnut dock 3", session_id=sid)
            b = big.on_message_inbound("walnut dock 3", session_id=sid)
            assert a.recalled == b.recalled and a.prepend_text == b.prepend_text
            assert small.recaller.vector_cache_bytes() <= 24 * 1024
    assert small.recaller.vector_cache_bytes() > 0
    # A session whose vectors pass the whole cache is served from the store, its vectors not
    # cached (its token counts, 4 bytes a turn, fit).
    tiny = _engine(store, vector_cache_mb=1 / 1024)
    assert tiny.on_message_inbound("walnut dock 3", session_id="s0").recalled
    assert not tiny.recaller._vectors and tiny.recaller.vector_cache_bytes() <= 1024


def test_the_vector_cache_holds_at_most_cached_sessions_sessions() -> None:
    store = MemoryStore(counter=CharCounter())
    cfg = MemoryConfig.model_validate({"cached_sessions": 2})
    engine = MemoryEngine(cfg, store=store, embedder=HashEmbedder(dim=64), counter=CharCounter())
    for sid in ("a", "b", "c", "d"):
        engine.on_turn_complete(_pairs(0, 5), session_id=sid)
        assert engine.on_message_inbound("walnut dock 3", session_id=sid).recalled
        assert len(engine.recaller._vectors) <= 2
    assert list(engine.recaller._vectors) == ["c", "d"]


def _count_calls(store: MemoryStore, name: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    original = getattr(store, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(*args, **kwargs)

    setattr(store, name, spy)
    return calls


def _compacting(**cfg: object) -> MemoryEngine:
    config = MemoryConfig.model_validate(
        {"context_window": 512, "compaction": {"protected_recent_turns": 4}, **cfg}
    )
    store = MemoryStore(counter=CharCounter())
    return MemoryEngine(config, store=store, embedder=None, counter=CharCounter())


def test_topics_after_a_compaction_read_the_kept_counts_not_the_turns() -> None:
    engine = _compacting()
    fresh = _compacting()
    for start in range(0, 60, 4):
        engine.on_turn_complete(_pairs(start, 4))
        fresh.on_turn_complete(_pairs(start, 4))
        engine.on_message_inbound("walnut veneer")
    counts = _count_calls(engine.store, "tag_counts")
    topics = _count_calls(engine.store, "topic_counts")
    last_seen = _count_calls(engine.store, "tag_last_seen")
    before = engine.store.session("default").compaction_watermark
    engine.on_turn_complete(_pairs(60, 30))
    fresh.on_turn_complete(_pairs(60, 30))
    after = engine.store.session("default").compaction_watermark
    assert after > before > 0
    segments = _count_calls(engine.store, "segments")  # (the compaction reads them)
    a = engine.on_message_inbound("walnut veneer dock 4")
    # no tag has a TTL rule: when a tag was last seen is never read; the compacted turns'
    # tag counts are the store's kept counts, read once (one row per tag), and neither the
    # tag rows nor the segments are read for them
    assert last_seen == [] and segments == []
    assert [c for c in counts if c.get("before") is not None] == []
    assert len(topics) == 1
    b = fresh.on_message_inbound("walnut veneer dock 4")  # its topics built in one read
    assert a.prepend_text == b.prepend_text


def test_a_compaction_reads_again_what_it_changed_so_the_next_recall_does_not() -> None:
    """The session's tag counts, related-tag counts and compacted topics' counts are kept per
    generation, which a compaction draws anew: the compaction reads them again itself
    (``MemoryEngine._rewarm``), and the recall after it reads none of them. A write after the
    compaction still makes the recall read them."""
    engine = _compacting()
    fresh = _compacting()
    for start in range(0, 60, 4):
        for one in (engine, fresh):
            one.on_turn_complete(_pairs(start, 4))
        engine.on_message_inbound("walnut veneer")
    before = engine.store.session("default").compaction_watermark
    for one in (engine, fresh):
        one.on_turn_complete(_pairs(60, 30))  # trips a compaction
    assert engine.store.session("default").compaction_watermark > before > 0
    names = ("tag_counts", "topic_counts", "segments")
    reads = {name: _count_calls(engine.store, name) for name in names}
    related = _count_calls(engine.store.vocab, "related_tag_counts")  # type: ignore[arg-type]
    a = engine.on_message_inbound("walnut veneer dock 4")
    assert related == [] and all(calls == [] for calls in reads.values()), (related, reads)
    assert a.prepend_text == fresh.on_message_inbound("walnut veneer dock 4").prepend_text
    # a write after the compaction the engine did not make (as another process's would be):
    # the recall reads them again
    engine.store.set_tags_many("default", {1: ({"teak": 1.0}, ["oak"])})
    b = engine.on_message_inbound("teak oak walnut veneer")
    assert reads["tag_counts"] and related
    assert "teak" in engine.vocabulary() and b.matched_tags


def test_a_session_deleted_as_its_compaction_ends_does_not_fail_the_compaction() -> None:
    config = MemoryConfig.model_validate({"compaction": {"protected_recent_turns": 4}})
    store = MemoryStore(counter=CharCounter())
    engine = MemoryEngine(config, store=store, embedder=None, counter=CharCounter())
    engine.on_turn_complete(_pairs(0, 40))  # under the thresholds: compacted below, by hand
    real = engine.assembler.rewarm

    def deleted_first(sid: str) -> None:
        engine.store.delete_session(sid)  # another process, between the writes and the rewarm
        real(sid)

    engine.assembler.rewarm = deleted_first  # type: ignore[method-assign]
    report = engine.compact()
    assert report is not None and report.turns_compacted > 0


def test_ttl_rules_read_when_only_their_tags_were_last_seen() -> None:
    engine = _compacting(tag_rules=[{"match": "shipment*", "ttl_days": 30}])
    last_seen = _count_calls(engine.store, "tag_last_seen")
    engine.on_turn_complete(_pairs(0, 40))
    engine.on_message_inbound("walnut veneer")
    assert last_seen and all(
        all(t.startswith("shipment") for t in call["tags"]) for call in last_seen
    )


def test_tag_candidates_are_capped_and_the_kept_ones_ranked_as_uncapped() -> None:
    capped = _compacting(recall={"tag_limit": 10})
    whole = _compacting(recall={"tag_limit": None})
    for engine in (capped, whole):
        engine.on_turn_complete(_pairs(0, 30))
        engine.on_turn_complete([{"role": "user", "content": "Shipment 7 walnut dock 3 late."}])
    query = "walnut veneer shipment dock"
    tags = capped.tag_message(query)
    assert tags.tags
    a = capped.recaller.rank("default", query, tags=tags.tags, related=tags.related_tags)
    b = whole.recaller.rank("default", query, tags=tags.tags, related=tags.related_tags)
    tag_ranked_a = {r.seq: r.ranks["tags"] for r in a if "tags" in r.ranks}
    tag_ranked_b = {r.seq: r.ranks["tags"] for r in b if "tags" in r.ranks}
    assert len(tag_ranked_a) == 10 < len(tag_ranked_b)
    assert all(tag_ranked_b[seq] == rank for seq, rank in tag_ranked_a.items())
    # the kept candidates are the uncapped list's head, scaled against the same lowest score
    counts = capped.vocabulary()
    hits_a, low_a = capped.recaller._tag_scores("default", tags.tags, tags.related_tags, counts)
    hits_b, low_b = whole.recaller._tag_scores("default", tags.tags, tags.related_tags, counts)
    assert hits_a == hits_b[:10] and low_a == low_b


class _GatedSummarizer(ExtractiveSummarizer):
    """An extractive summarizer that waits for ``gate`` before each summary."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(CharCounter())
        self.gate = gate

    def summarize(
        self,
        texts: Sequence[str],
        *,
        max_tokens: int,
        tags: Sequence[str] = (),
        instructions: str | None = None,
    ) -> str:
        assert self.gate.wait(30), "the test never opened the gate"
        return super().summarize(texts, max_tokens=max_tokens, tags=tags)


def _background(store: MemoryStore, gate: threading.Event) -> MemoryEngine:
    config = MemoryConfig.model_validate(
        {
            "context_window": 512,
            "compaction": {"protected_recent_turns": 4, "run": "background"},
            "recall": {"embedder": "none"},
        }
    )
    return MemoryEngine(
        config,
        store=store,
        embedder=None,
        counter=CharCounter(),
        summarizer=_GatedSummarizer(gate),
    )


def test_a_compaction_on_turn_complete_trips_runs_as_a_background_job() -> None:
    gate = threading.Event()
    engine = _background(MemoryStore(counter=CharCounter()), gate)
    # The summarizer is held: an inline compaction would never return here.
    assert engine.on_turn_complete(_pairs(0, 40)) is None
    assert engine.store.session("default").compaction_watermark == 0
    assert engine.vocabulary()  # tagged in the call: only the compaction waits
    assert engine.on_message_inbound("walnut veneer dock 3").recalled  # recall goes on
    gate.set()
    assert engine.flush(30)
    assert engine.store.session("default").compaction_watermark > 1
    assert engine.status().level == "none"
    assert engine.store.jobs.pending_jobs() == 0
    engine.close()


def test_a_background_compaction_left_by_a_stopped_engine_is_kept_in_the_store(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    gate.set()
    first = _background(MemoryStore(tmp_path / "m.db", counter=CharCounter()), gate)
    first.background.close()  # stopped before its thread runs anything
    first.on_turn_complete(_pairs(0, 40))
    assert first.store.session("default").compaction_watermark == 0
    assert first.store.jobs.pending_jobs() == 1  # the compaction waits in the store
    first.close()
    store = MemoryStore(tmp_path / "m.db", counter=CharCounter())
    second = _background(store, gate)
    report = second.derive()  # what a job worker runs for the job
    assert report is not None and report.segments_compacted > 0
    assert store.jobs.pending_jobs() == 0
    second.close()


def test_inline_compaction_stays_the_library_default() -> None:
    engine = _compacting()
    reports = [engine.on_turn_complete(_pairs(n, 4)) for n in range(0, 40, 4)]
    assert any(r is not None and r.segments_compacted for r in reports)
    assert engine.background.pending == 0


def test_a_vocabulary_read_again_after_a_compaction_keeps_its_order() -> None:
    engine = _compacting()
    engine.on_turn_complete(_pairs(0, 8))
    before = list(engine.vocabulary())
    indexed: list[bool] = []
    tagger = engine.inbound_tagger
    original = tagger._buckets  # type: ignore[attr-defined]
    group = tagger._group  # type: ignore[attr-defined]
    touched: list[str] = []

    def counted(buckets: Any, tags: Sequence[str]) -> None:
        touched.extend(tags)
        group(buckets, tags)

    tagger._group = counted  # type: ignore[attr-defined]

    def spy(vocabulary: Sequence[str]) -> Any:
        touched.clear()
        groups = original(vocabulary)
        # extended, not rebuilt: only the tags that changed were (un)grouped
        indexed.append(len(touched) < len(vocabulary))  # a rebuild groups every tag
        return groups

    # The first inbound vocabulary (the stored tags with their related tags and aliases) is
    # not the one the stored turns were tagged with: it gets its own index, kept from then on.
    engine.on_message_inbound("walnut veneer")
    tagger._buckets = spy  # type: ignore[attr-defined]
    for start in range(8, 60, 4):  # compactions draw new generations: the counts are re-read
        engine.on_turn_complete(_pairs(start, 4))
    assert engine.store.session("default").compaction_watermark > 0
    after = list(engine.vocabulary())
    assert after[: len(before)] == before  # the first tags first, new ones after
    assert sorted(after) == sorted(engine.store.tag_counts("default"))
    engine.on_message_inbound("walnut veneer dock 4")
    # the tagger's groups were extended (only the new tags grouped), never rebuilt
    assert len(indexed) > 5 and all(indexed)


def test_the_proxy_record_says_when_recall_ran_without_some_vectors() -> None:
    from types import SimpleNamespace

    from contextfold.items import Message
    from contextfold.server.proxy.recall import recall
    from contextfold.server.proxy.record import Plan
    from contextfold.server.proxy.wire import ParsedRequest

    engine = _engine()
    engine.on_turn_complete(_pairs(0, 10))
    engine.store_turns("default", [engine_message("Shipment 77 of teak arrives at dock 2.")])
    plan = Plan(
        id="r1", format="openai", path="/v1/chat/completions", model="m", stream=False,
        session_id="default",
    )  # fmt: skip
    parsed = ParsedRequest([Message(role="user", content="When does the teak arrive?")], [(0,)])
    assembled = recall(SimpleNamespace(memory=engine), plan, parsed)  # type: ignore[arg-type]
    assert assembled is not None and assembled.unembedded == 1
    assert any("1 turn(s) not embedded yet" in note for note in plan.notes)
    engine.derive()
    plan.notes.clear()
    recall(SimpleNamespace(memory=engine), plan, parsed)  # type: ignore[arg-type]
    assert not any("not embedded" in note for note in plan.notes)


def test_common_limit_counts_a_tags_related_rows_too() -> None:
    """A tag on few turns as a primary tag but on many as a related one has many rows to sum:
    ``common_limit`` bounds its rows, so it counts both."""
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *(f"turn {n} about walnut and oak" for n in range(20)))
    store.set_tags_many(
        "s",
        {
            **{seq: ({"walnut": 1.0}, []) for seq in (1, 2, 3)},
            **{seq: ({"oak": 1.0}, ["walnut"]) for seq in range(4, 12)},
            **{seq: ({"teak": 1.0}, ["walnut"]) for seq in range(12, 21)},
        },
    )
    assert store.tag_counts("s")["walnut"] == 3 and store.tag_counts("s")["oak"] == 8
    weights: list[list[str]] = []
    original = store.tag_overlap_scores

    def spy(session_id: str, wanted: Any) -> Any:
        weights.append(list(wanted))
        return original(session_id, wanted)

    store.tag_overlap_scores = spy  # type: ignore[method-assign]
    recaller = Recaller(store, common_limit=10)
    ranked = recaller.rank("s", "walnut oak", tags=["walnut", "oak"])
    # walnut is on 3 turns as a tag and 17 more as a related tag: 20 rows > 10, left out
    assert weights[-1] == ["oak"]
    assert {r.seq for r in ranked if "tags" in r.ranks} == set(range(4, 12))
    # the counts the caller keeps are used as given (the engine passes its cached ones)
    recaller.rank("s", "walnut oak", tags=["walnut", "oak"], related_counts={})
    assert weights[-1] == ["walnut", "oak"]
    assert Recaller(store, common_limit=20).rank("s", "walnut", tags=["walnut"])
    assert weights[-1] == ["walnut"]


def test_words_and_tags_on_more_turns_than_common_limit_are_left_out() -> None:
    limited = _compacting(recall={"common_limit": 10, "tag_limit": None, "common_min_turns": 0})
    whole = _compacting(recall={"common_limit": None, "tag_limit": None})
    weights: list[list[str]] = []
    rare = [
        {"role": "user", "content": "The oak lacquer of shipment 12 cracked: call the supplier."},
        {"role": "assistant", "content": "Noted: the oak lacquer cracked."},
    ]
    for engine in (limited, whole):
        engine.on_turn_complete(_pairs(0, 30))
        engine.on_turn_complete(rare)
        original = engine.store.tag_overlap_scores

        def spy(session_id: str, wanted: Any, _original: Any = original) -> Any:
            weights.append(list(wanted))
            return _original(session_id, wanted)

        engine.store.tag_overlap_scores = spy  # type: ignore[method-assign]
    query = "walnut veneer shipment oak lacquer"
    tags = limited.tag_message(query)
    counts = limited.vocabulary()
    assert any(counts[t] > 10 for t in tags.tags) and any(counts[t] <= 10 for t in tags.tags)
    a = limited.recaller.rank("default", query, tags=tags.tags, related=tags.related_tags)
    b = whole.recaller.rank("default", query, tags=tags.tags, related=tags.related_tags)
    # the tag signal read only the tags on at most 10 turns; unlimited, every tag
    assert weights[0] and all(counts.get(t, 0) <= 10 for t in weights[0])
    assert set(weights[1]) > set(weights[0])
    # the full-text signal searched only the words on at most 10 turns
    store = limited.store
    found = store.search_turn_seqs("default", query, limit=300, common_limit=10)
    assert found and {r.seq for r in a if "fts" in r.ranks} == {seq for seq, _ in found}
    assert len(store.search_turn_seqs("default", query, limit=300)) > len(found)
    assert {r.seq for r in b if "fts" in r.ranks} > {r.seq for r in a if "fts" in r.ranks}


def _segment_rows_read(store: MemoryStore) -> list[int]:
    """Every segment row the store hands back from here on (``segments`` and the paging's
    ``segments_since_summary``, one per tag and segment), one entry per call."""
    rows: list[int] = []
    segments, since = store.segments, store.paging.segments_since_summary

    def spy_segments(session_id: str) -> list[Any]:
        out = segments(session_id)
        rows.append(len(out))
        return out

    def spy_since(session_id: str, tags: Sequence[str] | None = None) -> dict[str, TagRollForward]:
        out = since(session_id, tags)
        rows.append(sum(len(v.segments) for v in out.values()))
        return out

    store.segments = spy_segments  # type: ignore[method-assign]
    store.paging.segments_since_summary = spy_since  # type: ignore[method-assign]
    return rows


def test_a_turn_and_its_compaction_read_only_the_segments_they_add() -> None:
    """Writing to a long compacted session reads the segments the new compactions made, not
    every segment of the session (their full text least of all): what a turn reads does not
    grow with the conversation."""
    engine = _compacting(compaction={"protected_recent_turns": 4, "max_segment_tokens": 100})
    for start in range(0, 80, 4):
        engine.on_turn_complete(_pairs(start, 4))
    store = engine.store
    before = len(store.segments("default"))
    assert before > 12
    rows = _segment_rows_read(store)
    for start in range(80, 100, 4):
        engine.on_turn_complete(_pairs(start, 4))
    read = sum(rows)
    added = len(store.segments("default")) - before
    assert added > 0
    tags_per_segment = max(len(s.tags) for s in store.segments("default"))
    assert read <= added * tags_per_segment, (read, added, before)
    summaries = store.paging.tag_summaries("default")
    assert set(summaries) == {t for s in store.segments("default") for t in s.tags}


def test_the_known_tag_cache_holds_its_limit_and_tags_as_an_unbounded_one() -> None:
    def engine(limit: int) -> MemoryEngine:
        config = MemoryConfig.model_validate({"tagger": {"known_tag_cache": limit}})
        store = MemoryStore(counter=CharCounter())
        return MemoryEngine(config, store=store, embedder=None, counter=CharCounter())

    small, large = engine(8), engine(200_000)
    words = ["walnut", "veneer", "teak", "oak", "maple", "cedar", "birch", "ash", "elm", "pine"]
    history = [
        {"role": "user", "content": f"The {a} and {b} boards for order {n} arrived."}
        for n, (a, b) in enumerate(zip(words, words[1:] + words[:1], strict=True))
    ]
    for eng in (small, large):
        eng.on_turn_complete(history)
    for a in words:
        for b in words[:4]:
            question = f"Where are the {a} {b} boards?"
            assert small.tag_message(question) == large.tag_message(question)
            assert len(small.inbound_tagger._entries) <= 8  # type: ignore[attr-defined]
    assert len(large.inbound_tagger._entries) > 8  # type: ignore[attr-defined]


def test_the_topics_are_ordered_by_rule_priority_then_count_then_name() -> None:
    from contextfold.memory.rules import TagRules

    engine = _compacting()
    engine.on_turn_complete(_pairs(0, 40))
    sid = "default"
    assert engine.store.session(sid).compaction_watermark > 0
    counts = engine.store.topic_counts(sid)[1]
    assert len(set(counts.values())) > 1  # the order by count is tested
    now = datetime.now(UTC)
    topics, _ = engine.assembler._topics(sid, now, False, 500)  # type: ignore[attr-defined]
    assert topics == sorted(counts, key=lambda t: (-counts[t], t))  # no rules: count, name
    engine.assembler.rules = TagRules.from_config([{"match": topics[-1], "priority": 9}])
    engine.assembler._topic_cache.pop(sid)  # type: ignore[attr-defined]
    ruled, _ = engine.assembler._topics(sid, now, False, 500)  # type: ignore[attr-defined]
    assert ruled[0] == topics[-1] and ruled[1:] == topics[:-1]


def _since_steps(segments: int) -> int:
    """SQLite VM steps of one ``segments_since_summary`` on a session of ``segments``
    segments over 300 tags, every tag summary current but one tag's (a tag no segment
    carries) summarised at the start: what every turn of such a session reads."""
    store = MemoryStore(counter=CharCounter())
    store.create_session("s")
    store.append_turns("s", [Message(role="user", content=f"t{i}") for i in range(2 * segments)])
    rng = random.Random(1)
    every = [f"tag{j}" for j in range(300)]
    made = [
        NewSegment(
            first_seq=2 * i + 1,
            last_seq=2 * i + 2,
            summary=f"sum {i}",
            full_text="",
            tags=tuple(rng.sample(every, 5)),
        )
        for i in range(segments)
    ]
    store.compact("s", made, 2 * segments + 1)
    for tag in {t for g in made for t in g.tags}:
        store.paging.upsert_tag_summary("s", tag, "x", 2 * segments)
    store.paging.upsert_tag_summary("s", "early-topic", "x", 0)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(count, 1)
    assert store.paging.segments_since_summary("s") == {}
    store._conn.set_progress_handler(None, 1)
    store.close()
    return steps


def test_nothing_to_roll_forward_is_found_without_reading_the_segments() -> None:
    """The check a turn of a compacted session runs (is there a segment some tag summary
    has not taken in?) reads one row per tag (the newest segment per tag, kept on write),
    not the segments: ten times the segments, about the same work, even with one tag's
    summary far behind (it read nearly every segment then)."""
    small, large = _since_steps(300), _since_steps(3000)
    assert large < 1.5 * small, (small, large)


def test_the_token_cache_keys_bound_the_engines_counter_and_counts_stay_exact() -> None:
    """``token_cache`` / ``token_cache_chars`` set the engine's token counter's memo: a long
    session's turns, counted once each, never hold more texts than the limit, a text longer
    than the character limit is never kept, and every count equals an uncached counter's."""
    config = MemoryConfig.model_validate({"token_cache": 16, "token_cache_chars": 40})
    engine = MemoryEngine(config, store=MemoryStore(), embedder=None)
    exact = TiktokenCounter(config.encoding, cache_size=0)
    texts = [f"Turn {n}: the kiln reached cone {n % 12}." for n in range(80)]
    texts.append("A text that is longer than forty characters, so it is never kept.")
    for text in texts:
        assert engine.counter.count(text) == exact.count(text)
    info = engine.counter.count.cache_info()  # type: ignore[attr-defined]
    assert info.maxsize == 16 and info.currsize == 16
    engine.counter.count.cache_clear()  # type: ignore[attr-defined]
    engine.counter.count(texts[-1])
    assert engine.counter.count.cache_info().currsize == 0  # type: ignore[attr-defined]
    default = MemoryEngine(MemoryConfig(), store=MemoryStore(), embedder=None)
    assert default.counter.count.cache_info().maxsize == 16_384  # type: ignore[attr-defined]


def _fetch(rows: list[tuple[int, bytes]]) -> Any:
    """A cursor's ``fetchmany`` over ``rows``."""
    left = list(rows)

    def fetchmany(size: int) -> list[tuple[int, bytes]]:
        taken, left[:] = left[:size], left[size:]
        return taken

    return fetchmany


def test_vectors_read_a_chunk_at_a_time_come_back_whole_however_many_were_counted() -> None:
    matrix = np.arange(5 * 4, dtype=np.float32).reshape(5, 4) / 3
    rows = [(seq, matrix[seq - 1].tobytes()) for seq in range(1, 6)]
    for counted in (5, 2, 9):  # as counted, more rows than counted (written since), fewer
        seqs, got = vector_matrix(_fetch(rows), counted)
        assert seqs == [1, 2, 3, 4, 5] and got.tobytes() == matrix.tobytes()
    assert vector_matrix(_fetch([]), 0)[0] == []


def test_the_first_rows_of_a_session_are_kept_as_read_and_later_ones_appended() -> None:
    read = np.ones((3, 4), np.float32)
    entry = SessionVectors(born=1)
    entry.append([1, 2, 3], read)
    assert np.shares_memory(entry.rows(0), read)  # no second copy of the session's vectors
    entry.append([4], np.full((1, 4), 2, np.float32))
    assert np.shares_memory(entry.rows(0, 3), read)  # nor one when more rows come
    assert entry.seqs == [1, 2, 3, 4] and entry.rows(0).tolist()[-1] == [2.0] * 4
    assert entry.rows(0)[:3].tolist() == [[1.0] * 4] * 3
    query = np.array([1, 0, 0, 0], np.float32)
    assert entry.scores(query[None]).tolist() == [[1.0], [1.0], [1.0], [2.0]]
    assert entry.search(query[None], 2, 16, ann=False) == ([[(4, 2.0), (1, 1.0)]], False)
    view = np.zeros((4, 4), np.float32)[1:]  # not its own memory: copied
    other = SessionVectors(born=1)
    other.append([1, 2, 3], view)
    assert not np.shares_memory(other.rows(0), view)


def _ranked_by(engine: MemoryEngine, query: str) -> list[tuple[int, float, tuple[str, ...]]]:
    tags = engine.tag_message(query)
    ranked = engine.recaller.rank("default", query, tags=tags.tags, related=tags.related_tags)
    return [(r.seq, r.score, tuple(sorted(r.ranks))) for r in ranked]


def test_common_limit_applies_only_from_common_min_turns() -> None:
    """Below ``common_min_turns`` every word and tag is kept (a small session ranks as with no
    limit); from it on, the limit leaves the common ones out."""
    query = "walnut veneer shipment oak lacquer"
    rare = [
        {"role": "user", "content": "The oak lacquer of shipment 12 cracked: call the supplier."},
        {"role": "assistant", "content": "Noted: the oak lacquer cracked."},
    ]
    engines = {
        "no limit": _compacting(recall={"common_limit": None, "tag_limit": None}),
        "above the session": _compacting(
            recall={"common_limit": 10, "tag_limit": None, "common_min_turns": 63}
        ),
        "at the session": _compacting(
            recall={"common_limit": 10, "tag_limit": None, "common_min_turns": 62}
        ),
        "default": _compacting(recall={"common_limit": 10, "tag_limit": None}),
    }
    for engine in engines.values():
        engine.on_turn_complete(_pairs(0, 30))
        engine.on_turn_complete(rare)
        assert engine.store.last_seq("default") == 62
    ranked = {name: _ranked_by(engine, query) for name, engine in engines.items()}
    assert ranked["above the session"] == ranked["no limit"]
    assert ranked["default"] == ranked["no limit"]  # 2,000 turns by default
    limited = ranked["at the session"]
    assert limited != ranked["no limit"]
    fts = {seq for seq, _, signals in limited if "fts" in signals}
    assert fts < {seq for seq, _, signals in ranked["no limit"] if "fts" in signals}
    assert MemoryConfig().recall.common_min_turns == 2000
