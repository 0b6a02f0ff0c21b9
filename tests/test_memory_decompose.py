"""Query decomposition (``memory.decompose``, ``recall.decompose``): a message that names
people is also recalled in parts, so one name's evidence does not crowd out another's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.decompose import interleave, query_parts
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.recall import Recaller
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")


@pytest.mark.parametrize(
    ("question", "parts"),
    [
        (
            "Which cities have both Anna and Ben visited?",
            [
                "Which cities have Anna visited?",
                "Which cities have Ben visited?",
                "Which cities have visited?",
            ],
        ),
        ("What are Joanna's hobbies?", ["What are hobbies?"]),
        # three names: one kept at a time, and the cap (MAX_PARTS) leaves out the bare part
        (
            "What did Ann, Bo and Cy buy?",
            ["What did Ann buy?", "What did Bo buy?", "What did Cy buy?"],
        ),
        ("What did Tim’s sister buy?", ["What did sister buy?"]),  # curly possessive too
        ("Where did she go last summer?", []),
        ("Where did she go in June, on Monday?", []),  # months and weekdays are no names
        ("Anna went where?", []),  # a capital opening the text names nobody
        # a part left with only the question's frame asks about nothing: not ranked
        ("Who is Bob?", []),
        ("Is Bob Bob?", []),
        # a name that is also a word: only the capitalised one is the name
        ("Did Art like the art class?", ["Did like the art class?"]),
        ("Did Will say it will rain?", ["Did say it will rain?"]),
    ],
)
def test_query_parts(question: str, parts: list[str]) -> None:
    assert query_parts(question) == parts


def test_parts_are_capped_and_never_repeat_the_message() -> None:
    assert len(query_parts("Did Ann, Bo, Cy and Di meet Ed?")) == 3
    assert query_parts("Did Ann, Bo, Cy and Di meet Ed?", max_parts=1) == ["Did Ann meet ?"]
    for question in ("Where is Oslo?", "Has Oslo grown?"):
        assert question not in query_parts(question)


def test_interleave_takes_each_turn_once_with_the_message_leading() -> None:
    assert interleave([[1, 2, 3], [2, 4], [5]], 10) == [(1, 0), (2, 1), (5, 2), (3, 0), (4, 1)]
    assert interleave([[1, 2, 3], [2, 4], [5]], 2) == [(1, 0), (2, 1)]
    assert interleave([[], [7]], 5) == [(7, 1)]


def _engine(decompose: bool) -> MemoryEngine:
    cfg = MemoryConfig.model_validate(
        {
            "recall": {
                "decompose": decompose,
                "embedder": "none",
                "neighbor_weight": 0,  # no turn comes in as another's neighbour here
            }
        }
    )
    eng = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    turns = [
        {"role": "user", "content": f"Anna: I visited the old harbour cities again, stop {n}."}
        for n in range(1, 13)
    ]
    ben = [
        {
            "role": "assistant",
            "content": "Ben: Last spring I visited Oslo with my two cousins and their dog.",
        },
        *(
            {"role": "assistant", "content": f"Ben: The weather is grey, day {n}."}
            for n in range(4)
        ),
    ]
    other = [
        {"role": "user", "content": f"Cleo: The choir rehearses on Thursday, song {n}."}
        for n in range(40)
    ]
    turns = other + ben + turns
    eng.on_turn_complete(turns, new_only=True)
    return eng


def test_one_name_evidence_no_longer_crowds_out_the_others() -> None:
    question = "Which cities have both Anna and Ben visited?"
    ben = "Ben: Last spring I visited Oslo with my two cousins and their dog."
    whole = _engine(decompose=False).on_message_inbound(question, budget=120)
    parted = _engine(decompose=True).on_message_inbound(question, budget=120)
    assert ben not in whole.prepend_text  # Anna's turns fill the small budget …
    assert ben in parted.prepend_text  # … unless Ben's part gets its share
    assert "Anna: I visited" in parted.prepend_text


def test_a_message_naming_nobody_is_ranked_as_before() -> None:
    question = "which harbour cities were visited?"
    whole = _engine(decompose=False).on_message_inbound(question, budget=200)
    parted = _engine(decompose=True).on_message_inbound(question, budget=200)
    assert [r.seq for r in whole.recalled] == [r.seq for r in parted.recalled]
    assert whole.prepend_text == parted.prepend_text


class _CountingEmbedder(HashEmbedder):
    """A hash embedder that records each model call's texts."""

    def __init__(self) -> None:
        super().__init__(dim=32)
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> Any:
        self.calls.append(list(texts))
        return super().embed(texts)


def test_a_prefetched_message_and_its_parts_are_embedded_in_one_batch() -> None:
    store = MemoryStore(counter=COUNTER)
    embedder = _CountingEmbedder()
    recaller = Recaller(store, embedder=embedder, decompose=True)
    store.create_session("s")
    store.append_turns(
        "s", [Message(role="user", content=f"Anna saw Oslo, day {n}.") for n in range(5)]
    )
    recaller.ensure_vectors("s")
    embedded_turns = len(embedder.calls)
    question = "Which cities have both Anna and Ben visited?"
    recaller.prefetch(question)
    ranked = recaller.rank("s", question)
    assert ranked and all(r.similarity is not None for r in ranked if r.seq <= 5)
    # one model call for the message and its parts, and none again while ranking
    assert embedder.calls[embedded_turns:] == [[question, *query_parts(question)]]


def test_the_tag_signal_is_read_once_for_a_message_and_its_parts() -> None:
    eng = _engine(decompose=True)
    reads: list[dict[str, Any]] = []
    top = eng.store.tag_overlap_top

    def spy(session_id: str, weights: dict[str, Any], limit: int) -> Any:
        reads.append(weights)
        return top(session_id, weights, limit)

    eng.store.tag_overlap_top = spy  # type: ignore[method-assign]
    question = "Which harbour cities have both Anna and Ben visited?"
    assert len(query_parts(question)) == 3
    whole = eng.on_message_inbound(question, budget=200)
    assert len(reads) == 1 and reads[0]  # the message has tags, and they were read once
    assert whole.recalled


def test_a_part_with_no_content_word_takes_no_slot_from_the_messages_own_hits() -> None:
    store = MemoryStore(counter=COUNTER)
    store.create_session("s")
    texts = [
        "Bob took up kayaking this spring",
        "Bob sold the old kayak last week",
        "the weather is nice today",
        "who is coming to the party",
    ]
    store.append_turns("s", [Message(role="user", content=t) for t in texts])
    plain = [r.seq for r in Recaller(store, decompose=False).rank("s", "Who is Bob?")]
    split = [r.seq for r in Recaller(store, decompose=True).rank("s", "Who is Bob?")]
    assert plain[:2] == [1, 2]
    assert split == plain
