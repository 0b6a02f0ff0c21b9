"""``TurnNumbers``: the conversation turn a request is, counted in the stored conversation.

A client that trims its history (keeps the last N messages, or sends only the new ones after
memory took the rest) sends the same few user messages every time: counting them would call
every request of a 30-turn conversation "turn 3". The turn is counted where the whole
conversation is: the user messages (with text: a tool result is not a turn) stored on the
branch up to the turn the request continues, plus the new ones the request brings.

The counts of the turns seen lately are remembered (a continuing conversation reads nothing);
a turn not remembered (the first request after a restart, another worker's turn) is counted
from the nearest remembered turn before it, reading only the turns in between. It runs on the
proxy's writer thread, never on the response path.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from contextfold.items import Message, TextBlock

if TYPE_CHECKING:
    from contextfold.server.proxy.record import Plan
    from contextfold.store.protocols import MemoryStorage

__all__ = ["TurnNumbers", "user_turns"]


def user_turns(messages: Sequence[Message]) -> int:
    """The user messages with text among ``messages`` (the turns a person typed)."""
    return sum(
        1 for m in messages if m.role == "user" and any(isinstance(b, TextBlock) for b in m.content)
    )


class TurnNumbers:
    """Remembered (session, seq) -> user turns up to that seq, for at most ``sessions``
    sessions (``points`` seqs each)."""

    def __init__(self, store: MemoryStorage, *, sessions: int = 2000, points: int = 64) -> None:
        self.store = store
        self.sessions = sessions
        self.points = points
        self._known: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, session_id: str, seq: int, turns: int) -> None:
        with self._lock:
            seqs, counts = self._known.setdefault(session_id, ([], []))
            self._known.move_to_end(session_id)
            i = bisect.bisect_left(seqs, seq)
            if i < len(seqs) and seqs[i] == seq:
                counts[i] = turns
            else:
                seqs.insert(i, seq)
                counts.insert(i, turns)
            if len(seqs) > self.points:
                del seqs[0], counts[0]
            while len(self._known) > self.sessions:
                self._known.popitem(last=False)

    def upto(self, session_id: str, seq: int) -> int:
        """The user turns stored on ``session_id`` at seqs ``1..seq``."""
        if seq <= 0:
            return 0
        with self._lock:
            seqs, counts = self._known.get(session_id, ([], []))
            i = bisect.bisect_right(seqs, seq) - 1
            base_seq, base = (seqs[i], counts[i]) if i >= 0 else (0, 0)
        if base_seq == seq:
            return base
        stored = self.store.turns(session_id, start=base_seq + 1, end=seq)
        total = base + user_turns([t.message for t in stored])
        self.remember(session_id, seq, total)
        return total

    def of(self, plan: Plan) -> int:
        """The turn ``plan``'s request is: stored user turns before it plus its new ones (a
        request memory could not place: the user messages it carries)."""
        messages = plan.parsed.messages if plan.parsed is not None else []
        position = plan.position
        if position is None:
            return user_turns(messages)
        new = user_turns(messages[position.new_from :])
        if position.fork is not None:
            before = self.upto(*position.fork)
        elif position.session_id is not None:
            before = self.upto(position.session_id, position.anchor)
        else:
            before = 0
        return before + new
