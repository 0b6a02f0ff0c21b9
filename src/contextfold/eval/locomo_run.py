"""Run systems over LoCoMo and score their contexts (the report and its writers are in
:mod:`contextfold.eval.locomo_report`).

For every conversation and every system, a fresh system ``ingest`` s the conversation, then
``contexts`` is asked once per question with all budgets. Every context is counted with the
run's token counter and must be at most its budget: a violation raises ``BudgetError`` naming
the system, the question and the numbers. The metrics, per system and budget:

- **evidence recall**: per question, the share of its gold turns whose ``turn_text`` occurs
  verbatim in the context (a paraphrase or a cut turn does not count), averaged over the
  questions with at least one valid evidence id; over categories 1–4 together (``"1-4"``), per
  category, and for category 5 apart. ``evidence_recall_corrected`` is the same with the
  audit's corrected citations where it has one.
- **answer containment**: the normalised gold answer (lower case, punctuation and the articles
  a / an / the removed, whitespace collapsed) occurs in the normalised context as whole words;
  categories 1–4 together and per category (category 5's "answer" is the adversarial trap, so
  it is not scored). **Answer beyond evidence** is the same test on the context with the
  question's gold turns taken out: the answer kept by summaries and other turns. The dataset
  counts say how many scored answers occur in their conversation's turns at all
  (``answer_said_1_4``), the ceiling of containment.
- mean / max context tokens, median and p95 latency of ``contexts`` (one call serves every
  budget), ingest seconds per conversation.
- with ``negative_per_conversation``: the **negative set**, each conversation asked questions
  of the run's other conversations that it cannot answer
  (:func:`~contextfold.eval.locomo.negative_questions`), and the tokens each system injected
  for them per budget (mean, p95, max, share empty): memory that never pads should give ~0.

The report states its ``split`` (:data:`~contextfold.eval.locomo.SPLITS`).
"""

from __future__ import annotations

import math
import os
import platform
import re
import statistics
import time
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from contextfold.errors import BudgetError, ConfigError
from contextfold.eval.locomo import (
    LocomoConversation,
    LocomoQA,
    dataset_counts,
    negative_questions,
)
from contextfold.eval.locomo_report import (
    GROUPS,
    BudgetResult,
    LocomoReport,
    NegativeResult,
    QuestionResult,
    Score,
    SystemResult,
)
from contextfold.eval.locomo_systems import SYSTEMS, ContextSystem, SystemContext, SystemFactory

__all__ = [
    "answer_contained",
    "evidence_recall",
    "normalize_answer",
    "run_locomo",
]

# --------------------------------------------------------------------------- metrics

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower case, punctuation (any Unicode ``P*``) removed, articles removed, whitespace
    collapsed — the SQuAD normalisation, applied to answers and contexts alike.

    >>> normalize_answer("  The Eternal-Sunshine, of a Mind! ")
    'eternalsunshine of mind'
    """
    text = "".join(ch for ch in text.lower() if not unicodedata.category(ch).startswith("P"))
    return " ".join(_ARTICLES.sub(" ", text).split())


def evidence_recall(gold_turns: Sequence[str], context: str) -> float | None:
    """The share of ``gold_turns`` (``turn_text`` s) found verbatim in ``context``; ``None``
    when there is no gold turn.

    >>> evidence_recall(["Ann: I adopted a cat.", "Bo: Nice!"], "Ann: I adopted a cat.")
    0.5
    """
    if not gold_turns:
        return None
    return sum(turn in context for turn in gold_turns) / len(gold_turns)


def answer_contained(answer: str, normalized_context: str) -> bool | None:
    """Whether ``answer``, normalised, occurs as whole words in an already normalised
    context; ``None`` when the answer normalises to nothing.

    >>> answer_contained("No", normalize_answer("I do not know."))
    False
    >>> answer_contained("7 May, 2023", normalize_answer("It was on 7 May 2023."))
    True
    """
    wanted = normalize_answer(answer)
    if not wanted:
        return None
    return f" {wanted} " in f" {normalized_context} "


def _without(context: str, gold_turns: Sequence[str]) -> str:
    """``context`` with every occurrence of each gold turn's text cut out.

    >>> _without("Ann: I adopted a cat. Bo: Nice!", ["Ann: I adopted a cat."])
    ' Bo: Nice!'
    """
    for turn in gold_turns:
        context = context.replace(turn, "")
    return context


def _answers_said(conversations: Sequence[LocomoConversation]) -> float | None:
    """The share of scored questions (categories 1–4 with evidence) whose answer occurs, as
    whole words, in their conversation's turns: what containment can reach at most."""
    hits: list[bool] = []
    for conv in conversations:
        said = normalize_answer("\n".join(t.turn_text for t in conv.turns))
        for qa in conv.qa:
            if qa.category != 5 and qa.evidence:
                found = answer_contained(qa.answer, said)
                if found is not None:
                    hits.append(found)
    return round(sum(hits) / len(hits), 4) if hits else None


# --------------------------------------------------------------------------- runner


def _percentile(values: Sequence[float], q: float) -> float:
    """Linearly interpolated percentile ``q`` in [0, 100] of a non-empty sequence."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _check_budgets(budgets: Sequence[int]) -> list[int]:
    if not budgets:
        raise ConfigError("run_locomo needs at least one budget")
    bad = [b for b in budgets if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ConfigError(f"budgets must be whole numbers of tokens >= 1, got {bad}")
    return sorted(set(budgets))


def _factories(
    systems: Sequence[str] | Mapping[str, SystemFactory],
) -> dict[str, SystemFactory]:
    if isinstance(systems, Mapping):
        chosen = dict(systems)
    else:
        unknown = [name for name in systems if name not in SYSTEMS]
        if unknown:
            raise ConfigError(
                f"unknown system(s) {', '.join(map(repr, unknown))}; registered: "
                f"{', '.join(SYSTEMS)}"
            )
        chosen = {name: SYSTEMS[name] for name in systems}
    if not chosen:
        raise ConfigError("run_locomo needs at least one system")
    return chosen


def _scores(
    values: Sequence[tuple[int, float | bool | None]], groups: Sequence[str]
) -> dict[str, Score]:
    """``{group: Score}`` from ``(category, value)`` pairs; ``None`` values are not scored."""
    out: dict[str, Score] = {}
    for group in groups:
        cats = {1, 2, 3, 4} if group == "1-4" else {int(group)}
        kept = [float(v) for cat, v in values if cat in cats and v is not None]
        out[group] = Score(mean=math.fsum(kept) / len(kept) if kept else None, n=len(kept))
    return out


class _Tally:
    """Per-question scores of one system, per budget."""

    def __init__(self, budgets: Sequence[int]) -> None:
        self.budgets = budgets
        self.questions: list[QuestionResult] = []
        self.latencies: list[float] = []
        self.ingest: dict[str, float] = {}
        self.negative: list[list[int]] = []  # tokens per budget, one list per question

    def add(
        self, conv: LocomoConversation, qa: LocomoQA, contexts: Mapping[int, str], tokens: list[int]
    ) -> None:
        gold = [conv.turn(d).turn_text for d in qa.evidence]
        fixed = qa.corrected_evidence
        gold_fixed = gold if fixed is None else [conv.turn(d).turn_text for d in fixed]
        scored = qa.category != 5  # category 5's "answer" is the adversarial trap
        normalized = [normalize_answer(contexts[b]) if scored else "" for b in self.budgets]
        beyond = [
            answer_contained(qa.answer, normalize_answer(_without(contexts[b], gold)))
            if scored
            else None
            for b in self.budgets
        ]
        self.questions.append(
            QuestionResult(
                question_id=qa.question_id,
                category=qa.category,
                recall=[evidence_recall(gold, contexts[b]) for b in self.budgets],
                recall_corrected=[evidence_recall(gold_fixed, contexts[b]) for b in self.budgets],
                contained=[answer_contained(qa.answer, n) if scored else None for n in normalized],
                tokens=tokens,
                beyond_evidence=beyond,
            )
        )

    def result(self, name: str, *, per_question: bool) -> SystemResult:
        qs = self.questions
        budgets = [
            BudgetResult(
                budget=budget,
                evidence_recall=_scores([(q.category, q.recall[i]) for q in qs], GROUPS),
                evidence_recall_corrected=_scores(
                    [(q.category, q.recall_corrected[i]) for q in qs], GROUPS
                ),
                answer_containment=_scores([(q.category, q.contained[i]) for q in qs], GROUPS[:-1]),
                answer_beyond_evidence=_scores(
                    [(q.category, q.beyond_evidence[i]) for q in qs], GROUPS[:-1]
                ),
                mean_tokens=statistics.fmean(q.tokens[i] for q in qs) if qs else 0.0,
                max_tokens=max((q.tokens[i] for q in qs), default=0),
            )
            for i, budget in enumerate(self.budgets)
        ]
        lat = self.latencies or [0.0]
        return SystemResult(
            system=name,
            budgets=budgets,
            latency_median_ms=statistics.median(lat),
            latency_p95_ms=_percentile(lat, 95),
            ingest_s=self.ingest,
            ingest_mean_s=statistics.fmean(self.ingest.values()) if self.ingest else 0.0,
            questions=self.questions if per_question else None,
            negative=[self._negative(i, b) for i, b in enumerate(self.budgets)]
            if self.negative
            else None,
        )

    def _negative(self, i: int, budget: int) -> NegativeResult:
        tokens = [q[i] for q in self.negative]
        return NegativeResult(
            budget=budget,
            n=len(tokens),
            mean_tokens=statistics.fmean(tokens),
            p95_tokens=_percentile(tokens, 95),
            max_tokens=max(tokens),
            empty_share=sum(t == 0 for t in tokens) / len(tokens),
        )


def _checked(
    name: str,
    qa: LocomoQA,
    contexts: Any,
    budgets: Sequence[int],
    ctx: SystemContext,
) -> list[int]:
    """Tokens of each context; ``BudgetError`` / ``ConfigError`` when a system breaks the
    protocol."""
    if not isinstance(contexts, Mapping):
        raise ConfigError(
            f"system {name!r} returned {type(contexts).__name__} for {qa.question_id}; "
            "contexts() must return {budget: context}"
        )
    tokens: list[int] = []
    for budget in budgets:
        text = contexts.get(budget)
        if not isinstance(text, str):
            raise ConfigError(
                f"system {name!r} returned no str context for the {budget:,}-token budget on "
                f"{qa.question_id} (got {type(text).__name__}); return one per budget asked"
            )
        used = ctx.counter.count(text)
        if used > budget:
            raise BudgetError(
                f"system {name!r} returned {used:,} tokens for the {budget:,}-token budget on "
                f"{qa.question_id} ({qa.question!r}), counted with {ctx.counter.name}; a "
                "context must fit its budget"
            )
        tokens.append(used)
    return tokens


def run_locomo(
    conversations: Sequence[LocomoConversation],
    systems: Sequence[str] | Mapping[str, SystemFactory],
    budgets: Sequence[int],
    *,
    progress: bool = True,
    context: SystemContext | None = None,
    partial_of: int | None = None,
    per_question: bool = False,
    split: str = "all",
    negative_per_conversation: int = 0,
) -> LocomoReport:
    """Evaluate ``systems`` (registered names, or ``{name: factory}``) on ``conversations``
    at every budget (tokens), in the given system order.

    ``context`` is the shared :class:`SystemContext` (default: cl100k_base, MiniLM, in-memory
    vector cache). ``partial_of`` is the number of conversations the dataset has when
    ``conversations`` is only the first few: the report then says its numbers are partial.
    ``per_question`` keeps every question's scores in the report. ``split`` names the
    conversations' split in the report (the caller chose them). With
    ``negative_per_conversation`` > 0 each conversation is also asked that many questions (at
    most) of the other ``conversations`` it cannot answer, and the tokens injected for them are
    reported (``SystemResult.negative``). A rich progress bar over the questions goes to stderr
    when ``progress``.
    """
    if not conversations:
        raise ConfigError("run_locomo needs at least one conversation")
    wanted = _check_budgets(budgets)
    factories = _factories(systems)
    ctx = context if context is not None else SystemContext()
    ctx.counter.count("warm up")  # load the encoding before anything is timed
    tallies = {name: _Tally(wanted) for name in factories}
    negatives = {
        c.sample_id: negative_questions(
            c, conversations, per_conversation=negative_per_conversation
        )
        if negative_per_conversation > 0
        else []
        for c in conversations
    }
    total = sum(len(c.qa) + len(negatives[c.sample_id]) for c in conversations) * len(factories)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), disable=not progress) as bar:
        task = bar.add_task("LoCoMo", total=total)
        for conv in conversations:
            for name, factory in factories.items():
                bar.update(task, description=f"LoCoMo {conv.sample_id} · {name}")
                tally = tallies[name]
                system: ContextSystem = factory(ctx)
                start = time.perf_counter()
                system.ingest(conv)
                tally.ingest[conv.sample_id] = time.perf_counter() - start
                for qa in conv.qa:
                    start = time.perf_counter()
                    contexts = system.contexts(qa.question, wanted)
                    tally.latencies.append((time.perf_counter() - start) * 1000)
                    tally.add(conv, qa, contexts, _checked(name, qa, contexts, wanted, ctx))
                    bar.advance(task)
                for qa in negatives[conv.sample_id]:
                    contexts = system.contexts(qa.question, wanted)
                    tally.negative.append(_checked(name, qa, contexts, wanted, ctx))
                    bar.advance(task)
    counts = dataset_counts(conversations)
    counts["qa_scored_1_4"] = sum(
        bool(qa.evidence) and qa.category != 5 for c in conversations for qa in c.qa
    )
    counts["answer_said_1_4"] = _answers_said(conversations)
    partial = partial_of is not None and partial_of > len(conversations)
    note = (
        f"first {len(conversations)} of {partial_of} conversations only (a smoke run); "
        "these numbers are partial and not comparable with a full run"
        if partial
        else "all conversations given"
    )
    return LocomoReport(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        split=split,
        partial=partial,
        note=note,
        config={
            "budgets": wanted,
            "systems": list(factories),
            "tokenizer": ctx.counter.name,
            "embedding_cache": ctx.embedding_cache,
            "memory_store": _masked(ctx.memory_store),
            "conversations": [c.sample_id for c in conversations],
            "split": split,
            "negative_per_conversation": negative_per_conversation,
            "context_order": "conversation order (baselines)",
            "fill": "rank order, skipping a turn that does not fit (baselines)",
        },
        machine={
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
        dataset=counts,
        results=[t.result(name, per_question=per_question) for name, t in tallies.items()],
    )


def _masked(location: str | None) -> str:
    """Where the contextfold system's memory lived, as the report states it (no password)."""
    if location is None:
        return "sqlite :memory: per conversation"
    from contextfold.store import masked_location

    return masked_location(location)
