"""``ChatSession``: one interactive conversation through the memory hooks, with what the chat
TUI shows about each turn — and nothing of Textual, so it is tested (and usable) on its own.

Per message: ``on_message_inbound`` with the live history (the turns not compacted yet), the
configured LLM's reply (a placeholder without one) with the memory block after the system
prompt, then ``on_turn_complete``, which tags the exchange and compacts past a threshold.
Each turn keeps the payload sent to the model, the inbound and response tags, the broad /
temporal flags, the assembled context and the budget breakdown (core / hint / tags /
conversation, of the model's window). Brief mode silently asks the model for two lines (the
stored turn is what the user typed). ``export`` writes the session as JSON that
``contextfold chat --replay`` reads back.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from contextfold.items import Message

if TYPE_CHECKING:
    from contextfold.memory.compactor import CompactionReport
    from contextfold.memory.engine import MemoryEngine

__all__ = ["BRIEF", "Budget", "ChatSession", "ChatTurn", "TagActivity"]

PLACEHOLDER = "(no model configured: set llm: in contextfold.yaml)"
SYSTEM_PROMPT = "You are a helpful assistant. Use the conversation memory below when it helps."
#: What brief mode appends to the message sent to the model (never to the stored turn).
BRIEF = "\n\n(Answer in 2 lines.)"


class Budget(BaseModel):
    """Tokens of the model's window per part of the request."""

    core: int = 0  # the system prompt
    hint: int = 0  # the <context-topics> hint
    tags: int = 0  # the rest of the memory block: summaries, paged topics, recalled turns
    conversation: int = 0  # the live history and the new message
    window: int = 0

    @property
    def used(self) -> int:
        return self.core + self.hint + self.tags + self.conversation


class ChatTurn(BaseModel):
    """One user message and what memory and the model did with it."""

    turn: int
    user: str
    reply: str
    reply_source: str  # "llm" or "placeholder"
    brief: bool = False
    matched_tags: list[str] = Field(default_factory=list)
    related_tags: list[str] = Field(default_factory=list)
    response_tags: list[str] = Field(default_factory=list)
    broad: bool = False
    temporal: bool = False
    context: str = ""  # the memory block injected after the system prompt
    payload: list[dict[str, str]] = Field(default_factory=list)  # what went to the model
    budget: Budget = Field(default_factory=Budget)
    recalled: int = 0
    inbound_ms: float = 0.0
    reply_ms: float = 0.0
    complete_ms: float = 0.0
    compacted_turns: int = 0
    tokens_freed: int = 0


class TagActivity(BaseModel):
    """A tag of the session: its stored turns, the chat turns since it last came up, and its
    depth in the working set (``-``: not paged)."""

    tag: str
    turns: int
    since: int | None  # None: not seen in this chat (stored earlier)
    depth: str = "-"

    @property
    def level(self) -> str:
        if self.since is None:
            return "stored"
        return "active" if self.since <= 1 else "warm" if self.since <= 5 else "cold"


class ChatSession:
    """A chat on ``engine``'s default session (``budget``: the memory budget per turn)."""

    def __init__(
        self, engine: MemoryEngine, *, budget: int | None = None, system: str = SYSTEM_PROMPT
    ) -> None:
        self.engine = engine
        self.budget = budget
        self.system = system
        self.brief = False
        self.turns: list[ChatTurn] = []
        self.compactions: list[CompactionReport] = []
        self.history: list[Message] = []
        self.live: list[Message] = []

    @property
    def session_id(self) -> str:
        return self.engine.session_id

    def _count(self, text: str) -> int:
        return self.engine.counter.count(text) if text else 0

    def _reply(self, payload: list[dict[str, str]]) -> tuple[str, str]:
        llm, client = self.engine.config.llm, self.engine.llm_client
        if llm is None or client is None:
            return PLACEHOLDER, "placeholder"
        result = client.chat(payload, llm.model)
        usage = result.usage
        cost = (
            usage.prompt_tokens * llm.prompt_price_per_million
            + usage.completion_tokens * llm.completion_price_per_million
        ) / 1e6
        self.engine.store.costs.log_cost(
            self.session_id,
            "chat",
            result.model or llm.model,
            usage.prompt_tokens,
            usage.completion_tokens,
            cost,
        )
        return str(result.text), "llm"

    def _response_tags(self) -> list[str]:
        store, sid = self.engine.store, self.session_id
        last = store.last_seq(sid)
        tags: dict[str, float] = {}
        for stored in store.turns(sid, start=max(1, last - 1), end=last):
            for tag, weight in stored.tags.items():
                tags[tag] = max(weight, tags.get(tag, 0.0))
        return sorted(tags, key=lambda t: (-tags[t], t))

    def _set_live(self) -> None:
        live_turns = self.engine.status().live_turns
        self.live = self.history[-live_turns:] if live_turns else []

    def send(self, text: str) -> ChatTurn:
        """One turn: recall, the model's reply, store and tag (and compact when due)."""
        if not text.strip():
            raise ValueError("an empty message; type something to send")
        engine = self.engine
        user = Message(role="user", content=text)
        start = time.perf_counter()
        ctx = engine.on_message_inbound(user, self.live, budget=self.budget)
        inbound_ms = (time.perf_counter() - start) * 1000
        system = self.system + (f"\n\n{ctx.prepend_text}" if ctx.prepend_text else "")
        payload = [{"role": "system", "content": system}]
        payload += [
            {"role": m.role, "content": m.text()}
            for m in self.live
            if m.role in ("user", "assistant")
        ]
        payload.append({"role": "user", "content": text + (BRIEF if self.brief else "")})
        start = time.perf_counter()
        reply, source = self._reply(payload)
        reply_ms = (time.perf_counter() - start) * 1000
        self.history += [user, Message(role="assistant", content=reply)]
        start = time.perf_counter()
        report = engine.on_turn_complete(self.history)
        complete_ms = (time.perf_counter() - start) * 1000
        if report is not None:
            self.compactions.append(report)
        memory = ctx.budget
        turn = ChatTurn(
            turn=len(self.turns) + 1,
            user=text,
            reply=reply,
            reply_source=source,
            brief=self.brief,
            matched_tags=list(ctx.matched_tags),
            related_tags=list(ctx.related_tags),
            response_tags=self._response_tags(),
            broad=ctx.broad,
            temporal=ctx.temporal,
            context=ctx.prepend_text,
            payload=payload,
            budget=Budget(
                core=self._count(self.system),
                hint=memory.hint,
                tags=max(0, memory.used - memory.hint),
                conversation=sum(self._count(m["content"]) + 3 for m in payload[1:]),
                window=engine.config.context_window,
            ),
            recalled=memory.turns_recalled,
            inbound_ms=round(inbound_ms, 2),
            reply_ms=round(reply_ms, 2),
            complete_ms=round(complete_ms, 2),
            compacted_turns=report.turns_compacted if report else 0,
            tokens_freed=report.tokens_freed if report else 0,
        )
        self.turns.append(turn)
        self._set_live()
        return turn

    def compact(self) -> CompactionReport | None:
        """Compact now (``/compact``), whatever the thresholds say; ``None``: nothing to."""
        report = self.engine.compact()
        if report is not None:
            self.compactions.append(report)
        self._set_live()
        return report

    def tags(self) -> list[TagActivity]:
        """Every tag of the session, most used first, with its activity in this chat."""
        status = self.engine.status()
        last: dict[str, int] = {}
        for turn in self.turns:
            for tag in turn.response_tags:
                last[tag] = turn.turn
        now = len(self.turns)
        return [
            TagActivity(
                tag=tag,
                turns=count,
                since=now - last[tag] if tag in last else None,
                depth=status.working_set.get(tag, "-"),
            )
            for tag, count in status.tags.items()
        ]

    def export(self, path: Path) -> Path:
        """Write the session (every turn with its data, the messages, the compactions) as
        JSON; ``contextfold chat --replay`` reads it back."""
        data: dict[str, Any] = {
            "session": self.session_id,
            "source": "contextfold chat",
            "exported_at": datetime.now(UTC).isoformat(),
            "turns": [t.model_dump() for t in self.turns],
            "compactions": [c.model_dump(mode="json") for c in self.compactions],
            "messages": [{"role": m.role, "content": m.text()} for m in self.history],
        }
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        return path
