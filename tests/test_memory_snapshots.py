"""A session's recall state saved at close beside a file-backed SQLite store
(``memory.snapshots``): the first recall in a new engine reads the file instead of the store,
and only what is still true is taken."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contextfold.memory.authors import TurnAuthors
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.snapshots import SessionState, StateFiles
from contextfold.memory.turn_lengths import TurnLengths, line_key
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")
SPEAKERS = ["Ann", "Bo", "Cy"]
TOPICS = ["kiln", "pottery", "hiking", "choir", "garden", "boots", "tents", "station"]
QUESTION = "What did Ann say about the kiln and the pottery class?"


def _turns(start: int, count: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{SPEAKERS[i % 3]}: the {TOPICS[i % 8]} and the {TOPICS[(i * 3) % 8]}"
            f" came up again on day {i}, with {TOPICS[(i * 5) % 8]} too.",
        }
        for i in range(start, start + count)
    ]


def _engine(path: Path, *, state_files: bool = True) -> MemoryEngine:
    cfg = MemoryConfig.model_validate(
        {"recall": {"embedder": "none", "state_files": state_files}, "context_window": 200_000}
    )
    store = MemoryStore(path, counter=COUNTER)
    return MemoryEngine(cfg, store=store, embedder=None, counter=COUNTER)


def _reads(engine: MemoryEngine) -> dict[str, list[Any]]:
    """Spy on the store reads a first recall makes of a whole session."""
    calls: dict[str, list[Any]] = {}
    store = engine.store
    for owner, name in [
        (store, "tag_counts"),
        (store.vocab, "related_tag_counts"),
        (store, "turn_token_counts_after"),
        (store, "turn_openings_with_incarnation"),
        (store, "turn_token_counts"),
        (store, "turn_openings"),
        (store, "topic_counts"),
    ]:
        original = getattr(owner, name)
        seen: list[Any] = []

        def spy(*args: Any, _original: Any = original, _seen: list[Any] = seen, **kw: Any) -> Any:
            _seen.append(args[1:])
            return _original(*args, **kw)

        setattr(owner, name, spy)
        calls[name] = seen
    return calls


def _read_only_after(calls: dict[str, list[Any]], seq: int) -> None:
    """The turns' counts and authors were read only after ``seq`` (the saved ones'): not one
    read of the whole session, nor of a first recall's candidates."""
    assert calls["turn_token_counts"] == calls["turn_openings"] == [], calls
    assert {c[0] for c in calls["turn_token_counts_after"]} == {seq}, calls
    assert {c[0] for c in calls["turn_openings_with_incarnation"]} == {seq}, calls


def _restarted(path: Path, seq: int = 400) -> str:
    """A new engine's answer to ``QUESTION``, its recall having read the turns' counts and
    authors only after ``seq`` (``_read_only_after``)."""
    engine = _engine(path)
    try:
        calls = _reads(engine)
        got = engine.on_message_inbound(QUESTION).prepend_text
        engine.recaller.start_reads()
        engine.recaller.settle()
        _read_only_after(calls, seq)
        return got
    finally:
        engine.close()


def _as_read_from_scratch(path: Path, answer: str) -> None:
    """``answer`` to ``QUESTION`` is the store's own, read from scratch (no state file)."""
    plain = _engine(path, state_files=False)
    try:
        assert plain.on_message_inbound(QUESTION).prepend_text == answer
    finally:
        plain.close()


def _stored(path: Path, turns: int = 400) -> str:
    engine = _engine(path)
    engine.on_turn_complete(_turns(0, turns), new_only=True)
    first = engine.on_message_inbound(QUESTION).prepend_text
    engine.recaller.settle()  # the worker's whole read of the counts and authors
    engine.on_message_inbound(QUESTION)
    engine.close()
    return first


def test_a_new_engine_takes_the_saved_state_instead_of_reading_the_session(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.db"
    before = _stored(path)
    assert list((tmp_path / "m.db.state").glob("*.state"))
    engine = _engine(path)
    calls = _reads(engine)
    after = engine.on_message_inbound(QUESTION)
    engine.recaller.start_reads()
    engine.recaller.settle()
    assert after.prepend_text == before
    # not one read of the whole session, nor of the candidates: only the turns after the
    # saved ones (none)
    assert calls["tag_counts"] == calls["related_tag_counts"] == calls["topic_counts"] == []
    _read_only_after(calls, 400)
    engine.close()
    _as_read_from_scratch(path, before)


def test_a_write_since_keeps_the_turns_state_and_reads_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _stored(path)
    other = _engine(path, state_files=False)  # another process: new turns, new tags
    other.on_turn_complete(
        [{"role": "user", "content": "Ann: the glaze cracked in the kiln overnight."}],
        new_only=True,
    )
    other.close()
    engine = _engine(path)
    calls = _reads(engine)
    got = engine.on_message_inbound("What did Ann say about the glaze in the kiln?")
    engine.recaller.start_reads()
    engine.recaller.settle()
    assert calls["tag_counts"] and calls["related_tag_counts"]  # another generation: read
    assert [c for c in calls["turn_token_counts_after"] if c[-1] == 0] == []  # counts taken
    assert [c for c in calls["turn_openings_with_incarnation"] if c[0] == 0] == []
    assert "glaze" in engine.vocabulary()
    assert "glaze cracked" in got.prepend_text
    fresh = _engine(path, state_files=False)
    question = "What did Ann say about the glaze in the kiln?"
    assert fresh.on_message_inbound(question).prepend_text == got.prepend_text
    fresh.close()
    engine.close()


def test_a_session_only_written_and_derived_restarts_with_its_counts_and_authors(
    tmp_path: Path,
) -> None:
    """A session ingested in two writes and never recalled: the derives keep its authors, the
    close reads its token counts and saves both, so the first recall after a restart reads
    neither the whole session's nor its candidates' (a bulk-ingested 100k-turn session's
    first recalls took 1.3-5x a steady one while they were read)."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.recaller.lengths_later_min = 100  # large: a recall would have the worker read
    engine.on_turn_complete(_turns(0, 250), new_only=True)
    engine.on_turn_complete(_turns(250, 150), new_only=True)
    authors = engine.recaller.kept_state("default")[1]
    assert authors is not None and authors.last == 400
    born, counts = engine.store.turn_token_counts_after("default", 0)
    engine.close()
    saved = StateFiles(tmp_path / "m.db.state").load("default")
    assert saved is not None and saved.lengths is not None and saved.born == born
    assert saved.lengths_last == 400 and saved.authors_last == 400
    assert saved.lengths[:401].tolist() == [0] + [n for _, n in counts]
    got = _restarted(path)
    assert "Ann:" in got
    _as_read_from_scratch(path, got)


def test_a_session_deleted_and_written_again_takes_nothing_saved(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _stored(path)
    store = MemoryStore(path, counter=COUNTER)
    store.delete_session("default")  # not through an engine: the file stays
    store.create_session("default")
    swapped = [{**t, "content": t["content"].replace("Ann:", "Zed:")} for t in _turns(0, 400)]
    store.close()
    writer = _engine(path, state_files=False)
    writer.on_turn_complete(swapped, new_only=True)
    writer.close()
    engine = _engine(path)
    calls = _reads(engine)
    got = engine.on_message_inbound(QUESTION).prepend_text
    assert calls["tag_counts"]  # another incarnation: everything read from the store
    lengths, authors = engine.recaller.kept_state("default")
    born = engine.store.session_version("default")
    assert born is not None and authors is None  # nothing of the saved incarnation taken:
    assert lengths is None or (lengths.born == born[0] and lengths.last == 0)  # only costs
    fresh = _engine(path, state_files=False)
    assert fresh.on_message_inbound(QUESTION).prepend_text == got
    fresh.close()
    engine.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another session"])
def test_a_damaged_or_foreign_file_is_ignored(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "m.db"
    before = _stored(path)
    files = StateFiles(tmp_path / "m.db.state")
    target = files.path("default")
    if damage == "garbage":
        target.write_bytes(b"not a state file")
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:100])
    else:
        saved = files.load("default")
        assert saved is not None
        saved.session_id = "other"
        files.save(saved)
        files.path("other").replace(target)
    assert files.load("default") is None
    engine = _engine(path)
    calls = _reads(engine)
    assert engine.on_message_inbound(QUESTION).prepend_text == before
    assert calls["tag_counts"]
    engine.close()


def test_deleting_the_session_through_the_engine_deletes_its_file(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _stored(path)
    target = StateFiles(tmp_path / "m.db.state").path("default")
    assert target.exists()
    engine = _engine(path)
    assert engine.delete_session("default")
    assert not target.exists()
    engine.close()


def test_no_files_without_state_files_or_a_file_store(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    engine = _engine(path, state_files=False)
    engine.on_turn_complete(_turns(0, 50), new_only=True)
    engine.on_message_inbound(QUESTION)
    engine.close()
    assert not (tmp_path / "m.db.state").exists()


def test_saved_counts_and_authors_answer_as_the_originals(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    lengths = TurnLengths(born=3)
    lengths.extend([(s, int(rng.integers(0, 90))) for s in range(1, 301)])
    authors = TurnAuthors(born=3)
    openings = ["Ann: hi", "Dr. Smith: hey", "no author", "Bo Lee: yo", "Note: x"]
    authors.extend([(s, openings[int(rng.integers(0, 5))]) for s in range(1, 301)])
    files = StateFiles(tmp_path)
    files.save(
        SessionState(
            "s", 3, 9,
            lengths=lengths.array, lengths_last=lengths.last,
            authors=authors.array, authors_last=authors.last, labels=authors.labels(),
        )
    )  # fmt: skip
    saved = files.load("s")
    assert saved is not None and saved.counts is None
    assert saved.lengths is not None and saved.authors is not None and saved.labels is not None
    again = TurnLengths.restored(3, saved.lengths_last, saved.lengths)
    back = TurnAuthors.restored(3, saved.authors_last, saved.authors, saved.labels)
    assert again is not None and back is not None
    seqs = list(range(-1, 305))
    assert again.counts(seqs) == lengths.counts(seqs)
    for names in (["ann"], ["smith"], ["lee"], ["bo"], ["note"], ["zed"]):
        assert back.named(names) == authors.named(names)
        assert (
            back.authored(seqs, back.named(names)) == authors.authored(seqs, authors.named(names))
        ).all()
    back.extend([(301, "Zed: new"), (302, "Ann: again")])  # goes on from the saved ones
    assert back.authored([301, 302], back.named(["zed", "ann"])).tolist() == [True, True]
    assert TurnLengths.restored(3, 400, saved.lengths) is None  # does not cover its last
    assert TurnAuthors.restored(3, 300, saved.authors, saved.labels[:1]) is None


def test_line_costs_are_kept_per_counter_and_past_last() -> None:
    lengths = TurnLengths(born=1)
    lengths.extend([(1, 5), (2, 7), (3, 9)])
    assert lengths.lines([1, 2, 3], "cl100k_base") == [0, 0, 0]
    # 4 is past last: a derive counts a turn's line before its token count is read.
    lengths.set_lines([(1, 6), (3, 10), (4, 99)], "cl100k_base")
    assert lengths.lines([1, 2, 3, 4, 5, 10_000], "cl100k_base") == [6, 0, 10, 99, 0, 0]
    assert lengths.lines([1, 3], "o200k_base") == [0, 0]  # another counter's are not its
    lengths.extend([(4, 3), (9, 4)])  # grows: the kept costs stay
    assert lengths.lines([1, 3, 4, 9], "cl100k_base") == [6, 10, 99, 0]
    lengths.set_lines([(9, 5)], "o200k_base")  # another counter: the earlier ones dropped
    assert lengths.lines([1, 9], "o200k_base") == [0, 5]
    assert lengths.lines([1, 9], "cl100k_base") == [0, 0]


class _Counting:
    """The engine's counter, noting the texts it counts as a memory block's line."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.lines = inner, inner.name, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def count(self, text: str) -> int:
        if text.endswith("\n") and not text.startswith(("<", "[")):  # not a tag nor a day
            self.lines += 1
        return int(self.inner.count(text))


def test_a_derived_turns_line_is_counted_once_and_saved_with_the_state(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    engine = _engine(path)
    counting = _Counting(COUNTER)
    engine.counter = engine.assembler.counter = counting  # type: ignore[assignment]
    engine.on_turn_complete(_turns(0, 400), new_only=True)
    assert counting.lines == 400  # the derive counted each turn's line
    first = engine.on_message_inbound(QUESTION).prepend_text
    engine.recaller.settle()  # the worker's whole read of the counts, which keeps the lines
    other = "What came up about the boots and the tents on the station?"
    engine.on_message_inbound(other)
    assert counting.lines == 400  # no recall counted one again
    engine.close()
    again = _engine(path)
    counting = _Counting(TiktokenCounter("cl100k_base"))  # a fresh memo: nothing counted yet
    again.counter = again.assembler.counter = counting  # type: ignore[assignment]
    assert again.on_message_inbound(QUESTION).prepend_text == first
    assert again.on_message_inbound(other).prepend_text == engine_answer(path, other)
    assert counting.lines == 0  # every line cost came with the saved state
    again.close()
    plain = _engine(path, state_files=False)  # counting every line gives the same memory
    assert plain.on_message_inbound(QUESTION).prepend_text == first
    plain.close()


def test_a_recalled_turns_line_is_counted_once(tmp_path: Path) -> None:
    """A session derived by another process: its recalled turns' lines are counted by the
    first recall that packs them, once."""
    path = tmp_path / "m.db"
    _stored(path)
    engine = _engine(path, state_files=False)
    counting = _Counting(TiktokenCounter("cl100k_base"))
    engine.counter = engine.assembler.counter = counting  # type: ignore[assignment]
    other = "What came up about the boots and the tents on the station?"
    answer = engine.on_message_inbound(other).prepend_text
    counted = counting.lines
    assert counted > 0  # turns not counted in this process: counted
    assert engine.on_message_inbound(other).prepend_text == answer
    assert counting.lines == counted  # and kept: not counted again
    engine.close()


def engine_answer(path: Path, question: str) -> str:
    engine = _engine(path)
    try:
        return engine.on_message_inbound(question).prepend_text
    finally:
        engine.close()


# -- line costs counted by the derive (review of the change) --------------------------------


def _held_bytes(engine: Any) -> int:
    r = engine.recaller
    return sum(e.charged for e in r._lengths.values()) + sum(e.charged for e in r._vectors.values())


def test_lines_noted_while_a_recall_extends_the_counts_are_not_lost_nor_orphaned(
    tmp_path: Path,
) -> None:
    """A recall's ``_turn_lengths`` takes the session's counts out of ``_lengths`` while it
    reads the turns stored since; the derive thread's ``note_lines`` at that moment finds no
    kept counts and starts an ``_early_lines`` entry, which the recall never takes (it puts
    its own entry back): the costs are lost and the early entry is held, charged, never read,
    for as long as the counts stay kept."""
    engine = _engine(tmp_path / "m.db", state_files=False)
    engine.on_turn_complete(_turns(0, 50), new_only=True)  # < 200 turns: counts read inline
    r, sid = engine.recaller, "default"
    assert r._turn_lengths(sid) is not None
    born = engine.store.session_version(sid)[0]
    key = line_key(engine.assembler.counter)
    store = engine.store
    original = store.turn_token_counts_after

    def during(session_id: str, after: int) -> Any:
        out = original(session_id, after)
        r.note_lines(sid, born, key, [(50, 999)])  # the derive thread, at this moment
        return out

    store.turn_token_counts_after = during  # type: ignore[method-assign]
    r._turn_lengths(sid)  # a recall's read of the turns stored since
    store.turn_token_counts_after = original  # type: ignore[method-assign]
    for _ in range(3):
        engine.on_message_inbound(QUESTION)  # later recalls: the early entry stays
    lines = r.session_lines(sid, store.session_version(sid))
    assert lines is not None
    got = lines.lines([50], key)
    orphan = sid in r._early_lines
    held, charged = _held_bytes(engine), r.vector_cache_bytes()
    engine.close()
    # want: the noted cost kept, no early entry beside the kept counts, nothing else charged
    assert (got, orphan, charged - held) == ([999], False, 0)


def test_a_session_deleted_during_its_derive_leaves_no_line_costs_behind(
    tmp_path: Path,
) -> None:
    """``delete_session`` (the session lock) may run between the derive's write and its
    ``_count_lines`` (which holds no session lock): ``note_lines`` then keeps the deleted
    incarnation's costs in ``_early_lines`` after ``forget``; nothing takes them out unless
    the session is recalled again or the cache fills."""
    engine = _engine(tmp_path / "m.db", state_files=False)
    original = engine._tag_pending

    def then_deleted(sid: str, *args: Any) -> Any:
        out = original(sid, *args)
        engine.delete_session(sid)  # a request thread, once the derive's write is done
        return out

    engine._tag_pending = then_deleted  # type: ignore[method-assign]
    with contextlib.suppress(Exception):  # the rest of the derive may fail on the deleted session
        engine.on_turn_complete(_turns(0, 10), new_only=True)
    r = engine.recaller
    left = dict(r._early_lines)
    kept = r.kept_state("default")
    charged = r.vector_cache_bytes()
    with contextlib.suppress(Exception):
        engine.close()
    assert "default" not in left, "a deleted session's line costs stay cached"
    assert kept == (None, None), "a deleted session's counts or authors stay cached"
    assert charged == 0


def test_lines_the_derive_counted_after_the_last_recall_come_back_after_a_restart(
    tmp_path: Path,
) -> None:
    """docs/memory.md (assembly): 'a recall counts only the lines of turns derived by another
    process or before a restart without a state file'. Costs noted past the kept counts'
    ``last`` are cut off when the state is saved (``lines[: lengths_last + 1]``)."""
    path = tmp_path / "m.db"
    _stored(path)  # 400 turns recalled: counts and line costs saved
    engine = _engine(path)
    engine.on_message_inbound(QUESTION)  # adopts the saved counts
    zebra = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Ann: the zebra crossing near the bakery came up on day {i}.",
        }
        for i in range(20)
    ]
    engine.on_turn_complete(zebra, new_only=True)  # the derive counts each new line
    engine.close()
    again = _engine(path)
    counting = _Counting(TiktokenCounter("cl100k_base"))
    again.counter = again.assembler.counter = counting  # type: ignore[assignment]
    text = again.on_message_inbound("What about the zebra crossing near the bakery?").prepend_text
    again.close()
    assert "zebra" in text
    assert counting.lines == 0, f"{counting.lines} lines counted again after the restart"


def test_lines_of_a_derive_only_run_come_back_after_a_restart(tmp_path: Path) -> None:
    """The same claim for a process that derived and closed without a recall: its costs sat in
    ``_early_lines``, which ``kept_state`` (hence the state file) never sees."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.on_turn_complete(_turns(0, 400), new_only=True)
    engine.close()
    again = _engine(path)
    counting = _Counting(TiktokenCounter("cl100k_base"))
    again.counter = again.assembler.counter = counting  # type: ignore[assignment]
    assert again.on_message_inbound(QUESTION).prepend_text
    again.close()
    assert counting.lines == 0, f"{counting.lines} lines counted again after the restart"


_KILLED = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from test_memory_snapshots import QUESTION, _engine, _turns
from pathlib import Path
engine = _engine(Path(sys.argv[1]))
engine.on_turn_complete(_turns(0, 400), new_only=True)
engine.on_message_inbound(QUESTION)
engine.recaller.settle()  # the counts and authors read whole, as a long-lived process has them
assert engine.compact(session_id="default") is not None
os.kill(os.getpid(), signal.SIGKILL)  # no close: nothing saved at close
"""


def test_a_process_killed_after_a_compaction_leaves_its_state_to_the_next(tmp_path: Path) -> None:
    """A compaction saves the session's recall state (not only ``close``): a process killed
    with SIGKILL after it leaves the turns' counts, authors and line costs to the next
    process, whose first recall reads only the turns after them."""
    path = tmp_path / "m.db"
    tests = str(Path(__file__).parent)
    child = subprocess.run(
        [sys.executable, "-c", _KILLED, str(path), tests], capture_output=True, text=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert list((tmp_path / "m.db.state").glob("*.state"))  # written by the compaction
    _as_read_from_scratch(path, _restarted(path))


def test_the_line_costs_are_saved_while_the_worker_reads_the_counts(tmp_path: Path) -> None:
    """A session whose counts the worker is reading (nothing to save of them yet) still has
    the line costs its derives counted saved (the state falls back to what is kept)."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.on_turn_complete(_turns(0, 30), new_only=True)
    engine.recaller._reading_lengths.add("default")
    engine._save_state("default")
    engine.recaller._reading_lengths.discard("default")
    saved = StateFiles(tmp_path / "m.db.state").load("default")
    engine.close()
    assert saved is not None and saved.lengths_last == 0 and saved.lines is not None
    assert int(np.count_nonzero(saved.lines)) == 30
