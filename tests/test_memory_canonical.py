"""Tag canonicalization (normalize, plural folding, aliases, suggestions) and tag rules."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contextfold.errors import ConfigError
from contextfold.memory.canonical import (
    TagCanonicalizer,
    _last_part,
    fold_plural,
    normalize_tag,
)
from contextfold.memory.rules import DEFAULT_RULE, TagRule, TagRules

# -- normalize and fold ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Database", "database"),
        ("  support group  ", "support-group"),
        ("support_group", "support-group"),
        ("CI/CD", "ci-cd"),
        ("node.js", "nodejs"),
        ("C++", "cplusplus"),
        ("C#", "csharp"),
        ("--a -- b--", "a-b"),
        ("what?!", "what"),
        ("Café Au Lait", "café-au-lait"),
        ("???", ""),
        ("", ""),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize_tag(raw) == expected


@pytest.mark.parametrize(
    ("plural", "singular"),
    [
        ("databases", "database"),
        ("queries", "query"),
        ("classes", "class"),
        ("boxes", "box"),
        ("churches", "church"),
        ("caches", "cache"),
        ("cookies", "cookie"),
        ("ties", "tie"),
        ("aliases", "alias"),
        ("statuses", "status"),
        ("analyses", "analysis"),
        ("leaves", "leaf"),
        ("potatoes", "potato"),
        ("apis", "api"),
        ("support-groups", "support-group"),
        ("sales-reports", "sales-report"),
    ],
)
def test_fold_plural_makes_singular(plural: str, singular: str) -> None:
    assert fold_plural(plural) == singular


@pytest.mark.parametrize(
    "word",
    [
        "status",
        "analysis",
        "news",
        "physics",
        "analytics",
        "series",
        "kubernetes",
        "postgres",
        "devops",
        "redis",
        "arthritis",
        "business",
        "aws",
        "nodejs",
        "famous",
        "glass",
        "rdbms",
    ],
)
def test_fold_plural_leaves_words_that_only_look_plural(word: str) -> None:
    assert fold_plural(word) == word


def test_protected_words_are_not_folded() -> None:
    canon = TagCanonicalizer(protected=["Hopkins"])
    assert canon.canonical("hopkins") == "hopkins"
    assert canon.canonical("johns-hopkins") == "johns-hopkins"
    assert TagCanonicalizer().canonical("hopkins") == "hopkin"
    canon.protect("Adams")
    assert canon.canonical("adams") == "adams"


_PLAIN_WORDS = st.sampled_from(
    [
        "james",
        "adams",
        "paris",
        "notes",
        "Lists",
        "caches",
        "news",
        "db",
        "c#",
        "hopkins",
        "go",
        "reeves",
        "Jones",
    ]
)


@st.composite
def _spelled(draw: st.DrawFn) -> str:
    """A word, sometimes with a mark inside it that normalizing drops (``Ree'ves``)."""
    word = draw(_PLAIN_WORDS)
    mark = draw(st.sampled_from(["", "", "'", ".", "!", "™", "·"]))
    at = draw(st.integers(min_value=0, max_value=len(word)))
    return word[:at] + mark + word[at:]


_WORDS = _spelled()
_TAGS = st.lists(_WORDS, min_size=1, max_size=3).map("-".join)


@given(st.lists(_TAGS, max_size=12), st.lists(_WORDS, min_size=1, max_size=3))
def test_protecting_a_word_gives_what_a_fresh_canonicalizer_would(
    tags: list[str], words: list[str]
) -> None:
    warm = TagCanonicalizer()
    for tag in tags:  # cached before the words are protected
        warm.canonical(tag)
    warm.protect(*words)
    fresh = TagCanonicalizer(protected=words)
    assert [warm.canonical(t) for t in tags] == [fresh.canonical(t) for t in tags]


def test_protecting_a_word_keeps_the_cached_tags_it_cannot_change() -> None:
    canon = TagCanonicalizer()
    for tag in ("databases", "queries", "reeves-trip", "notes", "trip-with-reeves", "Ree'ves"):
        canon.canonical(tag)
    canon.protect("Reeves")
    # only the tags whose normalized last part is "reeves" can fold differently now
    assert sorted(canon._cache) == ["databases", "notes", "queries", "reeves-trip"]
    assert canon.canonical("reeves-trip") == "reeves-trip"
    assert canon.canonical("trip-with-reeves") == "trip-with-reeves"
    canon.protect("Paris")  # never folded: nothing it could change is dropped
    assert len(canon._cache) == 5


@pytest.mark.parametrize("spelling", ["Ree'ves", "ree.ves", "REE!VES", "ops/ree'ves"])
def test_protecting_a_word_drops_cached_spellings_with_marks_inside_it(spelling: str) -> None:
    canon = TagCanonicalizer()
    assert canon.canonical(spelling).endswith("reeve")  # cached folded
    canon.protect("reeves")
    assert canon.canonical(spelling) == TagCanonicalizer(protected=["reeves"]).canonical(spelling)
    assert canon.canonical(spelling).endswith("reeves")


# -- aliases ---------------------------------------------------------------------------------


def test_canonical_follows_alias_chains() -> None:
    canon = TagCanonicalizer({"db": "database", "rdbms": "db"})
    assert canon.canonical("RDBMS") == "database"
    assert canon.canonical("DB") == "database"
    assert canon.canonical("Databases") == "database"
    assert canon.aliases == {"db": "database", "rdbms": "database"}


def test_alias_sides_are_normalized_and_folded() -> None:
    canon = TagCanonicalizer()
    canon.add_alias("Support Groups", "Therapy_Groups")
    assert canon.aliases == {"support-group": "therapy-group"}
    assert canon.canonical("support group") == "therapy-group"


@pytest.mark.parametrize(
    ("existing", "alias", "target"),
    [
        ({}, "db", "DB"),
        ({"db": "database"}, "database", "db"),
        ({"a1": "b1", "b1": "c1"}, "c1", "a1"),
    ],
)
def test_add_alias_refuses_a_cycle(existing: dict[str, str], alias: str, target: str) -> None:
    canon = TagCanonicalizer(existing)
    before = canon.aliases
    with pytest.raises(ConfigError, match="cycle"):
        canon.add_alias(alias, target)
    assert canon.aliases == before


def test_add_alias_refuses_empty_tags() -> None:
    with pytest.raises(ConfigError, match="non-empty"):
        TagCanonicalizer().add_alias("!!!", "database")


def test_a_new_alias_changes_later_answers() -> None:
    canon = TagCanonicalizer()
    assert canon.canonical("k8s") == "k8s"
    canon.add_alias("k8s", "kubernetes")
    assert canon.canonical("k8s") == "kubernetes"


tags = st.text(
    alphabet=st.sampled_from("abcdeisuxyz -_/.#+ÉßİK"), min_size=0, max_size=20
) | st.sampled_from(["databases", "statuses", "queries", "class", "c++", "support groups"])


@given(tag=tags)
def test_canonical_is_idempotent(tag: str) -> None:
    canon = TagCanonicalizer({"db": "database", "queries": "sql", "sql": "structured-query"})
    once = canon.canonical(tag)
    assert canon.canonical(once) == once
    assert once == normalize_tag(once)


# -- suggestions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tags", "alias", "canonical", "reason"),
    [
        (
            ["accommodation", "accommodation", "accomodation"],
            "accomodation",
            "accommodation",
            "edit distance 1",
        ),
        (["postgre", "postgres"], "postgre", "postgres", "edit distance 1"),
        (["data-base", "database", "database"], "data-base", "database", "hyphenation"),
        (["k8s", "kubernetes"], "k8s", "kubernetes", "numeronym"),
        (["i18n", "internationalization"], "i18n", "internationalization", "numeronym"),
        (["ml", "machine-learning"], "ml", "machine-learning", "initialism"),
    ],
)
def test_suggest_finds_alias(tags: list[str], alias: str, canonical: str, reason: str) -> None:
    found = {(s.alias, s.canonical, s.reason) for s in TagCanonicalizer().suggest(tags)}
    assert (alias, canonical, reason) in found


@pytest.mark.parametrize(
    "tags",
    [
        ["auth", "math"],  # two edits on a four-letter word is a different word
        ["cat", "bat"],  # below min_length
        ["pr", "pull-request", "public-relations"],  # ambiguous initialism
        ["database", "databases"],  # already the same canonical tag
        ["db", "database"],  # abbreviation: no principled rule, leave it to add_alias
    ],
)
def test_suggest_leaves_different_tags_alone(tags: list[str]) -> None:
    assert TagCanonicalizer().suggest(tags) == []


def test_suggest_prefers_the_more_frequent_spelling() -> None:
    counts = {"colour": 9, "color": 2}
    [suggestion] = TagCanonicalizer().suggest(counts)
    assert (suggestion.alias, suggestion.canonical, suggestion.distance) == ("color", "colour", 1)
    [flipped] = TagCanonicalizer().suggest({"colour": 1, "color": 5})
    assert (flipped.alias, flipped.canonical) == ("colour", "color")


# -- tag rules -------------------------------------------------------------------------------

RULES = TagRules(
    [
        TagRule(match="architecture*", priority=10, summary_prompt="Keep the decisions."),
        TagRule(match="debug*", priority=7, ttl_days=7),
        TagRule(match="*-meeting", priority=3, ttl_days=30),
        TagRule(match="debug-ui", priority=1),  # shadowed by debug*: first match wins
    ]
)


@pytest.mark.parametrize(
    ("tag", "priority", "ttl"),
    [
        ("architecture", 10, None),
        ("architecture-review", 10, None),
        ("debugging", 7, 7),
        ("debug-ui", 7, 7),
        ("Debug-UI", 7, 7),
        ("team-meeting", 3, 30),
        ("recipes", 5, None),
    ],
)
def test_rules_first_match_wins(tag: str, priority: int, ttl: float | None) -> None:
    rule = RULES.for_tag(tag)
    assert (rule.priority, rule.ttl_days) == (priority, ttl)
    assert RULES.priority(tag) == priority


def test_unmatched_tag_gets_the_default_rule() -> None:
    assert RULES.for_tag("recipes") is DEFAULT_RULE
    assert TagRules().for_tag("anything") == TagRule(match="*", priority=5)


@pytest.mark.parametrize(
    ("tag", "age_days", "expired"),
    [("debugging", 6.9, False), ("debugging", 7.1, True), ("architecture", 9999, False)],
)
def test_expired_uses_the_rule_ttl(tag: str, age_days: float, expired: bool) -> None:
    now = datetime(2026, 1, 31, tzinfo=UTC)
    assert RULES.expired(tag, now - timedelta(days=age_days), now) is expired


def test_expired_refuses_mixed_naive_and_aware_datetimes() -> None:
    with pytest.raises(ConfigError, match="naive"):
        RULES.expired("debugging", datetime(2026, 1, 1), datetime(2026, 1, 31, tzinfo=UTC))


def test_rules_validate_their_fields() -> None:
    rules = TagRules.from_config([{"match": "legal*", "priority": 9, "ttl_days": 90}])
    assert rules.for_tag("legal-filing").ttl_days == 90
    with pytest.raises(ValidationError, match="ttl_days"):
        TagRules.from_config([{"match": "x*", "ttl_days": 0}])
    with pytest.raises(ValidationError, match="prio"):
        TagRules.from_config([{"match": "x*", "prio": 1}])


@given(st.text(alphabet="ab-s'.#+ \u00c9", max_size=12))
def test_the_last_part_of_a_tag_is_that_of_its_normalized_form(tag: str) -> None:
    assert _last_part(tag) == normalize_tag(tag).rpartition("-")[2]


def test_the_version_grows_when_a_canonical_form_may_change() -> None:
    canon = TagCanonicalizer()
    start = canon.version
    canon.protect("Paris", "go")  # neither can fold: no canonical form changes
    canon.remove_alias("db")  # there was none
    assert canon.version == start
    canon.add_alias("db", "database")
    assert canon.version > start
    before = canon.version
    canon.protect("Reeves")
    assert canon.version > before
    before = canon.version
    canon.protect("reeves")  # already protected
    assert canon.version == before
    assert canon.remove_alias("DB")
    assert canon.version > before


_CHANGE = st.one_of(
    st.tuples(st.just("protect"), _WORDS),
    st.tuples(st.just("alias"), _TAGS, _TAGS),
    st.tuples(st.just("unalias"), _TAGS),
)


@given(st.lists(_TAGS, min_size=1, max_size=10), st.lists(_CHANGE, max_size=8))
def test_changed_since_names_every_tag_whose_canonical_form_changed(
    tags: list[str], changes: list[tuple[str, ...]]
) -> None:
    canon = TagCanonicalizer()
    seen = [(canon.version, [canon.canonical(t) for t in tags])]
    for change in changes:
        if change[0] == "protect":
            canon.protect(change[1])
        elif change[0] == "alias":
            with contextlib.suppress(ConfigError):
                canon.add_alias(change[1], change[2])
        else:
            canon.remove_alias(change[1])
        seen.append((canon.version, [canon.canonical(t) for t in tags]))
    now = [canon.canonical(t) for t in tags]
    for version, forms in seen:
        changed = canon.changed_since(version)
        for tag, before, after in zip(tags, forms, now, strict=True):
            if before != after:  # named by the change, or every tag may have changed
                assert changed is None or canon.last_part(tag) in changed
    assert canon.changed_since(canon.version) == frozenset()


def test_changed_since_forgets_old_changes_and_says_so() -> None:
    canon = TagCanonicalizer()
    start = canon.version
    canon.protect("Reeves")
    assert canon.changed_since(start) == {"reeves"}
    for n in range(100):
        canon.protect(f"Names{n}s")
    assert canon.changed_since(start) is None  # older than the changes kept: any tag
    recent = canon.version
    canon.add_alias("db", "database")
    assert canon.changed_since(recent) is None
