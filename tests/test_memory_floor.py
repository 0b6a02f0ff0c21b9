"""The relevance floors of memory recall (``recall.relevance_floor``, and
``recall.unknown_name_floor`` for a message naming something memory never stored): a message
nothing stored is close to gets no memory at all; a related one still recalls; each floor can be
turned off."""

from __future__ import annotations

import pytest

from contextfold.memory.config import RELEVANCE_FLOOR, UNKNOWN_NAME_FLOOR, MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.relevance import KnownNames
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")

CHAT = [
    {"role": "user", "content": "Planted twelve tomato seedlings and basil by the greenhouse."},
    {"role": "assistant", "content": "Did Mel help you plant them?"},
    {"role": "assistant", "content": "Lovely, basil likes the greenhouse warmth."},
    {"role": "user", "content": "My deadlift plan: five sets at ninety kilograms, then rowing."},
    {"role": "assistant", "content": "Rest well between the deadlift sets."},
]
UNRELATED = "Which quantum chromodynamics lattice paper did Marek cite?"
RELATED = "How many tomato seedlings went by the greenhouse?"


def engine(floor: object, names: object = False) -> MemoryEngine:
    cfg = MemoryConfig.model_validate(
        {"recall": {"relevance_floor": floor, "unknown_name_floor": names}}
    )
    eng = MemoryEngine(
        cfg, store=MemoryStore(counter=COUNTER), embedder=HashEmbedder(), counter=COUNTER
    )
    eng.on_turn_complete(CHAT)
    return eng


def test_an_unrelated_message_gets_no_memory_at_all() -> None:
    assembled = engine(0.3).on_message_inbound(UNRELATED, budget=2048)
    assert assembled.prepend_text == ""
    assert assembled.items == () and assembled.recalled == ()
    assert assembled.budget.used == 0 and assembled.budget.budget == 2048
    # The result says why (the proxy's record notes it).
    assert assembled.withheld is not None
    assert "under recall.relevance_floor 0.3" in assembled.withheld


def test_a_related_message_still_recalls() -> None:
    assembled = engine(0.3).on_message_inbound(RELATED, budget=2048)
    assert "twelve tomato seedlings" in assembled.prepend_text
    assert assembled.withheld is None
    best = max(r.similarity or -1.0 for r in assembled.recalled)
    assert best >= 0.3


def test_the_floor_can_be_turned_off() -> None:
    # Without the floor the unrelated message is padded with whatever ranks first.
    for off in (None, False):
        assembled = engine(off).on_message_inbound(UNRELATED, budget=2048)
        assert assembled.prepend_text != ""


def test_a_message_naming_what_memory_never_stored_meets_the_stricter_floor() -> None:
    # The same question about the seedlings: naming someone the chat mentions, it recalls;
    # naming someone it never mentions, the stricter floor (here: above any similarity)
    # withholds everything.
    known = "How many tomato seedlings did Mel plant by the greenhouse?"
    unknown = "How many tomato seedlings did Caroline plant by the greenhouse?"
    eng = engine(0.3, 0.99)
    assert "twelve tomato seedlings" in eng.on_message_inbound(known, budget=2048).prepend_text
    withheld = eng.on_message_inbound(unknown, budget=2048)
    assert withheld.prepend_text == "" and withheld.recalled == ()
    assert "names caroline, which no stored turn contains" in (withheld.withheld or "")
    assert "recall.unknown_name_floor 0.99" in (withheld.withheld or "")
    # Off, the plain floor alone decides, and the question recalls.
    for off in (None, False):
        text = engine(0.3, off).on_message_inbound(unknown, budget=2048).prepend_text
        assert "twelve tomato seedlings" in text


def test_known_names_are_looked_up_once_and_unknown_ones_each_time() -> None:
    store = MemoryStore(counter=COUNTER)
    eng = MemoryEngine(MemoryConfig(), store=store, embedder=HashEmbedder(), counter=COUNTER)
    eng.on_turn_complete(CHAT)
    sid = eng.session_id
    lookups: list[str] = []
    search = store.search_turn_seqs

    def counted(session_id: str, query: str, limit: int = 10) -> list[tuple[int, float]]:
        lookups.append(query)
        return search(session_id, query, limit)

    store.search_turn_seqs = counted  # type: ignore[method-assign]
    names = KnownNames(store)
    assert names.unknown(sid, ["mel", "caroline"]) == ["caroline"]
    assert names.unknown(sid, ["mel", "caroline"]) == ["caroline"]
    assert lookups == ["mel", "caroline", "caroline"]
    # A name said later is found the next time it is asked about.
    eng.on_turn_complete([*CHAT, {"role": "user", "content": "Caroline brought compost."}])
    assert names.unknown(sid, ["caroline"]) == []


def test_config_values() -> None:
    def floor(value: object) -> float | None:
        return MemoryConfig.model_validate(
            {"recall": {"relevance_floor": value}}
        ).recall.relevance_floor

    assert MemoryConfig().recall.relevance_floor == RELEVANCE_FLOOR
    assert floor(True) == RELEVANCE_FLOOR
    assert floor(False) is None and floor(None) is None
    assert floor(0.25) == 0.25
    with pytest.raises(ValueError, match="relevance_floor"):
        floor(1.5)
    names = MemoryConfig().recall.unknown_name_floor
    assert names == UNKNOWN_NAME_FLOOR and names > RELEVANCE_FLOOR
    strict = MemoryConfig.model_validate({"recall": {"unknown_name_floor": True}})
    assert strict.recall.unknown_name_floor == UNKNOWN_NAME_FLOOR
    off = MemoryConfig.model_validate({"recall": {"unknown_name_floor": False}})
    assert off.recall.unknown_name_floor is None


PAGE = (
    "The assay measured receptor binding in vitro across twelve cell lines over six weeks. "
    "Lattice simulations of the coupling constant agreed with the perturbative estimate. "
    "Samples were stored at minus eighty degrees before the spectrometry runs began. "
    "Marek Kowalski and Ines Duarte reviewed the protocol before the second cohort. "
)


def test_a_question_after_a_pasted_page_is_judged_by_its_asking_sentences() -> None:
    # A long message's embedding is mostly its page: the floor, judging the whole message,
    # withheld memory from the question at its end. Its asking sentence is judged too.
    message = f"{PAGE}\n\nAnyway: {RELATED}"
    assembled = engine(0.4).on_message_inbound(message, budget=2048)
    assert assembled.withheld is None
    assert "twelve tomato seedlings" in assembled.prepend_text
    # Judged whole (decomposition off asks the message as one text), it is withheld.
    cfg = MemoryConfig.model_validate(
        {"recall": {"relevance_floor": 0.4, "unknown_name_floor": False, "decompose": False}}
    )
    whole = MemoryEngine(
        cfg, store=MemoryStore(counter=COUNTER), embedder=HashEmbedder(), counter=COUNTER
    )
    whole.on_turn_complete(CHAT)
    assert whole.on_message_inbound(message, budget=2048).withheld is not None


def test_an_unrelated_question_after_a_pasted_page_still_gets_no_memory() -> None:
    for message in (f"{PAGE}\n\n{UNRELATED}", f"{UNRELATED}\n\nHere is the page:\n{PAGE}"):
        assembled = engine(0.4).on_message_inbound(message, budget=2048)
        assert assembled.prepend_text == "" and assembled.withheld is not None


def test_names_on_a_pasted_page_are_not_the_questions_names() -> None:
    # The page names people memory never stored; the question names Mel, whom it did: the
    # stricter floor looks up the question's names only.
    question = "How many tomato seedlings did Mel plant by the greenhouse?"
    assembled = engine(0.3, 0.99).on_message_inbound(f"{PAGE}\n\n{question}", budget=2048)
    assert assembled.withheld is None
    assert "twelve tomato seedlings" in assembled.prepend_text
    stranger = question.replace("Mel", "Caroline")
    assembled = engine(0.3, 0.99).on_message_inbound(f"{PAGE}\n\n{stranger}", budget=2048)
    assert "names caroline, which no stored turn contains" in (assembled.withheld or "")
