"""``TurnKeys``: which stored turn a message of the client's history is, without reading every
turn back on every request.

The proxy hands the engine the whole history on each request; the engine must tell which of
those messages are stored turns (they are not recalled again, and the compacted ones may be
left out of the forwarded history). A message matches a turn by ``(role, text)``. Reading
every stored turn's text back for that is O(session) per request, so this index keeps, per
session, the hash of each stored turn's ``(role, text)`` and reads only the turns stored since
its last look — turns are append-only. Before it extends a session's keys it checks that the
last turn it knows still has the same content hash, and starts the session over when not (the
session was deleted and written again, by this process or another).

Only a bounded number of sessions is kept (least recently used first out); a session that
falls out is read again in full the next time it is asked for.

>>> from contextfold.items import Message
>>> from contextfold.store.memory import MemoryStore
>>> store = MemoryStore()
>>> _ = store.create_session("s")
>>> _ = store.append_turns("s", [Message(role="user", content="hello")])
>>> keys = TurnKeys(store)
>>> keys.seqs_matching("s", {key_of(Message(role="user", content="hello"))})
{1}
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from contextfold.items import Message
from contextfold.store.memory import MemoryStore

__all__ = ["TurnKeys", "key_of"]


def key_of(message: Message) -> int:
    """The match key of a message: the hash of its role and text (equal messages, equal
    keys; Python caches a string's hash, so a resent history hashes almost for free)."""
    return hash((message.role, message.text()))


class _Session:
    __slots__ = ("keys", "last_hash")

    def __init__(self) -> None:
        self.keys: list[int] = []  # keys[i] is turn seq i + 1
        self.last_hash: str | None = None


class TurnKeys:
    def __init__(self, store: MemoryStore, *, sessions: int = 256) -> None:
        self.store = store
        self.max_sessions = sessions
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def keys(self, session_id: str) -> list[int]:
        """The key of every stored turn of the session, in seq order (index 0 is seq 1)."""
        state = self._sessions.pop(session_id, None)
        stale = (
            state is not None
            and bool(state.keys)
            and (self.store.turn_hash(session_id, len(state.keys)) != state.last_hash)
        )
        if state is None or stale:
            state = _Session()
        self._sessions[session_id] = state
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        rows = self.store.turn_texts_after(session_id, len(state.keys))
        if rows and rows[0][0] != len(state.keys) + 1:  # seqs always start at 1, no gaps
            state.keys = []
            rows = self.store.turn_texts_after(session_id, 0)
        for _, role, text, content_hash in rows:
            state.keys.append(hash((role, text)))
            state.last_hash = content_hash
        return state.keys

    def seqs_matching(self, session_id: str, keys: Collection[int]) -> set[int]:
        """The seqs of the stored turns whose key is in ``keys``."""
        return {i + 1 for i, key in enumerate(self.keys(session_id)) if key in keys}

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
