"""``contextfold chat``: the interactive chat terminal (``contextfold.tui``), or, with
``--replay FILE``, a conversation run through the memory hooks headless.

Without ``--replay`` the chat TUI starts (Textual; the ``tui`` extra): tag panel, budget bar,
turn list, turn inspector, ``/compact``, brief mode, session export, against the configured
``llm:``. ``--headless`` (seed 001's flag) asks for the headless run and needs ``--replay``.

In a replay, each user turn goes through ``on_message_inbound`` with the live history so far
(the turns not compacted yet: what an app keeps sending once memory holds the older ones), gets
a reply
— the file's own, the configured ``llm:``'s, or a placeholder — and is stored with
``on_turn_complete``, which compacts when the live turns cross a threshold. One line per turn
shows what memory did; ``--out`` keeps every turn's data as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contextfold.cli.common import InputError, cli_errors, read_text
from contextfold.cli.session import (
    ConfigOption,
    JsonOption,
    SessionOption,
    echo_json,
    excerpt,
    open_engine,
    read_messages,
)
from contextfold.items import Message

if TYPE_CHECKING:
    from contextfold.memory.engine import AssembledContext, MemoryEngine

__all__ = ["Replay", "ReplayTurn", "chat_command", "read_replay"]

PLACEHOLDER = "(no model configured)"
SYSTEM_PROMPT = "You are a helpful assistant. Use the conversation memory below when it helps."


class ReplayTurn(BaseModel):
    """What memory did for one replayed user turn."""

    turn: int
    user: str
    reply: str
    reply_source: str  # "file", "llm" or "placeholder"
    matched_tags: list[str]
    related_tags: list[str]
    broad: bool
    temporal: bool
    memory_tokens: int
    memory_budget: int
    recalled: int
    candidates: int
    inbound_ms: float
    complete_ms: float
    compacted_turns: int
    live_turns: int
    live_tokens: int


Replay = tuple[list[Message], list[tuple[Message, list[Message]]]]


def read_replay(source: str) -> Replay:
    """A replay file as ``(preamble, turns)``: the messages before the first user message
    (system prompts, kept as context), and each user message with the messages answering it.
    A ``.txt`` file holds one user prompt per line (blank lines skipped; no answers); anything
    else is read as a JSON message list, where the messages between two user messages answer
    the first."""
    if source != "-" and Path(source).suffix.lower() == ".txt":
        name, text = read_text(source)
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
        if not prompts:
            raise InputError(f"{name}: no prompts (one user message per line)")
        return [], [(Message(role="user", content=p), []) for p in prompts]
    preamble: list[Message] = []
    turns: list[tuple[Message, list[Message]]] = []
    for message in read_messages(source):
        if message.role == "user":
            turns.append((message, []))
        else:
            (turns[-1][1] if turns else preamble).append(message)
    if not turns:
        raise InputError(f"{source}: no user messages to replay")
    return preamble, turns


def _live(history: list[Message], live_turns: int) -> list[Message]:
    """The system messages and the newest ``live_turns`` other messages: what an app keeps
    sending once older turns are compacted into memory."""
    system = [m for m in history if m.role == "system"]
    rest = [m for m in history if m.role != "system"]
    return system + (rest[-live_turns:] if live_turns else [])


def _llm_reply(
    engine: MemoryEngine, ctx: AssembledContext, live: list[Message], user: Message
) -> str:
    llm = engine.config.llm
    assert llm is not None and engine.llm_client is not None
    system = "\n\n".join(m.text() for m in live if m.role == "system") or SYSTEM_PROMPT
    if ctx.prepend_text:
        system += "\n\n" + ctx.prepend_text
    messages = [{"role": "system", "content": system}]
    messages += [
        {"role": m.role, "content": m.text()} for m in live if m.role in ("user", "assistant")
    ]
    messages.append({"role": "user", "content": user.text()})
    result = engine.llm_client.chat(messages, llm.model)
    usage = result.usage
    cost = (
        usage.prompt_tokens * llm.prompt_price_per_million
        + usage.completion_tokens * llm.completion_price_per_million
    ) / 1e6
    model = result.model or llm.model
    engine.store.costs.log_cost(
        engine.session_id, "chat", model, usage.prompt_tokens, usage.completion_tokens, cost
    )
    return str(result.text)


def _replay_turn(
    engine: MemoryEngine,
    number: int,
    user: Message,
    answer: list[Message],
    history: list[Message],
    live: list[Message],
    budget: int | None,
) -> tuple[ReplayTurn, list[Message]]:
    start = time.perf_counter()
    ctx = engine.on_message_inbound(user, live, budget=budget)
    inbound_ms = (time.perf_counter() - start) * 1000
    if answer:
        source, reply = "file", next((m.text() for m in answer if m.role == "assistant"), "")
    elif engine.config.llm is not None:
        source, reply = "llm", _llm_reply(engine, ctx, live, user)
        answer = [Message(role="assistant", content=reply)]
    else:
        source, reply = "placeholder", PLACEHOLDER
        answer = [Message(role="assistant", content=reply)]
    history.extend([user, *answer])
    start = time.perf_counter()
    report = engine.on_turn_complete(history)
    complete_ms = (time.perf_counter() - start) * 1000
    status = engine.status()
    turn = ReplayTurn(
        turn=number,
        user=user.text(),
        reply=reply,
        reply_source=source,
        matched_tags=list(ctx.matched_tags),
        related_tags=list(ctx.related_tags),
        broad=ctx.broad,
        temporal=ctx.temporal,
        memory_tokens=ctx.budget.used,
        memory_budget=ctx.budget.budget,
        recalled=ctx.budget.turns_recalled,
        candidates=len(ctx.recalled),
        inbound_ms=round(inbound_ms, 2),
        complete_ms=round(complete_ms, 2),
        compacted_turns=report.turns_compacted if report else 0,
        live_turns=status.live_turns,
        live_tokens=status.live_tokens,
    )
    return turn, _live(history, status.live_turns)


def _check_out(out: Path) -> None:
    """``InputError`` when ``--out`` could not be written: a folder, or in a folder that is
    missing or not writable."""
    folder = out.parent
    if out.is_dir():
        reason = "it is a directory"
    elif not folder.is_dir():
        reason = f"no folder {folder}"
    elif not os.access(out if out.exists() else folder, os.W_OK):
        reason = "permission denied"
    else:
        return
    raise InputError(f"{out}: cannot write ({reason}); nothing was replayed")


@contextmanager
def _closing_client(engine: MemoryEngine) -> Iterator[None]:
    """Close the LLM client the engine built (``MemoryEngine.close`` only closes the store)."""
    try:
        yield
    finally:
        close = getattr(engine.llm_client, "close", None)
        if callable(close):
            close()


def _table(turns: list[ReplayTurn], session: str) -> Table:
    table = Table(title=f"replay into session {session!r}", title_justify="left", expand=True)
    table.add_column("#", justify="right")
    table.add_column("user", no_wrap=True, overflow="ellipsis", ratio=3)
    table.add_column("tags", no_wrap=True, overflow="ellipsis", ratio=2)
    for column in ("memory", "recalled", "ms", "compacted"):
        table.add_column(column, justify="right", no_wrap=True)
    for t in turns:
        flags = [f for f, on in (("broad", t.broad), ("temporal", t.temporal)) if on]
        tags = ", ".join(t.matched_tags) + (f" ({', '.join(flags)})" if flags else "")
        table.add_row(
            str(t.turn),
            excerpt(t.user, 200),
            tags or "—",
            f"{t.memory_tokens:,}",
            str(t.recalled),
            f"{t.inbound_ms:,.0f}",
            str(t.compacted_turns or ""),
        )
    return table


def _interactive(
    config: Path | None,
    session: str,
    budget: int | None,
    context_window: int | None,
    reset: bool,
    export: Path,
) -> None:
    """The chat terminal (``contextfold.tui.app.ChatApp``) on ``session``."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InputError(
            "the chat needs a terminal (stdin and stdout are not one here); run a file "
            "headless with --replay FILE"
        )
    try:
        from contextfold.tui.app import ChatApp
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("textual", "rich"):
            raise
        raise InputError(
            "the chat terminal needs the tui extra (textual is missing): "
            'pip install "contextfold[tui]"; or run a file headless with --replay FILE'
        ) from None
    from contextfold.tui.session import ChatSession

    opened = open_engine(config, session, llm=True, context_window=context_window)
    with opened as engine, _closing_client(engine):
        if reset:
            engine.delete_session(session)
        ChatApp(ChatSession(engine, budget=budget), export_path=export).run()


def chat_command(
    replay: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="Replay this file: .txt (one user prompt per line) or a JSON message list / "
            "`--out` export (its assistant replies are reused).",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(metavar="FILE.json", help="Write every turn's data as JSON.")
    ] = None,
    config: ConfigOption = None,
    session: SessionOption = "default",
    budget: Annotated[
        int | None,
        typer.Option(metavar="TOKENS", help="Memory budget (default: assembly.memory_budget)."),
    ] = None,
    context_window: Annotated[
        int | None,
        typer.Option(
            metavar="TOKENS",
            help="The model's window (default: the config's context_window, 120,000). "
            "Compaction starts at a share of it, so a small one (e.g. 1024) shows memory at "
            "work on a short conversation.",
        ),
    ] = None,
    reset: Annotated[
        bool, typer.Option("--reset", help="Delete the session's stored memory first.")
    ] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
    json_out: JsonOption = False,
    headless: Annotated[
        bool,
        typer.Option(
            "--headless", help="Run --replay FILE without the terminal UI (the default with it)."
        ),
    ] = False,
    export: Annotated[
        Path,
        typer.Option(
            metavar="FILE.json", help="Where the chat's Ctrl+S / /export writes the session."
        ),
    ] = Path("vc-session.json"),
) -> None:
    """Chat with the configured LLM through memory (a terminal UI), or replay a file headless.

    Without --replay: the chat terminal — tag panel with activity, budget bar (core / hint /
    tags / conversation), turn list (Ctrl+B / Ctrl+F), turn inspector (Ctrl+I / F2), /compact
    (Ctrl+K), brief mode (Ctrl+T), session export (Ctrl+S); needs the tui extra.

    With --replay FILE (headless): per user turn, the inbound hook (tags, broad / temporal,
    memory tokens, recalled turns, time), a reply (the file's, else the `llm:` model's when
    one is configured, else a placeholder), then the turn-complete hook, which may compact.
    One table row per turn."""
    with cli_errors():
        if budget is not None and budget < 64:
            raise InputError(f"--budget must be at least 64 tokens, got {budget}")
        if replay is None:
            if headless:
                raise InputError("--headless runs a file: pass --replay FILE (.txt or .json)")
            _interactive(config, session, budget, context_window, reset, export)
            return
        preamble, pairs = read_replay(replay)
        if out is not None:
            _check_out(out)  # before the replay stores anything: a rerun would store it twice
        turns: list[ReplayTurn] = []
        history = [m for m in preamble if m.role == "system"]
        opened = open_engine(config, session, llm=True, context_window=context_window)
        with opened as engine, _closing_client(engine):
            if reset:
                engine.delete_session(session)
            live = list(history)
            console = Console(stderr=True)
            with Progress(
                TextColumn("[bold]replay[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
                disable=not (progress and console.is_terminal) or len(pairs) < 10,
            ) as bar:
                task = bar.add_task("", total=len(pairs))
                for number, (user, answer) in enumerate(pairs, start=1):
                    turn, live = _replay_turn(engine, number, user, answer, history, live, budget)
                    turns.append(turn)
                    bar.advance(task)
        payload: dict[str, Any] = {
            "session": session,
            "source": replay,
            "turns": [t.model_dump() for t in turns],
            "messages": [{"role": m.role, "content": m.text()} for m in history],
        }
        if out is not None:
            try:
                out.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")
            except OSError as exc:
                raise InputError(f"{out}: cannot write ({exc.strerror or exc})") from None
    if json_out:
        echo_json(payload)
        return
    Console().print(_table(turns, session))
    if out is not None:
        typer.echo(f"wrote {len(turns)} turns to {out}", err=True)
