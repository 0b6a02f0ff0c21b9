"""The relevance floor of memory recall (``recall.relevance_floor``): a message nothing stored
is close to gets no memory at all; a related one still recalls; the floor can be turned off."""

from __future__ import annotations

import pytest

from contextfold.memory.config import RELEVANCE_FLOOR, MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")

CHAT = [
    {"role": "user", "content": "Planted twelve tomato seedlings and basil by the greenhouse."},
    {"role": "assistant", "content": "Lovely, basil likes the greenhouse warmth."},
    {"role": "user", "content": "My deadlift plan: five sets at ninety kilograms, then rowing."},
    {"role": "assistant", "content": "Rest well between the deadlift sets."},
]
UNRELATED = "Which quantum chromodynamics lattice paper did Marek cite?"
RELATED = "How many tomato seedlings went by the greenhouse?"


def engine(floor: object) -> MemoryEngine:
    cfg = MemoryConfig.model_validate({"recall": {"relevance_floor": floor}})
    eng = MemoryEngine(
        cfg, store=MemoryStore(counter=COUNTER), embedder=HashEmbedder(), counter=COUNTER
    )
    eng.on_turn_complete(CHAT)
    return eng


def test_an_unrelated_message_gets_no_memory_at_all() -> None:
    assembled = engine(0.3).on_message_inbound(UNRELATED, budget=2048)
    assert assembled.prepend_text == ""
    assert assembled.items == () and assembled.recalled == ()
    assert assembled.budget.used == 0 and assembled.budget.budget == 2048


def test_a_related_message_still_recalls() -> None:
    assembled = engine(0.3).on_message_inbound(RELATED, budget=2048)
    assert "twelve tomato seedlings" in assembled.prepend_text
    best = max(r.similarity or -1.0 for r in assembled.recalled)
    assert best >= 0.3


def test_the_floor_can_be_turned_off() -> None:
    # Without the floor the unrelated message is padded with whatever ranks first.
    for off in (None, False):
        assembled = engine(off).on_message_inbound(UNRELATED, budget=2048)
        assert assembled.prepend_text != ""


def test_config_values() -> None:
    def floor(value: object) -> float | None:
        return MemoryConfig.model_validate(
            {"recall": {"relevance_floor": value}}
        ).recall.relevance_floor

    assert MemoryConfig().recall.relevance_floor == RELEVANCE_FLOOR
    assert floor(True) == RELEVANCE_FLOOR
    assert floor(False) is None and floor(None) is None
    assert floor(0.25) == 0.25
    with pytest.raises(ValueError, match="relevance_floor"):
        floor(1.5)
