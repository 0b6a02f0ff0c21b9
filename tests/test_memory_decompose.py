"""Query decomposition (``memory.decompose``, ``recall.decompose``): a message that names
people is also recalled in parts, so one name's evidence does not crowd out another's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.decompose import (
    FOCUS_MIN_WORDS,
    FOCUS_SENTENCES,
    interleave,
    query_parts,
    question_focus,
)
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.fusion import Hit, merge_parts
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


def _embedded_recaller() -> tuple[Recaller, _CountingEmbedder, int]:
    """A recaller over five embedded turns about Anna, its counting embedder and how many
    model calls embedding the turns took."""
    store = MemoryStore(counter=COUNTER)
    embedder = _CountingEmbedder()
    recaller = Recaller(store, embedder=embedder, decompose=True)
    store.create_session("s")
    store.append_turns(
        "s", [Message(role="user", content=f"Anna saw Oslo, day {n}.") for n in range(5)]
    )
    recaller.ensure_vectors("s")
    return recaller, embedder, len(embedder.calls)


def test_a_prefetched_message_and_its_parts_are_embedded_in_one_batch() -> None:
    recaller, embedder, embedded_turns = _embedded_recaller()
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


PAGE = "The assay measured receptor binding in vitro across twelve cell lines. " * 5


@pytest.mark.parametrize(
    ("message", "focus"),
    [
        # a question after a page, and before one: its asking sentences
        (
            f"{PAGE}Anyway, where did Anna go? Was it Oslo?",
            "Anyway, where did Anna go? Was it Oslo?",
        ),
        (f"Where did Anna go?\n\n{PAGE}", "Where did Anna go?"),
        # a log's lines end its sentences: the question on its own line is found
        (
            "\n".join(f"ERROR worker {n} lost its lease after 30 s" for n in range(8))
            + "\nSeen it?",
            "Seen it?",
        ),
        # the last FOCUS_SENTENCES asking sentences, in order
        (
            PAGE + " ".join(f"Question {n}?" for n in range(5)),
            "Question 2? Question 3? Question 4?",
        ),
        # a title's or a country's full stop ends no sentence; a wrapped line is one line
        (
            f"{PAGE}What did Dr. Lee say about the U.S. trip?",
            "What did Dr. Lee say about the U.S. trip?",
        ),
        (
            f"{PAGE}\nAnyway, when did Anna\njoin the group?",
            "Anyway, when did Anna join the group?",
        ),
        (f"{PAGE}(when did Anna join the group?)", "(when did Anna join the group?)"),
        (f'{PAGE}When did Anna read "Becoming Nicole"?', 'When did Anna read "Becoming Nicole"?'),
        ("\r\n".join([PAGE, "Where did Anna go?"]), "Where did Anna go?"),
        # written without spaces: asks in one word
        (PAGE + "安娜什么时候加入了那个小组？", "安娜什么时候加入了那个小组？"),
        # code and logs ask nothing: a ternary, unknown frames, a URL's query, code fences
        ("Why does it crash?\n\n" + "const x = a ? b : c;\n" * 15, "Why does it crash?"),
        ("Why does it crash?\n```js\n" + "let y = a?.b ?? c?\n" * 15 + "```", "Why does it crash?"),
        (PAGE + "\n??? unknown frame\nin ?? ()", None),
        (PAGE + "see https://example.com/a? b=1", None),
        (PAGE + "Why?", None),  # one word asks nothing a search can use
        # what may follow the mark: markdown, an HTML tag, a footnote, an exclamation
        (f"{PAGE}\n**Did we try C++?**", "**Did we try C++?**"),
        (f"{PAGE}\nWhat about `config.yaml`?[1]", "What about `config.yaml`?[1]"),
        (f"{PAGE}\n<p>Is coverage above 80%?!</p>", "<p>Is coverage above 80%?!</p>"),
        # the user's question opens or closes the message: a page's own questions in the
        # middle, quoted mail and code lines are someone else's
        (
            f"Where did Anna go?\n\n{PAGE}\nWho can join? Anyone.\n\n{PAGE}",
            "Where did Anna go?",
        ),
        (
            f"{PAGE}\n> Can you send\n> the numbers by Friday?\n\nWhat did Bob say?",
            "What did Bob say?",
        ),
        (
            "Why does the deploy fail?\n\nx = input('Deploy to prod?')\n"
            "# is this safe to run twice?\nrun(x)\n" + PAGE,
            "Why does the deploy fail?",
        ),
        # a fence opened and closed on one line fences nothing; one never closed neither
        (f"{PAGE}\n```npm install```\nWhy does it fail?", "Why does it fail?"),
        (f"{PAGE}\n```\nWhy does it fail?", "Why does it fail?"),
        ("Smith J. " * 2000 + "\n\nWhat did Bob say?", "What did Bob say?"),
        # short paragraphs that ask nothing around the question: a greeting, a sign-off,
        # an instruction after a log
        (f"Hi team,\n\nWhen did Anna join the group?\n\n{PAGE}", "When did Anna join the group?"),
        (
            f"{PAGE}\n\nWhen did Anna join the group?\n\nThanks,\nBob",
            "When did Anna join the group?",
        ),
        (
            "I get this when I run the tests:\n\n"
            + "\n".join(
                f"2024-01-02 ERROR worker crashed on job {n} in queue main" for n in range(8)
            )
            + "\n\nWhat is causing it?\n\nPlease keep the fix minimal.",
            "What is causing it?",
        ),
        # prose about code is prose: a spaced "=", an indented list item, a heading
        (f"{PAGE}\n\nWhy is x = 3 after the loop?", "Why is x = 3 after the loop?"),
        (f"{PAGE}\n\nOpen:\n- Caching\n    - Why cache per session?", "- Why cache per session?"),
        (f"{PAGE}\n\nWhat does Fig. 3 show?", "What does Fig. 3 show?"),
        (
            f"{PAGE}\n\nHave you seen https://example.com/issues/12?",
            "Have you seen https://example.com/issues/12?",
        ),
        (f"{PAGE}\n\nOù est Anna allée\u00a0?", "Où est Anna allée\u00a0?"),  # no-break space
        # a mark after a plain space asks nothing: a table's missing value
        (
            f"{PAGE}\n\nThe MMSE score of ? 10 were lost.\n\nWho inspired Dave?",
            "Who inspired Dave?",
        ),
        # a lower-case answer after the mark is no part of the question
        (f"{PAGE}\n\nWhere did Anna go? she said Oslo.", "Where did Anna go?"),
        (f"{PAGE}\n\nIs it done? yes. What next?", "Is it done? What next?"),
        (f"{PAGE}\n\nWhy did it fail? 3 times now.", "Why did it fail?"),
        # questions pasted in the middle neither count as the user's nor make it "mostly
        # questions"
        (
            "Which of these should I prepare first?\n\n"
            + "\n".join(f"{n}. What is your strength number {n}?" for n in range(6))
            + f"\n\n{PAGE}",
            "Which of these should I prepare first?",
        ),
        (PAGE + "Tell me where Anna went.", None),  # asks nothing with a question mark
        ("Where did Anna go?", None),  # short: its own focus
        (" ".join(["Where did Anna go?"] * 12), None),  # all questions: its own focus
    ],
)
def test_question_focus(message: str, focus: str | None) -> None:
    assert question_focus(message) == focus


def test_the_focus_needs_a_long_message() -> None:
    question = "Where did Anna go?"
    filler = "Noted. " * (FOCUS_MIN_WORDS - len(question.split()))
    assert question_focus(filler + question) == question
    assert question_focus(filler[7:] + question) is None  # one word short
    assert FOCUS_SENTENCES == 3
    # Asking sentences of exactly half the words are still a focus; one word more is not.
    asking = "Where did Anna go? " * 5  # 20 words
    assert (
        question_focus("Noted. " * 20 + asking) == "Where did Anna go? " * 2 + "Where did Anna go?"
    )
    assert question_focus("Noted. " * 19 + asking) is None


def test_merged_cosines_are_the_messages_and_its_focus_never_a_parts() -> None:
    message = [
        Hit(1, 1.0, {"dense": 1}, 0.30),
        Hit(2, 0.5, {"fts": 1}, 0.20),
        Hit(5, 0.4, {"dense": 2}, 0.70),
    ]
    focus = [
        Hit(2, 1.0, {"dense": 1}, 0.60),
        Hit(3, 0.9, {"dense": 2}, 0.55),
        Hit(5, 0.3, {"dense": 3}, 0.10),
    ]
    part = [Hit(4, 1.0, {"dense": 1}, 0.90), Hit(3, 0.5, {"dense": 2}, 0.95)]
    merged = {h.seq: h for h in merge_parts([message, focus, part], 10, judged=2)}
    assert merged[1].similarity == 0.30  # the message's own
    assert merged[2].similarity == 0.60  # the better of the message's and the focus'
    assert merged[5].similarity == 0.70  # … whichever it is
    assert merged[3].similarity == 0.55  # the focus', not the part's 0.95
    assert merged[4].similarity is None  # only a part found it: not judged
    # Without a focus (judged=1) a turn only another list found has no cosine, as before.
    alone = {h.seq: h for h in merge_parts([message, focus], 10)}
    assert alone[2].similarity == 0.20 and alone[3].similarity is None
    assert merged[2].score == alone[2].score == 0.5  # the message's score either way


def test_a_long_message_its_focus_and_their_parts_are_embedded_in_one_batch() -> None:
    recaller, embedder, embedded_turns = _embedded_recaller()
    # The page's capitalised words name nobody the parts are made of: the focus' names are.
    message = f"Lattice QCD by Marek Kowalski. {PAGE}\n\nWhich cities did Anna visit?"
    recaller.prefetch(message)
    ranked = recaller.rank("s", message)
    assert ranked
    focus = "Which cities did Anna visit?"
    assert embedder.calls[embedded_turns:] == [[message, focus, "Which cities did visit?"]]


def test_the_focus_of_the_last_message_asked_is_kept_and_no_other() -> None:
    first, second = f"{PAGE}Where did Anna go?", f"{PAGE}What did Ben buy?"
    assert [question_focus(m) for m in (first, second, first, first)] == [
        "Where did Anna go?",
        "What did Ben buy?",
        "Where did Anna go?",
        "Where did Anna go?",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Why " + "!" * 200_000,  # runs after the mark that a regex anchored at the end
        "Why " + "<b>" * 60_000,  # would try from every position
        "x " + "f(" * 100_000 + "a;",  # calls that never close
        "Smith J. " * 22_000 + "What?",  # abbreviations chained on one line
    ],
)
def test_no_shape_of_a_long_message_hangs_the_focus(text: str) -> None:
    # Each took seconds to minutes when a check was quadratic; linear, each is well under
    # a second (the bound is generous: a shared CI machine).
    started = time.perf_counter()
    question_focus(text)
    assert time.perf_counter() - started < 2.0
