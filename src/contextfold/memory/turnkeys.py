"""``TurnKeys``: which stored turn a message of the client's history is, without reading every
turn back on every request.

The proxy hands the engine the whole history on each request; the engine must tell which of
those messages are stored turns (they are not recalled again, and the compacted ones may be
left out of the forwarded history). A message matches a turn by ``(role, text)``. Reading
every stored turn's text back for that is O(session) per request, so this index keeps, per
session, the hash of each stored turn's ``(role, text)`` — as stored, and with runs of
whitespace made one space — and reads only the turns stored since its last look — turns are
append-only. It reads them with the session's incarnation, in one snapshot
(``MemoryStorage.turn_texts_with_incarnation``), and starts the session over when that
changed (the session was deleted and written again, by this process or another, even with
as many turns and the same last one).

Only a bounded number of sessions is kept (least recently used first out); a session that
falls out is read again in full the next time it is asked for.

>>> from contextfold.items import Message
>>> from contextfold.store.sqlite.memory import MemoryStore
>>> store = MemoryStore()
>>> _ = store.create_session("s")
>>> _ = store.append_turns("s", [Message(role="user", content="hello")])
>>> keys = TurnKeys(store)
>>> keys.seqs_matching("s", {key_of(Message(role="user", content="hello"))})
{1}

A client that re-renders the history it resends (aider restores it from its Markdown
transcript: trailing spaces, blank lines around a reply) still holds the turn
(``seqs_held``):

>>> keys.seqs_held("s", [Message(role="user", content="hello  \\n")])
{1}
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Collection, Sequence

from contextfold.items import Message
from contextfold.store.protocols import MemoryStorage

__all__ = ["TurnKeys", "key_of", "loose_key_of"]


def key_of(message: Message) -> int:
    """The match key of a message: the hash of its role and text (equal messages, equal
    keys; Python caches a string's hash, so a resent history hashes almost for free)."""
    return hash((message.role, message.text()))


def _loose(role: str, text: str) -> int:
    return hash((role, " ".join(text.split())))


def loose_key_of(message: Message) -> int:
    """The key of a message with runs of whitespace in its text made one space (the
    comparison of ``store.memory_schema.match_key``, by which the proxy recognises a
    history)."""
    return _loose(message.role, message.text())


class _Session:
    __slots__ = ("incarnation", "keys", "loose")

    def __init__(self, incarnation: int | None = None) -> None:
        # Machine words (a hash fits a signed 64-bit one): 16 bytes a turn for both, not the
        # 80 that two lists of Python ints take.
        self.keys: array[int] = array("q")  # keys[i] is turn seq i + 1
        self.loose: array[int] = array("q")  # the same, whitespace collapsed
        self.incarnation = incarnation  # of the session the keys were read from


class TurnKeys:
    def __init__(self, store: MemoryStorage, *, sessions: int = 256) -> None:
        self.store = store
        self.max_sessions = sessions
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def keys(self, session_id: str) -> array[int]:
        """The key of every stored turn of the session, in seq order (index 0 is seq 1).

        One read of the store on the usual path: the turns after the last known one, with the
        session's incarnation. A second, from the first turn, only when the session was
        deleted and created again since (or the seqs do not follow on)."""
        state = self._sessions.pop(session_id, None) or _Session()
        self._sessions[session_id] = state
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        known = len(state.keys)
        incarnation, rows = self.store.turn_texts_with_incarnation(session_id, known)
        # seqs always start at 1, no gaps
        if incarnation != state.incarnation or (rows and rows[0][0] != known + 1):
            if known:
                incarnation, rows = self.store.turn_texts_with_incarnation(session_id, 0)
            state = self._sessions[session_id] = _Session(incarnation)
        for _, role, text, _ in rows:
            state.keys.append(hash((role, text)))
            state.loose.append(_loose(role, text))
        return state.keys

    def seqs_matching(self, session_id: str, keys: Collection[int]) -> set[int]:
        """The seqs of the stored turns whose key is in ``keys``."""
        return {i + 1 for i, key in enumerate(self.keys(session_id)) if key in keys}

    def seqs_held(self, session_id: str, messages: Sequence[Message]) -> set[int]:
        """The seqs of the stored turns that ``messages`` hold: the same role and text, or
        the same once runs of whitespace are made one space (a client that re-renders its
        history). Only the messages that match no turn as they are, and only while some turn
        is unmatched, have their whitespace collapsed: a history resent byte for byte costs
        what ``seqs_matching`` does."""
        keys = self.keys(session_id)
        exact = {key_of(m) for m in messages}
        held = {i + 1 for i, key in enumerate(keys) if key in exact}
        if len(held) == len(keys):
            return held
        known = set(keys)
        loose = {loose_key_of(m) for m in messages if key_of(m) not in known}
        if loose:
            state = self._sessions[session_id]
            held.update(
                i + 1 for i, key in enumerate(state.loose) if key in loose and i + 1 not in held
            )
        return held

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
