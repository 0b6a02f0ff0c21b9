"""``query_period``: the calendar period a message asks about, from the dates it names.

"What did Joanna finish in January 2022?", "Where was John between August 11 and August 15
2023?", "What happened on 3 May, 2023?" name a period; recall then prefers the turns stored in
it (``Recaller`` with ``date_weight``). Recognised: a day with a month and a year in either
order ("3 May 2023", "May 3rd, 2023"), a month with a year ("January 2022", "Jan of 2022"), a
bare year ("in 2019"), and a day or a month without a year when another date in the message
gives the year ("between August 11 and August 15 2023"). Several dates span from the earliest
to the latest. Dates without any year are ambiguous and ignored; so are relative ones ("last
week"), which depend on when a turn was said, not on the question.

>>> p = query_period("Where was John between August 11 and August 15 2023?")
>>> p.start.date().isoformat(), p.end.date().isoformat()
('2023-08-11', '2023-08-16')
>>> query_period("What did Joanna finish in January 2022?").end.date().isoformat()
'2022-02-01'
>>> query_period("When did we last talk about the budget?") is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["MONTH_NAMES", "Period", "query_period"]

_MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
MONTH_NAMES = frozenset(_MONTHS)
"""Month names and their abbreviations, lower case ("january", "jan", …)."""
_MONTH = r"(?P<{0}>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<{0}>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<{0}>(?:19|20)\d\d)"
_DATE = re.compile(
    r"\b(?:"
    + _DAY.format("d1") + r"\s+(?:of\s+)?" + _MONTH.format("m1")
    + r"(?:,?\s+" + _YEAR.format("y1") + r")?"
    + r"|" + _MONTH.format("m2") + r"\s+" + _DAY.format("d2") + r"(?![\d:])"
    + r"(?:,?\s+" + _YEAR.format("y2") + r")?"
    + r"|" + _MONTH.format("m3") + r",?\s+(?:of\s+)?" + _YEAR.format("y3")
    + r"|" + r"(?<![\d/.-])" + _YEAR.format("y4") + r"(?![\d/.-])"
    + r")\b",
    re.IGNORECASE,
)  # fmt: skip


@dataclass(frozen=True)
class Period:
    """``[start, end)`` in UTC."""

    start: datetime
    end: datetime

    def __contains__(self, moment: datetime) -> bool:
        when = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        return self.start <= when < self.end


def _span(year: int, month: int | None, day: int | None) -> tuple[datetime, datetime] | None:
    try:
        if month is None:
            return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
        if day is None:
            start = datetime(year, month, 1, tzinfo=UTC)
            after = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
            return start, after
        start = datetime(year, month, day, tzinfo=UTC)
    except ValueError:  # "31 February"
        return None
    return start, start + timedelta(days=1)


def query_period(text: str) -> Period | None:
    """The period ``text`` names (see the module docstring), or ``None``."""
    found: list[tuple[int | None, int | None, int | None]] = []  # (year, month, day)
    for match in _DATE.finditer(text):
        groups = match.groupdict()
        month_name = groups["m1"] or groups["m2"] or groups["m3"]
        day = groups["d1"] or groups["d2"]
        year = groups["y1"] or groups["y2"] or groups["y3"] or groups["y4"]
        if month_name is None and year is None:
            continue
        found.append(
            (
                int(year) if year else None,
                _MONTHS[month_name.lower()] if month_name else None,
                int(day) if day else None,
            )
        )
    years = {year for year, _, _ in found if year is not None}
    if not years:
        return None
    default = max(years)  # "August 11 and August 15 2023": the year given once
    spans = [
        span
        for year, month, day in found
        if (span := _span(year if year is not None else default, month, day)) is not None
    ]
    # Beside a day or a month, a year-long span only widens the period ("in 2023, around
    # May 3"): keep the narrower dates; years alone ("from 2019 to 2021") stay as they are.
    if len(spans) > 1:
        narrow = [s for s in spans if s[1] - s[0] < timedelta(days=366)]
        spans = narrow or spans
    if not spans:
        return None
    return Period(min(s for s, _ in spans), max(e for _, e in spans))
