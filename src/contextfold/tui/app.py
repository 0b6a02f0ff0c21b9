"""``ChatApp``: the interactive chat terminal (``contextfold chat``), seed 001's TUI on Textual.

::

    ┌ tags ───────────────┐┌ chat ──────────────────────────────────────────────┐
    │ tag   turns activity ││ you: …                                              │
    │ …                    ││ assistant: …                                        │
    ├ turns ──────────────┤│                                                     │
    │ 1  [kitchen, …]      │├ budget ─────────────────────────────────────────────┤
    │ 2  …                 ││ ████core▒▒hint▓▓▓tags░░░░conversation  1,234 / 8,192 │
    └─────────────────────┘└ > message, or /compact /brief /export /inspect ─────┘

- **Tag panel**: every tag of the session, its stored turns and its activity in this chat
  (active: this turn or the last, warm: within 5, cold: older, stored: from before), updated
  after each ``on_turn_complete``; the working-set depth when a topic is paged.
- **Budget bar**: the last request's tokens per part — core (system prompt), hint (the topic
  list), tags (summaries, paged topics, recalled turns), conversation (live history and the
  message) — of the model's window.
- **Turn list**: every turn with its tags; Ctrl+B / Ctrl+F move through it.
- **Turn inspector** (Ctrl+I or F2, ``/inspect [N]``): the payload sent to the model, the
  inbound vs response tags, broad / temporal, the assembled context, the budget.
- **Brief mode** (Ctrl+T, ``/brief``): asks the model for two lines, silently.
- **Compaction** (Ctrl+K, ``/compact``) on demand; **export** (Ctrl+S, ``/export [FILE]``)
  of the whole session as JSON (default ``vc-session.json``; ``--replay`` reads it).

The model calls run on a worker thread: the screen stays live while the model answers, and a
message typed meanwhile waits with a notice instead of running beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Input, Label, ListItem, ListView, Static

from contextfold.tui.session import Budget, ChatSession, ChatTurn

if TYPE_CHECKING:
    from contextfold.memory.compactor import CompactionReport

__all__ = ["ChatApp", "InspectorScreen", "budget_bar"]

EXPORT = Path("vc-session.json")
_PARTS = (("core", "blue"), ("hint", "magenta"), ("tags", "green"), ("conversation", "yellow"))
_LEVELS = {"active": "bold green", "warm": "yellow", "cold": "dim", "stored": "dim italic"}


def budget_bar(budget: Budget, width: int = 48) -> Text:
    """The window as a bar: one colored run per part, then the free space, then the numbers."""
    window = max(budget.window, budget.used, 1)
    bar = Text()
    for name, color in _PARTS:
        tokens = getattr(budget, name)
        cells = round(tokens / window * width)
        if tokens and not cells:
            cells = 1
        bar.append("█" * cells, style=color)
    bar.append("░" * max(0, width - bar.cell_len), style="dim")
    bar.append(f"  {budget.used:,} / {budget.window:,} tokens  ")
    for name, color in _PARTS:
        bar.append(f"■ {name} {getattr(budget, name):,}  ", style=color)
    return bar


class InspectorScreen(ModalScreen[None]):
    """One turn's whole record; Escape closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss", "close")]
    DEFAULT_CSS = """
    InspectorScreen { align: center middle; }
    #inspector { width: 90%; height: 90%; border: thick $accent; background: $surface; }
    #inspector Static { margin: 0 1 1 1; }
    """

    def __init__(self, turn: ChatTurn) -> None:
        super().__init__()
        self.turn = turn

    def compose(self) -> ComposeResult:
        t = self.turn
        flags = [f for f, on in (("broad", t.broad), ("temporal", t.temporal)) if on]
        with VerticalScroll(id="inspector"):
            yield Static(Text(f"Turn {t.turn} — inspector (Esc closes)", style="bold"))
            yield Static(
                f"inbound tags: {', '.join(t.matched_tags) or '—'}\n"
                f"related tags: {', '.join(t.related_tags) or '—'}\n"
                f"response tags: {', '.join(t.response_tags) or '—'}\n"
                f"flags: {', '.join(flags) or '—'}   brief: {t.brief}   reply: {t.reply_source}\n"
                f"recalled turns: {t.recalled}   inbound {t.inbound_ms:.0f} ms, model"
                f" {t.reply_ms:.0f} ms, complete {t.complete_ms:.0f} ms",
                id="inspector-tags",
            )
            yield Static(budget_bar(t.budget), id="inspector-budget")
            yield Static(Text("assembled context", style="bold"))
            yield Static(Text(t.context or "(nothing injected)"), id="inspector-context")
            yield Static(Text("API payload", style="bold"))
            yield Static(Text(json.dumps(t.payload, indent=2, ensure_ascii=False)), id="payload")


class ChatApp(App[None]):
    """The chat TUI over a ``ChatSession``."""

    TITLE = "contextfold chat"
    CSS = """
    #side { width: 42; border-right: solid $primary; }
    #side Label { text-style: bold; padding: 0 1; }
    #tags { height: 1fr; }
    #turns { height: 1fr; }
    #log { height: 1fr; padding: 0 1; }
    #log .user { color: $accent; margin-top: 1; }
    #log .assistant { margin-bottom: 0; }
    #log .note { color: $text-muted; }
    #budget { height: 2; padding: 0 1; border-top: solid $primary; }
    #status { height: 1; padding: 0 1; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+k", "compact", "compact", priority=True),
        Binding("ctrl+t", "brief", "brief mode", priority=True),
        Binding("ctrl+s", "export", "export", priority=True),
        Binding("ctrl+i,f2", "inspect", "inspect", priority=True),
        Binding("ctrl+b", "move(-1)", "prev turn", priority=True),
        Binding("ctrl+f", "move(1)", "next turn", priority=True),
        Binding("ctrl+q", "quit", "quit", priority=True),
    ]

    def __init__(self, session: ChatSession, *, export_path: Path = EXPORT) -> None:
        super().__init__()
        self.session = session
        self.export_path = export_path
        self.busy = False
        self.selected: int | None = None  # index into session.turns

    # -- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with Vertical(id="side"):
                yield Label("tags")
                yield DataTable(id="tags", cursor_type="row", zebra_stripes=True)
                yield Label("turns")
                yield ListView(id="turns")
            with Vertical(id="main"):
                yield VerticalScroll(id="log")
                yield Static(id="budget")
                yield Static(id="status")
                yield Input(
                    placeholder="message, or /compact /brief /export [FILE] /inspect [N] /quit",
                    id="input",
                )
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"session {self.session.session_id}"
        table = self.query_one("#tags", DataTable)
        table.add_columns("tag", "turns", "activity", "depth")
        self._refresh_tags()
        self.query_one("#budget", Static).update(budget_bar(Budget(window=self._window())))
        self._status()
        self.query_one("#input", Input).focus()

    def _window(self) -> int:
        return self.session.engine.config.context_window

    # -- panels --------------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        log = self.query_one("#log", VerticalScroll)
        log.mount(Static(Text(text), classes="note"))
        log.scroll_end(animate=False)

    def _status(self) -> None:
        s = self.session
        mode = "brief" if s.brief else "full"
        self.query_one("#status", Static).update(
            f"{len(s.turns)} turns · {len(s.compactions)} compactions · {mode} answers"
            f"{' · answering…' if self.busy else ''}"
        )

    def _refresh_tags(self) -> None:
        table = self.query_one("#tags", DataTable)
        table.clear()
        for tag in self.session.tags():
            level = tag.level
            table.add_row(
                tag.tag, str(tag.turns), Text(level, style=_LEVELS[level]), tag.depth, key=tag.tag
            )

    def _show_turn(self, turn: ChatTurn) -> None:
        self.busy = False
        log = self.query_one("#log", VerticalScroll)
        log.mount(Static(Text(f"you ({turn.turn}): {turn.user}"), classes="user"))
        log.mount(Static(Text(f"assistant: {turn.reply}"), classes="assistant"))
        tags = ", ".join(turn.response_tags) or "—"
        note = f"tags [{tags}] · memory {turn.budget.hint + turn.budget.tags:,} tokens"
        if turn.compacted_turns:
            note += f" · compacted {turn.compacted_turns} turns, freed {turn.tokens_freed:,}"
        log.mount(Static(Text(note), classes="note"))
        log.scroll_end(animate=False)
        turns = self.query_one("#turns", ListView)
        turns.append(ListItem(Label(f"{turn.turn:>3}  [{tags}]"), id=f"turn-{turn.turn}"))
        self.selected = len(self.session.turns) - 1
        turns.index = self.selected
        self.query_one("#budget", Static).update(budget_bar(turn.budget))
        self._refresh_tags()
        self._status()

    def _failed(self, error: str) -> None:
        self.busy = False
        self._note(f"error: {error}")
        self.notify(error, severity="error")
        self._status()

    # -- input ---------------------------------------------------------------------------------

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        event.input.value = ""
        if not text:
            return
        if text.startswith("/"):
            self._command(text)
            return
        if self.busy:
            self.notify("still answering the last message; send this one after it")
            event.input.value = text
            return
        self.busy = True
        self._status()
        self._send(text)

    @work(thread=True, exclusive=True, group="model")
    def _send(self, text: str) -> None:
        try:
            turn = self.session.send(text)
        except Exception as exc:  # a model or store error: shown, the chat goes on
            self.call_from_thread(self._failed, f"{type(exc).__name__}: {exc}")
            return
        self.call_from_thread(self._show_turn, turn)

    def _command(self, text: str) -> None:
        name, _, arg = text[1:].partition(" ")
        arg = arg.strip()
        if name == "compact":
            self.action_compact()
        elif name == "brief":
            self.action_brief()
        elif name == "export":
            self.action_export(arg or None)
        elif name == "inspect":
            if arg and not arg.isdigit():
                self._note(f"/inspect takes a turn number, not {arg!r}")
                return
            self.action_inspect(int(arg) if arg else None)
        elif name in ("quit", "exit"):
            self.exit()
        else:
            self._note(
                f"unknown command /{name}: /compact /brief /export [FILE] /inspect [N] /quit"
            )

    # -- actions -------------------------------------------------------------------------------

    def action_compact(self) -> None:
        if self.busy:
            self.notify("still answering; compact after the reply")
            return
        self._compact()

    @work(thread=True, exclusive=True, group="model")
    def _compact(self) -> None:
        try:
            report = self.session.compact()
        except Exception as exc:
            self.call_from_thread(self._failed, f"{type(exc).__name__}: {exc}")
            return
        self.call_from_thread(self._compacted, report)

    def _compacted(self, report: CompactionReport | None) -> None:
        if report is None:
            self._note("/compact: nothing to compact (the recent turns are protected)")
        else:
            ratio = report.tokens_compacted / report.summary_tokens if report.summary_tokens else 0
            self._note(
                f"/compact: {report.turns_compacted} turns into {report.segments_compacted}"
                f" segments, freed {report.tokens_freed:,} tokens (ratio {ratio:.1f}x)"
            )
        self._refresh_tags()
        self._status()

    def action_brief(self) -> None:
        self.session.brief = not self.session.brief
        self._note(f"brief mode {'on' if self.session.brief else 'off'}")
        self._status()

    def action_export(self, path: str | None = None) -> None:
        target = Path(path) if path else self.export_path
        try:
            self.session.export(target)
        except OSError as exc:
            self._note(f"export failed: {target}: {exc.strerror or exc}")
            return
        self._note(f"exported {len(self.session.turns)} turns to {target}")

    def action_inspect(self, number: int | None = None) -> None:
        turns = self.session.turns
        if not turns:
            self._note("no turn to inspect yet")
            return
        index = number - 1 if number is not None else self.selected
        if index is None or not 0 <= index < len(turns):
            self._note(f"no turn {number}; there are {len(turns)}")
            return
        self.push_screen(InspectorScreen(turns[index]))

    def action_move(self, step: int) -> None:
        turns = self.query_one("#turns", ListView)
        if not self.session.turns:
            return
        current = self.selected if self.selected is not None else len(self.session.turns) - 1
        self.selected = max(0, min(len(self.session.turns) - 1, current + step))
        turns.index = self.selected

    def on_list_view_highlighted(self, event: ListView.Highlighted) -> None:
        if event.list_view.index is not None:
            self.selected = event.list_view.index

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        self.action_inspect((event.list_view.index or 0) + 1)

    def snapshot(self) -> dict[str, Any]:
        """What the panels show, as data (tests, and ``--json`` of a headless run)."""
        return {
            "turns": [t.turn for t in self.session.turns],
            "tags": [t.model_dump() for t in self.session.tags()],
            "compactions": len(self.session.compactions),
            "brief": self.session.brief,
        }
