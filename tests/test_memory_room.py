"""What a request's window leaves memory (``Room``) and what compaction counts beside the live
turns (``MemoryEngine.note_fixed_tokens``); without either, the engine behaves as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contextfold.errors import ConfigError
from contextfold.memory import MemoryConfig, MemoryEngine, Room, TokenMonitor
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


@pytest.mark.parametrize(
    ("fixed", "tokens", "level"),
    [
        # Nothing noted: shares of the whole window, as before.
        (0, 83_999, "none"),
        (0, 84_000, "soft"),
        (0, 102_000, "hard"),
        # Claude Code: ~30k of system prompt and tools, 2,048 of memory, max_tokens 32,000 —
        # 55,952 tokens left for the history; soft at 70 % of that, hard at 85 %.
        (64_048, 39_166, "none"),
        (64_048, 39_167, "soft"),
        (64_048, 47_560, "hard"),
        # max_tokens 64,000 (a 60,000 reserve: half the window): 27,952 left for the history.
        (92_048, 19_566, "none"),
        (92_048, 19_567, "soft"),
        # Fixed parts past the window: the history's room is a tenth of the window.
        (130_000, 8_399, "none"),
        (130_000, 8_400, "soft"),
    ],
)
def test_the_thresholds_are_shares_of_what_the_window_leaves_the_history(
    fixed: int, tokens: int, level: str
) -> None:
    monitor = TokenMonitor(120_000)
    assert monitor.level(tokens, fixed) == level
    if not fixed:
        assert monitor.level(tokens) == level


def test_a_large_reply_reserve_does_not_compact_every_exchange() -> None:
    """Claude Code with max_tokens 64,000 in a 120,000 window: the fixed parts (92,048) pass
    70 % of the window on their own, yet a short conversation is not compacted."""
    with MemoryEngine(
        MemoryConfig(context_window=120_000), store=":memory:", embedder=None
    ) as memory:
        memory.note_fixed_tokens(30_000 + 2_048 + 60_000)
        turns: list[dict[str, str]] = []
        for k in range(6):
            turns += chat(k + 1)[-2:]
            assert memory.on_turn_complete(turns) is None, f"compacted at exchange {k}"
        assert memory.status().level == "none"


@pytest.mark.parametrize(
    ("fixed", "compacted"), [(None, False), (0, False), (1200, False), (1650, True)]
)
def test_compaction_counts_the_fixed_tokens_noted_for_the_session(
    engine: MemoryEngine, fixed: int | None, compacted: bool
) -> None:
    """267 live tokens in a 2,000-token window stay under 70 % of it alone, and under 70 % of
    the 800 tokens that 1,200 fixed tokens leave the history; 1,650 leave 350, and they cross
    70 % of that."""
    if fixed is not None:
        engine.note_fixed_tokens(fixed)
    report = engine.on_turn_complete(chat(8))
    assert (report is not None) is compacted
    assert engine.fixed_tokens() == (fixed or 0)


def test_the_status_level_counts_the_fixed_tokens_too(engine: MemoryEngine) -> None:
    engine.store_turns("default", [engine_message(m) for m in chat(8)])  # stored, not derived
    assert engine.status().level == "none"
    engine.note_fixed_tokens(1650)
    assert engine.status().level == "soft"


def test_background_compaction_counts_the_fixed_tokens_too(tmp_path: Path) -> None:
    """With ``compaction.run: background`` the derive hands the compaction to the engine's
    thread when the live turns cross a threshold beside the fixed tokens noted."""
    config = MemoryConfig(
        context_window=2000, compaction={"protected_recent_turns": 2, "run": "background"}
    )
    with MemoryEngine(config, store=tmp_path / "memory.db", embedder=None) as memory:
        memory.note_fixed_tokens(1650)
        assert memory.on_turn_complete(chat(8)) is None  # left to the background
        assert memory.flush(timeout=30)
        assert memory.status().compaction_watermark > 1


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


def test_compacted_history_leaves_its_room_to_memory(engine: MemoryEngine) -> None:
    """The history's compacted messages are not sent (the filter removes them): memory gets
    their room — unless the caller says it sends them all the same (``Room.sent``)."""
    engine.note_fixed_tokens(1650)
    history = chat(8)
    assert engine.on_turn_complete(history) is not None
    costs = [engine.counter.count(m["content"]) + 4 for m in history]
    query = "When is the Henninger filing due?"
    assembled = engine.on_message_inbound(query, history, room=Room(tokens=1000, history=costs))
    assert assembled.history is not None
    removed = {r.index for r in assembled.history.removed}
    assert removed, "the compacted turns are filtered out"
    assert assembled.room_left == 1000 - sum(c for i, c in enumerate(costs) if i not in removed)
    everything = Room(tokens=1000, history=costs, sent=lambda kept: range(len(history)))
    assembled = engine.on_message_inbound(query, history, room=everything)
    assert assembled.room_left == 1000 - sum(costs)
