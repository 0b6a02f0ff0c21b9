"""The ``contextfold`` system of the LoCoMo harness: the real ``MemoryEngine``, end to end.

Each conversation is ingested in order into a fresh in-memory store, one message per turn
(``"speaker: text"``, the first speaker as ``user``), with the session timestamps, through
``MemoryEngine.ingest_history`` — tagging, compaction (an 8k-token window, so the engine pages
as it would in a long chat) and all. Each question then gets ``on_message_inbound`` with no
live history (every stored turn is a candidate), once per budget; the context is the
returned ``prepend_text``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from contextfold.eval.locomo import LocomoConversation
from contextfold.eval.locomo_systems import SystemContext, register_system
from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.protocols import MemoryStorage
from contextfold.store.sqlite.memory import MemoryStore

__all__ = ["MemoryEngineSystem", "eval_config"]


def eval_config() -> MemoryConfig:
    """The configuration the LoCoMo run uses: defaults, with an 8k-token window."""
    return MemoryConfig.model_validate({"context_window": 8192})


class _SharedEmbedder:
    """The run's shared embedder: stored turns through its cache, questions embedded now."""

    def __init__(self, ctx: SystemContext) -> None:
        self.ctx = ctx
        self.name = "locomo-shared"

    @property
    def dim(self) -> int:
        return int(self.ctx.embed_query("dimension probe").shape[0])

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if len(texts) == 1:
            return self.ctx.embed_query(texts[0])[None, :]
        return self.ctx.embed_stored(texts)


class MemoryEngineSystem:
    name = "contextfold"

    def __init__(self, ctx: SystemContext, config: MemoryConfig | None = None) -> None:
        self.ctx = ctx
        self.config = config if config is not None else eval_config()
        self.engine: MemoryEngine | None = None

    def ingest(self, conversation: LocomoConversation) -> None:
        first = conversation.speakers[0]
        messages = [
            Message(role="user" if t.speaker == first else "assistant", content=t.turn_text)
            for t in conversation.turns
        ]
        self.engine = MemoryEngine(
            self.config,
            store=self._store(conversation.sample_id),
            embedder=_SharedEmbedder(self.ctx),
            counter=self.ctx.counter,
            session_id=conversation.sample_id,
        )
        self.engine.ingest_history(messages, timestamps=[t.timestamp for t in conversation.turns])
        self.engine.recaller.ensure_vectors(conversation.sample_id)

    def _store(self, session_id: str) -> MemoryStorage:
        """A fresh in-memory store, or the run's shared one emptied of every session."""
        if self.ctx.memory_store is None:
            return MemoryStore(counter=self.ctx.counter)
        store = self.ctx.shared_store()
        for sid in store.sessions():
            # Through the last conversation's engine when there is one: its vector files go too.
            if self.engine is not None:
                self.engine.delete_session(sid)
            else:
                store.delete_session(sid)
        return store

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
        if self.engine is None:
            raise RuntimeError("ingest a conversation first")
        return {b: self.engine.on_message_inbound(question, budget=b).prepend_text for b in budgets}


register_system("contextfold", MemoryEngineSystem)
