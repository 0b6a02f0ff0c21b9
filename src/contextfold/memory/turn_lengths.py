"""A session's turn token counts kept in memory for recall's length prior.

Recall multiplies each candidate's score by ``(tokens + 2) ** length_prior``; reading the
token counts of a few thousand candidates from the store at every recall cost time in
proportion to the candidates (about 17 ms for 2,800 at 100k turns). A stored turn never
changes while its session lives (turns are only appended; a deleted session is written again
under a new ``born`` number), so ``TurnLengths`` keeps the counts in an ``int32`` array
indexed by seq and appends the turns stored since, read with their incarnation in one query
(``MemoryStorage.turn_token_counts_after``). A recall then reads only the turns stored since
the last one. The ``Recaller`` charges these arrays to its cache limit
(``recall.vector_cache_mb``).

Beside them, the cost of each turn as a line of the memory block (its text and the newline
after it, counted by the assembler's counter: ``lines``, 0 until counted): the assembler counts
a recalled turn's line once, not again each time the token counter's memo has let it go. The
engine's derive counts each new turn's line as it tags it (``Recaller.note_lines``), so at
100k turns a recall, whose candidates are mostly turns no recall has packed before, counts
none (it counted about 130 a recall, 1.7 ms). Line costs may run past ``last``: a turn's line
is known before the recaller reads its token count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["LineCosts", "TurnLengths", "grown", "line_key"]


def grown(array: npt.NDArray[Any], top: int) -> npt.NDArray[Any]:
    """An array by seq long enough for seq ``top``: ``array`` itself, or a copy grown by a
    quarter at least (zeros after its values)."""
    if top < len(array):
        return array
    out = np.zeros(max(top + 1, len(array) * 5 // 4), array.dtype)
    out[: len(array)] = array
    return out


class LineCosts(Protocol):
    """Where the assembler reads and keeps line costs (``TurnLengths`` itself, or the
    recaller's ``SessionLines``)."""

    def lines(self, seqs: Sequence[int], counter: str) -> list[int]: ...

    def set_lines(self, costs: Sequence[tuple[int, int]], counter: str) -> None: ...


def line_key(counter: object) -> str:
    """What line costs are kept under: the counter's name and safety margin (two counters of
    one name may differ in their margin)."""
    return f"{getattr(counter, 'name', '')}/{getattr(counter, 'safety_margin', 0)!r}"


class TurnLengths:
    """The token counts of one session's turns, by seq (0 for a seq not stored), up to
    ``last``; ``born`` is the session's incarnation they belong to."""

    def __init__(self, born: int) -> None:
        self.born = born
        self.last = 0
        self._counts: npt.NDArray[np.int32] = np.zeros(0, np.int32)
        self._lines: npt.NDArray[np.int32] = np.zeros(0, np.int32)
        self.line_counter = ""  # the name of the counter the lines were counted with
        self.charged = 0  # the bytes the recaller's cache counted for it

    @classmethod
    def restored(
        cls,
        born: int,
        last: int,
        counts: npt.NDArray[np.int32],
        lines: npt.NDArray[np.int32] | None = None,
        line_counter: str = "",
    ) -> TurnLengths | None:
        """The counts (and line costs, counted by ``line_counter``) saved by an earlier process
        (``memory.snapshots``) up to seq ``last``; ``None`` when they do not cover it."""
        has_lines = lines is not None and bool(line_counter)
        if last < 0 or (len(counts) < last + 1 and (last or not has_lines)):
            return None  # (``last`` 0 and no counts: the line costs a derive counted, alone)
        out = cls(born)
        out._counts = np.array(counts[: last + 1], np.int32)
        if lines is not None and line_counter:
            out._lines = np.array(lines, np.int32)  # past ``last`` too: a turn's never changes
            out.line_counter = line_counter
        else:
            out._lines = np.zeros(last + 1, np.int32)
        out.last = last
        return out

    def copy(self) -> TurnLengths:
        """A copy: the counts and line costs as they are now (its own arrays). ``last`` is
        read first: ``extend`` (a recall's, meanwhile) writes the counts before it moves
        ``last``, so the copy's counts up to its ``last`` are all written."""
        out = TurnLengths(self.born)
        out.last = self.last
        out._counts, out._lines = self._counts.copy(), self._lines.copy()
        out.line_counter = self.line_counter
        return out

    @property
    def array(self) -> npt.NDArray[np.int32]:
        """The counts by seq (0 for a seq not stored), up to ``last`` at least."""
        return self._counts

    @property
    def line_array(self) -> npt.NDArray[np.int32]:
        """The line costs by seq (0: not counted yet)."""
        return self._lines

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes + self._lines.nbytes)

    def lines(self, seqs: Sequence[int], counter: str) -> list[int]:
        """Each seq's line cost as counted by the counter named ``counter`` (0: not counted,
        or counted by another counter, or past ``last``)."""
        if counter != self.line_counter:
            return [0] * len(seqs)
        lines = self._lines
        return [int(lines[s]) if 0 <= s < len(lines) else 0 for s in seqs]

    def set_lines(self, costs: Sequence[tuple[int, int]], counter: str) -> None:
        """Keep (seq, line cost) pairs of stored turns of this incarnation, counted by the
        counter named ``counter`` (another counter's costs kept so far are dropped first)."""
        if counter != self.line_counter:
            self._lines = np.zeros(len(self._lines), np.int32)
            self.line_counter = counter
        kept = [(seq, cost) for seq, cost in costs if seq >= 0]
        if not kept:
            return
        lines = self._lines = grown(self._lines, max(seq for seq, _ in kept))
        for seq, cost in kept:
            lines[seq] = cost

    def extend(self, rows: Sequence[tuple[int, int]]) -> None:
        """Add (seq, token count) pairs of turns after ``last``, in seq order."""
        if not rows:
            return
        top = rows[-1][0]
        self._counts = grown(self._counts, top)
        seqs = np.fromiter((seq for seq, _ in rows), np.int64, len(rows))
        self._counts[seqs] = np.fromiter((n for _, n in rows), np.int32, len(rows))
        self.last = max(self.last, top)

    def counts(self, seqs: Iterable[int]) -> list[int]:
        """The token count of each seq, in order (0 for one not stored or past ``last``)."""
        wanted = np.fromiter(seqs, np.int64)
        inside = (wanted >= 0) & (wanted <= self.last)
        found = np.zeros(len(wanted), np.int32)
        found[inside] = self._counts[wanted[inside]]
        out: list[int] = found.tolist()
        return out
