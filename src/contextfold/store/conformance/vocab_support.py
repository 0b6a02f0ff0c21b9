"""Helpers of the vocabulary tests: a conversation with one over-broad tag, and an engine that
splits it."""

from __future__ import annotations

from typing import Any

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.protocols import MemoryStorage
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")

# Three sub-topics under one tag the keyword list puts on every turn: each user turn and the
# reply to it.
SUBTOPICS = {
    "availability": (
        "Reservation check: does Resy show availability for {n} people on Friday?",
        "Resy lists availability at 7pm Friday for the reservation.",
    ),
    "browser": (
        "Reservation help: the browser session for OpenTable expired again, attempt {n}.",
        "I reopened the OpenTable browser session for the reservation.",
    ),
    "payment": (
        "Reservation deposit: the credit card payment failed at checkout, try {n}.",
        "The reservation deposit needs another credit card payment at checkout.",
    ),
}


def broad_conversation(exchanges: int = 24) -> list[dict[str, str]]:
    """``2 * exchanges`` turns, every one of them about a reservation."""
    kinds = list(SUBTOPICS)
    messages = []
    for n in range(exchanges):
        question, answer = SUBTOPICS[kinds[n % len(kinds)]]
        messages.append({"role": "user", "content": question.format(n=n + 2)})
        messages.append({"role": "assistant", "content": answer})
    return messages


def make_engine(store: MemoryStorage | None = None, **overrides: Any) -> MemoryEngine:
    cfg = MemoryConfig.model_validate(
        {
            "tagger": {
                "keywords": {"reservation": ["reservation"]},
                "splitting": {"enabled": True, "frequency_threshold": 15},
            },
            "recall": {"embedder": "none"},
            **overrides,
        }
    )
    return MemoryEngine(
        cfg, store=store or MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER
    )


def turn_by_turn(engine: MemoryEngine, messages: list[dict[str, str]], sid: str = "s") -> None:
    for i in range(0, len(messages), 2):
        engine.on_turn_complete(messages[i : i + 2], session_id=sid)
