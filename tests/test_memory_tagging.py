"""Taggers: intent regexes, the keyword, embedding and LLM taggers, and over-broad tag splitting.

The LLM tagger talks to the fake OpenAI-compatible server through the real client; the
embedding tagger runs on ``HashEmbedder`` and on a tiny embedder whose geometry the tests set.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contextfold.errors import ConfigError, EmbeddingError
from contextfold.llm import OpenAICompatibleClient, Usage
from contextfold.memory.canonical import TagCanonicalizer
from contextfold.memory.splitting import find_overbroad, split_tag
from contextfold.memory.tagging import (
    EmbeddingTagger,
    KeywordTagger,
    LLMTagger,
    Tagger,
    TagResult,
    detect_broad,
    detect_temporal,
)
from contextfold.testing import HashEmbedder
from fake_llm import FakeLLMServer

# -- broad and temporal intent ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "broad"),
    [
        ("What did we discuss earlier?", True),
        ("what have we talked about so far", True),
        ("Can you summarize everything?", True),
        ("Please summarise the whole conversation for me", True),
        ("Give me a quick recap", True),
        ("What have we covered?", True),
        ("Remind me what we talked about.", True),
        ("What were we talking about before lunch?", True),
        ("Catch me up, I was away", True),
        ("When did Caroline go to the support group?", False),
        ("Summarize this article about climate change", False),
        ("What did Caroline discuss with her therapist?", False),
        ("We discussed pricing; now the API design.", False),
        ("The recapitulation theory in biology", False),
        ("", False),
    ],
)
def test_detect_broad(text: str, broad: bool) -> None:
    assert detect_broad(text) is broad


@pytest.mark.parametrize(
    ("text", "temporal"),
    [
        ("Going back to the very beginning, what were the key decisions?", True),
        ("What did we set up with tokens at the start?", True),
        ("Something you said early on about indexing.", True),
        ("What was the first thing I asked?", True),
        ("the first thing I asked you about", True),
        ("Earlier in our conversation you mentioned Redis", True),
        ("What did we originally plan for the schema?", True),
        ("In the first session we picked Postgres", True),
        ("Last time you suggested a smaller model", True),
        ("a few messages ago you said something about caching", True),
        ("Python has first-class functions", False),
        ("The first thing to do is install Python", False),
        ("She is originally from Sweden", False),
        ("Early onset diabetes runs in my family", False),
        ("Let's start the migration now", False),
        ("", False),
    ],
)
def test_detect_temporal(text: str, temporal: bool) -> None:
    assert detect_temporal(text) is temporal


# -- TagResult -------------------------------------------------------------------------------


def test_tag_result_primary_is_the_first_tag_and_is_serialised() -> None:
    result = TagResult(tags=("database", "auth"), related_tags=("sql",))
    assert result.primary == "database"
    assert json.loads(result.model_dump_json())["primary"] == "database"
    assert TagResult().primary is None


@pytest.mark.parametrize(
    "fields",
    [
        {"tags": ("db", "db")},
        {"tags": ("",)},
        {"tags": ("db",), "related_tags": ("db", "sql")},
    ],
)
def test_tag_result_rejects_inconsistent_tags(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TagResult(**fields)


# -- KeywordTagger ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "!!! ???", "42 2024 3.14", "the and of it", "ok"])
def test_keyword_tagger_gives_no_tags_for_contentless_text(text: str) -> None:
    result = KeywordTagger().tag(text)
    assert result.tags == () and result.primary is None
    assert result.source == "keyword"


def test_keyword_tags_emerge_from_the_text() -> None:
    result = KeywordTagger().tag("When did Caroline go to the support group?")
    assert result.tags == ("caroline", "support-group")
    assert {"support", "group"} <= set(result.related_tags)
    assert not result.broad and not result.temporal


@pytest.mark.parametrize(
    ("text", "tags"),
    [
        ("The court filings are due.", ("legal",)),
        ("She walked across the COURTYARD.", ()),  # word boundary: court != courtyard
        ("My attorney FILED a motion", ("legal",)),  # stem-aware and case-insensitive
        ("Is there a support group nearby?", ("therapy",)),  # a multi-word keyword
        ("The group offered support.", ()),  # the phrase, not its words apart
        ("Motion to dismiss; the support group met.", ("legal", "therapy")),
    ],
)
def test_configured_keywords(text: str, tags: tuple[str, ...]) -> None:
    tagger = KeywordTagger(
        {"legal": ["court", "filing", "motion"], "therapy": ["support group"]}, keyphrases=False
    )
    assert tagger.tag(text).tags == tags


def test_configured_tags_rank_by_hits_and_come_first() -> None:
    tagger = KeywordTagger({"Legal": ["court", "motion"], "Money": ["invoice"]})
    result = tagger.tag("An invoice for the court motion, filed by Dr. Jones.")
    assert result.tags[:2] == ("legal", "money")
    assert "jones" in result.tags
    assert "court" not in result.tags  # explained by the configured tag


def test_known_tags_are_reused_stem_aware() -> None:
    tagger = KeywordTagger()
    result = tagger.tag(
        "Our databases keep timing out on staging", vocabulary=["database", "cooking"]
    )
    assert result.primary == "database"
    assert "cooking" not in result.tags + result.related_tags
    both = tagger.tag("Any group for support here?", vocabulary=["support-group"])
    assert both.tags[0] == "support-group"
    assert "support" not in both.tags and "group" not in both.tags


def test_rare_words_outrank_words_common_in_the_conversation() -> None:
    tagger = KeywordTagger()
    for topic in ["lists", "decorators", "generators", "typing", "asyncio"]:
        tagger.observe(f"A question about python {topic}")
    assert tagger.documents_seen == 5
    assert tagger.tag("python dataclasses").primary == "dataclass"
    assert KeywordTagger().tag("python dataclasses").primary == "python-dataclass"


def test_capitalised_names_outrank_plain_words() -> None:
    result = KeywordTagger().tag("we hiked near the river with Melanie")
    assert result.primary == "melanie"
    assert result.tags[0] == "melanie" and "river" in result.tags


def test_names_keep_their_final_s_and_acronym_plurals_fold() -> None:
    canon = TagCanonicalizer()
    result = KeywordTagger(canonicalizer=canon).tag("We need better APIs, said Dr. Jones.")
    assert {"api", "jones"} <= set(result.tags)
    assert canon.canonical("Jones") == "jones"  # remembered for every later tag
    assert canon.canonical("APIs") == "api"


def test_keyword_tagger_caps_tags_and_moves_the_rest_to_related() -> None:
    text = "alpha bravo, charlie; delta. echo: foxtrot! golf (hotel) india"
    result = KeywordTagger(max_tags=3).tag(text)
    assert len(result.tags) == 3
    assert 0 < len(result.related_tags) <= 3
    assert set(result.tags).isdisjoint(result.related_tags)


@pytest.mark.parametrize(
    ("text", "context", "expected"),
    [
        ("ok, do that", ["Set up the Postgres replica"], "postgres"),
        ("ok, do that", [], None),
        ("Use Redis instead", ["Set up the Postgres replica"], "redis"),  # has its own topic
    ],
)
def test_contentless_short_turns_take_their_context_topics(
    text: str, context: list[str], expected: str | None
) -> None:
    assert KeywordTagger().tag(text, context=context).primary == expected


def test_learning_is_optional_and_keyphrases_of_never_learns() -> None:
    tagger = KeywordTagger(learn=False)
    tagger.tag("Kubernetes pods keep crashing")
    assert tagger.documents_seen == 0
    learning = KeywordTagger()
    assert learning.keyphrases_of("Kubernetes pods keep crashing")[0][0] == "kubernetes-pod"
    assert learning.documents_seen == 0


def test_keyword_tagger_is_deterministic() -> None:
    texts = ["Postgres replica lag", "replica lag again on Postgres", "new Redis cache layer"]
    first, second = KeywordTagger(), KeywordTagger()
    assert [first.tag(t) for t in texts] == [second.tag(t) for t in texts]


@given(text=st.text(max_size=200), vocabulary=st.lists(st.text(max_size=12), max_size=5))
def test_keyword_tagger_never_raises_and_returns_canonical_tags(
    text: str, vocabulary: list[str]
) -> None:
    canon = TagCanonicalizer()
    result = KeywordTagger(max_tags=4, canonicalizer=canon).tag(text, vocabulary=vocabulary)
    assert len(result.tags) <= 4 and len(result.related_tags) <= 4
    assert all(canon.canonical(t) == t for t in result.tags + result.related_tags)
    assert set(result.tags).isdisjoint(result.related_tags)


# -- EmbeddingTagger -------------------------------------------------------------------------

_AXES = {"pasta": 0, "recipe": 0, "cooking": 0, "python": 1, "code": 1, "marathon": 2}


class AxisEmbedder:
    """Each known word pulls toward its own axis; a small shared fourth component keeps
    every vector non-zero. Records what it was asked to embed."""

    name = "axis"
    dim = 4

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row, 3] = 0.1
            for word in text.lower().split():
                if word in _AXES:
                    out[row, _AXES[word]] += 1.0
            out[row] /= np.linalg.norm(out[row])
        return out


VOCAB = ["cooking", "python", "marathon-training"]


@pytest.mark.parametrize(
    ("text", "tags", "related"),
    [
        ("a pasta recipe", ("cooking",), ()),
        ("python code for a pasta recipe", ("cooking", "python"), ()),
        ("pasta recipe with python", ("cooking",), ("python",)),  # outside the margin
        ("what is the weather", (), ()),
    ],
)
def test_embedding_tagger_ranks_known_tags_by_cosine(
    text: str, tags: tuple[str, ...], related: tuple[str, ...]
) -> None:
    result = EmbeddingTagger(AxisEmbedder(), threshold=0.3, margin=0.2).tag(text, vocabulary=VOCAB)
    assert (result.tags, result.related_tags) == (tags, related)
    assert result.source == "embedding"


def test_embedding_tagger_caches_tag_vectors_and_embeds_tag_words() -> None:
    embedder = AxisEmbedder()
    tagger = EmbeddingTagger(embedder)
    tagger.tag("marathon plans", vocabulary=VOCAB)
    tagger.tag("more marathon plans", vocabulary=VOCAB)
    texts = [t for call in embedder.calls for t in call]
    assert texts.count("marathon training") == 1  # hyphens become spaces, embedded once
    assert "marathon-training" not in texts


def test_embedding_tagger_without_vocabulary_embeds_nothing() -> None:
    embedder = AxisEmbedder()
    result = EmbeddingTagger(embedder).tag("Can you recap everything?", vocabulary=[])
    assert result.tags == () and result.broad
    assert embedder.calls == []


def test_embedding_tagger_reads_context_for_short_texts() -> None:
    embedder = AxisEmbedder()
    tagger = EmbeddingTagger(embedder, lookback_words=4)
    assert tagger.tag("yes please", vocabulary=VOCAB, context=["a pasta recipe"]).tags == (
        "cooking",
    )
    long_text = "yes please go ahead with that one now"
    assert tagger.tag(long_text, vocabulary=VOCAB, context=["a pasta recipe"]).tags == ()


def test_embedding_tagger_survives_a_failing_embedder(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(AxisEmbedder):
        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            raise EmbeddingError("model file missing")

    with caplog.at_level(logging.WARNING, logger="contextfold.memory.tagging"):
        result = EmbeddingTagger(Broken()).tag("a pasta recipe", vocabulary=VOCAB)
    assert result.tags == () and result.fallback_reason == "model file missing"
    assert "model file missing" in caplog.text


def test_embedding_tagger_with_hash_embedder() -> None:
    tagger = EmbeddingTagger(HashEmbedder(), threshold=0.2)
    result = tagger.tag("the refund policy for damaged items", vocabulary=["refund-policy", "css"])
    assert result.tags == ("refund-policy",)


@given(
    text=st.text(max_size=80),
    vocabulary=st.lists(st.text(min_size=1, max_size=15), max_size=8),
    threshold=st.floats(-1.0, 1.0),
)
def test_embedding_tagger_is_closed_set(text: str, vocabulary: list[str], threshold: float) -> None:
    result = EmbeddingTagger(HashEmbedder(dim=32), threshold=threshold).tag(
        text, vocabulary=vocabulary
    )
    assert set(result.tags) | set(result.related_tags) <= set(vocabulary)
    assert len(result.tags) <= 3


# -- LLMTagger -------------------------------------------------------------------------------


@pytest.fixture
def client(fake_llm: FakeLLMServer) -> Iterator[OpenAICompatibleClient]:
    with OpenAICompatibleClient(fake_llm.base_url, max_retries=1, sleep=lambda _: None) as c:
        yield c


def _user_prompt(fake_llm: FakeLLMServer) -> str:
    return str(fake_llm.requests[-1].body["messages"][-1]["content"])


def test_llm_tagger_parses_and_canonicalises_the_reply(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient
) -> None:
    fake_llm.reply = json.dumps(
        {
            "tags": ["Databases", "query tuning", "Databases", "_general"],
            "primary": "query_tuning",
            "related_tags": ["SQL", "database", "indexes"],
            "broad": False,
            "temporal": False,
        }
    )
    result = LLMTagger(client, "m").tag("Why are my Postgres queries slow?", vocabulary=["auth"])
    assert result.tags == ("query-tuning", "database")
    assert result.related_tags == ("sql", "index")
    assert (result.source, result.fallback_reason) == ("llm", None)
    assert "Known tags: auth" in _user_prompt(fake_llm)


@pytest.mark.parametrize(
    "reply",
    [
        '```json\n{"tags": ["fitness"], "broad": false, "temporal": false}\n```',
        'Sure! Here are the tags:\n{"tags": ["fitness"]}\nHope that helps.',
        'Thinking {not json} ... ```\n{"tags": ["fitness"]}\n```',
    ],
)
def test_llm_tagger_finds_json_in_fences_and_prose(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient, reply: str
) -> None:
    fake_llm.reply = reply
    result = LLMTagger(client, "m").tag("My deadlift form feels off")
    assert (result.tags, result.source) == (("fitness",), "llm")


def test_llm_tagger_ors_the_regex_detectors_in(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient
) -> None:
    fake_llm.reply = '{"tags": ["project"], "broad": false, "temporal": false}'
    result = LLMTagger(client, "m").tag("Recap: what was the first thing I asked?")
    assert result.broad and result.temporal
    fake_llm.reply = '{"tags": ["project"], "broad": true, "temporal": "false"}'
    assert LLMTagger(client, "m").tag("And the budget?").broad


@pytest.mark.parametrize(
    ("text", "in_prompt"),
    [("yes, do that", True), ("Please migrate the whole billing schema to Postgres 16", False)],
)
def test_llm_tagger_prompt_has_context_only_for_short_turns(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient, text: str, in_prompt: bool
) -> None:
    fake_llm.reply = '{"tags": ["billing"]}'
    context = ["Should I move the billing tables to Postgres?"]
    LLMTagger(client, "m").tag(text, vocabulary=["billing", "auth"], context=context)
    prompt = _user_prompt(fake_llm)
    assert ("move the billing tables" in prompt) is in_prompt
    assert "Known tags: billing, auth" in prompt and text in prompt


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("I cannot help with that.", "no JSON object"),
        ('{"tags": "fitness"}', "wrong shape"),
        ('{"labels": ["fitness"]}', "wrong shape"),
        ('{"tags": ["_general", "misc", "???"]}', "no usable tags"),
        ('{"tags": []}', "no usable tags"),
    ],
)
def test_llm_tagger_falls_back_on_a_bad_reply(
    fake_llm: FakeLLMServer,
    client: OpenAICompatibleClient,
    caplog: pytest.LogCaptureFixture,
    reply: str,
    reason: str,
) -> None:
    fake_llm.reply = reply
    with caplog.at_level(logging.WARNING, logger="contextfold.memory.tagging"):
        result = LLMTagger(client, "m").tag("When did Caroline go to the support group?")
    assert result.source == "keyword-fallback"
    assert reason in (result.fallback_reason or "")
    assert result.tags == ("caroline", "support-group")
    assert "fell back" in caplog.text


@pytest.mark.parametrize("failure", ["http-500", "disconnect"])
def test_llm_tagger_falls_back_when_the_call_fails(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient, failure: str
) -> None:
    if failure == "http-500":
        fake_llm.fail_next(500, times=2)
    else:
        fake_llm.disconnect_next(times=2)
    fallback = KeywordTagger({"fitness": ["deadlift"]}, keyphrases=False)
    result = LLMTagger(client, "m", fallback=fallback).tag("deadlift form")
    assert len(fake_llm.requests) == 2  # one try and one retry
    assert (result.tags, result.source) == (("fitness",), "keyword-fallback")
    assert "LLM call failed" in (result.fallback_reason or "")


def test_llm_tagger_reports_usage_and_limits_tags(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient
) -> None:
    reply = '{"tags": ["a1", "b2", "c3", "d4"], "primary": "c3"}'
    fake_llm.reply = reply
    seen: list[tuple[str, Usage]] = []
    tagger = LLMTagger(
        client, "tagger-model", max_tags=2, on_usage=lambda m, u: seen.append((m, u))
    )
    result = tagger.tag("alpha beta gamma")
    assert result.tags == ("c3", "a1")
    [(model, usage)] = seen
    assert model == "tagger-model"
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens == len(reply.split())  # the fake counts words
    assert fake_llm.requests[-1].body["temperature"] == 0.0


def test_llm_tagger_skips_the_call_for_empty_text(
    fake_llm: FakeLLMServer, client: OpenAICompatibleClient
) -> None:
    result = LLMTagger(client, "m").tag("   ")
    assert result.tags == () and fake_llm.requests == []


def test_every_tagger_satisfies_the_protocol(client: OpenAICompatibleClient) -> None:
    taggers = [KeywordTagger(), EmbeddingTagger(HashEmbedder()), LLMTagger(client, "m")]
    assert all(isinstance(t, Tagger) for t in taggers)


# -- splitting over-broad tags ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "total", "expected"),
    [
        (
            {"reservation": 43, "troubleshooting": 34, "auth": 9},
            143,
            ["reservation", "troubleshooting"],
        ),
        ({"reservation": 14}, 20, []),  # frequent share, but under min_count
        ({"reservation": 20}, 200, []),  # enough turns, but only 10 %
        ({}, 0, []),
    ],
)
def test_find_overbroad(counts: dict[str, int], total: int, expected: list[str]) -> None:
    assert find_overbroad(counts, total) == expected


def test_find_overbroad_skips_tags_already_examined() -> None:
    assert find_overbroad({"a1": 50, "b2": 40}, 100, exclude={"a1"}) == ["b2"]


TURNS = [
    (1, "Resy shows no availability for Friday"),
    (2, "Check availability on OpenTable for Saturday"),
    (3, "Any availability at Nopa next week?"),
    (4, "The browser session expired again"),
    (5, "Log in to a browser session for Resy"),
    (6, "Book a table"),
]


def test_split_tag_groups_turns_by_shared_keyphrases() -> None:
    groups = split_tag("reservation", TURNS, existing={"reservation"}, tagger=KeywordTagger())
    assert groups == {
        "reservation-availability": [1, 2, 3],
        "reservation-browser-session": [4, 5],
        "reservation-general": [6],
    }


def test_split_tag_never_reuses_an_existing_tag() -> None:
    existing = {"reservation", "reservation-availability", "reservation-general"}
    groups = split_tag("reservation", TURNS, existing=existing, tagger=KeywordTagger())
    assert set(groups) == {
        "reservation-availability-2",
        "reservation-browser-session",
        "reservation-general-2",
    }


def test_split_tag_returns_nothing_for_a_uniform_tag() -> None:
    turns = [(1, "Book a table"), (2, "Reserve for two"), (3, "Cancel it")]
    assert split_tag("reservation", turns, existing=set(), tagger=KeywordTagger()) == {}


def test_reactions_and_fillers_never_become_topics() -> None:
    tagger = KeywordTagger()
    result = tagger.tag("That's so true! Amazing, I'm happy and excited for the pottery workshop.")
    assert "pottery" in " ".join(result.tags)
    for filler in ("true", "amazing", "happy", "excited"):
        assert filler not in result.tags and filler not in result.related_tags


def test_a_vocabulary_growing_turn_by_turn_keeps_one_index_and_the_others_theirs() -> None:
    tagger = KeywordTagger()
    stored = ["kiln", "glaze"]
    inbound = [*stored, "pottery"]  # the inbound vocabulary adds a related tag
    tagger.tag("the kiln glaze", vocabulary=inbound)
    for n in range(12):  # a derive: the stored turns' vocabulary grows turn by turn
        stored = [*stored, f"tag{n}"]
        assert tagger.tag("kiln glaze tag0", vocabulary=stored).primary is not None
    known = [seen for seen, _ in tagger._known]  # type: ignore[attr-defined]
    # the growing vocabulary has one index (the latest); the inbound one was not pushed out
    assert known == [stored, inbound]
    grown = [*inbound, "tag3"]
    names: list[str] = []
    canonical = tagger.canonicalizer.canonical

    def spy(tag: str) -> str:
        names.append(tag)
        return canonical(tag)

    tagger.canonicalizer.canonical = spy  # type: ignore[method-assign]
    result = tagger.tag("kiln pottery and tag3", vocabulary=grown)
    assert "pottery" in result.tags and "tag3" in result.tags
    assert "glaze" not in names  # extended by the new tag, not rebuilt
    assert "tag3" not in names  # its entry was made for the stored vocabulary already


def _index_names(tagger: KeywordTagger, vocabulary: list[str]) -> dict[str, list[Any]]:
    index = tagger._known_index(vocabulary)  # type: ignore[attr-defined]
    return {stem: sorted(entries) for stem, entries in index.items() if entries}


def test_a_carried_index_follows_an_alias_added_since_it_was_built() -> None:
    canon = TagCanonicalizer()
    tagger = KeywordTagger(canonicalizer=canon)
    _index_names(tagger, ["deploy", "billing", "release", "invoice"])
    canon.add_alias("release", "deploy")
    vocabulary = ["deploy", "billing", "invoice"]
    fresh = _index_names(KeywordTagger(canonicalizer=canon), vocabulary)
    assert _index_names(tagger, vocabulary) == fresh
    assert [name for name, _ in fresh["deploy"]] == ["deploy"]


def test_a_carried_index_follows_a_replaced_canonicalizer() -> None:
    tagger = KeywordTagger()
    vocabulary = ["deploy", "billing", "release"]
    _index_names(tagger, vocabulary)
    tagger.canonicalizer = TagCanonicalizer({"release": "deploy"})
    fresh = _index_names(KeywordTagger(canonicalizer=tagger.canonicalizer), vocabulary)
    assert _index_names(tagger, vocabulary) == fresh
    assert "releas" not in fresh


_VOCAB_WORDS = st.sampled_from(
    [
        "deploy", "release", "billing", "invoice", "reeves", "Jones", "release-notes", "kiln",
        "mice", "mouse-trap", "Dying", "die", "db", " Support_Group", "s", "x-ray", "lying",
    ]
)  # fmt: skip
_VOCAB_STEP = st.one_of(
    st.tuples(
        st.just("vocabulary"),
        st.integers(min_value=0, max_value=6),
        st.lists(_VOCAB_WORDS, max_size=3),
    ),
    st.tuples(st.just("alias"), _VOCAB_WORDS, _VOCAB_WORDS),
    st.tuples(st.just("unalias"), _VOCAB_WORDS),
    st.tuples(st.just("protect"), _VOCAB_WORDS),
)


def _stems_of(tagger: KeywordTagger, text: str) -> set[str]:
    return {tagger._stem(w) for w in re.findall(r"\w+", text.lower())}  # type: ignore[attr-defined]


def _looked_up(tagger: KeywordTagger, vocabulary: list[str], text: str) -> dict[str, list[Any]]:
    """What a text's lookup finds: the index restricted to the text's stems."""
    index = tagger._known_index(vocabulary, _stems_of(tagger, text))  # type: ignore[attr-defined]
    return {stem: sorted(entries) for stem, entries in index.items() if entries}


def _restricted(full: dict[str, list[Any]], tagger: KeywordTagger, text: str) -> dict[str, Any]:
    present = _stems_of(tagger, text)
    return {stem: entries for stem, entries in full.items() if stem in present}


@given(st.lists(_VOCAB_STEP, min_size=1, max_size=12), st.lists(_VOCAB_WORDS, max_size=4))
def test_a_carried_index_equals_a_fresh_one_across_canonicalizer_changes(
    steps: list[tuple[Any, ...]], words: list[str]
) -> None:
    canon = TagCanonicalizer()
    tagger = KeywordTagger(canonicalizer=canon)
    vocabulary: list[str] = []
    text = " ".join(w.replace("-", " ") for w in words) + " deploying invoices"
    for step in steps:
        if step[0] == "vocabulary":  # keep a start of the last one, append new tags
            vocabulary = [*vocabulary[: step[1]], *step[2]]
        elif step[0] == "alias":
            with contextlib.suppress(ConfigError):  # a cycle or a self-alias: refused
                canon.add_alias(step[1], step[2])
        elif step[0] == "unalias":
            canon.remove_alias(step[1])
        else:
            canon.protect(step[1])
        fresh_tagger = KeywordTagger(canonicalizer=canon)
        fresh = _index_names(fresh_tagger, vocabulary)
        # a text's lookup (only the tags starting like its stems) finds what the whole
        # index holds for its stems, carried or fresh
        assert _looked_up(tagger, vocabulary, text) == _restricted(fresh, tagger, text)
        assert _index_names(tagger, vocabulary) == fresh


def test_the_stem_cache_holds_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextfold.memory import tagging

    monkeypatch.setattr(tagging, "_CACHE_LIMIT", 50)
    tagger = KeywordTagger()
    for n in range(20):
        tagger.tag(" ".join(f"word{n}x{k} running" for k in range(10)))
        assert len(tagger._stems) <= 50  # type: ignore[attr-defined]
    assert tagger._stem("running") == "run"  # type: ignore[attr-defined]


def test_configured_keywords_follow_an_alias_added_after_the_tagger_was_built() -> None:
    canon = TagCanonicalizer()
    tagger = KeywordTagger({"legal": ["court"], "billing": ["invoice"]}, canonicalizer=canon)
    assert tagger.tag("The court ruled on the invoice.").tags[:2] == ("legal", "billing")
    canon.add_alias("legal", "law")
    fresh = KeywordTagger({"legal": ["court"], "billing": ["invoice"]}, canonicalizer=canon)
    text = "The court ruled on the invoice."
    assert tagger.tag(text).tags[:2] == ("law", "billing")
    assert tagger.tag(text) == fresh.tag(text)
    canon.remove_alias("legal")
    assert tagger.tag(text).tags[:2] == ("legal", "billing")
    tagger.canonicalizer = TagCanonicalizer({"billing": "payments"})
    assert tagger.tag(text).tags[:2] == ("legal", "payment")


@pytest.mark.parametrize("language", ["english", "porter"])
def test_a_prefix_stemmer_keeps_the_first_two_letters_the_lookup_relies_on(language: str) -> None:
    """``KeywordTagger._known_index`` looks a stem ``s`` up among the tags starting with
    ``s[:2]`` (or ``s[0] + "y"`` when ``s[1]`` is ``i``; when ``s`` is shorter, ``s``
    followed by nothing, ``e``, ``i`` or ``s``): every word of up to four letters, and
    inflections of every start of up to three letters, stem so."""
    import itertools
    import string

    from contextfold.analysis import _stemmer

    letters = string.ascii_lowercase
    words = ["".join(p) for n in range(1, 5) for p in itertools.product(letters, repeat=n)]
    starts = ["".join(p) for n in (1, 2, 3) for p in itertools.product(letters, repeat=n)]
    suffixes = ["ing", "ed", "ies", "ied", "es", "ly", "ingly", "edly", "ying", "yed", "ness"]
    suffixes += ["s", "eed", "ement", "ance", "ation", "ational", "fulness", "iveness", "alli"]
    suffixes += ["ogi", "bli", "ator", "aliti", "biliti", "icate", "ical", "ful", "sses", "e"]
    words += [start + suffix for start in starts for suffix in suffixes]
    words += ["dying", "lying", "tying", "skies", "gently", "early", "only", "news", "x9s", "a1"]
    stems = _stemmer(language).stemWords(words)
    missed = [
        (word, stem)
        for word, stem in zip(words, stems, strict=True)
        if not (
            word[:2] in {stem + after for after in ("", "e", "i", "s")}
            if len(stem) < 2
            else word[:2] == stem[:2] or (stem[1] == "i" and word[:2] == stem[0] + "y")
        )
    ]
    assert missed == []


_TAG_POOL = [
    "kiln", "kilns", "glaze", "pottery-class", "support-group", "mice", "mouse", "dying",
    "die", "lie", "lying", "db", "database", "Jones", "james", "x-ray", "a", "s", "C++",
    "caroline", "carolines", "news", "analysis", "ayes", "eye", "running", "run", "ai",
]  # fmt: skip
_TEXT_WORDS = [*_TAG_POOL, "the", "a", "s", "dyed", "kilning", "supporting", "groups", "ran"]


@given(
    st.lists(st.sampled_from(_TAG_POOL), max_size=15),
    st.lists(st.lists(st.sampled_from(_TEXT_WORDS), min_size=1, max_size=8), max_size=4),
    st.lists(st.tuples(st.sampled_from(_TAG_POOL), st.sampled_from(_TAG_POOL)), max_size=2),
)
def test_a_lookup_by_the_texts_stems_tags_as_the_whole_index_does(
    vocabulary: list[str], texts: list[list[str]], aliases: list[tuple[str, str]]
) -> None:
    canon = TagCanonicalizer()
    for alias, target in aliases:
        with contextlib.suppress(ConfigError):
            canon.add_alias(alias, target)
    lazy = KeywordTagger(canonicalizer=canon)
    whole = KeywordTagger(canonicalizer=canon)
    whole._prefix_stems = False  # type: ignore[attr-defined]
    for words in texts:
        text = " ".join(words)
        assert lazy.tag(text, vocabulary=vocabulary) == whole.tag(text, vocabulary=vocabulary)


def test_a_first_lookup_makes_entries_only_for_the_tags_starting_like_the_text() -> None:
    vocabulary = [f"{a}{b}topic{n}" for a in "abcdefgh" for b in "aeiou" for n in range(20)]
    vocabulary += ["kiln", "kiln-glaze"]
    tagger = KeywordTagger()
    result = tagger.tag("Is the kiln glaze ready?", vocabulary=vocabulary)
    assert result.tags[0] == "kiln-glaze"
    made = set(tagger._entries)  # type: ignore[attr-defined]
    assert {"kiln", "kiln-glaze"} <= made
    assert len(made) < 50  # of 802: only the groups of "is", "the", "kiln", "glaze", "ready"


def test_the_known_tag_entries_hold_their_limit() -> None:
    tagger = KeywordTagger(cache_limit=30)
    vocabulary = [f"kiln-{n}" for n in range(100)]
    for n in range(0, 100, 7):
        result = tagger.tag(f"the kiln {n}", vocabulary=vocabulary)
        assert f"kiln-{n}" in result.tags
        assert len(tagger._entries) <= 30  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="cache_limit"):
        KeywordTagger(cache_limit=0)


def test_protecting_a_name_drops_only_the_known_tag_entries_ending_in_it() -> None:
    tagger = KeywordTagger()
    vocabulary = ["trip-with-reeves", "reeves", "kiln", "kiln-glaze", "trip"]
    tagger.tag("the kiln glaze and the trip with reeves", vocabulary=vocabulary)
    assert set(tagger._entries) == set(vocabulary)  # type: ignore[attr-defined]
    tagger.canonicalizer.protect("Reeves")
    result = tagger.tag("the kiln glaze and the trip with Reeves", vocabulary=vocabulary)
    fresh = KeywordTagger(canonicalizer=TagCanonicalizer(protected=["reeves"]))
    assert result == fresh.tag("the kiln glaze and the trip with Reeves", vocabulary=vocabulary)
    made: list[str] = []
    entry = tagger._known_entry  # type: ignore[attr-defined]

    def counted(tag: str) -> Any:
        made.append(tag)
        return entry(tag)

    tagger._known_entry = counted  # type: ignore[attr-defined]
    tagger.canonicalizer.protect("Jenkins")  # changes no tag of the vocabulary
    tagger.canonicalizer.protect("Reevess")
    tagger.tag("kiln glaze trip", vocabulary=vocabulary)
    assert made == []  # kept: no protected name is one of their last parts
