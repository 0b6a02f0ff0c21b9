"""Conformance: full-text search over turns and segment summaries — the same terms
(``store.text.query_terms``: stop words and question grammar out, Porter stemming), best
first with ties by seq, within one session, scored with the whole store's statistics."""

from __future__ import annotations

import itertools

import pytest

from contextfold.items import Message
from contextfold.store.conformance.memory_support import filled, messages
from contextfold.store.models import NewSegment
from contextfold.store.protocols import MemoryStorage
from contextfold.tokens import CharCounter


def _ordered(hits: list[tuple[int, float]]) -> bool:
    """Best first (higher score), ties by seq."""
    return all((a[1] > b[1]) or (a[1] == b[1] and a[0] < b[0]) for a, b in itertools.pairwise(hits))


def test_inserted_turns_are_searchable_in_bm25_order(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    hits = store.search_turns("s1", "rollback plan for the invoices")
    assert [turn.seq for turn, _ in hits] == [2, 5]  # all three words beat one shared word
    assert hits[0][1] > hits[1][1] > 0
    rare_first = store.search_turns("s1", "kubernetes ramen")
    assert rare_first[0][0].seq == 4  # a rare word outweighs a common one
    assert {turn.seq for turn, _ in rare_first} == {1, 3, 4, 6}
    assert [t.seq for t, _ in store.search_turns("s1", "restart")] == [3]  # porter stemming
    assert len(store.search_turns("s1", "kubernetes billing", limit=2)) == 2
    assert store.search_turns("s1", "the and of") == []  # stop words only
    store.append_turns("s1", messages(["a brand new ramen place opened"]))
    assert [t.seq for t, _ in store.search_turns("s1", "ramen")] in ([4, 7], [7, 4])


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced quote',
        "billing-service",
        "bill*",
        "kubernetes AND",
        "NOT OR NEAR(",
        "a'b\"c:d^",
        "x & y | !z <-> (w)",  # PostgreSQL tsquery operators
        "%_\\",  # LIKE wildcards and an escape
    ],
)
def test_special_characters_in_queries_do_not_raise(
    memory_store: MemoryStorage, query: str
) -> None:
    store = filled(memory_store)
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="billing", full_text="")], 3)
    hits = store.search_turns("s1", query)
    assert all(turn.session_id == "s1" for turn, _ in hits)
    store.search_segments("s1", query)
    store.search_turn_seqs("s1", query)


def test_search_segments_ranks_summaries(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    segments = [
        NewSegment(first_seq=1, last_seq=2, summary="Deploy billing to Kubernetes.", full_text=""),
        NewSegment(first_seq=3, last_seq=4, summary="Lunch: ramen or tacos.", full_text=""),
    ]
    ids = store.compact("s1", segments, 5)
    hits = store.search_segments("s1", "kubernetes deployment")
    assert [seg.id for seg, _ in hits] == [ids[0]]
    assert hits[0][0].seqs == (1, 2) and hits[0][0].summary_tokens == CharCounter().count(
        segments[0].summary
    )
    assert store.search_segments("other", "kubernetes") == []


def test_question_words_do_not_match_turns_that_only_share_grammar(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    sid = store.create_session()
    store.append_turns(
        sid,
        [
            Message(role="user", content="What did you do about it? How would we know?"),
            Message(role="user", content="The kiln firing reached 1200 degrees."),
        ],
    )
    hits = store.search_turn_seqs(sid, "What did we do about the kiln?")
    assert [seq for seq, _ in hits] == [2]
    # A question made only of such words still searches with them.
    assert [seq for seq, _ in store.search_turn_seqs(sid, "what did we do")] == [1]


def test_search_stays_in_its_session(memory_store: MemoryStorage) -> None:
    search_stays_in_its_session(memory_store)


def search_stays_in_its_session(store: MemoryStorage) -> None:
    """Turns and segments found by search belong to the session searched, whatever words its
    id holds (also run on a store upgraded from an older schema)."""
    sessions = ("conv-1", "conv-10", "a-b", "---")
    for n, sid in enumerate(sessions):
        store.create_session(sid)
        store.append_turns(sid, [Message(role="user", content=f"kiln firing number {n}")])
    for n, sid in enumerate(sessions):
        assert len(store.search_turn_seqs(sid, "kiln")) == 1
        ((turn, _),) = store.search_turns(sid, "kiln")
        assert turn.session_id == sid and turn.message.text().endswith(str(n))
    # Session words are not content: "conv" matches no turn text.
    assert store.search_turn_seqs("conv-1", "conv") == []
    store.compact("a-b", [NewSegment(first_seq=1, last_seq=1, summary="kiln", full_text="")], 2)
    assert [seg.session_id for seg, _ in store.search_segments("a-b", "kiln")] == ["a-b"]
    assert store.search_segments("conv-1", "kiln") == []


def test_a_deleted_session_is_no_longer_found(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="")], 3)
    store.delete_session("s1")
    assert store.search_turns("s1", "deploy") == [] and store.search_turn_seqs("s1", "deploy") == []
    assert store.search_segments("s1", "deploy") == []


def test_results_are_best_first_with_ties_by_seq(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s")
    texts = [
        "the kiln is hot",  # 1
        "glaze recipe",  # 2
        "the kiln is hot",  # 3: the same text as 1, the same score
        "kiln kiln kiln firing schedule for the kiln",  # 4
        "the kiln is hot",  # 5
        "kiln",  # 6
    ]
    store.append_turns("s", messages(texts))
    seqs = store.search_turn_seqs("s", "kiln")
    assert _ordered(seqs) and {s for s, _ in seqs} == {1, 3, 4, 5, 6}
    scores = dict(seqs)
    assert scores[1] == scores[3] == scores[5]
    tied = [s for s, _ in seqs if s in (1, 3, 5)]
    assert tied == [1, 3, 5]
    full = store.search_turns("s", "kiln")
    assert [(t.seq, score) for t, score in full] == seqs  # both reads rank alike
    assert all(t.message.text() == texts[t.seq - 1] for t, _ in full)
    # A limit keeps the best ones, in the same order.
    assert store.search_turn_seqs("s", "kiln", limit=2) == seqs[:2]
    assert [(t.seq, sc) for t, sc in store.search_turns("s", "kiln", limit=3)] == seqs[:3]


def test_segment_ties_are_ordered_by_seq(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s")
    store.append_turns("s", messages(["x"] * 8))
    same = "the kiln firing"
    ids = store.compact(
        "s",
        [
            NewSegment(first_seq=1, last_seq=2, summary=same, full_text=""),
            NewSegment(first_seq=3, last_seq=4, summary="kiln kiln kiln kiln", full_text=""),
            NewSegment(first_seq=5, last_seq=6, summary=same, full_text=""),
        ],
        7,
    )
    hits = store.search_segments("s", "kiln")
    assert _ordered([(seg.first_seq, score) for seg, score in hits])
    assert [seg.id for seg, _ in hits if seg.summary == same] == [ids[0], ids[2]]
    assert hits[0][1] > 0 and {seg.id for seg, _ in hits} == set(ids)
    assert [seg.id for seg, _ in store.search_segments("s", "kiln", limit=1)] == [hits[0][0].id]


def test_ranking_uses_the_whole_stores_statistics(memory_store: MemoryStorage) -> None:
    """BM25's document frequencies and average length are the whole store's (FTS5's over
    its whole table), not the session's: turns stored in ANOTHER session change a session's
    scores — here, many turns without the word raise its rarity, so every score goes up —
    while the order within the session still follows the scores, ties by seq."""
    store = filled(memory_store)
    store.compact(
        "s1",
        [
            NewSegment(first_seq=1, last_seq=2, summary="kubernetes billing deploy", full_text=""),
            NewSegment(first_seq=3, last_seq=4, summary="kubernetes pods lunch", full_text=""),
        ],
        5,
    )
    before = store.search_turn_seqs("s1", "kubernetes billing")
    segments_before = [(s.id, sc) for s, sc in store.search_segments("s1", "kubernetes billing")]
    store.create_session("other")
    store.append_turns("other", messages([f"unrelated note number {n}" for n in range(40)]))
    store.compact(
        "other",
        [
            NewSegment(first_seq=n, last_seq=n, summary=f"unrelated summary {n}", full_text="")
            for n in range(1, 31)
        ],
        31,
    )
    after = store.search_turn_seqs("s1", "kubernetes billing")
    segments_after = [(s.id, sc) for s, sc in store.search_segments("s1", "kubernetes billing")]
    assert {s for s, _ in after} == {s for s, _ in before} == {1, 3, 5, 6}
    assert _ordered(before) and _ordered(after)
    old, new = dict(before), dict(after)
    assert all(new[seq] > old[seq] > 0 for seq in old)
    assert [i for i, _ in segments_after] == [i for i, _ in segments_before]
    assert all(b > a > 0 for (_, a), (_, b) in zip(segments_before, segments_after, strict=True))


def test_a_word_common_in_another_session_ranks_lower(memory_store: MemoryStorage) -> None:
    """The other direction: a session's rare word that is common in the rest of the store
    weighs less than a word rare everywhere — a per-session ranking would tie them."""
    store = memory_store
    store.create_session("s")
    store.append_turns("s", messages(["the kiln", "the glaze", "filler one", "filler two"]))
    first = dict(store.search_turn_seqs("s", "kiln glaze"))
    assert first[1] == first[2]  # as rare as each other so far
    store.create_session("other")
    store.append_turns("other", messages([f"kiln note {n}" for n in range(10)]))
    second = store.search_turn_seqs("s", "kiln glaze")
    assert [seq for seq, _ in second] == [2, 1]  # "kiln" is now common in the store
    assert dict(second)[2] > dict(second)[1]
    assert store.search_turn_seqs("other", "glaze") == []
    assert [seq for seq, _ in store.search_turn_seqs("s", "kiln")] == [1]


def test_common_limit_leaves_out_the_words_on_more_turns(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("s")
    store.create_session("s-other")  # its id holds "s" as a word: its turns must not count
    texts = [
        "kiln glaze",  # 1
        "kiln firing",  # 2
        "kiln",  # 3
        "pit_fire notes",  # 4: a word of two tokens
        "pit_fire again",  # 5
        "nothing here",  # 6
    ]
    store.append_turns("s", messages(texts))
    store.append_turns("s-other", messages(["glaze"] * 5 + ["pit_fire"] * 5))
    every = store.search_turn_seqs("s", "kiln glaze pit_fire")
    assert {seq for seq, _ in every} == {1, 2, 3, 4, 5}
    # kiln is on 3 turns of s: over a limit of 2 it is left out, and the scores of the rest
    # are what they were without it (the other words' statistics are unchanged).
    bounded = store.search_turn_seqs("s", "kiln glaze pit_fire", common_limit=2)
    assert {seq for seq, _ in bounded} == {1, 4, 5}
    alone = dict(store.search_turn_seqs("s", "glaze pit_fire"))
    assert dict(bounded) == alone
    assert store.search_turn_seqs("s", "kiln glaze pit_fire", common_limit=3) == every
    assert store.search_turn_seqs("s", "kiln", common_limit=2) == []  # only common words
    assert store.search_turn_seqs("s", "pit_fire", common_limit=1) == []
    assert [s for s, _ in store.search_turn_seqs("s", "glaze", common_limit=1)] == [1]


def test_a_search_finds_the_same_in_a_store_of_one_session_or_many(
    memory_store: MemoryStorage,
) -> None:
    """What a search reads may depend on the rest of the store (SQLite leaves the session
    out of the full-text match when the session is alone, or large beside its words' rows
    elsewhere), never what it finds: only the session's turns, scored as without a limit."""
    store = memory_store
    store.create_session("s")
    texts = [f"filler line {n}" for n in range(600)]  # many turns beside few word rows
    texts[10], texts[90], texts[91] = "walnut veneer", "walnut dock", "kiln and walnut"
    store.append_turns("s", messages(texts))
    alone = store.search_turn_seqs("s", "walnut kiln", common_limit=5)
    assert [seq for seq, _ in alone] == [92, 11, 91]  # two words beat one; ties by seq
    assert alone == store.search_turn_seqs("s", "walnut kiln")
    assert store.search_turn_seqs("s", "filler walnut", common_limit=5) == (
        store.search_turn_seqs("s", "walnut")
    )
    # Another session holding the words: they still find only this session's turns, and the
    # scores move (the store's statistics changed) the same way with and without a limit.
    store.create_session("t")
    store.append_turns("t", messages(["walnut kiln", "walnut", "kiln"]))
    many = store.search_turn_seqs("s", "walnut kiln", common_limit=5)
    assert [seq for seq, _ in many] == [92, 11, 91]
    assert many == store.search_turn_seqs("s", "walnut kiln") != alone
    found = store.search_turn_seqs("t", "walnut kiln", common_limit=5)
    assert [seq for seq, _ in found] == [1, 3, 2]  # kiln is the rarer word in the store
    # A word past the limit in the whole store but not in the session is kept for it; in
    # the session holding it past the limit, it is left out.
    store.append_turns("t", messages(["kiln"] * 10))
    assert store.search_turn_seqs("s", "walnut kiln", common_limit=5) == (
        store.search_turn_seqs("s", "walnut kiln")
    )
    assert [seq for seq, _ in store.search_turn_seqs("s", "kiln", common_limit=5)] == [92]
    assert store.search_turn_seqs("t", "walnut kiln", common_limit=5) == (
        store.search_turn_seqs("t", "walnut")
    )


@pytest.mark.parametrize("common_limit", [None, 1, 2, 3, 1000])
@pytest.mark.parametrize("limit", [1, 3, 50])
def test_many_searches_find_what_each_search_finds(
    memory_store: MemoryStorage, common_limit: int | None, limit: int
) -> None:
    """``search_turn_seqs_many`` (a message and its parts; a backend may score each word once
    and add them up) returns exactly each query's ``search_turn_seqs``: the same hits, in the
    same order, with the same scores to the last bit."""
    store = memory_store
    store.create_session("s")
    store.create_session("t")
    texts = [
        "Caroline went running by the kiln with Melanie",
        "Melanie runs a pottery class; the kiln glaze cracked",
        "kiln kiln kiln firing schedule for Caroline",
        "nothing to see",
        "glaze recipes and a run to the store",
        "Caroline and Melanie adopted a dog",
        "the pottery class ran late",
    ]
    store.append_turns("s", messages(texts))
    store.append_turns("t", messages(["kiln glaze", "Caroline pottery"] * 3))
    queries = [
        "What did Caroline and Melanie do at the kiln running class?",
        "What did Caroline do at the kiln running class?",
        "What did do at the kiln running class?",
        "glaze glaze pottery",
        "the and of",
        "zebra",
        "",
    ]
    many = store.search_turn_seqs_many("s", queries, limit, common_limit=common_limit)
    each = [store.search_turn_seqs("s", q, limit, common_limit=common_limit) for q in queries]
    assert many == each
    if common_limit != 1:
        assert any(many)  # some words are found (under a limit of 1 there may be none)
