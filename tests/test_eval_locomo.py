"""The LoCoMo harness: the loader and its traps on a small synthetic file, the metrics on
hand-built contexts, the baselines' budget invariant, the runner's checks, the CLI end to
end, and the dataset counts of the real file (skipped when ../shared is absent)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from contextfold.cli import app
from contextfold.errors import BudgetError, ConfigError
from contextfold.eval.locomo import (
    LocomoConversation,
    load_locomo,
    negative_questions,
    parse_session_time,
    split_conversations,
)
from contextfold.eval.locomo_report import write_plot
from contextfold.eval.locomo_run import (
    answer_contained,
    evidence_recall,
    normalize_answer,
    run_locomo,
)
from contextfold.eval.locomo_systems import (
    SYSTEMS,
    ContextSystem,
    RankingSystem,
    SystemContext,
    pack_turns,
    register_system,
)
from contextfold.testing import HashEmbedder
from contextfold.tokens import TiktokenCounter

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(
    os.environ.get("CONTEXTFOLD_BENCH_DATA") or ROOT.parent / "shared" / "benchmarks" / "data"
)
BASELINES = ("truncation", "bm25", "dense", "rrf", "oracle")
LEAK = "GOLD-SUMMARY-LEAK"

# --------------------------------------------------------------------------- synthetic data


def _turn(dia_id: str, speaker: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"speaker": speaker, "dia_id": dia_id, "text": text, **extra}


def _sample(sample_id: str) -> dict[str, Any]:
    # Keys deliberately out of order: session_10 before session_2, and a date for a
    # session (3) that has no turns, as the real file has.
    conversation = {
        "speaker_a": "Ann",
        "speaker_b": "Bo",
        "session_10_date_time": "12:09 am on 13 September, 2023",
        "session_10": [
            _turn("D10:1", "Ann", "My violin teacher moved to Oslo last week."),
            _turn("D10:2", "Bo", "Oslo is far, will you keep taking lessons online?"),
        ],
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            _turn("D1:1", "Ann", "I adopted a grey cat named Pixel from the shelter."),
            _turn("D1:2", "Bo", "Pixel is a great name! What does Pixel eat?"),
            _turn("D1:3", "Ann", "Mostly salmon. Here is a photo.", blip_caption="a grey cat"),
        ],
        "session_3_date_time": "9:00 am on 1 June, 2023",
        "session_2_date_time": "12:30 pm on 20 May, 2023",
        "session_2": [
            _turn("D2:1", "Bo", "I ran the Berlin marathon in 2022 and finished in four hours."),
            _turn("D2:2", "Ann", "Four hours is impressive, well done!"),
        ],
    }
    qa = [
        {"question": "What cat did Ann adopt?", "answer": "a grey cat", "evidence": ["D1:1"],
         "category": 4},
        {"question": "When did Bo run the Berlin marathon?", "answer": 2022,
         "evidence": ["D2:1; D1:2", "D:10:1", "D2:01", "D", "D9:9"], "category": 2},
        {"question": "What did Bo realise after the marathon?", "category": 5,
         "evidence": ["D2:2"], "adversarial_answer": "rest matters"},
        {"question": "Would Ann like dogs?", "answer": "Probably", "category": 3},
        {"question": "Who moved to Oslo and what does Pixel eat?", "answer": "salmon",
         "evidence": ["D10:1", "D1:3"], "category": 1},
    ]  # fmt: skip
    return {
        "sample_id": sample_id,
        "conversation": conversation,
        "qa": qa,
        "observation": {"session_1_observation": LEAK},
        "session_summary": {"session_1_summary": LEAK},
        "event_summary": {"events_session_1": LEAK},
    }


def write_locomo(folder: Path, n: int = 2, *, audit: list[dict[str, Any]] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "locomo10.json"
    path.write_text(json.dumps([_sample(f"conv-{i}") for i in range(n)]), encoding="utf-8")
    if audit is not None:
        (folder / "audit").mkdir()
        (folder / "audit/errors.json").write_text(json.dumps(audit), encoding="utf-8")
    return path


AUDIT = [
    {"question_id": "locomo_0_qa0", "question": "What cat did Ann adopt?",
     "error_type": "WRONG_CITATION", "cited_evidence": ["D1:1"],
     "correct_evidence": ["D1:1", "D1:3"]},
    {"question_id": "locomo_1_qa1", "question": "When did Bo run the Berlin marathon?",
     "error_type": "HALLUCINATION", "cited_evidence": ["D2:1"], "correct_evidence": ["D2:2"]},
]  # fmt: skip


@pytest.fixture
def convs(tmp_path: Path) -> list[LocomoConversation]:
    return load_locomo(write_locomo(tmp_path / "locomo", audit=AUDIT))


@pytest.fixture
def ctx() -> SystemContext:
    return SystemContext(embedder=HashEmbedder())


# --------------------------------------------------------------------------- loader


def test_sessions_sorted_numerically_with_their_timestamps(
    convs: list[LocomoConversation],
) -> None:
    turns = convs[0].turns
    assert [t.dia_id for t in turns] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2", "D10:1", "D10:2"]
    assert [t.session for t in turns] == [1, 1, 1, 2, 2, 10, 10]
    assert turns[0].timestamp == datetime(2023, 5, 8, 13, 56)
    assert turns[3].timestamp == datetime(2023, 5, 20, 12, 30)
    assert turns[5].timestamp == datetime(2023, 9, 13, 0, 9)
    assert turns[0].turn_text == "Ann: I adopted a grey cat named Pixel from the shelter."
    assert turns[2].image_caption == "a grey cat" and turns[0].image_caption is None
    assert convs[0].n_sessions == 3  # session_3 has a date but no turns
    assert (convs[0].index, convs[1].index, convs[1].speakers) == (0, 1, ("Ann", "Bo"))


def test_malformed_evidence_is_repaired_or_dropped(convs: list[LocomoConversation]) -> None:
    qa = convs[0].qa[1]
    # 'D2:1; D1:2' -> two ids, 'D:10:1' -> D10:1, 'D2:01' -> D2:1 (a repeat), 'D' and the
    # turn that does not exist ('D9:9') dropped.
    assert qa.evidence == ("D2:1", "D1:2", "D10:1")
    fixes = {fix.raw: fix.ids for fix in qa.evidence_fixes}
    assert fixes == {
        "D2:1; D1:2": ("D2:1", "D1:2"),
        "D:10:1": ("D10:1",),
        "D2:01": ("D2:1",),
        "D": (),
        "D9:9": (),
    }
    assert convs[0].qa[0].evidence_fixes == ()


def test_answers_ids_categories_and_missing_evidence(convs: list[LocomoConversation]) -> None:
    qa = convs[1].qa
    assert [q.question_id for q in qa] == [f"locomo_1_qa{i}" for i in range(5)]
    assert qa[1].answer == "2022"  # an int in the file
    assert (qa[2].category, qa[2].answer) == (5, "rest matters")  # adversarial_answer
    assert (qa[3].evidence, qa[3].category) == ((), 3)  # no 'evidence' key at all
    assert [q.category for q in qa] == [4, 2, 5, 3, 1]


def test_gold_summaries_never_reach_the_loaded_values(convs: list[LocomoConversation]) -> None:
    assert LEAK not in repr(convs)


def test_audit_wrong_citations_become_corrected_evidence(tmp_path: Path) -> None:
    path = write_locomo(tmp_path / "d", audit=AUDIT)
    convs = load_locomo(path)  # the default audit path: <data dir>/audit/errors.json
    assert convs[0].qa[0].corrected_evidence == ("D1:1", "D1:3")
    assert convs[0].qa[0].evidence == ("D1:1",)
    assert convs[1].qa[1].corrected_evidence is None  # a HALLUCINATION entry is not a citation
    assert all(q.corrected_evidence is None for q in convs[1].qa)
    no_audit = load_locomo(write_locomo(tmp_path / "plain"))
    assert all(q.corrected_evidence is None for c in no_audit for q in c.qa)


def test_an_audit_of_another_dataset_is_refused(tmp_path: Path) -> None:
    wrong = [{**AUDIT[0], "question": "Something else entirely?"}]
    path = write_locomo(tmp_path / "d", audit=wrong)
    with pytest.raises(ConfigError, match="locomo_0_qa0 is about 'Something else entirely"):
        load_locomo(path)
    (tmp_path / "d/audit/errors.json").write_text(
        json.dumps([{**AUDIT[0], "question_id": "locomo_7_qa0"}])
    )
    with pytest.raises(ConfigError, match="does not have"):
        load_locomo(path)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s[0]["conversation"].pop("session_2_date_time"), "session_2_date_time"),
        (lambda s: s[0]["conversation"].update(session_1_date_time="May 8"), "session time"),
        (lambda s: s[0]["qa"][0].update(category=9), "category 9"),
        (lambda s: s[0]["qa"][0].pop("answer"), "no answer"),
        (lambda s: s[0]["conversation"]["session_1"].append(s[0]["conversation"]["session_1"][0]),
         "appears twice"),
        (lambda s: s[0].pop("conversation"), "'conversation'"),
    ],
)  # fmt: skip
def test_bad_files_raise_config_errors(tmp_path: Path, mutate: Any, message: str) -> None:
    samples = [_sample("conv-0")]
    mutate(samples)
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(samples))
    with pytest.raises(ConfigError, match=message):
        load_locomo(path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_locomo(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        load_locomo(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56)),
        ("12:30 pm on 20 May, 2023", datetime(2023, 5, 20, 12, 30)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9)),
        ("10:04 AM on 19 December 2023", datetime(2023, 12, 19, 10, 4)),
    ],
)
def test_parse_session_time(text: str, expected: datetime) -> None:
    assert parse_session_time(text) == expected


@pytest.mark.parametrize("text", ["13:00 pm on 1 May, 2023", "1:00 pm on 31 June, 2023", "soon"])
def test_parse_session_time_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_session_time(text)


# --------------------------------------------------------------------------- metrics


def test_evidence_recall_needs_the_verbatim_turn() -> None:
    gold = ["Ann: I adopted a grey cat named Pixel.", "Bo: Pixel is a great name!"]
    assert evidence_recall(gold, "\n".join(gold)) == 1.0
    assert evidence_recall(gold, "Bo: hi\nAnn: I adopted a grey cat named Pixel.") == 0.5
    assert evidence_recall(gold, "Ann: I adopted a gray cat called Pixel.") == 0.0  # paraphrase
    assert evidence_recall(gold, "Ann: I adopted a grey cat named") == 0.0  # a cut turn
    assert evidence_recall(gold, "I adopted a grey cat named Pixel.") == 0.0  # no speaker
    assert evidence_recall([], "anything") is None


@pytest.mark.parametrize(
    ("answer", "context", "expected"),
    [
        ("The Eternal Sunshine", "we saw eternal sunshine, twice", True),
        ('"Eternal Sunshine"', "We saw Eternal  Sunshine.", True),
        ("7 May 2023", "on 7 May, 2023", True),
        ("No", "I do not know", False),  # whole words only
        ("cat", "a category", False),
        ("Psychology, counseling", "psychology counseling certification", True),
        ("a", "a cat", None),  # nothing left after normalising
    ],
)
def test_answer_containment(answer: str, context: str, expected: bool | None) -> None:
    assert answer_contained(answer, normalize_answer(context)) is expected


def test_normalize_answer() -> None:
    assert normalize_answer("  The U.S. — an ‘odd’ case!\n") == "us odd case"


# --------------------------------------------------------------------------- systems


def test_pack_turns_skip_and_stop(cl100k: TiktokenCounter) -> None:
    texts = ["A: " + "word " * 40 + "end.", "B: short one.", "A: also short."]
    costs = [cl100k.count(t + "\n") for t in texts]
    budget = costs[1] + costs[2]
    assert costs[0] > budget
    assert pack_turns([0, 2, 1], texts, costs, budget, cl100k, fill="skip") == (
        "B: short one.\nA: also short."  # conversation order, whatever the rank order
    )
    assert pack_turns([0, 2, 1], texts, costs, budget, cl100k, fill="stop") == ""
    assert pack_turns([2, 0, 1], texts, costs, budget, cl100k, fill="stop") == "A: also short."


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_never_exceed_the_budget(
    name: str, convs: list[LocomoConversation], ctx: SystemContext
) -> None:
    conv = convs[0]
    system = SYSTEMS[name](ctx)
    system.ingest(conv)
    texts = {t.turn_text for t in conv.turns}
    budgets = [1, 5, 12, 20, 33, 64, 1000]
    for qa in conv.qa:
        out = system.contexts(qa.question, budgets)
        assert sorted(out) == budgets
        for budget, text in out.items():
            assert ctx.counter.count(text) <= budget, (name, qa.question, budget)
            assert not text or set(text.split("\n")) <= texts  # whole turns only


def test_truncation_keeps_the_most_recent_turns(
    convs: list[LocomoConversation], ctx: SystemContext
) -> None:
    conv = convs[0]
    last_two = "\n".join(t.turn_text for t in conv.turns[-2:])
    budget = ctx.counter.count(last_two) + 1
    system = SYSTEMS["truncation"](ctx)
    system.ingest(conv)
    assert system.contexts("anything", [budget])[budget] == last_two


def test_rankers_put_the_matching_turn_first(
    convs: list[LocomoConversation], ctx: SystemContext
) -> None:
    conv = convs[0]
    violin = conv.turn("D10:1").turn_text
    budget = ctx.counter.count(violin + "\n")
    for name in ("bm25", "dense", "rrf"):
        system = SYSTEMS[name](ctx)
        system.ingest(conv)
        assert system.contexts("violin teacher moved", [budget])[budget] == violin, name


def test_oracle_recall_is_one_when_the_gold_fits(
    convs: list[LocomoConversation], ctx: SystemContext
) -> None:
    report = run_locomo(convs, ["oracle"], [4, 200], progress=False, context=ctx)
    roomy, tight = report.system("oracle").at(200), report.system("oracle").at(4)
    assert roomy.evidence_recall["1-4"].mean == 1.0
    assert roomy.evidence_recall["5"].mean == 1.0
    assert roomy.evidence_recall["1-4"].n == 6  # 3 questions with evidence x 2 conversations
    assert tight.evidence_recall["1-4"].mean == 0.0  # no gold turn is 4 tokens long
    # the audit cites two turns for conv 0's q0 (cat 4), where the oracle holds the one gold turn
    assert roomy.evidence_recall_corrected["4"].mean == pytest.approx((0.5 + 1.0) / 2)


class _HandBuilt:
    """Returns, for every budget, the gold turns of category-1 questions and nothing else."""

    name = "hand"

    def __init__(self, ctx: SystemContext) -> None:
        self.gold: dict[str, str] = {}

    def ingest(self, conversation: LocomoConversation) -> None:
        for qa in conversation.qa:
            if qa.category == 1:
                turns = [conversation.turn(d).turn_text for d in qa.evidence]
                self.gold[qa.question] = "\n".join(turns)

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
        return {b: self.gold.get(question, "") for b in budgets}


def test_report_scores_hand_built_contexts(convs: list[LocomoConversation]) -> None:
    ctx = SystemContext(embedder=HashEmbedder())
    report = run_locomo(
        convs[:1], {"hand": _HandBuilt}, [500], progress=False, context=ctx, per_question=True
    )
    result = report.system("hand").at(500)
    recall = {g: s.mean for g, s in result.evidence_recall.items()}
    # with evidence: cat 4 (q0), cat 2 (q1), cat 1 (q4); cat 3 has none; cat 5 is apart
    assert recall == {"1-4": 1 / 3, "1": 1.0, "2": 0.0, "3": None, "4": 0.0, "5": 0.0}
    # the cat-1 answer "salmon" is in its context; "a grey cat" and "2022" are not in theirs
    contained = {g: s.mean for g, s in result.answer_containment.items()}
    assert contained == {"1-4": 1 / 4, "1": 1.0, "2": 0.0, "3": 0.0, "4": 0.0}
    assert report.dataset["qa_scored_1_4"] == 3
    questions = {q.question_id: q for q in report.system("hand").questions or []}
    assert questions["locomo_0_qa4"].recall == [1.0] and questions["locomo_0_qa4"].contained == [
        True
    ]
    assert questions["locomo_0_qa2"].contained == [None]  # category 5 is not scored
    assert "PARTIAL" not in report.to_markdown()
    # the answer is only in the gold turns: nothing beyond the evidence holds it
    assert questions["locomo_0_qa4"].beyond_evidence == [False]
    assert result.answer_beyond_evidence["1"].mean == 0.0
    # every scored answer is said in the conversation ("a grey cat", "2022", "salmon")
    assert report.dataset["answer_said_1_4"] == 1.0


class _Summaries(_HandBuilt):
    """The gold turns of category-1 questions plus a summary line naming the answer; for the
    cat-4 question a summary alone (no gold turn)."""

    name = "summaries"

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
        if question in self.gold:
            text = self.gold[question] + "\nSummary: Pixel eats salmon every day."
        elif question == "What cat did Ann adopt?":
            text = "Summary: Ann adopted a grey cat from the shelter."
        else:
            text = ""
        return dict.fromkeys(budgets, text)


def test_answer_beyond_evidence_credits_what_summaries_keep(
    convs: list[LocomoConversation],
) -> None:
    ctx = SystemContext(embedder=HashEmbedder())
    report = run_locomo(
        convs[:1], {"summaries": _Summaries}, [500], progress=False, context=ctx,
        per_question=True,
    )  # fmt: skip
    result = report.system("summaries").at(500)
    questions = {q.question_id: q for q in report.system("summaries").questions or []}
    # cat 1: gold turns and a summary both hold "salmon"; cat 4: no gold turn, the summary
    # holds "a grey cat" (evidence recall 0, the answer kept all the same)
    assert questions["locomo_0_qa4"].beyond_evidence == [True]
    assert questions["locomo_0_qa0"].recall == [0.0]
    assert questions["locomo_0_qa0"].beyond_evidence == [True]
    assert questions["locomo_0_qa1"].beyond_evidence == [False]
    beyond = {g: s.mean for g, s in result.answer_beyond_evidence.items()}
    assert beyond == {"1-4": 2 / 4, "1": 1.0, "2": 0.0, "3": 0.0, "4": 1.0}
    assert "answer beyond evidence 1–4" in report.to_markdown()


# --------------------------------------------------------------------------- protocol


def _renamed(sample: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """``sample`` with its speakers Ann and Bo called ``a`` and ``b`` everywhere."""
    text = json.dumps(sample).replace("Ann", a).replace("Bo", b)
    return dict(json.loads(text))


def test_splits_are_conversations_1_to_5_and_6_to_10_in_file_order(tmp_path: Path) -> None:
    convs = load_locomo(write_locomo(tmp_path / "locomo", n=10))
    assert [c.sample_id for c in split_conversations(convs, "tune")] == [
        f"conv-{i}" for i in range(5)
    ]
    assert [c.sample_id for c in split_conversations(convs, "held-out")] == [
        f"conv-{i}" for i in range(5, 10)
    ]
    assert len(split_conversations(convs, "all")) == 10
    with pytest.raises(ConfigError, match="held-out"):
        split_conversations(convs[:3], "held-out")
    with pytest.raises(ConfigError, match="unknown split"):
        split_conversations(convs, "test")


def test_negative_questions_name_people_the_conversation_never_mentions(tmp_path: Path) -> None:
    path = tmp_path / "locomo10.json"
    samples = [
        _sample("ab"),
        _renamed(_sample("cd"), "Cy", "Di"),
        _renamed(_sample("ae"), "Ann", "Ed"),
    ]
    path.write_text(json.dumps(samples), encoding="utf-8")
    ab, cd, ae = load_locomo(path)
    negatives = negative_questions(ab, [ab, cd, ae])
    # cd's questions name Cy or Di, never said in ab, but ab tells the same story: its answers
    # "a grey cat", "2022" and "salmon" are said in ab, so only "Probably" is kept; ae's name
    # Ann, who is in ab, or have an answer ab says; ab's own and category 5 are never asked.
    assert {qa.question_id for qa in negatives} == {"locomo_1_qa3"}
    assert negatives[0].question == "Would Cy like dogs?"
    assert negative_questions(ab, [ab, cd, ae], per_conversation=0) == []


class _Padder:
    """Returns a fixed filler whatever is asked: the negative set must see it."""

    name = "padder"

    def __init__(self, ctx: SystemContext) -> None:
        pass

    def ingest(self, conversation: LocomoConversation) -> None:
        pass

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
        return dict.fromkeys(budgets, "filler " * 10)


def test_negative_set_reports_injected_tokens(tmp_path: Path) -> None:
    path = tmp_path / "locomo10.json"
    samples = [_sample("ab"), _renamed(_sample("cd"), "Cy", "Di")]
    path.write_text(json.dumps(samples), encoding="utf-8")
    convs = load_locomo(path)
    ctx = SystemContext(embedder=HashEmbedder())
    systems = {"padder": _Padder, "oracle": SYSTEMS["oracle"]}
    report = run_locomo(
        convs, systems, [64], progress=False, context=ctx, negative_per_conversation=5,
        split="tune",
    )  # fmt: skip
    padder = (report.system("padder").negative or [])[0]
    filler = ctx.counter.count("filler " * 10)
    assert padder.n == 2 and padder.mean_tokens == padder.p95_tokens == filler
    assert padder.empty_share == 0.0
    assert (report.system("oracle").negative or [])[0].mean_tokens == 0
    assert report.split == "tune" and report.config["split"] == "tune"
    markdown = report.to_markdown()
    assert "Split: **tune**" in markdown and "Negative set" in markdown


class _Greedy:
    name = "greedy"

    def __init__(self, ctx: SystemContext) -> None:
        self.text = ""

    def ingest(self, conversation: LocomoConversation) -> None:
        self.text = "\n".join(t.turn_text for t in conversation.turns)

    def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
        return dict.fromkeys(budgets, self.text)


def test_a_context_over_budget_fails_loudly(convs: list[LocomoConversation]) -> None:
    with pytest.raises(BudgetError, match=r"system 'greedy' returned \d+ tokens for the 50-token"):
        run_locomo(convs, {"greedy": _Greedy}, [50], progress=False)


def test_a_missing_budget_is_a_protocol_error(convs: list[LocomoConversation]) -> None:
    class Forgetful(_Greedy):
        def contexts(self, question: str, budgets: Sequence[int]) -> dict[int, str]:
            return {budgets[0]: ""}

    with pytest.raises(ConfigError, match="no str context for the 2,000-token budget"):
        run_locomo(convs, {"forgetful": Forgetful}, [1000, 2000], progress=False)


@pytest.mark.parametrize(
    ("systems", "budgets", "message"),
    [
        (["nope"], [100], "unknown system"),
        (["oracle"], [], "at least one budget"),
        (["oracle"], [0], ">= 1"),
        ([], [100], "at least one system"),
    ],
)
def test_run_locomo_rejects_bad_arguments(
    convs: list[LocomoConversation], systems: list[str], budgets: list[int], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run_locomo(convs, systems, budgets, progress=False)


def test_register_system_as_decorator(convs: list[LocomoConversation]) -> None:
    try:

        @register_system("test-first-turn")
        class FirstTurn(RankingSystem):
            def rank(self, question: str) -> list[int]:
                return [0]

        assert SYSTEMS["test-first-turn"] is FirstTurn
        assert isinstance(FirstTurn(SystemContext()), ContextSystem)
        with pytest.raises(ConfigError, match="already registered"):
            register_system("test-first-turn", FirstTurn)
        register_system("test-first-turn", FirstTurn, replace=True)
        report = run_locomo(convs, ["test-first-turn"], [100], progress=False)
        # D1:1 is the gold of q0 (cat 4) only
        assert report.system("test-first-turn").at(100).evidence_recall["4"].mean == 1.0
    finally:
        SYSTEMS.pop("test-first-turn", None)


def test_plot_without_matplotlib_says_how_to_install(
    convs: list[LocomoConversation], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = run_locomo(convs, ["oracle"], [100], progress=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r'pip install "contextfold\[plot\]"'):
        write_plot(report, tmp_path / "x.png")


# --------------------------------------------------------------------------- CLI


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, ["eval", "locomo", *args])


@pytest.mark.integration
def test_cli_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "locomo", audit=AUDIT).parent
    out = tmp_path / "out"
    result = invoke(
        "--data", str(data), "--budget", "16,64,1024", "--systems", "truncation,bm25,oracle",
        "--out", str(out), "--no-progress", "--conversations", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| oracle | 1,024 | 1.000 |" in result.stdout
    report = json.loads((out / "locomo.json").read_text())
    assert report["config"]["budgets"] == [16, 64, 1024]
    assert report["config"]["conversations"] == ["conv-0"]
    assert report["partial"] is True and "first 1 of 2 conversations" in report["note"]
    assert [r["system"] for r in report["results"]] == ["truncation", "bm25", "oracle"]
    assert report["dataset"]["evidence_entries_dropped"] == 2
    assert "**PARTIAL RUN**" in (out / "locomo.md").read_text()
    assert (out / "locomo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["split"] == "all"


@pytest.mark.integration
def test_cli_split_held_out_is_conversations_6_to_10(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "locomo", n=10).parent
    out = tmp_path / "out"
    result = invoke(
        "--data", str(data), "--budget", "64", "--systems", "oracle", "--out", str(out),
        "--no-progress", "--split", "held-out",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "locomo.json").read_text())
    assert report["split"] == "held-out" and report["config"]["split"] == "held-out"
    assert report["config"]["conversations"] == [f"conv-{i}" for i in range(5, 10)]
    assert report["partial"] is False
    assert "Split: **held-out**" in (out / "locomo.md").read_text()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--systems", "bm25,magic"], "unknown 'magic'"),
        (["--budget", "512,zero"], "--budget takes"),
        (["--budget", "0"], "--budget takes"),
        (["--data", "/nonexistent/locomo10.json"], "no such file"),
        (["--split", "test"], "--split"),
    ],
)
def test_cli_bad_input_is_one_error_line(tmp_path: Path, args: list[str], message: str) -> None:
    data = write_locomo(tmp_path / "locomo")
    base = {"--data": str(data), "--out": str(tmp_path / "out"), "--systems": "oracle"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = invoke(*[part for pair in base.items() for part in pair], "--no-progress")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- real data


@pytest.mark.skipif(
    not (DATA / "locomo/locomo10.json").is_file(),
    reason=f"shared benchmark data not found at {DATA}",
)
def test_real_locomo_counts() -> None:
    convs = load_locomo(DATA / "locomo")
    qas = [qa for c in convs for qa in c.qa]
    assert len(convs) == 10
    assert sum(len(c.turns) for c in convs) == 5_882
    assert sum(c.n_sessions for c in convs) == 272
    assert len(qas) == 1_986
    counts = {cat: sum(qa.category == cat for qa in qas) for cat in range(1, 6)}
    assert counts == {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}
    assert sum(len(qa.evidence_fixes) for qa in qas) == 9  # the README's 9 malformed ids
    assert sum(qa.corrected_evidence is not None for qa in qas) == 57  # WRONG_CITATION
    assert sum(not qa.evidence for qa in qas) == 4
    fixed = {qa.question_id: qa.evidence for qa in qas}
    assert fixed["locomo_0_qa37"][-2:] == ("D8:6", "D9:17")
    assert "D30:5" in fixed["locomo_9_qa69"]
    for conv in convs:  # every kept id names a turn of its conversation
        assert all(conv.turn(d) for qa in conv.qa for d in qa.evidence)


@pytest.mark.integration
def test_cli_without_matplotlib_warns_first_and_still_writes_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defect: the run went to the end, then exited 2 and wrote nothing."""
    import contextfold.eval.locomo_run as locomo_run

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # ``import matplotlib`` fails
    order: list[str] = []
    real_run = locomo_run.run_locomo

    def run(*args: object, **kwargs: object) -> object:
        order.append("run")
        return real_run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(locomo_run, "run_locomo", run)
    data = write_locomo(tmp_path / "locomo", audit=AUDIT).parent
    out = tmp_path / "out"
    result = invoke(
        "--data", str(data), "--budget", "64", "--systems", "oracle", "--out", str(out),
        "--no-progress", "--conversations", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert order == ["run"]
    warning = result.output.index('pip install "contextfold[plot]"')
    assert warning < result.output.index("| oracle |")  # said before the results
    assert json.loads((out / "locomo.json").read_text())["config"]["budgets"] == [64]
    assert (out / "locomo.md").exists() and not (out / "locomo.png").exists()


@pytest.fixture(params=["sqlite-file", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "eval-memory.db")


def test_one_shared_store_answers_as_a_fresh_store_per_conversation(
    convs: list[LocomoConversation], shared_store: str
) -> None:
    """``--store``: the contextfold system on one store for the whole run (SQLite file or
    PostgreSQL) recalls exactly what it recalls from a fresh in-memory store per
    conversation — the backend must not change the answer."""
    import contextfold.eval.locomo_memory  # noqa: F401 - registers "contextfold"

    def run(location: str | None) -> list[tuple[str, list[float | None], list[int]]]:
        ctx = SystemContext(embedder=HashEmbedder(), memory_store=location)
        try:
            report = run_locomo(
                convs, ["contextfold"], [32, 256], progress=False, context=ctx, per_question=True
            )
        finally:
            ctx.close()
        questions = report.system("contextfold").questions or []
        return [(q.question_id, q.recall, q.tokens) for q in questions]

    fresh = run(None)
    assert fresh and any(r and r[-1] for _, r, _ in fresh)  # something was recalled
    assert run(shared_store) == fresh
