"""Query decomposition without an LLM: a message that names people or things is also asked
in parts, so each part's best evidence gets a share of the memory budget.

A question such as "Which city have both Jean and John visited?" needs a turn where Jean
names a city and another where John does; asked whole, the turns that mention both names (or
the one the embedder leans to) fill the budget first. And "What are Joanna's hobbies?" is
pulled by its name toward every turn that mentions Joanna, whatever it is about. So beside the
message itself recall ranks:

* for a message naming two or more names, the message with **one name kept** and the others
  taken out ("Which city have Jean visited?", "Which city have John visited?");
* for a message naming any, the message with **every name taken out** ("What are hobbies?"):
  what it asks about, with nothing pulling toward who.

Names are ``relevance.names_in``'s (capitalised words that do not open a sentence, months and
weekdays aside); a name goes with a possessive ``'s`` and the ``and``/``or``/comma joining it
to the next, and "both" goes too. ``Recaller.rank`` interleaves the parts' rankings with the
message's own (``recall.decompose``; docs/memory.md has the measurements on LoCoMo's tune
split).

>>> query_parts("Which city have both Jean and John visited?")
['Which city have Jean visited?', 'Which city have John visited?', 'Which city have visited?']
>>> query_parts("What are Joanna's hobbies?")
['What are hobbies?']
>>> query_parts("what did she say about the trip?")
[]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from contextfold.analysis import analyze
from contextfold.memory.relevance import names_in
from contextfold.store.text import QUESTION_STOPWORDS

__all__ = ["MAX_PARTS", "interleave", "query_parts"]

MAX_PARTS = 3
"""At most this many parts per message: each is one more full-text search, tag-free fusion
and query embedding in the recall."""

_BOTH = re.compile(r"\bboth\b\s*", re.IGNORECASE)


def _without(text: str, names: Sequence[str]) -> str:
    for name in names:
        # The name as a name: capitalised ("Art", not the "art" of "art class"); the rest of
        # its letters, and the joining words, in any case.
        spelled = rf"(?-i:{re.escape(name[:1].upper())})(?i:{re.escape(name[1:])})"
        text = re.sub(
            rf"\s*(?:,|\band\b|\bor\b|&)?\s*\b{spelled}\b(?:['’]s)?\s*(?:,|\band\b|\bor\b|&)?\s*",
            " ",
            text,
            flags=re.IGNORECASE,
        )
    return " ".join(_BOTH.sub("", text).split())


def _asks_something(part: str) -> bool:
    """Whether ``part`` has a word beyond stop words and a question's grammar."""
    return any(w not in QUESTION_STOPWORDS for w in analyze(part, stemmer=None))


def query_parts(text: str, max_parts: int = MAX_PARTS) -> list[str]:
    """The parts ``text`` is also asked in (see the module docstring), at most ``max_parts``;
    empty when it names nothing."""
    names = names_in(text)
    if not names:
        return []
    parts: list[str] = []
    if len(names) >= 2:
        parts += [_without(text, [other for other in names if other != kept]) for kept in names]
    parts.append(_without(text, names))
    seen = {" ".join(text.split()).lower()}
    out = []
    for part in parts:
        key = part.lower()
        # A part must still ask about something: one left with only the question's frame
        # ("Who is ?" of "Who is Bob?") would match any turn saying "who" or "is", and its
        # hits would take every other slot of the interleave. One that is the message itself
        # adds nothing.
        if _asks_something(part) and key not in seen:
            seen.add(key)
            out.append(part)
    return out[:max_parts]


def interleave(lists: Sequence[Sequence[int]], limit: int) -> list[tuple[int, int]]:
    """Round-robin over ``lists`` (each best first), each seq taken once, at most ``limit``:
    ``(seq, index of the list it was taken from)``. The first list (the message's own ranking)
    leads each round.

    >>> interleave([[1, 2, 3], [2, 4], [5]], 10)
    [(1, 0), (2, 1), (5, 2), (3, 0), (4, 1)]
    """
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    cursors = [0] * len(lists)
    while len(out) < limit and any(c < len(lst) for c, lst in zip(cursors, lists, strict=True)):
        for which, lst in enumerate(lists):
            while cursors[which] < len(lst) and lst[cursors[which]] in seen:
                cursors[which] += 1
            if cursors[which] < len(lst) and len(out) < limit:
                seq = lst[cursors[which]]
                seen.add(seq)
                out.append((seq, which))
                cursors[which] += 1
    return out
