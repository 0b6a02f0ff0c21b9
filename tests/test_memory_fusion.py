"""Recall's fusion (``Recaller._rank_text``) runs on arrays; its result must be exactly that of
the fusion as the module docstring states it, written here plainly over dicts: each signal's
(non-excluded) hits min-max scaled (or RRF) and summed with its weight, each turn lifted by
``neighbor_weight`` of its better neighbour's score, the length prior, the author prior, the
period preference, best first with ties by seq."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.memory.authors import TurnAuthors
from contextfold.memory.periods import Period, query_period
from contextfold.memory.recall import Recaller

Hits = list[tuple[int, float]]


class _Store:
    """The two reads the fusion makes, from fixed data."""

    def __init__(self, counts: dict[int, int], times: dict[int, datetime]) -> None:
        self.counts, self.times = counts, times

    def turn_token_counts(self, session_id: str, seqs: Sequence[int]) -> dict[int, int]:
        return {s: self.counts[s] for s in seqs if s in self.counts}

    def turn_times(self, session_id: str, seqs: Sequence[int]) -> dict[int, datetime]:
        return {s: self.times[s] for s in seqs if s in self.times}


def _reference(
    r: Recaller,
    signals: dict[str, Hits],
    tag_low: float | None,
    exclude: Collection[int],
    counts: dict[int, int],
    times: dict[int, datetime],
    period: Period | None,
    by_ann: set[int],
    limit: int,
) -> list[tuple[int, float, dict[str, int]]]:
    fused: dict[int, float] = {}
    ranks: dict[int, dict[str, int]] = {}
    for name, all_hits in signals.items():
        capped = name == "tags" and len(all_hits) == r.tag_limit
        hits = [(s, v) for s, v in all_hits if s not in exclude]
        if not hits:
            continue
        high, low = hits[0][1], hits[-1][1]
        if capped and tag_low is not None:
            low = min(low, tag_low)
        for position, (seq, score) in enumerate(hits, 1):
            if r.fusion == "rrf":
                share = 1 / (r.k + position)
            else:
                share = (score - low) / (high - low) if high > low else 1.0
            fused[seq] = fused.get(seq, 0.0) + r.weights[name] * share
            ranks.setdefault(seq, {})[name] = position
    if r.neighbor_weight:
        base = dict(fused)
        for seq, score in base.items():
            for near in (seq - 1, seq + 1):
                if near not in exclude and near >= 1:
                    lifted = base.get(near, 0.0) + r.neighbor_weight * score
                    fused[near] = max(fused.get(near, 0.0), lifted)
                    ranks.setdefault(near, {})
    if r.length_prior:
        for seq in fused:
            fused[seq] *= (counts.get(seq, 0) + 2) ** r.length_prior
    if r.author_weight:
        for seq in fused:
            if seq in by_ann:
                fused[seq] *= 1 + r.author_weight
    if period is not None:
        window = Period(period.start, period.end + r.date_slack)
        for seq in fused:
            if seq in times and times[seq] in window:
                fused[seq] *= 1 + r.date_weight
    order = sorted(fused, key=lambda s: (-fused[s], s))[:limit]
    return [(s, fused[s], ranks[s]) for s in order]


def _signal(draw: st.DrawFn, seqs: list[int]) -> Hits:
    chosen = draw(st.lists(st.sampled_from(seqs), unique=True, max_size=25))
    scores = draw(
        st.lists(
            st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.75]) | st.floats(0, 10),
            min_size=len(chosen),
            max_size=len(chosen),
        )
    )
    hits = list(zip(chosen, scores, strict=True))
    return sorted(hits, key=lambda h: -h[1])  # best first, as every signal returns them


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    seqs = list(range(1, draw(st.integers(1, 40)) + 1))
    start = datetime(2024, 1, 1, tzinfo=UTC)
    return {
        "signals": {name: _signal(draw, seqs) for name in ("tags", "fts", "dense")},
        "tag_low": draw(st.none() | st.floats(-1, 1)),
        "exclude": set(draw(st.lists(st.sampled_from(seqs), max_size=8))),
        "counts": {s: draw(st.integers(0, 60)) for s in seqs if draw(st.booleans()) or s % 3},
        "times": {s: start + timedelta(days=draw(st.integers(0, 90))) for s in seqs},
        "period": draw(st.booleans()),  # whether the message names one (January 2024)
        "limit": draw(st.integers(1, 60)),
        "by_ann": set(draw(st.lists(st.sampled_from(seqs), max_size=15))),
        "settings": {
            "fusion": draw(st.sampled_from(["score", "rrf"])),
            "k": draw(st.integers(1, 60)),
            "neighbor_weight": draw(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0, 1)),
            "length_prior": draw(st.sampled_from([0.0, 0.3]) | st.floats(0, 1)),
            "date_weight": draw(st.sampled_from([0.0, 0.5])),
            "author_weight": draw(st.sampled_from([0.0, 1.0]) | st.floats(0, 3)),
            "weights": {"tags": draw(st.floats(0, 2)), "fts": 1.0, "dense": draw(st.floats(0, 2))},
        },
    }


@settings(max_examples=400, deadline=None)
@given(case=_cases())
def test_array_fusion_equals_the_stated_fusion_exactly(case: dict[str, Any]) -> None:
    signals = case["signals"]
    store = _Store(case["counts"], case["times"])
    r = Recaller(store, tag_limit=len(signals["tags"]) or None, **case["settings"])  # type: ignore[arg-type]
    r._turn_lengths = lambda sid: None  # type: ignore[method-assign]
    text = "what happened in January 2024" if case["period"] else "what happened"
    period = query_period(text)
    assert (period is not None) == case["period"]
    authors = TurnAuthors(born=1)  # Ann wrote ``by_ann``, Bo the rest
    authors.extend([(s, "Ann: hi" if s in case["by_ann"] else "Bo: hi") for s in range(1, 41)])
    got = r._rank_text(
        "s",
        text,
        (signals["tags"], case["tag_low"]),
        signals["fts"],
        signals["dense"],
        exclude=case["exclude"],
        limit=case["limit"],
        authored=(authors, frozenset(["ann"])) if r.author_weight else None,
    )
    want = _reference(
        r,
        signals,
        case["tag_low"],
        case["exclude"],
        case["counts"],
        case["times"],
        period if r.date_weight else None,
        case["by_ann"],
        case["limit"],
    )
    assert [(h.seq, h.score, h.ranks) for h in got] == want, repr(case)
    dense = dict(signals["dense"])
    assert [h.similarity for h in got] == [
        dense.get(h.seq) if h.seq not in case["exclude"] else None for h in got
    ]


def test_a_period_reads_the_times_only_of_candidates_that_could_be_kept() -> None:
    """Lifted by the period preference or not, a candidate far below the ``limit`` best cannot
    be kept: its time is not read. The ranking is the stated one all the same."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    seqs = list(range(1, 401))
    times = {s: start + timedelta(days=s % 60) for s in seqs}
    store = _Store({}, times)
    asked: list[int] = []
    turn_times = store.turn_times

    def counted(session_id: str, wanted: Sequence[int]) -> dict[int, datetime]:
        asked.extend(wanted)
        return turn_times(session_id, wanted)

    store.turn_times = counted  # type: ignore[method-assign]
    settings = {"fusion": "rrf", "k": 1, "neighbor_weight": 0.0, "length_prior": 0.0}
    r = Recaller(store, date_weight=0.5, author_weight=0.0, **settings)  # type: ignore[arg-type]
    r._turn_lengths = lambda sid: None  # type: ignore[method-assign]
    fts = [(s, float(1000 - s)) for s in seqs]
    text = "what happened in January 2024"
    got = r._rank_text("s", text, ([], None), fts, [], limit=10)
    signals = {"tags": [], "fts": fts, "dense": []}
    want = _reference(r, signals, None, set(), {}, times, query_period(text), set(), 10)
    assert [(h.seq, h.score, h.ranks) for h in got] == want
    assert 10 <= len(asked) < 40  # RRF with k=1: only the first ranks can reach the 10th


_PERIOD_TEXT = "what happened in January 2024"


def _period_recaller(times: dict[int, datetime], date_weight: float) -> Recaller:
    r = Recaller(  # type: ignore[arg-type]
        _Store({}, times),
        date_weight=date_weight,
        author_weight=0.0,
        fusion="score",
        neighbor_weight=0.0,
        length_prior=0.0,
    )
    r._turn_lengths = lambda sid: None  # type: ignore[method-assign]
    return r


def _cut_and_whole(r: Recaller, fts: list[tuple[int, float]], limit: int) -> tuple[list, list]:
    cut = r._rank_text("s", _PERIOD_TEXT, ([], None), fts, [], limit=limit)
    whole = r._rank_text("s", _PERIOD_TEXT, ([], None), fts, [], limit=len(fts))[:limit]
    return [(h.seq, h.score) for h in cut], [(h.seq, h.score) for h in whole]


def test_a_negative_date_weight_keeps_the_stated_ranking() -> None:
    jan, june = datetime(2024, 1, 5, tzinfo=UTC), datetime(2024, 6, 5, tzinfo=UTC)
    r = _period_recaller({1: jan, 2: jan, 3: june}, date_weight=-0.5)  # a period demoted
    cut, whole = _cut_and_whole(r, [(1, 10.0), (2, 9.0), (3, 0.0)], limit=1)
    assert cut == whole  # cut: [(2, 0.9)] (2's time never read); stated: [(1, 0.5)]


def test_a_nan_score_keeps_the_stated_ranking() -> None:
    jan, june = datetime(2024, 1, 5, tzinfo=UTC), datetime(2024, 6, 5, tzinfo=UTC)
    r = _period_recaller({1: june, 2: june, 3: jan, 4: june}, date_weight=0.5)
    cut, whole = _cut_and_whole(r, [(1, 3.0), (2, float("nan")), (3, 2.0), (4, 1.0)], limit=2)
    assert cut == whole  # NaN counts as the largest in np.partition: the floor is too high
