"""What the memory commands share: the ``--config`` / ``--session`` / ``--json`` options, opening
the ``MemoryEngine`` a command works on, and reading a JSON file of chat messages.

The configuration is ``--config FILE``, else ``./contextfold.yaml`` when it exists, else the
built-in defaults; memory lives where it says (``storage_path``, default
``$CONTEXTFOLD_HOME/memory.db``).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.common import InputError, read_text
from contextfold.errors import ConfigError, FormatError, StoreError
from contextfold.formats.openai import message_from_dict
from contextfold.items import Message
from contextfold.store import describe_store

if TYPE_CHECKING:
    from contextfold.memory.config import MemoryConfig
    from contextfold.memory.engine import MemoryEngine

__all__ = [
    "DEFAULT_CONFIG",
    "ConfigOption",
    "JsonOption",
    "SessionOption",
    "echo_json",
    "excerpt",
    "open_engine",
    "print_pairs",
    "read_messages",
    "resolve_config",
]

DEFAULT_CONFIG = Path("contextfold.yaml")
#: The keys of a message file's message that are read (any other is ignored).
_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "function_call")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="contextfold.yaml to use (default: ./contextfold.yaml if it exists, else the "
        "built-in defaults).",
    ),
]
SessionOption = Annotated[
    str, typer.Option("--session", "-s", metavar="ID", help="The conversation session.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def resolve_config(path: Path | None) -> tuple[MemoryConfig, Path | None]:
    """The validated configuration and the file it came from (``None``: the defaults)."""
    from contextfold.memory.config import MemoryConfig, load_config

    if path is None:
        if not DEFAULT_CONFIG.is_file():
            return MemoryConfig(), None
        path = DEFAULT_CONFIG
    return load_config(path), path


class _NoModel:
    """The LLM client of a command that never calls the model: it needs no API key, and a call
    (a bug) fails loudly instead of reaching a provider."""

    def chat(self, messages: Any, model: str, **params: Any) -> Any:
        raise ConfigError("this command does not call the configured LLM")


def open_engine(
    config: Path | None,
    session: str,
    *,
    must_exist: bool = False,
    llm: bool = False,
    context_window: int | None = None,
) -> MemoryEngine:
    """The engine for ``config`` with ``session`` as its default session. With ``must_exist``,
    a session that was never stored is an input error naming the sessions there are. Without
    ``llm`` the configured model's client is not built (so no API key is needed).
    ``context_window`` overrides the config's (validated like it)."""
    from contextfold.memory.config import parse_config
    from contextfold.memory.engine import MemoryEngine

    if not session.strip():
        raise InputError("--session is empty; name a session (the default is 'default')")
    cfg, _ = resolve_config(config)
    if context_window is not None:
        cfg = parse_config(
            {**cfg.model_dump(exclude_unset=True), "context_window": context_window},
            source="--context-window",
        )
    try:
        engine = MemoryEngine(
            cfg, session_id=session, llm_client=None if llm or cfg.llm is None else _NoModel()
        )
    except (OSError, sqlite3.Error, StoreError) as exc:
        where = describe_store(cfg.store or cfg.storage_path)
        raise InputError(f"cannot open the memory store {where}: {exc}") from None
    if must_exist:
        sessions = engine.store.sessions()
        if session not in sessions:
            engine.close()
            known = f"sessions there: {', '.join(sessions[:10])}" if sessions else "it is empty"
            raise InputError(
                f"no session {session!r} in {engine.store.path} ({known}); store one with "
                "`contextfold memory compact -i FILE` or `contextfold chat --replay FILE`"
            )
    return engine


def _shape(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string"}
    return next((n for t, n in names.items() if isinstance(value, t)), "a value")


def read_messages(source: str) -> list[Message]:
    """The messages of a JSON file: a list of ``{"role", "content"}`` objects, or an object
    with such a list under ``"messages"`` (a ``contextfold chat --out`` export). A content may
    be text or content blocks; OpenAI's tool traffic reads as tool blocks too (an assistant's
    ``tool_calls``, with ``null`` or no content; a ``tool`` message's ``tool_call_id``). Other
    keys of a message are ignored; a ``null`` content reads as ``""``."""
    name, text = read_text(source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{name}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    if isinstance(data, dict):
        if "messages" not in data:
            keys = ", ".join(sorted(map(str, data))[:6]) or "none"
            raise InputError(
                f'{name}: expected a list of messages or an object with a "messages" list, '
                f"got an object with keys {keys}"
            )
        data = data["messages"]
    if not isinstance(data, list):
        raise InputError(f"{name}: expected a list of messages, got {_shape(data)}")
    if not data:
        raise InputError(f"{name}: the message list is empty")
    messages = []
    for number, item in enumerate(data, start=1):
        if (
            not isinstance(item, dict)
            or "role" not in item
            or ("content" not in item and "tool_calls" not in item)
        ):
            raise InputError(
                f'{name}: message {number} must be an object with "role" and "content", '
                f"got {excerpt(json.dumps(item, ensure_ascii=False), 60)}"
            )
        fields = {k: v for k, v in item.items() if k in _FIELDS and v is not None}
        if "tool_calls" not in fields:
            fields.setdefault("content", "")
        try:
            messages.append(message_from_dict(fields))
        except FormatError as exc:
            plain = _as_text(fields)
            if plain is None:
                raise InputError(f"{name}: message {number}: {exc}") from None
            messages.append(plain)
    return messages


def _as_text(fields: dict[str, Any]) -> Message | None:
    """A message with a text content whose tool call the parser does not read (OpenAI's
    legacy ``function_call``, a ``custom`` tool call, arguments cut off mid-JSON), read as its
    text alone, as such a file always was; ``None`` for any other message."""
    if fields.get("role") == "tool" or not isinstance(fields.get("content"), str):
        return None
    if not {"tool_calls", "function_call"} & set(fields):
        return None
    try:
        return message_from_dict({k: fields[k] for k in ("role", "content", "name") if k in fields})
    except FormatError:
        return None


def echo_json(data: object) -> None:
    """``data`` as indented JSON on stdout."""
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def print_pairs(title: str, rows: list[tuple[str, str]], *, stderr: bool = False) -> None:
    """A two-column key / value table (on stderr with ``stderr``)."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    Console(stderr=stderr).print(table)


def excerpt(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
