"""``contextfold mcp``: serve memory and the document corpus to MCP clients over stdio.

An MCP client (Claude Desktop, an IDE, an agent framework) launches this command and talks
JSON-RPC over its stdin/stdout, so nothing else is ever written to stdout; errors before the
server starts are one ``error:`` line on stderr and exit code 2, like every command.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING, Annotated

import typer

from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.corpus import DbOption
from contextfold.cli.session import ConfigOption, SessionOption, resolve_config
from contextfold.errors import StoreError
from contextfold.store import describe_store, masked_location

if TYPE_CHECKING:
    from contextfold.mcp_server import LogLevel

__all__ = ["mcp_command"]

LEVELS: tuple[LogLevel, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def mcp_command(
    config: ConfigOption = None,
    session: SessionOption = "default",
    store: Annotated[
        str | None,
        typer.Option(
            metavar="LOCATION",
            help="The memory store: an SQLite file or a postgresql:// URL; overrides "
            "$CONTEXTFOLD_STORE_URL and store: of the config (default: "
            "$CONTEXTFOLD_HOME/memory.db).",
        ),
    ] = None,
    db: DbOption = None,
    embed: Annotated[
        bool,
        typer.Option(
            "--embed/--no-embed",
            help="Dense and hybrid corpus search with the offline embedding model "
            "(--no-embed: BM25 only, no model loads).",
        ),
    ] = True,
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="Server log level on stderr: DEBUG ... CRITICAL.")
    ] = "WARNING",
) -> None:
    """Run the MCP server on stdio: memory tools (recall_context, compact_context,
    domain_status, expand_topic, collapse_topic, find_quote), corpus tools (search_documents,
    get_context), the contextfold://topics resources and the recall / summarize_session
    prompts. See docs/mcp.md for client configuration."""
    from contextfold.memory.engine import MemoryEngine

    with cli_errors():
        try:
            from contextfold.mcp_server import create_server
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing not in ("mcp", "mcp_types"):
                raise
            raise InputError(
                f"the MCP server needs the mcp SDK ({missing} is missing): "
                'pip install "contextfold[mcp]"'
            ) from None
        level = next((lv for lv in LEVELS if lv == log_level.upper()), None)
        if level is None:
            raise InputError(f"--log-level must be one of {', '.join(LEVELS)}, got {log_level!r}")
        if not session.strip():
            raise InputError("--session is empty; name a session (the default is 'default')")
        if store is not None and not store.strip():
            raise InputError("--store is empty; name an SQLite file or a postgresql:// URL")
        cfg, _ = resolve_config(config)
        try:
            engine = MemoryEngine(cfg, store=store, session_id=session)
        except (OSError, sqlite3.Error, StoreError) as exc:
            where = (
                masked_location(store) if store else describe_store(cfg.store or cfg.storage_path)
            )
            raise InputError(f"cannot open the memory store {where}: {exc}") from None
    with engine:
        server = create_server(engine, corpus=db, embed=embed, log_level=level)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C when run by hand: stop quietly
            server.run("stdio")
