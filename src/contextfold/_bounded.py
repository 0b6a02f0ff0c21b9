"""Bounded in-process state: memos bounded by bytes as well as entries, per-session state kept
for the most recently used sessions only, and client values clipped before they reach a log,
a record or a response.

Nothing a client sends may make the process keep more than a fixed amount: a memo keyed by
message text counts the text's size, and a per-session cache holds a bounded number of
sessions, each rebuilt from the store when it is asked for again.

>>> print(clip("x" * 500, 10))
xxxxxxxxxx… (500 characters)
>>> memo = BoundedMemo(entries=2, max_bytes=1000)
>>> memo.get("a", lambda: 1, size=1), memo.get("a", lambda: 2, size=1)
(1, 1)
>>> lru = SessionLRU(2)
>>> for sid in "abc":
...     _ = lru.get(sid, lambda: {})
>>> list(lru)
['b', 'c']
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["CLIP", "BoundedMemo", "SessionLRU", "clip", "text_size"]

K = TypeVar("K")
V = TypeVar("V")

#: How many characters of a client value an error, a log line or a record may quote.
CLIP = 200


def clip(text: str, limit: int = CLIP) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was when cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def text_size(text: str) -> int:
    """The bytes ``text`` takes in memory, near enough (a CPython str: a header, then one to
    four bytes per character)."""
    return 64 + len(text) * (1 if text.isascii() else 4)


class BoundedMemo(Generic[K, V]):
    """A memo shared by requests, bounded by ``entries`` and by ``max_bytes`` (each entry's
    ``size`` as the caller measures it). Least recently used entries go first; a value larger
    than a quarter of ``max_bytes`` is made and returned, never kept. Thread-safe."""

    def __init__(self, *, entries: int, max_bytes: int) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K, make: Callable[[], V], *, size: int | Callable[[V], int]) -> V:
        """The memo's value for ``key``, made by ``make`` on a miss. ``size``: the entry's
        bytes, or a function measuring them from the value made."""
        with self._lock:
            found = self._data.get(key)
            if found is not None:
                self._data.move_to_end(key)
                return found[0]
        value = make()
        if callable(size):
            size = size(value)
        if size * 4 > self.max_bytes:
            return value
        with self._lock:
            if key not in self._data:
                self._data[key] = (value, size)
                self.bytes += size
                while len(self._data) > self.entries or self.bytes > self.max_bytes:
                    _, (_, dropped) = self._data.popitem(last=False)
                    self.bytes -= dropped
        return value

    def discard(self, key: K) -> None:
        with self._lock:
            found = self._data.pop(key, None)
            if found is not None:
                self.bytes -= found[1]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = 0


class SessionLRU(Generic[V]):
    """Per-session state for at most ``size`` sessions, least recently used out first; a
    session that falls out is rebuilt by ``get``'s ``load`` (from the store) the next time it
    is asked for. Thread-safe; ``load`` runs outside the lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._data))

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._data

    def touch(self, session_id: str) -> None:
        """Count a use of the session's state (it goes out last), if cached."""
        with self._lock:
            if session_id in self._data:
                self._data.move_to_end(session_id)

    def peek(self, session_id: str) -> V | None:
        """The session's state when cached (not counted as a use), else ``None``."""
        with self._lock:
            return self._data.get(session_id)

    def get(self, session_id: str, load: Callable[[], V]) -> V:
        with self._lock:
            found = self._data.get(session_id)
            if found is not None:
                self._data.move_to_end(session_id)
                return found
        value = load()
        return self.put(session_id, value, keep=True)

    def put(self, session_id: str, value: V, *, keep: bool = False) -> V:
        """Cache ``value`` for the session; with ``keep``, a value cached meanwhile wins and
        is returned."""
        with self._lock:
            if keep and session_id in self._data:
                self._data.move_to_end(session_id)
                return self._data[session_id]
            self._data[session_id] = value
            self._data.move_to_end(session_id)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
            return value

    def pop(self, session_id: str) -> V | None:
        with self._lock:
            return self._data.pop(session_id, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
