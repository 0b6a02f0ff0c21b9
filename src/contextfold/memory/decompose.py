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

A long message is asked in its **asking sentences** too (``question_focus``): a question at the
end of a pasted page ("Here is the paper I read: … Anyway, when did Caroline join the support
group?") has its embedding drowned by the page, and the relevance floor, judging the message's
best cosine with a stored turn, would withhold memory for it nearly always. The sentences that
ask, in the paragraphs opening and closing the message, are ranked as one more part, their
cosines judged by the floor beside the message's, and the name parts are made from them, not
from the page's capitalised words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from contextfold.analysis import analyze
from contextfold.memory.relevance import names_in
from contextfold.store.text import QUESTION_STOPWORDS
from contextfold.truncation import sentence_ends

__all__ = [
    "FOCUS_MIN_WORDS",
    "FOCUS_SENTENCES",
    "MAX_PARTS",
    "interleave",
    "query_parts",
    "question_focus",
]

MAX_PARTS = 3
"""At most this many parts per message: each is one more full-text search, tag-free fusion
and query embedding in the recall."""

FOCUS_MIN_WORDS = 40
"""A message of fewer words is its own focus (``question_focus``): a question, or a question
with a sentence or two around it, is embedded whole without being drowned."""

FOCUS_SENTENCES = 3
"""A long message's focus is at most this many asking sentences."""

_BOTH = re.compile(r"\bboth\b\s*", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(?:```|~~~)[^`~]*$")  # (```npm i``` on one line fences nothing)
# Code-looking lines (``_is_code``): indented, a comment, a prompt or quoted mail, an
# assignment opening the line, a call.
_INDENTED = re.compile(r"^(?: {4}|\t)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
_CODE_START = re.compile(r"^\s*(?:>|//|/\*|\*/|#!|\$\s)")
_ASSIGNMENT = re.compile(r"^\s*[\w.\[\]]+\s*[-+*/]?=\s")
_CALL = re.compile(r"\w\(")
_SPACES = re.compile(r"[ \t\r\f\v]+")
# A piece ending so ends no sentence: a single letter ("U.S.", "J. Smith") or a title.
_ABBREVIATION = re.compile(
    r"(?:\b[A-Za-z]|\b(?:Dr|Mr|Mrs|Ms|Mx|Prof|Sr|Jr|St|Mt|vs|etc|al|Fig|No|approx|Inc|Ltd|Co))\.$"
)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
_CLOSERS = "\"')]”’」』"
_LINE_ENDS = (".", "!", "?", "…", ":", ";", "。", "！", "？", *_CLOSERS)
# What may follow a question's mark: closing quotes and brackets, markdown (**, _, `), an HTML
# closing tag, a footnote, an exclamation mark.
_TRAILING = re.compile(r"(?:</?[A-Za-z][\w-]*>|\[\d+\]|[\s\"'”’」』)\]*_`~!])+$")


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


def question_focus(text: str) -> str | None:
    """What a long message asks, or ``None``: a message of fewer than ``FOCUS_MIN_WORDS``
    words (counted between spaces), one that asks nothing, or one whose asking sentences are
    more than half of it (it is its own focus).

    A sentence asks when it ends with a question mark right after something that is not a
    space (closing quotes, brackets, markdown or a footnote after it aside) and has two words
    or more (or is written in Chinese, Japanese or Korean, without spaces); a URL's query does
    not. The user's question opens or closes a message, around what it carries (a page, a log,
    a file), so the asking sentences are those of the paragraphs opening and closing it
    (``_paragraphs``, ``_edges``: short paragraphs that ask nothing are walked past): the last
    ``FOCUS_SENTENCES`` when that is one paragraph, else the opening one's first and the
    closing one's last ``FOCUS_SENTENCES - 1`` (all three from one of them when the other asks
    nothing). A question in the middle of a page (a pasted FAQ, a quoted mail, code) is
    someone else's, and is not counted in "more than half".

    >>> page = "The assay measured binding in vitro across twelve cell lines. " * 5
    >>> question_focus(page + "Anyway, when did Caroline join the group? Was it May?")
    'Anyway, when did Caroline join the group? Was it May?'
    >>> question_focus(page + "What did Dr. Lee say about the U.S. trip?")
    'What did Dr. Lee say about the U.S. trip?'
    >>> question_focus("When did Caroline join the group?") is None
    True
    """
    asked, focus = _LAST_FOCUS[0]  # (a recall asks two or three times: 7 ms each for 100 KB)
    if asked != text:
        focus = _focus(text)
        _LAST_FOCUS[0] = (text, focus)
    return focus


#: The last message asked and its focus (one message held, whatever its size).
_LAST_FOCUS: list[tuple[str, str | None]] = [("", None)]


def _focus(text: str) -> str | None:
    words = len(text.split())
    if words < FOCUS_MIN_WORDS:
        return None
    asking = [[s for s in paragraph if _asks(s)] for paragraph in _edges(_paragraphs(text))]
    if len(asking) == 1:
        chosen = asking[0][-FOCUS_SENTENCES:]
    elif asking[0] and asking[-1]:
        chosen = asking[0][:1] + asking[-1][-(FOCUS_SENTENCES - 1) :]
    else:
        chosen = asking[0][:FOCUS_SENTENCES] or asking[-1][-FOCUS_SENTENCES:]
    asked = sum(len(sentence.split()) for paragraph in asking for sentence in paragraph)
    if not chosen or 2 * asked > words:  # (the message is mostly questions: its own focus)
        return None
    return " ".join(chosen)


def _edges(paragraphs: list[list[str]]) -> list[list[str]]:
    """The paragraph opening the message and the one closing it, each found by walking in
    from its end past short paragraphs that ask nothing (a greeting, "Thanks, Bob", "Keep
    the fix minimal."): the walk stops at one that asks or is long (what the message
    carries). One paragraph when both walks stop at the same one."""
    if not paragraphs:
        return [[]]

    def stops(paragraph: list[str]) -> bool:
        return any(_asks(s) for s in paragraph) or sum(len(s.split()) for s in paragraph) > 20

    first = next((i for i, p in enumerate(paragraphs) if stops(p)), 0)
    last = next((i for i in range(len(paragraphs) - 1, -1, -1) if stops(paragraphs[i])), first)
    return [paragraphs[first]] if first >= last else [paragraphs[first], paragraphs[last]]


def _paragraphs(text: str) -> list[list[str]]:
    """``text``'s paragraphs of prose, each a list of its sentences (whitespace squeezed).
    Paragraphs are cut at blank lines and at what is not prose: fenced code (a fence that
    never closes fences nothing), code-looking lines (``_CODE``) and quoted mail (``>``). A
    line that ends without punctuation and one that starts in lower case are one line
    wrapped. Sentences are cut at ``truncation.sentence_ends``, where a piece after an
    abbreviation ("Dr.", "U.S.") goes on the same sentence."""
    raw = text.splitlines()
    fences = [i for i, line in enumerate(raw) if _FENCE.match(line)]
    fenced: set[int] = set()
    for opening, closing in zip(fences[::2], fences[1::2], strict=False):
        fenced.update(range(opening, closing + 1))
    paragraphs: list[list[list[str]]] = [[]]  # lines, each a list of its wrapped parts
    for i, line in enumerate(raw):
        words = line.split()
        if not words or i in fenced or _is_code(line):
            if paragraphs[-1]:
                paragraphs.append([])
            continue
        lines = paragraphs[-1]
        squeezed = _SPACES.sub(" ", line.strip())  # (not a no-break space: "allée ?")
        if lines and not lines[-1][-1].endswith(_LINE_ENDS) and words[0][0].islower():
            lines[-1].append(squeezed)
        else:
            lines.append([squeezed])
    return [[s for parts in lines for s in _cut(" ".join(parts))] for lines in paragraphs if lines]


def _is_code(line: str) -> bool:
    """Whether ``line`` looks like code, a prompt or quoted mail, not prose: indented (but a
    list item), a comment or prompt or ``>`` quote, an assignment opening it, or ending as
    code does (``;``, ``{``, ``}``, a call). Checks linear in the line."""
    stripped = line.rstrip()
    if _INDENTED.match(line) and not _LIST_ITEM.match(line):
        return True
    if _CODE_START.match(line) or _ASSIGNMENT.match(line):
        return True
    return stripped.endswith((";", "{", "}")) or (
        stripped.endswith(")") and _CALL.search(stripped) is not None
    )


def _cut(line: str) -> list[str]:
    """``line``'s sentences: cut at its sentence ends, a piece kept on the sentence before it
    when that one ends with an abbreviation ("Dr.", "U.S.", "Fig."), or with a full stop or a
    URL and the piece opens with a digit or in lower case (each piece joined once: no string
    grows piece by piece)."""
    sentences: list[list[str]] = []
    start = 0
    for end in sentence_ends(line):
        piece = line[start:end].strip()
        start = end
        if not piece:
            continue
        before = sentences[-1][-1] if sentences else ""
        # (after a full stop only: "Where did Anna go? she said Oslo." keeps its question)
        glued = (
            bool(before)
            and (piece[0].isdigit() or piece[0].islower())
            and (before.endswith(".") or before.split()[-1].startswith(("http://", "https://")))
        )
        if sentences and (glued or _ABBREVIATION.search(before[-8:])):
            sentences[-1].append(piece)
        else:
            sentences.append([piece])
    return [" ".join(pieces) for pieces in sentences]


def _asks(sentence: str) -> bool:
    tail = sentence[-200:]  # (what may follow the mark is short: the regex stays bounded)
    if "?" not in tail and "？" not in tail:
        return False
    core = sentence[: len(sentence) - len(tail)] + _TRAILING.sub("", tail)
    if not core.endswith(("?", "？")):
        return False
    core = core.rstrip("?？")
    # A mark after a space is code or noise ("a ? b", "in ?? ()", a table's "score of ?");
    # French typography puts a no-break space there ("allée\u00a0?"), which asks.
    if not core or core[-1] in " \t":
        return False
    words = core.split()
    if words[-1].startswith(("http://", "https://")) and len(words) < 3:  # a URL's query
        return False
    return len(words) >= 2 or bool(_CJK.search(core))  # (CJK: no spaces between words)


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
