"""The LoCoMo report: plain values (JSON via pydantic), a markdown table, and a PNG of
evidence recall against budget. :func:`contextfold.eval.locomo_run.run_locomo` builds it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from contextfold.errors import ConfigError
from contextfold.eval.locomo import CATEGORIES

__all__ = [
    "GROUPS",
    "BudgetResult",
    "LocomoReport",
    "NegativeResult",
    "QuestionResult",
    "Score",
    "SystemResult",
    "write_plot",
    "write_report",
]

GROUPS = ("1-4", "1", "2", "3", "4", "5")
"""Category groups evidence recall is reported for; containment leaves out ``"5"``."""

# --------------------------------------------------------------------------- report values


class Score(BaseModel):
    """A mean over ``n`` questions (``None`` when ``n`` is 0)."""

    model_config = ConfigDict(frozen=True)
    mean: float | None
    n: int


class BudgetResult(BaseModel):
    """One system at one budget. Score dicts are keyed by category group (:data:`GROUPS`).
    ``answer_beyond_evidence``: the share of questions whose gold answer the context holds
    even with its gold turns taken out — what summaries and other turns keep of the answer
    (empty in reports from before it was measured)."""

    model_config = ConfigDict(frozen=True)
    budget: int
    evidence_recall: dict[str, Score]
    evidence_recall_corrected: dict[str, Score]
    answer_containment: dict[str, Score]
    answer_beyond_evidence: dict[str, Score] = {}
    mean_tokens: float
    max_tokens: int


class QuestionResult(BaseModel):
    """One question's scores, one entry per budget (in the report's budget order)."""

    model_config = ConfigDict(frozen=True)
    question_id: str
    category: int
    recall: list[float | None]
    recall_corrected: list[float | None]
    contained: list[bool | None]
    tokens: list[int]
    beyond_evidence: list[bool | None] = []


class NegativeResult(BaseModel):
    """Memory a system injected for questions its conversation cannot answer (the negative
    set, :func:`contextfold.eval.locomo.negative_questions`) at one budget: tokens per
    question (mean, 95th percentile, max) and the share of questions that got nothing."""

    model_config = ConfigDict(frozen=True)
    budget: int
    n: int
    mean_tokens: float
    p95_tokens: float
    max_tokens: int
    empty_share: float


class SystemResult(BaseModel):
    """One system over the run: a result per budget, latency and ingest time."""

    model_config = ConfigDict(frozen=True)
    system: str
    budgets: list[BudgetResult]
    latency_median_ms: float
    latency_p95_ms: float
    ingest_s: dict[str, float]  # per conversation sample_id
    ingest_mean_s: float
    questions: list[QuestionResult] | None = None
    negative: list[NegativeResult] | None = None

    def at(self, budget: int) -> BudgetResult:
        """The result at ``budget`` (``KeyError`` when it was not run)."""
        for result in self.budgets:
            if result.budget == budget:
                return result
        raise KeyError(budget)


class LocomoReport(BaseModel):
    """What :func:`run_locomo` measured, printable as JSON or markdown."""

    model_config = ConfigDict(frozen=True)
    created: str
    partial: bool
    note: str
    config: dict[str, Any]
    machine: dict[str, Any]
    dataset: dict[str, Any]
    results: list[SystemResult]
    split: str = "all"  # reports from before the split was stated ran on all 10

    def system(self, name: str) -> SystemResult:
        """The result of the system called ``name`` (``KeyError`` when it was not run)."""
        for result in self.results:
            if result.system == name:
                return result
        raise KeyError(name)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)

    def to_markdown(self) -> str:
        """A caption, the system × budget table, per-category recall, and ingest times."""
        d = self.dataset
        lines = [
            f"LoCoMo: {d['conversations']} conversations, {d['turns']:,} turns, {d['qa']:,} "
            f"questions ({d['qa_scored_1_4']:,} with evidence in categories 1–4); tokens "
            f"counted with {self.config['tokenizer']}. Split: **{self.split}** "
            f"({', '.join(self.config['conversations'])}).",
        ]
        if self.partial:
            lines.append(f"**PARTIAL RUN**: {self.note}")
        lines += [
            "",
            "| system | budget | recall 1–4 | multi-hop (1) | recall 1–4, audit-corrected "
            "| containment 1–4 | answer beyond evidence 1–4 | recall cat 5 | mean tokens "
            "| median ms | p95 ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in self.results:
            for b in s.budgets:
                lines.append(
                    f"| {s.system} | {b.budget:,} | {_fmt(b.evidence_recall['1-4'])} "
                    f"| {_fmt(b.evidence_recall['1'])} "
                    f"| {_fmt(b.evidence_recall_corrected['1-4'])} "
                    f"| {_fmt(b.answer_containment['1-4'])} "
                    f"| {_fmt(b.answer_beyond_evidence.get('1-4'))} "
                    f"| {_fmt(b.evidence_recall['5'])} "
                    f"| {b.mean_tokens:,.0f} | {s.latency_median_ms:.2f} "
                    f"| {s.latency_p95_ms:.2f} |"
                )
        said = d.get("answer_said_1_4")
        if said is not None:
            lines += [
                "",
                "Containment: the gold answer (normalised) occurs in the context as whole words. "
                "Answer beyond evidence: it still does with the question's gold turns taken out "
                "of the context (what summaries and other turns keep). LoCoMo's answers are "
                f"often not said verbatim: {said:.3f} of the scored questions' answers occur in "
                "their conversation's turns at all, the ceiling of containment.",
            ]
        names = " | ".join(f"{c} {CATEGORIES[int(c)]}" for c in GROUPS[1:])
        lines += [
            "",
            "Evidence recall per category:",
            "",
            f"| system | budget | {names} |",
            "|---|---:|" + "---:|" * (len(GROUPS) - 1),
        ]
        for s in self.results:
            for b in s.budgets:
                cells = " | ".join(_fmt(b.evidence_recall[g]) for g in GROUPS[1:])
                lines.append(f"| {s.system} | {b.budget:,} | {cells} |")
        negatives = [s for s in self.results if s.negative]
        if negatives:
            lines += [
                "",
                "Negative set (questions of the split's other conversations that this one "
                f"cannot answer, {self.config.get('negative_per_conversation')} at most per "
                "conversation): tokens injected per question.",
                "",
                "| system | budget | questions | mean tokens | p95 tokens | max tokens "
                "| share empty |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for s in negatives:
                for n in s.negative or []:
                    lines.append(
                        f"| {s.system} | {n.budget:,} | {n.n:,} | {n.mean_tokens:,.1f} "
                        f"| {n.p95_tokens:,.0f} | {n.max_tokens:,} | {n.empty_share:.3f} |"
                    )
        lines += ["", "| system | mean ingest s per conversation |", "|---|---:|"]
        lines += [f"| {s.system} | {s.ingest_mean_s:.3f} |" for s in self.results]
        lines += [
            "",
            "Latency is one `contexts` call serving every budget (question embedding included). "
            "Ingest embeds only turns the run's shared vector cache does not hold yet, so a "
            "system that reuses another's vectors (rrf after dense) ingests faster"
            + (
                f", and vectors cached on disk by an earlier run ({cache}) are not re-embedded."
                if (cache := self.config.get("embedding_cache"))
                else "."
            ),
        ]
        return "\n".join(lines)


def _fmt(score: Score | None) -> str:
    return "–" if score is None or score.mean is None else f"{score.mean:.3f}"


# --------------------------------------------------------------------------- writers

PLOT_HINT = 'the LoCoMo plot needs matplotlib; pip install "contextfold[plot]"'


def plot_available() -> bool:
    """Whether matplotlib (the ``plot`` extra) can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _require_matplotlib() -> None:
    if not plot_available():
        raise ConfigError(PLOT_HINT)


def write_plot(report: LocomoReport, path: str | Path) -> Path:
    """A PNG of evidence recall (categories 1–4) against budget, one line per system.

    Uses matplotlib's Agg canvas directly (no pyplot, no global backend switch).
    """
    _require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for s in report.results:
        xs = [b.budget for b in s.budgets]
        ys = [b.evidence_recall["1-4"].mean for b in s.budgets]
        ax.plot(xs, [math.nan if y is None else y for y in ys], marker="o", label=s.system)
    budgets = report.config["budgets"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [f"{b:,}" for b in budgets])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"context budget (tokens, {report.config['tokenizer']})")
    ax.set_ylabel("evidence recall, categories 1–4")
    title = "LoCoMo evidence recall vs budget"
    ax.set_title(title + (" (PARTIAL RUN)" if report.partial else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    return path


def write_report(report: LocomoReport, out_dir: str | Path) -> dict[str, Path]:
    """Write ``locomo.json`` and ``locomo.md`` into ``out_dir`` (created), then ``locomo.png``
    when matplotlib is installed: the results are never lost to a missing plot library (the
    returned paths say which files were written; ``PLOT_HINT`` says how to get the plot)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "locomo.json", "md": out / "locomo.md"}
    paths["json"].write_text(report.to_json() + "\n", encoding="utf-8")
    paths["md"].write_text(report.to_markdown() + "\n", encoding="utf-8")
    if plot_available():
        paths["png"] = write_plot(report, out / "locomo.png")
    return paths
