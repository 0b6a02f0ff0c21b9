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
