"""What a build returns: the payload, a plain-text rendering, and the diagnostics that explain
it (a per-section budget table, every decision, step records, timing)."""

from __future__ import annotations

import io
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from contextfold.items import ContextItem, QueryBundle
from contextfold.window import Action, Decision, SectionUsage, Window

__all__ = ["ContextResult", "Diagnostics", "StepRecord", "render_budget_table"]


class StepRecord(BaseModel):
    """How one pipeline step went; a skipped step's changes were rolled back."""

    model_config = ConfigDict(frozen=True)
    name: str
    status: Literal["ok", "skipped"]
    items_before: int
    items_after: int
    ms: float
    error: str | None = None


class Diagnostics(BaseModel):
    """Token usage per section, totals, timing and steps. ``str()`` gives the budget table."""

    model_config = ConfigDict(frozen=True)
    sections: tuple[SectionUsage, ...]
    used_tokens: int
    available: int
    max_tokens: int
    reserve_output: int
    counter: str
    estimated: bool
    format: str
    build_time_ms: float
    candidates: int
    kept: int
    truncated: int
    dropped: int
    steps: tuple[StepRecord, ...] = ()
    #: The encoding counted with, and whether it was a fallback (no tokenizer known for the
    #: model: counts are then estimates).
    encoding: str | None = None
    encoding_fallback: bool = False

    def __str__(self) -> str:
        return render_budget_table(self)

    @property
    def truncated_sections(self) -> list[str]:
        return [s.name for s in self.sections if s.status != "ok"]


def _status(section: SectionUsage) -> str:
    if section.status == "ok":
        return f"{section.percent:.0f}%"
    return "⚠ OVER CAP" if section.status == "OVER" else "⚠ TRUNCATED"


def render_budget_table(diagnostics: Diagnostics, *, width: int = 100) -> str:
    """The per-section table (budget / used / % or ⚠ TRUNCATED) plus a totals line."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Context budget", title_justify="left")
    for header in ("Section", "Budget", "Used", "Status", "Kept", "Cut", "Dropped", "Source"):
        table.add_column(header, justify="right" if header in {"Budget", "Used"} else "left")
    for s in diagnostics.sections:
        limit = f"{s.limit:,}" if s.limit is not None else f"≤{s.allowance:,}"
        table.add_row(
            s.name,
            limit,
            f"{s.used:,}",
            _status(s),
            str(s.kept),
            str(s.truncated),
            str(s.dropped),
            s.description,
        )
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    console.print(table)
    estimated = " (estimated)" if diagnostics.estimated else ""
    if diagnostics.encoding_fallback:
        estimated = " (a fallback: no tokenizer is known for the model; estimated)"
    console.print(
        f"total {diagnostics.used_tokens:,} / {diagnostics.available:,} tokens "
        f"({diagnostics.max_tokens:,} max, {diagnostics.reserve_output:,} reserved for the "
        f"response) · {diagnostics.format} format · {diagnostics.counter}{estimated} · "
        f"{diagnostics.kept} kept, {diagnostics.truncated} truncated, {diagnostics.dropped} "
        f"dropped of {diagnostics.candidates} · {diagnostics.build_time_ms:.1f} ms"
    )
    for step in diagnostics.steps:
        if step.status == "skipped":
            console.print(f"step {step.name!r} skipped (rolled back): {step.error}")
    return out.getvalue().rstrip() + "\n"


class ContextResult(BaseModel):
    """The outcome of ``ContextPipeline.build``.

    ``formatted_output`` is ready for the provider API; ``text`` is the same window as plain
    text; ``diagnostics`` and ``decisions`` explain it. ``str(result)`` prints the budget table
    and every item that was cut or dropped; ``to_json()`` dumps everything.
    """

    model_config = ConfigDict(frozen=True)
    formatted_output: Any
    text: str
    query: QueryBundle
    window: Window
    diagnostics: Diagnostics

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return self.window.decisions

    @property
    def overflow_items(self) -> tuple[ContextItem, ...]:
        """Candidates that did not make it into the window (dropped or summarized away)."""
        return self.window.overflow_items

    @property
    def items(self) -> tuple[ContextItem, ...]:
        """The kept items, truncated ones with their cut content."""
        return self.window.items

    def explain(self) -> str:
        """The budget table followed by one line per truncated or dropped item, each named by
        its label (``lodging.md chunk 3``, ``user turn 2``; see ``item_label``)."""
        lines = [str(self.diagnostics)]
        for d in self.decisions:
            if d.action is not Action.KEPT:
                lines.append(
                    f"  {d.action.value:<10} {d.section:<14} {d.label or d.item_id}  "
                    f"{d.tokens_before:,} → {d.tokens_after:,} tokens: {d.reason}"
                )
        return "\n".join(lines).rstrip() + "\n"

    def __str__(self) -> str:
        return self.explain()

    def to_json(self, *, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)
