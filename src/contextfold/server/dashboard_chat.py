"""The Ask page as a multi-turn chat (seed 004's demo): each question with a ``chat_id`` is
one turn of a conversation kept in the server's ``MemoryEngine`` (session ``ask:<chat_id>``).

Per turn, all five sections of the fixed budget are live:

- **goal**: the question and the conversation's most recent ``RECENT_EXCHANGES`` exchanges
  (as conversation items; the budget keeps the question and drops the oldest history first);
- **memory**: what ``MemoryEngine.on_message_inbound`` recalls for the question from the
  turns that left that recent window (a fact said in turn 1 comes back in turn 6), ranked by
  its recall score;
- **retrieval**: the corpus chunks, as on the one-shot Ask page;
- **tool outputs**: the result of the memory tool ``find_quote`` for the question when
  ``dashboard.chat_tool`` is ``find_quote`` (the exact earlier lines the question matches);
- **instructions**: the answer instructions.

After the answer, the question and the answer (when an LLM gave one) are stored as the
conversation's next turns.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from contextfold.items import ContextItem, Message, SourceType

if TYPE_CHECKING:
    from contextfold.memory.engine import MemoryEngine

__all__ = ["RECENT_EXCHANGES", "ChatTurn", "chat_session"]

#: Exchanges of the conversation sent in the goal section; older ones are memory's to recall.
RECENT_EXCHANGES = 2


def chat_session(chat_id: str) -> str:
    return f"ask:{chat_id}"


class ChatTurn:
    """One chat turn's context before the answer, and its storing after."""

    def __init__(self, memory: MemoryEngine, chat_id: str, question: str, tool: str | None):
        self.memory = memory
        self.session = chat_session(chat_id)
        self.question = question
        store = memory.store
        sid = memory._session(self.session)
        stored = [t.message for t in store.turns(sid)]
        self.turn = sum(m.role == "user" for m in stored) + 1
        starts = [i for i, m in enumerate(stored) if m.role == "user"]
        cut = starts[-RECENT_EXCHANGES] if len(starts) >= RECENT_EXCHANGES else 0
        self.recent: list[Message] = stored[cut:]
        assembled = memory.on_message_inbound(question, self.recent, session_id=sid)
        self.memory_items = [
            item.model_copy(
                update={"section": None, "score": float(item.metadata.get("score", 0.0))}
            )
            for item in assembled.items
        ]
        self.tool_outputs: list[str] = []
        if tool == "find_quote" and stored:
            found = json.loads(
                memory.handle_tool_call(
                    "find_quote", {"query": question, "limit": 3}, session_id=sid
                )
            )
            if isinstance(found, list) and found:
                lines = [f"- {q.get('role', '')}: {q.get('excerpt', '')}" for q in found]
                self.tool_outputs.append("find_quote results:\n" + "\n".join(lines))

    def items(self) -> list[ContextItem]:
        """The conversation and memory items for the packer."""
        history = [ContextItem.from_message(m) for m in self.recent]
        return [*history, *self.memory_items]

    def store(self, answer: str | None) -> None:
        turns = [Message(role="user", content=self.question)]
        if answer:
            turns.append(Message(role="assistant", content=answer))
        self.memory.on_turn_complete(turns, session_id=self.session, new_only=True)

    def summary(self, answer: str | None) -> dict[str, Any]:
        """What the page shows of the conversation: this turn's number, the history sent in
        the goal section, and the memory recalled."""
        return {
            "turn": self.turn,
            "history": [{"role": m.role, "text": m.text()} for m in self.recent],
            "memory": [i.content for i in self.memory_items],
            "tool_outputs": list(self.tool_outputs),
            "answer": answer,
            "source_type": SourceType.CONVERSATION.value,
        }
