"""Conformance: the vocabulary state — aliases scoped to one session beside the store-wide ones,
aliases removed, the splitter's record of the tags it examined, and related-tag counts."""

from __future__ import annotations

import pytest

from contextfold.errors import ConfigError
from contextfold.store.conformance.memory_support import filled
from contextfold.store.conformance.vocab_support import (
    broad_conversation,
    make_engine,
    turn_by_turn,
)
from contextfold.store.protocols import MemoryStorage


def test_session_aliases_stay_in_their_session(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    filled(store, "s2")
    store.vocab.set_alias("k8s", "kubernetes")
    store.vocab.set_alias("pg", "postgres", session_id="s1")
    store.vocab.set_alias("pg", "postgresql", session_id="s1")  # replaced
    assert store.vocab.aliases() == {"k8s": "kubernetes"}
    assert store.vocab.aliases("s1") == {"pg": "postgresql"}
    assert store.vocab.aliases("s2") == {}
    with pytest.raises(ConfigError, match="no session 'ghost'"):
        store.vocab.set_alias("a", "b", session_id="ghost")
    assert store.vocab.remove_alias("pg", session_id="s2") is False
    assert store.vocab.remove_alias("pg", session_id="s1") is True
    assert store.vocab.aliases("s1") == {}
    assert store.vocab.remove_alias("k8s") is True and store.vocab.remove_alias("k8s") is False
    assert store.vocab.aliases() == {}


def test_session_aliases_and_splits_go_with_their_session(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.vocab.set_alias("pg", "postgres", session_id="s1")
    store.vocab.record_split("s1", "deploy", ["deploy-rollback", "deploy-general"])
    assert store.delete_session("s1")
    filled(store, "s1")
    assert store.vocab.aliases("s1") == {} and store.vocab.tag_splits("s1") == {}


def test_session_aliases_and_splits_draw_a_new_generation(memory_store: MemoryStorage) -> None:
    """Every process's cache of them is keyed by the session's generation."""
    store = filled(memory_store)

    def generation() -> int:
        version = store.session_version("s1")
        assert version is not None
        return version[1]

    first = generation()
    store.vocab.set_alias("pg", "postgres", session_id="s1")
    second = generation()
    store.vocab.record_split("s1", "deploy", [])
    third = generation()
    store.vocab.remove_alias("pg", session_id="s1")
    assert first < second < third < generation()


def test_a_tag_is_recorded_as_split_once(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    assert store.vocab.tag_splits("s1") == {}
    assert store.vocab.record_split("s1", "deploy", ["deploy-rollback", "deploy-general"]) is True
    assert store.vocab.record_split("s1", "billing", []) is True  # examined, kept whole
    assert store.vocab.record_split("s1", "deploy", ["deploy-other"]) is False
    assert store.vocab.tag_splits("s1") == {
        "billing": (),
        "deploy": ("deploy-rollback", "deploy-general"),
    }
    with pytest.raises(ConfigError, match="no session 'ghost'"):
        store.vocab.record_split("ghost", "deploy", [])


def test_related_tag_counts(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.set_turn_tags("s1", 1, {"deploy": 1.0}, related=["release", "rollout"])
    store.set_turn_tags("s1", 2, {"release": 1.0}, related=["rollout"])
    assert store.vocab.related_tag_counts("s1") == {"release": 1, "rollout": 2}
    assert store.tag_counts("s1") == {"deploy": 1, "release": 1}


# -- through the engine ------------------------------------------------------------------------


def test_a_48_turn_conversation_gets_its_over_broad_tag_split(memory_store: MemoryStorage) -> None:
    engine = make_engine(memory_store)
    turn_by_turn(engine, broad_conversation())
    subs = engine.vocab.splits("s")["reservation"]
    assert len(subs) >= 2 and all(s.startswith("reservation-") for s in subs)
    vocab = engine.vocabulary(session_id="s")
    # The old tag no longer sits on every turn: each turn carries its sub-tag instead.
    assert vocab.get("reservation", 0) < 48
    assert sum(vocab.get(s, 0) for s in subs) >= 15
    # The split is an alias: a question naming the old tag is matched to the sub-tags.
    ctx = engine.on_message_inbound("What about the reservation?", session_id="s")
    assert set(subs) <= set(ctx.matched_tags) and ctx.recalled
    # The stored turns keep the old tag as a related tag.
    first = engine.store.turns("s", 1, 1)[0]
    assert "reservation" in first.related_tags
    assert set(first.tags) & set(subs)
