"""Intent detection: two deterministic regex tests that every tagger ORs into its result.

- ``detect_broad`` — the message asks about the conversation as a whole ("what did we
  discuss?", "summarize everything"): recall loads every tag summary instead of filtering by
  tag.
- ``detect_temporal`` — the message points at a position in time ("at the beginning", "the
  first thing I asked"): recall reads segment summaries, earliest first.

Each regex is guarded by a cheap substring test (every pattern contains one of its hints), so
most messages never reach the regex.
"""

from __future__ import annotations

import re

__all__ = ["detect_broad", "detect_temporal"]

_CONVO = r"(?:conversation|discussion|chat|session|thread)"
_TALKED = (
    r"(?:discuss(?:ed)?|talk(?:ed)? about|cover(?:ed)?|go(?:ne)? over|went over|chat(?:ted)? about)"
)
_BROAD = re.compile(
    "|".join(
        [
            rf"\bwhat (?:did|have|had) (?:we|you and i|i) (?:been )?{_TALKED}",
            r"\bwhat (?:were|was) (?:we|i) (?:talking|chatting) about\b",
            rf"\b(?:summari[sz]e|sum up|recap|review|go over) (?:everything|it all|all of it|"
            rf"(?:the|our|this) (?:whole |entire )?{_CONVO}|what (?:we|you)(?:'ve| have)? "
            rf"{_TALKED})",
            r"\brecap\b",
            r"\bcatch me up\b",
            rf"\bremind me (?:of )?(?:what|everything) (?:we|you|i)(?:'ve| have)? "
            rf"(?:{_TALKED}|said|decided|asked)",
            rf"\beverything (?:we|you)(?:'ve| have)? (?:{_TALKED}|said|decided)",
            rf"\b(?:overview|summary|rundown) of (?:our|the|this) (?:whole |entire )?{_CONVO}",
            r"\bwhat (?:topics|things|subjects) (?:have|did) (?:we|you)\b",
            r"\bwhat have we (?:done|decided) so far\b",
        ]
    ),
    re.IGNORECASE,
)
# Every pattern above contains one of these: a cheap test before the regex.
_BROAD_HINTS = (
    "what",
    "summ",
    "recap",
    "review",
    "go over",
    "catch me up",
    "remind",
    "everything",
    "overview",
    "rundown",
)
_PAST = r"(?:\w+ed|said|told|wrote|did|brought up|gave|sent|made|thought)"
_TEMPORAL = re.compile(
    "|".join(
        [
            r"\b(?:at|to|from|since) the (?:very )?(?:beginning|start|outset)\b",
            rf"\b(?:beginning|start) of (?:our|the|this) {_CONVO}",
            r"\b(?:very )?early on\b",
            rf"\bearlier (?:in|during) (?:our|the|this) {_CONVO}",
            rf"\bfirst (?:thing|question|topic|message|request|few \w+) (?:that )?(?:i|we|you) "
            rf"{_PAST}",
            r"\bwhat was (?:the|my|our) (?:very )?first\b",
            rf"\b(?:in|during) (?:our|the) (?:first|previous|last|earlier) {_CONVO}",
            rf"\b(?:previous|earlier|last) {_CONVO}\b",
            r"\boriginally\b(?! from)",
            r"\blast time\b(?!-)",
            r"\bwhen we (?:first|started|began)\b",
            r"\b(?:i|we|you) (?:\w+ed|said|asked|told) (?:\w+ )?(?:earlier|before|at first|"
            r"initially|at the start)\b",
            r"\b(?:a few|several|some|\d+) (?:messages|turns|questions) ago\b",
        ]
    ),
    re.IGNORECASE,
)
# Every pattern above contains one of these.
_TEMPORAL_HINTS = (
    "begin",
    "start",
    "outset",
    "early",
    "earlier",
    "first",
    "previous",
    "last",
    "original",
    "when we",
    "ago",
    "before",
    "initially",
)


def detect_broad(text: str) -> bool:
    """Whether ``text`` asks about the conversation as a whole.

    >>> detect_broad("Can you recap what we discussed?"), detect_broad("When did Caroline go?")
    (True, False)
    """
    low = text.lower()
    return any(hint in low for hint in _BROAD_HINTS) and _BROAD.search(text) is not None


def detect_temporal(text: str) -> bool:
    """Whether ``text`` refers to a position in the conversation's time.

    >>> detect_temporal("What was the first thing I asked?"), detect_temporal("first-class")
    (True, False)
    """
    low = text.lower()
    return any(hint in low for hint in _TEMPORAL_HINTS) and _TEMPORAL.search(text) is not None
