"""``KeyChain``: one session's turn match keys held in memory and extended incrementally, the
cache behind the PostgreSQL store's ``turn_keys`` (backend-neutral: it reads through a callable).

Raw turns are append-only, so a session's keys only grow: each ``extend`` reads the turns
stored since the last call, starting at the last known turn to check, by its content hash,
that the session was not deleted and written again meanwhile (then it reads everything
over). The backend hands in how to read the rows (``read(from_seq)``).

>>> rows = [(1, "k1", "h1"), (2, "k2", "h2")]
>>> chain = KeyChain()
>>> chain.extend(lambda start: [r for r in rows if r[0] >= start]), chain.keys
(True, ['k1', 'k2'])
>>> rows[:] = [(1, "x1", "g1"), (2, "x2", "g2"), (3, "x3", "g3")]  # rewritten
>>> chain.extend(lambda start: [r for r in rows if r[0] >= start]), chain.keys
(True, ['x1', 'x2', 'x3'])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["KEY_CHAIN_SESSIONS", "KeyChain"]

#: Sessions whose turn match keys are kept in memory (``turn_keys``).
KEY_CHAIN_SESSIONS = 256

#: (seq, match key, mark) of a session's turns with seq >= the argument, in order; the mark
#: (content hash or row id) tells whether the last known turn is still the same row.
RowReader = Callable[[int], Sequence[Sequence[Any]]]


class KeyChain:
    """One session's turn match keys in seq order (``keys[i]`` is seq ``i + 1``) and the
    content hash of the last of them, extended from the store as turns are appended."""

    __slots__ = ("keys", "last_hash", "lock")

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.last_hash: str | None = None
        self.lock = threading.Lock()

    def extend(self, read: RowReader) -> bool:
        """Read the turns stored since the last call (from the last known one, whose hash
        must not have changed, else from the start); False when the seqs are not 1, 2, …
        without gaps (the chain is then dropped and the caller reads the store itself)."""
        known = len(self.keys)
        rows = list(read(max(known, 1)))
        if known:
            if rows and rows[0][0] == known and rows[0][2] == self.last_hash:
                rows = rows[1:]
            else:  # deleted and written again: start over
                self.keys, self.last_hash = [], None
                return self.extend(read)
        for seq, key, content_hash in rows:
            if seq != len(self.keys) + 1:
                self.keys, self.last_hash = [], None
                return False
            self.keys.append(str(key))
            self.last_hash = str(content_hash)
        return True

    def window(self, lo: int, hi: int) -> dict[int, str]:
        """seq -> key of the known turns with ``lo <= seq <= hi``."""
        keys = self.keys
        return {seq: keys[seq - 1] for seq in range(max(lo, 1), min(hi, len(keys)) + 1)}
