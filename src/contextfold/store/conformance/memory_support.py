"""Shared data and helpers of the memory-store conformance suite."""

from __future__ import annotations

from collections.abc import Callable

from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.store import open_memory_store
from contextfold.store.protocols import MemoryStorage
from contextfold.tokens import CharCounter, TokenCounter

TOPICS = [
    "We should deploy the billing service to Kubernetes on Friday.",
    "The database migration for invoices needs a rollback plan.",
    "Kubernetes pods keep restarting; check the billing service memory limit.",
    "Lunch options near the office include ramen and tacos.",
    "Invoices are generated nightly by the billing cron job.",
    "Remember to rotate the API keys before the Kubernetes upgrade.",
]


def messages(texts: list[str]) -> list[Message]:
    """User and assistant turns, alternating, from ``texts``."""
    roles = ("user", "assistant")
    return [Message(role=roles[i % 2], content=t) for i, t in enumerate(texts)]


def msg(role: str, text: str) -> Message:
    return Message(role=role, content=text)


def filled(store: MemoryStorage, session: str = "s1") -> MemoryStorage:
    """``store`` with session ``session`` (metadata ``{"user": "ada"}``) holding ``TOPICS``."""
    store.create_session(session, {"user": "ada"})
    store.append_turns(session, messages(TOPICS))
    return store


def stored(store: MemoryStorage, sid: str, *texts: str) -> None:
    """Append ``texts`` (user, assistant, …) to ``sid``, creating it when needed."""
    if sid not in store.sessions():
        store.create_session(sid)
    roles = ["user", "assistant"]
    store.append_turns(sid, [msg(roles[i % 2], t) for i, t in enumerate(texts)])


def exchange(store: MemoryStorage, sid: str, n: int) -> list[int]:
    """One question and its answer, committed with the session's derive job."""
    return store.commit_exchange(
        sid,
        [Message(role="user", content=f"question {n}"), Message(role="assistant", content="ok")],
    )


def tool_exchange() -> list[Message]:
    return [
        Message(role="user", content="What's the weather in Paris?"),
        Message(
            role="assistant",
            content=(
                TextBlock(text="Let me check."),
                ToolUseBlock(id="call_1", name="get_weather", input={"city": "Paris", "n": [1, 2]}),
            ),
        ),
        Message(
            role="tool",
            content=(
                ToolResultBlock(tool_use_id="call_1", name="get_weather", content='{"c": 18}'),
            ),
        ),
        Message(role="assistant", content="It is 18 °C in Paris.", name="bot"),
    ]


def is_sqlite(store: MemoryStorage) -> bool:
    """Whether ``store`` is the SQLite backend (for the strict xfails of known SQLite bugs)."""
    return type(store).__module__.startswith("contextfold.store.sqlite")


class StoreFactory:
    """Opens stores at ``location`` with ``open`` (``open_memory_store``: a new ``":memory:"``
    database each call for ``sqlite-memory``), and closes them all at the end of the test."""

    def __init__(
        self,
        backend: str,
        location: str,
        open: Callable[..., MemoryStorage] = open_memory_store,
    ) -> None:
        self.backend = backend
        self.location = location
        self._open = open
        self.opened: list[MemoryStorage] = []

    def __call__(self, *, counter: TokenCounter | None = None) -> MemoryStorage:
        store = self._open(self.location, counter=counter or CharCounter())
        self.opened.append(store)
        return store

    def close(self) -> None:
        for store in reversed(self.opened):
            store.close()
        self.opened.clear()
