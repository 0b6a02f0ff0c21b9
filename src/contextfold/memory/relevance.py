"""Whether memory helps a message at all, judged before anything is injected.

Two floors, both on the best cosine similarity between the message and a stored turn it could
recall (``RankedTurn.similarity``; for a long message, the better of the message's and its
asking sentences', ``decompose.question_focus``, whose names are the ones looked up):

* ``recall.relevance_floor``: under it, the message gets no memory at all;
* ``recall.unknown_name_floor``, stricter, for a message that **names something no stored
  turn contains**: a capitalised word that does not open a sentence and is not a month or a
  weekday ("What did *Caroline* say…" in a conversation that never mentioned a Caroline). A
  dense embedder finds turns about hiking or family for any question about hiking or family;
  the name says whose hiking it asks about, and memory that never heard the name cannot
  hold the answer. On LoCoMo's tuning half this is what separated the questions of other
  conversations (the negative set, see docs/memory.md) from real ones: best cosine alone
  could not without losing recall.

A name is looked up with the store's own full-text search (``search_turn_seqs``, limit 1), so
it matches as recall's full text does (stemmed, case-folded). Names found are kept per session
(a stored turn stays stored while the session lives): the speakers or the project's names
asked about again cost nothing; a name not found is looked up again next time (a turn may
have said it since).

>>> names_in("What did Caroline tell Mel about the LGBTQ support group in May?")
['caroline', 'mel', 'lgbtq']
>>> names_in("Where is it? Paris, I think. Or was it in June, on Monday?")
[]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from contextfold._bounded import SessionLRU
from contextfold.memory.periods import MONTH_NAMES
from contextfold.store.protocols import MemoryStorage

__all__ = ["KnownNames", "names_in"]

_WORD = re.compile(r"\b[A-Z][A-Za-z]+\b")
_WEEKDAYS = frozenset(
    ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
)
# Characters after which a capital opens a sentence (or a quote) rather than marks a name.
_OPENERS = frozenset(".?!:;\"'(“‘[")
_NAMES_PER_SESSION = 4096  # known names kept per session, at most


def names_in(text: str) -> list[str]:
    """The distinct names ``text`` mentions, lower case, in order: capitalised words that do
    not open the text or a sentence, months and weekdays left out."""
    found: dict[str, None] = {}
    for match in _WORD.finditer(text):
        before = text[: match.start()].rstrip()
        if not before or before[-1] in _OPENERS:
            continue
        word = match.group(0).lower()
        if word in MONTH_NAMES or word in _WEEKDAYS:
            continue
        found[word] = None
    return list(found)


class KnownNames:
    """Which names a session's stored turns contain (see the module docstring); the names
    found are cached for the ``sessions`` most recently asked, keyed by the session's
    ``born`` number (a session deleted and written again starts afresh)."""

    def __init__(self, store: MemoryStorage, *, sessions: int = 1000) -> None:
        self.store = store
        self._known: SessionLRU[tuple[int, set[str]]] = SessionLRU(sessions)

    def unknown(self, session_id: str, names: Sequence[str]) -> list[str]:
        """The ``names`` no stored turn of the session contains."""
        if not names:
            return []
        version = self.store.session_version(session_id)
        born = version[0] if version is not None else 0
        cached = self._known.peek(session_id)
        if cached is None or cached[0] != born:
            cached = self._known.put(session_id, (born, set()))
        known = cached[1]
        missing = []
        for name in names:
            if name in known:
                continue
            if self.store.search_turn_seqs(session_id, name, limit=1):
                if len(known) < _NAMES_PER_SESSION:
                    known.add(name)
            else:
                missing.append(name)
        return missing
