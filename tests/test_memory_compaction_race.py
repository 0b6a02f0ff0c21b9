"""Two processes (two store objects on one SQLite file) roll the same tag summary forward at
once (a cold review's finding): the summary and the segments it has not taken in are one
read, the new summary covers the newest segment read (not the session's watermark, which a
compaction in between moves), and it is stored only while the summary it rolled forward is
still the one stored."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from contextfold.items import Message
from contextfold.memory.compactor import Compactor, TokenMonitor
from contextfold.memory.summarize import ExtractiveSummarizer
from contextfold.store.models import NewSegment, TagRollForward
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import CharCounter


def _compactor(store: MemoryStore) -> Compactor:
    return Compactor(store, ExtractiveSummarizer(CharCounter()), TokenMonitor(10_000))


def _two(tmp_path: Path) -> tuple[MemoryStore, MemoryStore]:
    path = str(tmp_path / "m.db")
    a, b = MemoryStore(path, counter=CharCounter()), MemoryStore(path, counter=CharCounter())
    a.create_session("s")
    a.append_turns("s", [Message(role="user", content=f"turn {i}") for i in range(8)])
    for seq in range(1, 9):  # a recurring topic: its live turns carry the tag too
        a.tag_turn("s", seq, "k8s")
    a.compact("s", [_seg(1, 2, "Ann: first part.")], 3)
    assert _compactor(a).rebuild_tag_summaries("s") == ["k8s"]
    return a, b


def _seg(first: int, last: int, summary: str) -> NewSegment:
    return NewSegment(first_seq=first, last_seq=last, summary=summary, full_text="", tags=("k8s",))


def _after_read(store: MemoryStore, then: Callable[[], object]) -> None:
    """Run ``then`` (the other process) right after ``store``'s next read of what to roll
    forward, before its rebuild writes."""
    original = store.paging.segments_since_summary

    def interleaved(
        session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, TagRollForward]:
        out = original(session_id, tags)
        store.paging.segments_since_summary = original  # type: ignore[method-assign]
        then()
        return out

    store.paging.segments_since_summary = interleaved  # type: ignore[method-assign]


def test_a_concurrent_roll_forward_takes_each_segment_once(tmp_path: Path) -> None:
    a_store, b_store = _two(tmp_path)
    b_store.compact("s", [_seg(3, 4, "Bob: second part.")], 5)
    # Process B rolls k8s forward while A's derive-time rebuild is between its read and write.
    _after_read(a_store, lambda: _compactor(b_store).rebuild_tag_summaries("s", {"k8s"}))
    assert _compactor(a_store).rebuild_tag_summaries("s") == []  # B's summary stands
    summary = a_store.paging.tag_summaries("s")["k8s"]
    assert summary.summary.count("second part") == 1, summary.summary
    assert summary.summary.count("first part") == 1, summary.summary
    assert summary.source_watermark == 4
    assert a_store.paging.segments_since_summary("s") == {}


def test_a_compaction_between_read_and_write_is_left_for_the_next_roll_forward(
    tmp_path: Path,
) -> None:
    a_store, b_store = _two(tmp_path)
    a_store.compact("s", [_seg(3, 4, "Bob: second part.")], 5)
    # B compacts turns 5-6 after A read what to roll forward: A's summary must not claim them.
    _after_read(a_store, lambda: b_store.compact("s", [_seg(5, 6, "Cy: third part.")], 7))
    assert _compactor(a_store).rebuild_tag_summaries("s") == ["k8s"]
    summary = a_store.paging.tag_summaries("s")["k8s"]
    assert summary.source_watermark == 4 and "third part" not in summary.summary
    pending = a_store.paging.segments_since_summary("s")
    assert list(pending) == ["k8s"] and pending["k8s"].segments == ("Cy: third part.",)
    assert _compactor(b_store).rebuild_tag_summaries("s") == ["k8s"]
    text = a_store.paging.tag_summaries("s")["k8s"].summary
    assert [text.count(p) for p in ("first", "second", "third")] == [1, 1, 1], text
