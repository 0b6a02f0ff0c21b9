"""TurnKeys in the engine: a history resent before the first compaction. ``TurnKeys`` over
each store backend (appends, whitespace, rewrites, other store objects, the session LRU) is
tested by ``tests/store/test_conformance_sessions.py``."""

from __future__ import annotations

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore


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


class _LongSession:
    """Just what ``TurnKeys`` reads of a store: a session of ``n`` turns, made when asked."""

    def __init__(self, n: int) -> None:
        self.n = n

    def turn_texts_with_incarnation(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, str, str, str]]]:
        roles = ("user", "assistant")
        return 1, [
            (s, roles[s % 2], f"turn {s} of the long chat", "")
            for s in range(after + 1, self.n + 1)
        ]


def test_a_long_sessions_turn_keys_take_a_few_bytes_per_turn() -> None:
    """The keys of a 100k-turn session (exact and whitespace-collapsed) are two machine words
    per turn, not two Python ints and their list slots (80 bytes per turn)."""
    import gc
    import tracemalloc

    from contextfold.items import Message
    from contextfold.memory.turnkeys import TurnKeys, key_of

    n = 100_000
    keys = TurnKeys(_LongSession(n))  # type: ignore[arg-type]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert len(keys.keys("s")) == n
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= n * 2 * 8 * 1.25, held
    last = Message(role="assistant" if n % 2 else "user", content=f"turn {n} of the long chat")
    assert keys.seqs_matching("s", {key_of(last)}) == {n}
    assert keys.seqs_held(
        "s", [Message(role=last.role, content=f"turn  {n} of the long chat")]
    ) == {n}
