"""Cutting text to a token budget: at a sentence boundary when one fits, at a token boundary
as the last resort, always with a visible marker.

>>> from contextfold.tokens import TiktokenCounter
>>> text = "First sentence here. Second sentence is longer than the first one. Third."
>>> truncate_text(text, 12, TiktokenCounter())
'First sentence here. […truncated]'
"""

from __future__ import annotations

import re
from typing import Literal

from contextfold.tokens import TokenCounter

__all__ = ["TRUNCATION_MARKER", "Keep", "sentence_ends", "truncate_text"]

TRUNCATION_MARKER = "[…truncated]"
Keep = Literal["head", "tail", "middle"]

# A sentence ends after . ! ? … (optionally followed by closing quotes or brackets) when
# whitespace follows, after CJK full stops whether or not whitespace follows (CJK text puts
# none there), and at every line break.
_BOUNDARY = re.compile(r"""(?<=[.!?…])["'”’)\]]*\s+|(?<=[。！？])["'”’)\]」』]*\s*|\n+""")


def sentence_ends(text: str) -> list[int]:
    """Offsets just past each sentence's end (whitespace excluded), in order; the text's own
    end is always last."""
    # A match is (closing quotes or brackets) + whitespace; the sentence keeps its closers.
    ends = [m.start() + len(m.group().rstrip()) for m in _BOUNDARY.finditer(text)]
    ends = [end for end in ends if end > 0]
    if not ends or ends[-1] != len(text):
        ends.append(len(text))
    return ends


def _largest_fitting(candidates: list[str], room: int, counter: TokenCounter) -> str | None:
    """The longest candidate (candidates grow in length) that counts at most ``room``."""
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if counter.count(candidates[mid]) <= room:
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def _head(text: str, room: int, counter: TokenCounter) -> str:
    prefixes = [text[:end] for end in sentence_ends(text)]
    return _largest_fitting(prefixes, room, counter) or counter.cut(text, room)


def _tail(text: str, room: int, counter: TokenCounter) -> str:
    starts = [0] + [m.end() for m in _BOUNDARY.finditer(text)]
    suffixes = [text[s:] for s in reversed(starts) if s < len(text)]
    return _largest_fitting(suffixes, room, counter) or counter.cut(text, room, from_end=True)


def truncate_text(
    text: str,
    max_tokens: int,
    counter: TokenCounter,
    *,
    keep: Keep = "head",
    marker: str = TRUNCATION_MARKER,
) -> str:
    """``text`` cut to at most ``max_tokens`` (marker included), or ``""`` if not even the
    marker and one token of text fit. Text that already fits comes back unchanged."""
    if counter.count(text) <= max_tokens:
        return text
    room = max_tokens - counter.count(marker)
    while room > 0:
        if keep == "head":
            result = f"{_head(text, room, counter).rstrip()} {marker}"
        elif keep == "tail":
            result = f"{marker} {_tail(text, room, counter).lstrip()}"
        else:
            head = _head(text, (room + 1) // 2, counter).rstrip()
            tail = _tail(text, room // 2, counter).lstrip()
            result = " ".join(piece for piece in (head, marker, tail) if piece)
        if result.strip() != marker and counter.count(result) <= max_tokens:
            return result
        room -= 1  # joining pieces can cost a token more than their parts; try smaller
    return ""
