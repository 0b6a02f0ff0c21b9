"""Splitting over-broad tags: a tag on too many turns stops telling them apart.

``find_overbroad`` names the tags that cross both frequency thresholds; ``split_tag`` groups one
tag's turns by the most telling other keyphrase they share and names each group with a new
compound tag (``reservation`` → ``reservation-availability``, ``reservation-browser-session``,
and ``reservation-general`` for the rest). Offline and deterministic: the keyphrases come from
a ``KeywordTagger``. Storing the sub-tags on their turns (and keeping the old tag there, so
queries for it still match) is the caller's job.

>>> turns = [(1, "Resy shows no availability tonight"), (2, "Availability on Friday?"),
...          (3, "The browser session expired"), (4, "Open a browser session for OpenTable"),
...          (5, "Book it")]
>>> groups = split_tag("reservation", turns, existing={"reservation"}, tagger=KeywordTagger())
>>> for sub_tag, turn_ids in groups.items():
...     print(sub_tag, turn_ids)
reservation-browser-session [3, 4]
reservation-availability [1, 2]
reservation-general [5]
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from contextfold.errors import ConfigError
from contextfold.memory.tagging import KeywordTagger

__all__ = ["find_overbroad", "split_tag"]


def find_overbroad(
    tag_counts: Mapping[str, int],
    total_turns: int,
    *,
    min_count: int = 15,
    min_fraction: float = 0.15,
    exclude: Collection[str] = (),
) -> list[str]:
    """Tags on at least ``min_count`` turns *and* at least ``min_fraction`` of
    ``total_turns``, most frequent first; ``exclude`` lists tags already examined.

    >>> find_overbroad({"reservation": 43, "auth": 9, "misc": 25, "rare": 16}, 143)
    ['reservation', 'misc']
    """
    if total_turns <= 0:
        return []
    broad = [
        tag
        for tag, count in tag_counts.items()
        if count >= min_count and count / total_turns >= min_fraction and tag not in exclude
    ]
    return sorted(broad, key=lambda tag: (-tag_counts[tag], tag))


def split_tag(
    tag: str,
    turns: Sequence[tuple[int, str]],
    *,
    existing: Collection[str],
    tagger: KeywordTagger,
    min_group: int = 2,
    max_groups: int = 6,
    phrases_per_turn: int = 5,
) -> dict[str, list[int]]:
    """Group ``turns`` (``(turn_id, text)`` pairs, all tagged ``tag``) into sub-topics.

    Each turn offers its ``phrases_per_turn`` best keyphrases other than ``tag`` and its parts.
    Greedily, the phrase shared by the most still-ungrouped turns (at least ``min_group``)
    forms the next group ``f"{tag}-{phrase}"``, up to ``max_groups``; the rest go to
    ``f"{tag}-general"``. A name that is in ``existing`` (or already used) gets ``-2``,
    ``-3``… — a split never reuses a tag. Returns ``{}`` when no phrase is shared by
    ``min_group`` turns: the tag is uniform, summarize it instead of splitting it.
    """
    if min_group < 1 or max_groups < 1:
        raise ConfigError(f"min_group and max_groups must be >= 1, got {min_group}, {max_groups}")
    canonical = tagger.canonicalizer.canonical
    name = canonical(tag)
    parts = set(name.split("-"))
    offered: dict[int, dict[str, float]] = {}
    for turn_id, text in turns:
        phrases = [
            (phrase, score)
            for phrase, score in tagger.keyphrases_of(text)
            if phrase != name and phrase not in parts and not set(phrase.split("-")) <= parts
        ]
        offered[turn_id] = dict(phrases[:phrases_per_turn])
    ungrouped = [turn_id for turn_id, _ in turns]
    groups: list[tuple[str, list[int]]] = []
    while ungrouped and len(groups) < max_groups:
        support: dict[str, tuple[int, float]] = {}
        for turn_id in ungrouped:
            for phrase, score in offered[turn_id].items():
                count, total = support.get(phrase, (0, 0.0))
                support[phrase] = (count + 1, total + score)
        if not support:
            break
        best = min(support, key=lambda p: (-support[p][0], -support[p][1], p))
        if support[best][0] < min_group:
            break
        members = [t for t in ungrouped if best in offered[t]]
        groups.append((best, members))
        ungrouped = [t for t in ungrouped if best not in offered[t]]
    if not groups:
        return {}
    taken = set(existing)
    result: dict[str, list[int]] = {}
    for phrase, members in [*groups, ("general", ungrouped)]:
        if not members:
            continue
        base = canonical(f"{name}-{phrase}")
        new, n = base, 1
        while new in taken:
            n += 1
            new = f"{base}-{n}"
        taken.add(new)
        result[new] = sorted(members)
    return result
