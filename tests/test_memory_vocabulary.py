"""A vocabulary that evolves: over-broad tags split (keyphrases, or the LLM when configured),
split tags answering for the old one, related tags matched inbound, automatic and
session-scoped aliases, and expired tags held back from recall."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contextfold.errors import ConfigError
from contextfold.llm import OpenAICompatibleClient
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.conformance.vocab_support import (
    COUNTER,
    broad_conversation,
    make_engine,
    turn_by_turn,
)
from contextfold.store.sqlite.memory import MemoryStore
from fake_llm import FakeLLMServer

# -- splitting -------------------------------------------------------------------------------------


def test_a_tag_is_split_once_and_sub_tags_never_reuse_a_name() -> None:
    engine = make_engine()
    engine.on_turn_complete(
        [{"role": "user", "content": "Reservation browser tips"}], session_id="s", new_only=True
    )
    engine.store.set_turn_tags("s", 1, {"reservation-browser-session": 1.0})
    messages = broad_conversation()
    turn_by_turn(engine, messages)
    subs = engine.vocab.splits("s")["reservation"]
    assert "reservation-browser-session" not in subs  # taken: the next free name is used
    before = engine.vocabulary(session_id="s")
    more = [{"role": "user", "content": f"Reservation for a table, round {n}"} for n in range(30)]
    for message in more:
        engine.on_turn_complete([message], session_id="s", new_only=True)
    assert engine.vocab.splits("s")["reservation"] == subs  # examined once, never again
    assert engine.vocabulary(session_id="s").get("reservation", 0) > before.get("reservation", 0)


def test_split_settings_gate_the_split() -> None:
    off = make_engine(tagger={"keywords": {"reservation": ["reservation"]}})
    turn_by_turn(off, broad_conversation())
    assert off.vocab.splits("s") == {} and off.vocabulary(session_id="s")["reservation"] == 48
    high = make_engine(
        tagger={
            "keywords": {"reservation": ["reservation"]},
            "splitting": {"enabled": True, "frequency_threshold": 100},
        }
    )
    turn_by_turn(high, broad_conversation())
    assert high.vocab.splits("s") == {}


def test_max_splits_per_turn_bounds_each_derive() -> None:
    keywords = {"reservation": ["reservation"], "checkout": ["reservation"]}
    one = make_engine(tagger={"keywords": keywords, "splitting": {"enabled": True}})
    one.on_turn_complete(broad_conversation(), session_id="s")
    assert len(one.vocab.splits("s")) == 1
    two = make_engine(
        tagger={"keywords": keywords, "splitting": {"enabled": True, "max_splits_per_turn": 2}}
    )
    two.on_turn_complete(broad_conversation(), session_id="s")
    assert set(two.vocab.splits("s")) == {"reservation", "checkout"}


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


LLMEngines = Callable[..., MemoryEngine]


@pytest.fixture
def llm_engine(llm: FakeLLMServer) -> Iterator[LLMEngines]:
    """``llm_engine(**tagger)``: an engine whose LLM is the fake one (closed at the end)."""
    made: list[tuple[MemoryEngine, OpenAICompatibleClient]] = []

    def make(**tagger: Any) -> MemoryEngine:
        cfg = MemoryConfig.model_validate(
            {
                "llm": {"provider": "openai", "model": "fake-model", "base_url": llm.base_url},
                "tagger": {
                    "keywords": {"reservation": ["reservation"]},
                    "splitting": {"enabled": True},
                    **tagger,
                },
                "recall": {"embedder": "none"},
            }
        )
        client = OpenAICompatibleClient(llm.base_url, max_retries=1, sleep=lambda _: None)
        engine = MemoryEngine(
            cfg,
            store=MemoryStore(counter=COUNTER),
            embedder=None,
            counter=COUNTER,
            llm_client=client,
        )
        made.append((engine, client))
        return engine

    yield make
    for engine, client in made:
        engine.close()
        client.close()


def split_reply(body: dict[str, Any]) -> str:
    """The fake model's split: turns by the word they contain, one of them left out."""
    prompt = body["messages"][-1]["content"]
    groups: dict[str, list[int]] = {"reservation-browser-access": [], "checkout-trouble": []}
    for line in prompt.splitlines():
        if line.startswith("["):
            seq = int(line[1 : line.index("]")])
            if "browser" in line:
                groups["reservation-browser-access"].append(seq)
            elif "payment" in line:
                groups["checkout-trouble"].append(seq)
    return json.dumps(
        {"uniform": False, "groups": [{"tag": k, "turns": v} for k, v in groups.items()]}
    )


def test_the_llm_splits_when_one_is_configured(llm: FakeLLMServer, llm_engine: LLMEngines) -> None:
    llm.reply = split_reply
    engine = llm_engine()
    engine.on_turn_complete(broad_conversation(), session_id="s")
    [report] = engine.last_splits
    assert report.source == "llm"
    assert set(report.sub_tags) == {
        "reservation-browser-access",
        "checkout-trouble",
        "reservation-general",
    }
    browser = report.sub_tags["reservation-browser-access"]
    assert browser and all(
        "browser" in engine.store.turns("s", seq, seq)[0].message.text() for seq in browser
    )
    prompt = llm.requests[-1].body["messages"][0]["content"]
    assert "reservation" in prompt and "splitting" in engine.cost_report(session_id="s").by_kind


def test_a_uniform_verdict_keeps_the_tag_and_a_failed_call_falls_back(
    llm: FakeLLMServer, llm_engine: LLMEngines
) -> None:
    llm.reply = '{"uniform": true, "groups": []}'
    engine = llm_engine()
    engine.on_turn_complete(broad_conversation(), session_id="s")
    assert engine.vocab.splits("s") == {"reservation": ()}
    assert engine.vocabulary(session_id="s")["reservation"] == 48
    llm.reply = "I cannot decide."
    other = llm_engine()
    other.on_turn_complete(broad_conversation(), session_id="s")
    [report] = other.last_splits
    assert report.source == "keyword-fallback" and len(report.sub_tags) >= 2


# -- related tags ----------------------------------------------------------------------------------

FEED = [
    {"role": "user", "content": "The home feed takes four seconds to render for big accounts."},
    {
        "role": "assistant",
        "content": "We can precompute it with a materialized view refreshed"
        " every minute, so the feed reads one row per account.",
    },
    {"role": "user", "content": "Separately, the login page needs a dark mode toggle."},
    {"role": "assistant", "content": "Add a theme switch that stores the choice in a cookie."},
]


def tag_reply(body: dict[str, Any]) -> str:
    """The fake LLM tagger: the materialized-view turn gets related tags a later question may
    use; the question about "that caching trick" gets related tags of its own."""
    prompt = body["messages"][-1]["content"]
    message = prompt.rsplit("Message to tag:\n", 1)[-1]
    if "materialized view" in message:
        reply = {"tags": ["materialized-view", "feed"], "related_tags": ["caching", "precomputed"]}
    elif "caching trick" in message:
        reply = {"tags": ["caching-trick"], "related_tags": ["caching", "materialized-view"]}
    elif "dark mode" in message or "theme" in message:
        reply = {"tags": ["dark-mode", "login"], "related_tags": ["theme"]}
    else:
        reply = {"tags": ["feed", "performance"], "related_tags": ["latency"]}
    return json.dumps(reply)


@pytest.mark.parametrize("inbound", ["keyword", "llm"])
def test_that_caching_trick_recalls_the_materialized_view_turn(
    llm: FakeLLMServer, llm_engine: LLMEngines, inbound: str
) -> None:
    llm.reply = tag_reply
    engine = llm_engine(type="llm", inbound=inbound, keywords={})
    engine.on_turn_complete(FEED, session_id="s")
    assert "caching" in engine.store.turns("s", 2, 2)[0].related_tags
    ctx = engine.on_message_inbound("Remind me of that caching trick?", session_id="s")
    assert "caching" in ctx.related_tags
    if inbound == "llm":  # the model's related tags for the query reach the stored tags too
        assert "materialized-view" in ctx.related_tags + ctx.matched_tags
    assert ctx.recalled and ctx.recalled[0].seq == 2
    assert ctx.recalled[0].ranks.get("tags") == 1 and "fts" not in ctx.recalled[0].ranks
    assert "materialized view" in ctx.prepend_text


# -- aliases ---------------------------------------------------------------------------------------

KUBE = [
    {"role": "user", "content": "Our kubernetes cluster needs a kubernetes upgrade plan."},
    {"role": "assistant", "content": "Drain each kubernetes node, then upgrade kubelet."},
    {"role": "user", "content": "And kubernetez ingress certificates expire next week."},
]


def plain_engine(**tagger: Any) -> MemoryEngine:
    cfg = MemoryConfig.model_validate(
        {
            "tagger": {
                "keywords": {"kubernetes": ["kubernetes"], "kubernetez": ["kubernetez"]},
                **tagger,
            },
            "recall": {"embedder": "none"},
        }
    )
    return MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)


def test_a_near_spelling_is_aliased_automatically_and_its_turns_retagged() -> None:
    engine = plain_engine()
    engine.on_turn_complete(KUBE, session_id="s")
    assert engine.vocab.session_aliases("s") == {"kubernetez": "kubernetes"}
    assert "kubernetez" not in engine.vocabulary(session_id="s")
    assert "kubernetes" in engine.store.turns("s", 3, 3)[0].tags
    # Later tagging and lookups resolve it too; other sessions are untouched.
    ctx = engine.on_message_inbound("kubernetez ingress?", session_id="s")
    assert "kubernetes" in ctx.matched_tags and 3 in [r.seq for r in ctx.recalled]
    assert engine.vocab.session_aliases("t") == {} and engine.canonicalizer.aliases == {}


@pytest.mark.parametrize(
    "aliases", [{"auto": False}, {"min_similarity": 0.95}], ids=["off", "threshold"]
)
def test_automatic_aliases_have_an_off_switch_and_a_threshold(aliases: dict[str, Any]) -> None:
    engine = plain_engine(aliases=aliases)
    engine.on_turn_complete(KUBE, session_id="s")
    assert engine.vocab.session_aliases("s") == {}
    assert "kubernetez" in engine.vocabulary(session_id="s")


def test_session_aliases_apply_to_their_session_only() -> None:
    engine = plain_engine(aliases={"auto": False})
    for sid in ("s", "t"):
        engine.on_turn_complete(
            [{"role": "user", "content": "Postgres vacuum settings"}], session_id=sid
        )
    engine.add_alias("pg", "postgres", session_id="s")

    def tags(sid: str) -> tuple[str, ...]:
        found = engine.tag_message("pg vacuum", session_id=sid)
        return found.tags + found.related_tags

    assert "postgres" in tags("s")
    assert "postgres" not in tags("t")
    engine.on_turn_complete([{"role": "user", "content": "pg replication lag"}], session_id="s")
    assert "postgres" in engine.store.turns("s", 2, 2)[0].tags
    with pytest.raises(ConfigError, match="cycle"):
        engine.add_alias("postgres", "pg", session_id="s")
    with pytest.raises(ConfigError, match="no session 'ghost'"):
        engine.add_alias("pg", "postgres", session_id="ghost")
    assert engine.remove_alias("pg", session_id="s") is True
    assert "postgres" not in tags("s")


def test_the_inbound_vocabulary_is_made_once_per_generation_and_follows_every_change() -> None:
    engine = plain_engine(aliases={"auto": False})
    engine.on_turn_complete(
        [{"role": "user", "content": "Postgres vacuum settings"}], session_id="s"
    )
    counts = engine._counts("s")  # type: ignore[attr-defined]
    first = engine.vocab.inbound_vocabulary("s", counts)
    # the same generation: the same list, not one made again per message
    assert engine.vocab.inbound_vocabulary("s", counts) is first
    engine.tag_message("pg vacuum", session_id="s")  # cached before the alias below
    engine.add_alias("pg", "postgres", session_id="s")  # a scoped alias: no new turn
    assert "pg" in engine.vocab.inbound_vocabulary("s", engine._counts("s"))  # type: ignore[attr-defined]
    found = engine.tag_message("pg vacuum", session_id="s")
    assert "postgres" in found.tags + found.related_tags
    engine.on_turn_complete([{"role": "user", "content": "Kiln glaze firing"}], session_id="s")
    after = engine.vocab.inbound_vocabulary("s", engine._counts("s"))  # type: ignore[attr-defined]
    assert after[: len(first)] == first and "kiln" in after  # grown in its order
    assert engine.remove_alias("pg", session_id="s") is True
    assert "pg" not in engine.vocab.inbound_vocabulary("s", engine._counts("s"))  # type: ignore[attr-defined]


# -- expiry ----------------------------------------------------------------------------------------


def test_an_expired_tags_turns_and_summary_are_not_recalled_but_stay_stored() -> None:
    cfg = MemoryConfig.model_validate(
        {
            "tagger": {"keywords": {"debugging": ["websocket", "flaky"]}},
            "tag_rules": [{"match": "debug*", "ttl_days": 7}],
            "recall": {"embedder": "none"},
            "compaction": {"protected_recent_turns": 4},
        }
    )
    engine = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    old = datetime.now(UTC) - timedelta(days=30)
    debug = [
        {"role": "user", "content": "The flaky websocket test fails when the heartbeat is 5s."},
        {"role": "assistant", "content": "Raise the websocket heartbeat timeout to 15s."},
    ]
    engine.on_turn_complete(debug, session_id="s", timestamps=[old, old])
    garden = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Tomato seedlings, row {i}."}
        for i in range(6)
    ]
    engine.on_turn_complete(garden, session_id="s")
    assert engine.compact(session_id="s") is not None
    assert "debugging" in engine.store.paging.tag_summaries("s")
    ctx = engine.on_message_inbound("What fixed the flaky websocket heartbeat?", session_id="s")
    assert ctx.expired_tags == ("debugging",) and ctx.expired_turns == 2
    assert not {1, 2} & {r.seq for r in ctx.recalled}
    memory = ctx.prepend_text.partition("<memory>")[2]
    assert "heartbeat" not in memory and "websocket" not in memory
    # Still stored, and found by a full-text search of the raw turns.
    assert [t.seq for t in engine.store.turns("s", 1, 2)] == [1, 2]
    assert engine.find_quote("websocket heartbeat", session_id="s")
    # A fresh mention makes the tag live again.
    engine.on_turn_complete(
        [{"role": "user", "content": "The websocket test is flaky again."}], session_id="s"
    )
    again = engine.on_message_inbound("What fixed the flaky websocket heartbeat?", session_id="s")
    assert again.expired_tags == () and {1, 2} & {r.seq for r in again.recalled}


def test_versions_are_not_merged_as_near_spellings() -> None:
    cfg = MemoryConfig.model_validate(
        {
            "tagger": {"keywords": {"windows-10": ["win10"], "windows-11": ["win11"]}},
            "recall": {"embedder": "none"},
        }
    )
    engine = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    engine.on_turn_complete(
        [
            {"role": "user", "content": "win10 drivers"},
            {"role": "user", "content": "win11 drivers"},
        ],
        session_id="s",
        new_only=True,
    )
    assert engine.vocab.session_aliases("s") == {}
    assert {"windows-10", "windows-11"} <= set(engine.vocabulary(session_id="s"))


def test_without_a_ttl_rule_no_tag_of_the_session_is_asked_about() -> None:
    engine = plain_engine()
    engine.on_turn_complete([{"role": "user", "content": "Kiln glaze firing schedule"}])
    asked: list[str] = []
    for_tag = engine.rules.for_tag

    def spy(tag: str) -> Any:
        asked.append(tag)
        return for_tag(tag)

    engine.rules.for_tag = spy  # type: ignore[method-assign]
    assert not engine.rules.has_ttl
    assert engine.vocab.expired("default", engine.vocabulary()) == []
    assert asked == []  # a session of any size: nothing per tag
    cfg = MemoryConfig.model_validate({"tag_rules": [{"match": "kiln*", "ttl_days": 1}]})
    timed = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    assert timed.rules.has_ttl
    timed.on_turn_complete([{"role": "user", "content": "Kiln glaze firing schedule"}])
    later = datetime.now(UTC) + timedelta(days=3)
    assert timed.vocab.expired("default", timed.vocabulary(), later) == ["kiln-glaze"]
