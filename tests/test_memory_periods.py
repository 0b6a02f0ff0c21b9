"""query_period (the calendar period a message names) and recall's preference for turns said
in it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.periods import query_period
from contextfold.store.sqlite.memory import MemoryStore

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]  # fmt: skip


def day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("What did Joanna finish in January 2022?", day(2022, 1, 1), day(2022, 2, 1)),
        ("What happened on 3 May, 2023?", day(2023, 5, 3), day(2023, 5, 4)),
        ("the meeting on May 3rd, 2023 at 10:30", day(2023, 5, 3), day(2023, 5, 4)),
        ("Jan of 2022", day(2022, 1, 1), day(2022, 2, 1)),
        ("December 2023", day(2023, 12, 1), day(2024, 1, 1)),
        ("anything in 2019?", day(2019, 1, 1), day(2020, 1, 1)),
        ("between August 11 and August 15 2023", day(2023, 8, 11), day(2023, 8, 16)),
        ("from 2019 to 2021", day(2019, 1, 1), day(2022, 1, 1)),
    ],
)
def test_named_periods(text: str, start: datetime, end: datetime) -> None:
    period = query_period(text)
    assert period is not None
    assert (period.start, period.end) == (start, end)


@pytest.mark.parametrize(
    "text",
    [
        "When did we last talk about the budget?",
        "May I ask something?",
        "Call me on March 3",  # no year anywhere: ambiguous
        "error 404 at 2023-05-01T10:00",  # an ISO stamp inside a token, not prose
        "31 February 2023",
        "We need 2500 units",
    ],
)
def test_no_period(text: str) -> None:
    assert query_period(text) is None


@given(st.integers(1990, 2090), st.integers(1, 12), st.integers(1, 28), st.booleans())
def test_a_day_is_one_day_long_and_contains_itself(y: int, m: int, d: int, day_first: bool) -> None:
    text = f"{d} {MONTHS[m - 1]} {y}" if day_first else f"{MONTHS[m - 1]} {d}, {y}"
    period = query_period(f"What happened on {text}?")
    assert period is not None
    assert day(y, m, d) in period
    assert (period.end - period.start).days == 1


def test_recall_prefers_the_turns_said_in_the_named_period() -> None:
    cfg = MemoryConfig.model_validate({"recall": {"embedder": "none", "neighbor_weight": 0}})
    eng = MemoryEngine(cfg, store=MemoryStore(), embedder=None)
    eng.on_turn_complete(
        [
            {"role": "user", "content": "I finished a pottery bowl with a blue glaze."},
            {"role": "user", "content": "I finished a pottery vase with a green glaze today."},
            {"role": "user", "content": "The community pottery class meets on Tuesdays."},
        ],
        timestamps=[day(2022, 1, 20), day(2022, 6, 5), day(2021, 3, 1)],
    )

    def top(question: str) -> str:
        (first, *_) = eng.on_message_inbound(question).recalled
        return eng.store.turn_rows("default", [first.seq])[first.seq].text

    assert "bowl" in top("What pottery did I finish in January 2022?")
    assert "vase" in top("What pottery did I finish in June 2022?")  # said June 5
    assert "vase" in top("What pottery did I finish in May 2022?")  # told soon after May
    off = MemoryConfig.model_validate(
        {"recall": {"embedder": "none", "neighbor_weight": 0, "date_weight": 0}}
    )
    plain = MemoryEngine(off, store=eng.store, embedder=None)
    (first, *_) = plain.on_message_inbound("What pottery did I finish in June 2022?").recalled
    assert first.seq == 1  # without the date signal the bowl leads: the date moved the vase
