"""Conformance: turn tags (set, replaced, counted, scored), turn vectors (bit-exact float32),
the working set, aliases and the cost log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from contextfold.errors import ConfigError
from contextfold.store import models
from contextfold.store.conformance.memory_support import TOPICS, filled, messages
from contextfold.store.protocols import MemoryStorage

# -- tags -----------------------------------------------------------------------------------------


def test_turn_tags_are_set_replaced_and_read_back(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.tag_turn("s1", 2, "database", 0.5)
    store.tag_turn("s1", 2, "database", 0.8)
    store.tag_turn("s1", 2, "invoices")
    assert store.turns("s1", 2, 2)[0].tags == {"database": 0.8, "invoices": 1.0}
    store.set_turn_tags("s1", 2, {"migration": 0.7})
    assert store.turns("s1", 2, 2)[0].tags == {"migration": 0.7}
    assert store.tag_counts("s1") == {"migration": 1}
    with pytest.raises(ConfigError, match="no turn 99"):
        store.tag_turn("s1", 99, "ghost")


def test_related_tags_are_kept_apart_from_tags(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.set_turn_tags("s1", 1, {"deploy": 0.9, "billing": 0.6}, related=["release", "deploy"])
    [turn] = store.turns("s1", 1, 1)
    assert turn.tags == {"deploy": 0.9, "billing": 0.6}
    assert turn.related_tags == ("release",)  # a related tag that is a tag stays a tag
    assert store.tag_counts("s1") == {"billing": 1, "deploy": 1}  # related ones not counted
    found = store.turns_tagged("s1", ["release", "billing", "nothing"])
    assert list(found) == [1]
    assert sorted(found[1]) == [("billing", False), ("release", True)]
    assert store.turns_tagged("s1", []) == {} and store.turns_tagged("s1", ["nothing"]) == {}
    # Found by search too: tags ride along with the turns read.
    [(hit, _)] = store.search_turns("s1", "friday")
    assert hit.tags == turn.tags and hit.related_tags == ("release",)


def test_set_tags_many_replaces_several_turns_at_once_or_not_at_all(
    memory_store: MemoryStorage,
) -> None:
    store = filled(memory_store)
    store.set_tags_many("s1", {1: ({"a": 1.0}, []), 2: ({"b": 0.5}, ["c"])})
    before = store.turns("s1")
    with pytest.raises(ConfigError, match="no turn 42"):
        store.set_tags_many("s1", {1: ({"x": 1.0}, []), 42: ({"y": 1.0}, []), 3: ({}, ["z"])})
    assert store.turns("s1") == before  # nothing of the refused write
    store.set_tags_many("s1", {2: ({}, []), 3: ({"a": 0.25}, [])})
    turns = {t.seq: t for t in store.turns("s1")}
    assert (turns[1].tags, turns[2].tags, turns[2].related_tags) == ({"a": 1.0}, {}, ())
    assert turns[3].tags == {"a": 0.25}
    assert store.tag_counts("s1") == {"a": 2}


def test_tag_counts_before_and_since(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.set_tags_many(
        "s1",
        {seq: ({"k8s": 1.0, f"t{seq % 2}": 1.0}, ["rel"]) for seq in range(1, 7)},
    )
    assert store.tag_counts("s1") == {"k8s": 6, "t0": 3, "t1": 3}
    assert store.tag_counts("s1", before=3) == {"k8s": 2, "t0": 1, "t1": 1}  # seqs 1, 2
    assert store.tag_counts("s1", since=5) == {"k8s": 2, "t0": 1, "t1": 1}  # seqs 5, 6
    assert store.tag_counts("s1", before=5, since=3) == {"k8s": 2, "t0": 1, "t1": 1}
    assert store.tag_counts("s1", before=1) == {} and store.tag_counts("other") == {}


def test_tag_overlap_scores_sum_each_match_at_its_tag_or_related_weight(
    memory_store: MemoryStorage,
) -> None:
    store = filled(memory_store)
    store.set_tags_many(
        "s1",
        {
            1: ({"billing": 1.0, "invoices": 0.9}, ["payments"]),
            2: ({"payments": 1.0}, []),
            3: ({"deploy": 1.0}, ["billing"]),
        },
    )
    store.create_session("other")
    store.append_turns("other", messages(TOPICS))
    store.set_tags_many("other", {1: ({"billing": 1.0}, [])})
    weights = {"billing": (2.0, 0.5), "payments": (1.5, 0.25), "invoices": (1.0, 0.1)}
    assert store.tag_overlap_scores("s1", weights) == pytest.approx(
        {1: 2.0 + 1.0 + 0.25, 2: 1.5, 3: 0.5}  # turn 1: billing, invoices, related payments
    )
    many = {f"t{i}": (1.0, 0.5) for i in range(700)} | weights  # spans several SQL chunks
    assert store.tag_overlap_scores("s1", many) == pytest.approx({1: 3.25, 2: 1.5, 3: 0.5})
    assert store.tag_overlap_scores("s1", {}) == {}


@pytest.mark.parametrize("padding", [0, 400], ids=["few-tags", "many-tags"])
def test_tag_overlap_top_keeps_the_best_and_the_lowest_score(
    memory_store: MemoryStorage, padding: int
) -> None:
    store = filled(memory_store)
    store.set_tags_many(
        "s1",
        {
            1: ({"a": 1.0}, []),
            2: ({"a": 1.0, "b": 1.0}, []),
            3: ({"a": 1.0}, []),  # ties turn 1: the later turn first
            4: ({}, ["a"]),
            5: ({"zzz": 1.0}, []),
        },
    )
    weights = {"a": (1.0, 0.25), "b": (2.0, 0.5)} | {f"p{i}": (1.0, 1.0) for i in range(padding)}
    top, lowest = store.tag_overlap_top("s1", weights, 3)
    assert top == [(2, 3.0), (3, 1.0), (1, 1.0)]  # sums of exact binary fractions
    assert lowest == 0.25  # turn 4's, though it is not kept
    scores = store.tag_overlap_scores("s1", weights)
    assert store.tag_overlap_top("s1", weights, 10)[0] == sorted(
        scores.items(), key=lambda kv: (-kv[1], -kv[0])
    )
    assert store.tag_overlap_top("s1", {"nothing": (1.0, 1.0)}, 3) == ([], 0.0)


def test_tag_last_seen_is_the_latest_turn_of_each_tag(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s")
    start = datetime(2026, 2, 1, tzinfo=UTC)
    stamps = [start + timedelta(hours=h) for h in range(4)]
    store.append_turns("s", messages(["a", "b", "c", "d"]), timestamps=stamps)
    store.set_tags_many(
        "s",
        {1: ({"x": 1.0}, []), 3: ({"x": 1.0, "y": 1.0}, []), 4: ({}, ["x", "z"])},
    )
    assert store.tag_last_seen("s") == {"x": stamps[2], "y": stamps[2]}  # related not counted
    assert store.tag_last_seen("s", ["y", "z", "none"]) == {"y": stamps[2]}
    assert store.tag_last_seen("s", []) == {} and store.tag_last_seen("other") == {}


# -- vectors --------------------------------------------------------------------------------------


def test_vectors_round_trip_bit_exact(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    tiny = np.finfo(np.float32).smallest_subnormal
    special = np.array(
        [
            [0.1, -0.0, 1e-30, np.float32(3.4e38)],
            [tiny, -tiny, 1 / 3, 123456.789],
            [np.pi, -np.e, 0.0, 1.0000001],
        ],
        dtype=np.float32,
    )
    store.add_turn_vectors("s1", "m", [1, 2, 3], special)
    seqs, got = store.turn_vectors("s1", "m")
    assert seqs == [1, 2, 3] and got.dtype == np.float32 and got.shape == (3, 4)
    assert got.tobytes() == special.tobytes()  # bit for bit: -0.0 and subnormals included
    # float64 input is stored as float32.
    wide = np.random.default_rng(7).standard_normal((2, 4))
    store.add_turn_vectors("s1", "m", [4, 5], wide)
    assert store.turn_vectors("s1", "m", after=3)[1].tobytes() == wide.astype(np.float32).tobytes()


def test_vectors_are_read_whole_a_chunk_at_a_time(
    memory_store: MemoryStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``turn_vectors`` reads its rows ``VECTOR_CHUNK`` at a time into one matrix: across
    chunks (a last one part full, one exactly full) the rows come back whole, in order, bit
    for bit, and the matrix is the caller's own (the recaller keeps it as it is)."""
    monkeypatch.setattr(models, "VECTOR_CHUNK", 2)
    store = filled(memory_store)  # six turns
    matrix = np.arange(6 * 3, dtype=np.float32).reshape(6, 3) / 7
    store.add_turn_vectors("s1", "m", [1, 2, 3, 4, 5, 6], matrix)
    seqs, got = store.turn_vectors("s1", "m")
    assert seqs == [1, 2, 3, 4, 5, 6] and got.tobytes() == matrix.tobytes()
    assert got.flags.owndata and got.flags.writeable and got.flags.c_contiguous
    seqs, got = store.turn_vectors("s1", "m", after=1)  # five rows: 2 + 2 + 1
    assert seqs == [2, 3, 4, 5, 6] and got.tobytes() == matrix[1:].tobytes()
    seqs, got = store.turn_vectors("s1", "m", after=2)  # four rows: two full chunks
    assert seqs == [3, 4, 5, 6] and got.tobytes() == matrix[2:].tobytes()
    assert store.turn_vectors("s1", "m", after=6)[0] == []


def test_vectors_by_model_after_and_missing(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    assert store.turn_vectors("s1", "m")[0] == [] and store.last_vector_seq("s1", "m") == 0
    assert store.turns_without_vectors("s1", "m") == [
        (seq, text) for seq, text in enumerate(TOPICS, 1)
    ]
    store.add_turn_vectors("s1", "m", [1, 2, 3], np.eye(3, dtype=np.float32))
    store.add_turn_vectors("s1", "other-model", [1], np.ones((1, 2), dtype=np.float32))
    assert store.last_vector_seq("s1", "m") == 3
    assert store.last_vector_seq("s1", "other-model") == 1
    seqs, matrix = store.turn_vectors("s1", "m", after=1)
    assert seqs == [2, 3] and matrix.tobytes() == np.eye(3, dtype=np.float32)[1:].tobytes()
    assert store.turn_vectors("s1", "m", after=3)[0] == []
    assert [seq for seq, _ in store.turns_without_vectors("s1", "m")] == [4, 5, 6]
    assert store.turns_without_vectors("s1", "m", after=4) == [(5, TOPICS[4]), (6, TOPICS[5])]
    assert [seq for seq, _ in store.turns_without_vectors("s1", "other-model")] == [2, 3, 4, 5, 6]
    # A vector written again replaces the old one.
    store.add_turn_vectors("s1", "m", [2], np.full((1, 3), 0.5, dtype=np.float32))
    assert store.turn_vectors("s1", "m")[1][1].tolist() == [0.5, 0.5, 0.5]
    with pytest.raises(ConfigError, match="vectors"):
        store.add_turn_vectors("s1", "m", [4, 5], np.ones((1, 3), dtype=np.float32))
    assert store.last_vector_seq("s1", "m") == 3  # the refused write stored nothing
    store.create_session("s2")
    assert store.turn_vectors("s2", "m")[0] == []


# -- working set, aliases, costs ------------------------------------------------------------------


def test_working_set_aliases_and_costs(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.paging.set_working_set(
        "s1", "billing", "full", 300, last_used=datetime(2026, 1, 2, tzinfo=UTC)
    )
    store.paging.set_working_set(
        "s1", "lunch", "summary", 20, last_used=datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert list(store.paging.working_set("s1")) == ["lunch", "billing"]  # least recently used first
    with pytest.raises(ConfigError, match="depth"):
        store.paging.set_working_set("s1", "x", "huge", 1)  # type: ignore[arg-type]
    store.vocab.set_alias("k8s", "kubernetes")
    store.vocab.set_alias("k8s", "kube")
    assert store.vocab.aliases() == {"k8s": "kube"}
    store.costs.log_cost("s1", "summary", "m", 100, 10, 0.25)
    store.costs.log_cost("s1", "tagging", "m", 50, 5, 0.5)
    store.costs.log_cost(None, "tagging", "m", 1, 1, 1.0)
    report = store.costs.cost_report("s1")
    assert (report.calls, report.prompt_tokens, report.completion_tokens) == (2, 150, 15)
    assert report.by_kind == {"summary": 0.25, "tagging": 0.5}
    assert store.costs.cost_report().cost_usd == pytest.approx(1.75)


def test_working_set_entries_are_replaced_and_read_back(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    when = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    store.paging.set_working_set("s1", "deploy", "segments", 40, last_used=when)
    store.paging.set_working_set("s1", "deploy", "none", 0, last_used=when + timedelta(seconds=1))
    entry = store.paging.working_set("s1")["deploy"]
    assert (entry.tag, entry.depth, entry.tokens) == ("deploy", "none", 0)
    assert entry.last_used == when + timedelta(seconds=1)
    store.paging.set_working_set("s1", "later", "full", 1)  # last_used: now
    assert list(store.paging.working_set("s1")) == ["deploy", "later"]
    assert store.paging.working_set("other") == {} and store.vocab.aliases() == {}


def test_the_cost_log_sums_by_session_and_kind(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    empty = store.costs.cost_report()
    assert (empty.calls, empty.prompt_tokens, empty.completion_tokens) == (0, 0, 0)
    assert empty.cost_usd == 0 and empty.by_kind == {}
    store.create_session("s2")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    store.costs.log_cost("s1", "summary", "m1", 10, 1, 0.125, at=at)
    store.costs.log_cost("s1", "summary", "m2", 20, 2, 0.25)
    store.costs.log_cost("s2", "tagging", "m1", 30, 3, 0.5)
    store.costs.log_cost(None, "embedding", "e", 40, 0, 0.0625)
    s1 = store.costs.cost_report("s1")
    assert (s1.calls, s1.prompt_tokens, s1.completion_tokens) == (2, 30, 3)
    assert s1.cost_usd == pytest.approx(0.375) and s1.by_kind == pytest.approx({"summary": 0.375})
    everything = store.costs.cost_report()
    assert (everything.calls, everything.prompt_tokens, everything.completion_tokens) == (
        4,
        100,
        6,
    )
    assert everything.by_kind == pytest.approx(
        {"embedding": 0.0625, "summary": 0.375, "tagging": 0.5}
    )
    assert everything.cost_usd == pytest.approx(0.9375)
    store.delete_session("s2")  # its rows stay in the log, detached
    assert (
        store.costs.cost_report().calls == 4
        and store.costs.cost_report().cost_usd == pytest.approx(0.9375)
    )
    assert store.costs.cost_report("s2").calls == 0
    assert store.costs.cost_report("nobody").by_kind == {}
