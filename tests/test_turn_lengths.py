"""The length prior's token counts kept per session by the recaller (``memory/turn_lengths``):
the same ranking as counts read from the store, turns stored since read at the next recall
(and only those), a session written again read again, and the cache limit held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.recall import Recaller
from contextfold.memory.turn_lengths import TurnLengths
from contextfold.store.conformance.memory_support import stored
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import CharCounter

QUESTION = "Which dock took the walnut veneer shipment?"


def _turns(start: int, count: int) -> list[str]:
    # Turns of many lengths, so the length prior reorders them.
    return [
        f"Shipment {i} of walnut veneer" + " arrives at the north dock today" * (i % 5)
        for i in range(start, start + count)
    ]


def _recaller(store: MemoryStore, **kw: Any) -> Recaller:
    recaller = Recaller(store, length_prior=0.3, neighbor_weight=0.2, **kw)
    recaller.lengths_later_min = None  # read in the recall (the worker's read: its own test)
    return recaller


def _expected(store: MemoryStore, sid: str) -> dict[int, float]:
    """The fused scores with the prior applied from the store's own counts."""
    plain = Recaller(store, length_prior=0.0, neighbor_weight=0.2).rank(sid, QUESTION)
    counts = store.turn_token_counts(sid, [r.seq for r in plain])
    return {r.seq: r.score * (counts.get(r.seq, 0) + 2) ** 0.3 for r in plain}


def _spy(store: MemoryStore) -> list[int]:
    calls: list[int] = []
    original = store.turn_token_counts_after

    def spy(session_id: str, after: int) -> Any:
        calls.append(after)
        return original(session_id, after)

    store.turn_token_counts_after = spy  # type: ignore[method-assign]
    return calls


def test_kept_counts_rank_as_the_stores_and_only_new_turns_are_read() -> None:
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 30))
    recaller = _recaller(store)
    calls = _spy(store)
    got = {r.seq: r.score for r in recaller.rank("s", QUESTION)}
    assert got == _expected(store, "s") and len(got) > 10
    stored(store, "s", *_turns(30, 7))  # stored since: read at the next recall, alone
    got = {r.seq: r.score for r in recaller.rank("s", QUESTION)}
    assert got == _expected(store, "s") and max(got) > 30
    recaller.rank("s", QUESTION)
    assert calls == [0, 30, 37]


def test_a_session_written_again_has_its_counts_read_again() -> None:
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 12))
    recaller = _recaller(store)
    recaller.rank("s", QUESTION)
    store.delete_session("s")
    stored(store, "s", *reversed(_turns(0, 20)))  # other lengths at the same seqs
    got = {r.seq: r.score for r in recaller.rank("s", QUESTION)}
    assert got == _expected(store, "s")
    store.delete_session("s")
    assert recaller.rank("s", QUESTION) == []


def test_another_store_objects_turns_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store, other = (
        MemoryStore(path, counter=CharCounter()),
        MemoryStore(path, counter=CharCounter()),
    )
    stored(store, "s", *_turns(0, 10))
    recaller = _recaller(store)
    recaller.rank("s", QUESTION)
    stored(other, "s", *_turns(10, 10))
    assert {r.seq: r.score for r in recaller.rank("s", QUESTION)} == _expected(store, "s")


def test_turn_lengths_extend_and_read_zero_outside() -> None:
    lengths = TurnLengths(born=1)
    lengths.extend([(1, 5), (2, 9)])
    lengths.extend([(3, 4), (7, 11)])  # a gap (seqs 4-6 not stored) reads 0
    assert lengths.counts([7, 1, 2, 3, 4, 8, 100, 0]) == [11, 5, 9, 4, 0, 0, 0, 0]
    assert lengths.last == 7 and lengths.nbytes >= 8 * 4


def test_kept_counts_hold_the_cache_limit_with_vectors_and_without() -> None:
    store = MemoryStore(counter=CharCounter())
    sessions = [f"s{n}" for n in range(6)]
    for sid in sessions:
        stored(store, sid, *_turns(0, 200))
    # 201 int32 counts a session (line costs take room only once counted: none here, no
    # assembler): 804 bytes; the limit holds two sessions' counts.
    limit = 2 * 804 + 100
    keyword = _recaller(store, vector_cache_bytes=limit)
    for sid in sessions:
        assert keyword.rank(sid, QUESTION)
        assert 0 < keyword.vector_cache_bytes() <= limit
    assert list(keyword._lengths) == sessions[-2:]  # the least recently used went
    keyword.cached_sessions = 1  # and at most ``cached_sessions`` sessions are kept
    keyword.rank(sessions[0], QUESTION)
    assert list(keyword._lengths) == sessions[:1]
    keyword.cached_sessions = 1000
    keyword.rank(sessions[-2], QUESTION)
    keyword.forget(sessions[0])
    assert keyword.vector_cache_bytes() == keyword._lengths[sessions[-2]].charged
    # With vectors (16 floats: 64 bytes a turn): counts and vectors share the limit.
    cfg = MemoryConfig.model_validate({"recall": {"vector_cache_mb": 16 / 1024}})
    engine = MemoryEngine(cfg, store=store, embedder=HashEmbedder(dim=16), counter=CharCounter())
    unbounded = MemoryEngine(
        MemoryConfig(), store=store, embedder=HashEmbedder(dim=16), counter=CharCounter()
    )
    for sid in sessions:
        engine.derive(sid)
        a = engine.on_message_inbound(QUESTION, session_id=sid)
        b = unbounded.on_message_inbound(QUESTION, session_id=sid)
        assert a.prepend_text == b.prepend_text and a.recalled
        assert engine.recaller.vector_cache_bytes() <= 16 * 1024
    assert engine.recaller._vectors and engine.recaller._lengths


def test_a_large_sessions_counts_are_read_by_the_worker_not_the_recall() -> None:
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 40))
    recaller = _recaller(store)
    recaller.lengths_later_min = 30  # "large" from 30 turns
    after = _spy(store)
    candidates: list[int] = []
    original = store.turn_token_counts

    def spy(session_id: str, seqs: Any) -> dict[int, int]:
        candidates.append(len(seqs))
        return original(session_id, seqs)

    store.turn_token_counts = spy  # type: ignore[method-assign]
    first = {r.seq: r.score for r in recaller.rank("s", QUESTION)}
    assert first == _expected(store, "s")
    recaller.settle()  # the worker read them meanwhile
    assert after == [0] and candidates and "s" in recaller._lengths
    calls = len(candidates)
    assert {r.seq: r.score for r in recaller.rank("s", QUESTION)} == first
    assert len(candidates) == calls and after == [0, 40]  # the kept counts, then new turns only


def test_counts_that_do_not_fit_beside_the_vectors_are_not_read_whole_at_every_recall() -> None:
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 300))

    def engine(mb: float) -> MemoryEngine:
        cfg = MemoryConfig.model_validate({"recall": {"vector_cache_mb": mb}})
        return MemoryEngine(cfg, store=store, embedder=HashEmbedder(dim=16), counter=CharCounter())

    probe = engine(512)
    probe.derive("s")
    probe.on_message_inbound(QUESTION, session_id="s")
    probe.recaller.settle()  # its counts were read whole by the worker, after the recall
    vectors = probe.recaller._vectors["s"].charged
    lengths = probe.recaller._lengths["s"].charged
    tight = engine((vectors + lengths // 2) / 2**20)  # its vectors fit; with its counts, not
    reads: list[int] = []
    original = store.turn_token_counts_after

    def spy(session_id: str, after: int) -> Any:
        reads.append(after)
        return original(session_id, after)

    store.turn_token_counts_after = spy  # type: ignore[method-assign]
    answers = [tight.on_message_inbound(QUESTION, session_id="s") for _ in range(4)]
    assert tight.recaller.vector_cache_bytes() <= vectors + lengths // 2
    assert reads.count(0) == 1, reads  # read whole once, then the candidates' counts
    assert len({a.prepend_text for a in answers}) == 1  # and the same recall each time
    assert (
        answers[0].prepend_text == probe.on_message_inbound(QUESTION, session_id="s").prepend_text
    )


def test_lengths_to_save_read_a_large_sessions_counts_here_then_only_new_turns() -> None:
    """What the engine saves in a session's state: the counts read in the caller's thread even
    for a large session (no worker read queued) and kept as they fit; then the kept ones with
    the turns stored since, the kept entry itself left as it was. Nothing while the worker
    reads them, nor with the prior off."""
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 40))
    recaller = _recaller(store)
    recaller.lengths_later_min = 30  # "large" from 30 turns
    calls = _spy(store)
    saved = recaller.lengths_to_save("s")
    assert saved is not None and saved.last == 40 and calls == [0]
    assert not recaller._pending and not recaller._reading_lengths  # no worker read
    kept = recaller.kept_state("s")[0]
    assert kept is saved  # it fit: kept
    stored(store, "s", *_turns(40, 5))
    again = recaller.lengths_to_save("s")
    assert again is not None and again is not kept and calls == [0, 40]
    assert again.last == 45 and kept.last == 40  # the kept entry as it was
    counts = store.turn_token_counts("s", list(range(1, 46)))
    assert again.counts(range(47)) == [0] + [counts[n] for n in range(1, 46)] + [0]
    assert {r.seq: r.score for r in recaller.rank("s", QUESTION)} == _expected(store, "s")
    other = _recaller(store)
    other._reading_lengths.add("s")
    assert calls == [0, 40, 40]  # the recall extends the kept entry (at 40) itself
    assert other.lengths_to_save("s") is None and calls == [0, 40, 40]
    assert Recaller(store, length_prior=0.0).lengths_to_save("s") is None
    assert calls == [0, 40, 40]  # the prior off: nothing read


def test_lengths_to_save_never_push_another_sessions_vectors_out() -> None:
    """Counts read whole for a state file are kept only where they fit beside what is kept:
    a session being recalled keeps its vectors (and their last write at close)."""
    store = MemoryStore(counter=CharCounter())
    stored(store, "a", *_turns(0, 200))
    stored(store, "b", *_turns(0, 3000))
    recaller = _recaller(store, embedder=HashEmbedder())
    recaller.read_later_min = None
    recaller.ensure_vectors("a")
    recaller.rank("a", QUESTION)
    used = recaller.vector_cache_bytes()
    recaller.vector_cache_limit = used + 3000  # room for less than b's 3,001 counts
    saved = recaller.lengths_to_save("b")
    assert saved is not None and saved.last == 3000  # read for the file
    assert "a" in recaller._vectors and "a" in recaller._lengths  # nothing pushed out
    assert "b" not in recaller._lengths and recaller.vector_cache_bytes() == used
    recaller.vector_cache_limit = 10 * used  # room enough, but one session's counts at most
    recaller.cached_sessions = 1
    assert recaller.lengths_to_save("b") is not None
    assert list(recaller._lengths) == ["a"]
    recaller.close()


def test_lengths_to_save_of_another_incarnation_are_the_stores() -> None:
    """A kept entry of the session's earlier incarnation is neither saved nor charged twice:
    the new incarnation's counts are read whole."""
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 20))
    recaller = _recaller(store)
    recaller.rank("s", QUESTION)  # keeps the counts of incarnation 1
    store.delete_session("s")
    stored(store, "s", *_turns(100, 12))  # written again: other turns, another incarnation
    version = store.session_version("s")
    assert version is not None
    saved = recaller.lengths_to_save("s")
    counts = store.turn_token_counts("s", list(range(1, 13)))
    assert saved is not None and (saved.born, saved.last) == (version[0], 12)
    assert saved.counts(range(1, 13)) == [counts[n] for n in range(1, 13)]
    charged = sum(e.charged for e in [*recaller._lengths.values(), *recaller._early_lines.values()])
    assert recaller.vector_cache_bytes() == charged


def test_lengths_to_save_take_the_line_costs_counted_ahead_of_their_incarnation() -> None:
    store = MemoryStore(counter=CharCounter())
    stored(store, "s", *_turns(0, 10))
    version = store.session_version("s")
    assert version is not None
    recaller = _recaller(store)
    recaller.note_lines("s", version[0], "cl100k_base", [(3, 7), (5, 9)])  # a derive's
    saved = recaller.lengths_to_save("s")
    assert saved is not None and saved.lines([3, 4, 5], "cl100k_base") == [7, 0, 9]
    small = _recaller(store, vector_cache_bytes=40)  # the counts read will not be kept
    small.note_lines("s", version[0], "cl100k_base", [(3, 7)])
    saved = small.lengths_to_save("s")
    assert saved is not None and saved.lines([3], "cl100k_base") == [7]
    assert "s" not in small._lengths
    other = _recaller(store)
    other.note_lines("s", version[0] + 1, "cl100k_base", [(3, 7)])  # not this incarnation's
    saved = other.lengths_to_save("s")
    assert saved is not None and saved.lines([3], "cl100k_base") == [0]
