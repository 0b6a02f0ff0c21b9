"""The assembler's packing order: a recalled question is packed later (``question_demotion``)."""

from __future__ import annotations

import pytest

from contextfold.items import Message
from contextfold.memory.assemble import Assembler
from contextfold.memory.config import AssemblySettings
from contextfold.memory.recall import RankedTurn
from contextfold.memory.rules import TagRules
from contextfold.memory.tagging import TagResult
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")
TURNS = [
    "Ann: What did you do with the kids last weekend?",  # seq 1: echoes the question
    "Bo: We went camping by the lake and roasted marshmallows.",  # seq 2: the answer
    "Bo: The weather was fine, a little windy in the evening.",  # seq 3
    "Ann: Did they like the camping trip and the lake?",  # seq 4
]


def packed(ranked_seqs: list[int], *, turns: int, demotion: float) -> list[int]:
    """The seqs packed with room for ``turns`` of them, in the order recall ranked them."""
    store = MemoryStore(counter=COUNTER)
    store.create_session("s")
    store.append_turns("s", [Message(role="user", content=t) for t in TURNS])
    settings = AssemblySettings(context_hint_enabled=False, question_demotion=demotion)
    assembler = Assembler(store, COUNTER, TagRules([]), settings)
    rows = store.turn_rows("s", [1, 2, 3, 4])
    wrapper = COUNTER.count("<memory>\n") + COUNTER.count("\n</memory>")
    day = COUNTER.count(f"[{rows[1].created_at.day} {rows[1].created_at:%B %Y}]\n")
    costs = sorted(COUNTER.count(rows[s].text + "\n") for s in rows)
    budget = wrapper + day + sum(costs[-turns:])  # enough for any ``turns`` of them, no more
    ranked = [
        RankedTurn(seq=s, score=10.0 - i, ranks={"fts": i + 1}) for i, s in enumerate(ranked_seqs)
    ]
    block = assembler.assemble("s", ranked, tags=TagResult(), paged=[], budget=budget)
    taken = [int(str(i.metadata["seq"])) for i in block.items if i.metadata["kind"] == "turn"]
    assert len(taken) == turns
    return sorted(taken, key=ranked_seqs.index)


def test_a_recalled_question_is_packed_after_the_statements_ranked_within_twice_its_rank() -> None:
    # The question ranked 2 goes to 4, after the statement ranked 3: room for two takes the
    # statements, not the echo.
    assert packed([2, 1, 3, 4], turns=2, demotion=2.0) == [2, 3]
    # Questions ranked 1 and 2 go to 2 and 4: the first still leads the statement ranked 3,
    # and the second ties the statement ranked 4, which recall put after it.
    assert packed([1, 4, 2, 3], turns=2, demotion=2.0) == [1, 2]
    assert packed([1, 4, 2, 3], turns=3, demotion=2.0) == [1, 4, 2]


@pytest.mark.parametrize("demotion", [1.0, 0.5])
def test_demotion_one_or_less_packs_in_recall_order(demotion: float) -> None:
    if demotion < 1:
        with pytest.raises(ValueError):
            AssemblySettings(question_demotion=demotion)
        return
    assert packed([2, 1, 3, 4], turns=2, demotion=demotion) == [2, 1]
