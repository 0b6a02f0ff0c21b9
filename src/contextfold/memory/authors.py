"""Who wrote a stored turn, when its text says so: recall's author prior.

A transcript stores each turn as ``"Name: text"`` — LoCoMo's turns are stored so, as are chat
exports, meeting notes and multi-party bridges (the extractive summarizer keeps that speaker on
each sentence it takes). A question that names one of those authors ("What activities does
Melanie partake in?") is most often answered by the author's own turns: on LoCoMo's tune split
97 % of the multi-hop evidence of the questions naming one speaker was that speaker's, while
58 % of the turns recall packed for them were. ``recall.author_weight`` multiplies the score of
a turn whose author the message names (``names_named``) by ``1 + author_weight``.

An author is the leading ``Name:`` of a turn's text: one to three capitalised words, a colon,
then white space (also ``**Name**:`` and ``__Name__:``, and after a ``[10:30]`` stamp). Its
words, lower case and without titles, are what a message's names are matched against
("Dr. Smith:" is named by "Smith" or "Dr. Smith", never by "Dr" alone). A field label
(``LABELS``: "Note:", "URL:", "TODO:") or a one-letter one ("Q:") is no author. A turn without
an author prefix, and a message that names no author, are ranked as without the prior.

``TurnAuthors`` keeps a session's authors by seq as small ids (two bytes a turn, at most
``MAX_AUTHORS`` distinct authors a session), appended as turns are stored: a stored turn never
changes while its session lives, so a recall reads only the turns stored since the last one.

>>> author_of("Melanie: I'm off to go swimming with the kids.")
'melanie'
>>> author_of("Dr. Smith: take two.") , author_of("no author: here"), author_of("Note:x")
('dr. smith', None, None)
>>> author_of("[10:30] **Bob**: hi"), author_of("Note: call Bob"), author_of("Q: why?")
('bob', None, None)
>>> sorted(names_named("Did Dr. Jones see Mrs. Brown and Ann?"))
['ann', 'brown', 'jones']
>>> authors = TurnAuthors(born=1)
>>> authors.extend([(1, "Ann: hi"), (2, "Bo: hey"), (3, "plain text"), (5, "Ann: bye")])
>>> wanted = authors.named(["ann"])
>>> authors.authored([1, 2, 3, 4, 5, 9], wanted).tolist()
[True, False, False, False, True, False]
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from contextfold.memory.relevance import names_in
from contextfold.memory.turn_lengths import grown

__all__ = [
    "LABELS",
    "MAX_AUTHORS",
    "OPENING_CHARS",
    "TITLES",
    "TurnAuthors",
    "author_of",
    "names_named",
]

#: How much of a turn's text is read to find its author: a "[stamp] " and three words.
OPENING_CHARS = 96

MAX_AUTHORS = 4096
"""Distinct authors kept per session; a turn by a later new one counts as having none."""

_NAME = r"[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}"
# "Name: ", "**Name**: " or "__Name__: " (markdown), after an optional "[10:30] " stamp.
_AUTHOR = re.compile(
    rf"(?:\[[^\]\n]{{1,40}}\]\s*)?(?:\*\*({_NAME})\*\*|__({_NAME})__|({_NAME})):\s"
)
_WORDS = re.compile(r"\w+")
#: Titles: "Dr. Smith:" is named by "Smith" (and "Dr. Smith"), never by "Dr" alone.
TITLES = frozenset([
    "dr", "mr", "mrs", "ms", "miss", "mx", "prof", "sir", "dame", "madam", "rev", "fr", "capt",
    "col", "gen", "lt", "sgt", "hon", "st",
])  # fmt: skip
_TITLED = re.compile(
    r"\b(?:Dr|Mr|Mrs|Ms|Miss|Mx|Prof|Sir|Dame|Madam|Rev|Fr|Capt|Col|Gen|Lt|Sgt|Hon|St)\.?"
    r"\s+([A-Z][\w'’-]*)"
)
#: Field labels that open notes, mail and logs ("Note: …", "URL: …"), never authors; a
#: one-letter label ("Q:", "A:") is none either.
LABELS = frozenset([
    "note", "notes", "nb", "ps", "fyi", "todo", "fixme", "url", "link", "links", "source",
    "sources", "ref", "re", "fwd", "subject", "from", "to", "cc", "date", "time", "when",
    "where", "update", "edit", "edited", "warning", "error", "info", "tip", "hint", "example",
    "question", "answer", "summary", "title", "tags", "tag", "step", "task", "action", "result",
    "output", "input", "status", "reply", "quote",
])  # fmt: skip


def author_of(text: str) -> str | None:
    """The author a turn's text opens with (``"Name: …"``), lower case; ``None`` if none
    (or a field label such as ``"Note:"``)."""
    match = _AUTHOR.match(text)
    return _label(match.group(1) or match.group(2) or match.group(3)) if match else None


def _label(name: str) -> str | None:
    """An opening ``name`` as an author's label, or ``None`` for a field label."""
    label = name.lower()
    if len(label) < 2 or label.rstrip(".") in LABELS:
        return None
    return label


def names_named(text: str) -> frozenset[str]:
    """The people a message names, lower case: ``relevance.names_in``'s names without the
    titles, and the name after a title ("Dr. Jones": ``names_in`` takes the capital after
    "Dr." for a sentence's start)."""
    names = {name for name in names_in(text) if name not in TITLES}
    names.update(match.group(1).lower() for match in _TITLED.finditer(text))
    return frozenset(names)


class TurnAuthors:
    """The authors of one session's turns, by seq, up to ``last``; ``born`` is the session's
    incarnation they belong to. Id 0 is "no author"."""

    def __init__(self, born: int) -> None:
        self.born = born
        self.last = 0
        self._ids: npt.NDArray[np.uint16] = np.zeros(0, np.uint16)
        self._by_label: dict[str, int] = {}
        self._by_name: dict[str, int] = {}  # an opening's name as written -> id (0: none)
        self._words: list[frozenset[str]] = [frozenset()]  # by id
        self.lock = threading.Lock()  # held while the turns stored since are read and added

    @classmethod
    def restored(
        cls, born: int, last: int, ids: npt.NDArray[np.uint16], labels: Sequence[str]
    ) -> TurnAuthors | None:
        """The authors saved by an earlier process (``memory.snapshots``): ``ids`` by seq up to
        ``last``, ``labels`` by id (id 0, no author, first); ``None`` when they do not fit."""
        if last < 0 or len(ids) < last + 1 or not labels or len(labels) > MAX_AUTHORS + 1:
            return None
        if len(ids) and int(ids.max(initial=0)) >= len(labels):
            return None
        out = cls(born)
        out._ids = np.array(ids[: last + 1], np.uint16)
        out.last = last
        for label in labels[1:]:
            out._by_label[label] = len(out._words)
            words = frozenset(_WORDS.findall(label))
            out._words.append(words - TITLES or words)
        return out

    @property
    def array(self) -> npt.NDArray[np.uint16]:
        """The author ids by seq (0: none), up to ``last`` at least."""
        return self._ids

    def labels(self) -> list[str]:
        """The authors' labels by id (id 0, no author: ``""``)."""
        out = [""] * len(self._words)
        for label, i in self._by_label.items():
            out[i] = label
        return out

    @property
    def nbytes(self) -> int:
        return int(self._ids.nbytes)

    def extend(self, rows: Sequence[tuple[int, str]]) -> None:
        """Add (seq, text) pairs of turns after ``last``, in seq order."""
        if not rows:
            return
        top = rows[-1][0]
        self._ids = grown(self._ids, top)
        seqs: list[int] = []
        ids: list[int] = []
        for seq, text in rows:
            match = _AUTHOR.match(text)
            if match is None:
                continue
            name = match.group(1) or match.group(2) or match.group(3)
            found = self._by_name.get(name)
            if found is None:
                found = self._id_of(name)
            if found:
                seqs.append(seq)
                ids.append(found)
        if seqs:
            self._ids[np.asarray(seqs, np.int64)] = np.asarray(ids, np.uint16)
        self.last = max(self.last, top)

    def _id_of(self, name: str) -> int:
        """The id of the author an opening ``name`` is (0: a field label, or past
        ``MAX_AUTHORS``), remembered for the next turns that open so."""
        label = _label(name)
        found = 0
        if label is not None:
            known = self._by_label.get(label)
            if known is not None:
                found = known
            elif len(self._words) <= MAX_AUTHORS:
                found = self._by_label[label] = len(self._words)
                words = frozenset(_WORDS.findall(label))
                self._words.append(words - TITLES or words)
        if len(self._by_name) < 4 * MAX_AUTHORS:  # openings that name no one: bounded
            self._by_name[name] = found
        return found

    def named(self, names: Iterable[str]) -> frozenset[int]:
        """The ids of the authors one of ``names`` (lower case words) names."""
        wanted = set(names)
        return frozenset(i for i, words in enumerate(self._words) if i and words & wanted)

    def authored(self, seqs: Iterable[int], ids: Collection[int]) -> npt.NDArray[np.bool_]:
        """Whether each seq's turn is by one of the authors ``ids``, in order."""
        wanted = np.fromiter(seqs, np.int64)
        inside = (wanted >= 0) & (wanted <= self.last) & (wanted < len(self._ids))
        found = np.zeros(len(wanted), np.uint16)
        found[inside] = self._ids[wanted[inside]]
        out: npt.NDArray[np.bool_] = np.isin(found, np.fromiter(ids, np.uint16, len(ids)))
        return out & (found > 0)
