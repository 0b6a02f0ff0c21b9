"""What a request's window leaves memory (``Room``) and what compaction counts beside the live
turns (``MemoryEngine.note_fixed_tokens``); without either, the engine behaves as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contextfold.errors import ConfigError
from contextfold.memory import MemoryConfig, MemoryEngine, Room
from contextfold.memory.engine import as_message as engine_message

FACT = "The Henninger filing is due on 14 March, at the county court."


@pytest.fixture
def engine() -> Iterator[MemoryEngine]:
    config = MemoryConfig(context_window=2000, compaction={"protected_recent_turns": 2})
    with MemoryEngine(config, store=":memory:", embedder=None) as memory:
        yield memory


def chat(n: int) -> list[dict[str, str]]:
    """``n`` exchanges of about 60 tokens, the fact in the first."""
    turns = []
    for k in range(n):
        said = FACT if k == 0 else f"Exchange {k}: the orchard survey counted {k * 17} trees."
        turns.append({"role": "user", "content": said + " Please keep it in mind for later."})
        turns.append({"role": "assistant", "content": f"Noted, item {k}; I will keep it."})
    return turns


@pytest.mark.parametrize(("fixed", "compacted"), [(None, False), (0, False), (1200, True)])
def test_compaction_counts_the_fixed_tokens_noted_for_the_session(
    engine: MemoryEngine, fixed: int | None, compacted: bool
) -> None:
    """About 500 live tokens in a 2,000-token window stay under the 70 % threshold alone; with
    1,200 tokens every request carries besides them they cross it."""
    if fixed is not None:
        engine.note_fixed_tokens(fixed)
    report = engine.on_turn_complete(chat(8))
    assert (report is not None) is compacted
    assert engine.fixed_tokens() == (fixed or 0)


def test_the_status_level_counts_the_fixed_tokens_too(engine: MemoryEngine) -> None:
    engine.store_turns("default", [engine_message(m) for m in chat(8)])  # stored, not derived
    assert engine.status().level == "none"
    engine.note_fixed_tokens(1200)
    assert engine.status().level == "soft"


@pytest.mark.parametrize(("tokens", "memory"), [(5000, True), (400, True), (60, False)])
def test_memory_gets_what_the_room_leaves_beside_the_history_kept(
    engine: MemoryEngine, tokens: int, memory: bool
) -> None:
    engine.on_turn_complete(chat(4))
    history = [{"role": "user", "content": "Something else entirely, about the weather."}]
    costs = [engine.counter.count(history[0]["content"]) + 4]
    room = Room(tokens=tokens + costs[0], history=costs)
    assembled = engine.on_message_inbound("When is the Henninger filing due?", history, room=room)
    assert assembled.room_left == tokens
    assert assembled.budget.budget == min(tokens, engine.config.assembly.memory_budget)
    assert assembled.budget.used <= assembled.budget.budget
    assert ("14 March" in assembled.prepend_text) is memory
    assert bool(assembled.prepend_text) is memory  # below 64 tokens: no memory at all


def test_without_a_room_memory_gets_its_whole_budget(engine: MemoryEngine) -> None:
    engine.on_turn_complete(chat(4))
    assembled = engine.on_message_inbound("When is the Henninger filing due?")
    assert assembled.room_left is None
    assert assembled.budget.budget == engine.config.assembly.memory_budget
    assert "14 March" in assembled.prepend_text


def test_a_room_needs_one_count_per_history_message(engine: MemoryEngine) -> None:
    history = chat(1)
    with pytest.raises(ConfigError, match=r"one count per message .* \(2\), got 1"):
        engine.on_message_inbound("Hi", history, room=Room(tokens=500, history=[10]))
    with pytest.raises(ConfigError, match="tokens must be a whole number"):
        engine.note_fixed_tokens(-1)
