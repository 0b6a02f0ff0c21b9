"""The ``contextfold`` command line: one module per command group.

``tokens`` (:mod:`contextfold.cli.tokens`) counts tokens offline; ``build``
(:mod:`contextfold.cli.build`) packs a request under a budget and explains the result;
``ingest`` / ``search`` (:mod:`contextfold.cli.corpus`) index and query documents; ``ask``
(:mod:`contextfold.cli.ask`) answers from them under a budget; ``eval``
(:mod:`contextfold.cli.eval`) measures retrieval quality on public datasets. ``memory``
(:mod:`contextfold.cli.memory`) inspects and drives a conversation's memory; ``chat``
(:mod:`contextfold.cli.chat`) replays a conversation through it; ``config`` / ``init`` /
``cost-report`` (:mod:`contextfold.cli.config_cmd`) manage ``contextfold.yaml``; ``mcp``
(:mod:`contextfold.cli.mcp`) serves memory and the corpus to MCP clients; ``store migrate``
(:mod:`contextfold.cli.store`) copies a whole memory store to another (SQLite, PostgreSQL).
``serve`` / ``proxy`` (:mod:`contextfold.cli.serve`) run the HTTP server and LLM proxy. Errors
become one stderr line and an exit code in :mod:`contextfold.cli.common`, never a traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from contextfold.cli.ask import ask_command
from contextfold.cli.build import build_command
from contextfold.cli.chat import chat_command
from contextfold.cli.config_cmd import config_app, cost_report_command, init_command
from contextfold.cli.corpus import ingest_command, search_command
from contextfold.cli.eval import eval_app
from contextfold.cli.mcp import mcp_command
from contextfold.cli.memory import memory_app
from contextfold.cli.serve import proxy_command, serve_command
from contextfold.cli.store import store_app
from contextfold.cli.tokens import tokens_command

__all__ = ["app", "main"]

app = typer.Typer(
    name="contextfold",
    help="contextfold decides what an LLM sees: exact token budgets, provider formats, "
    "and an explanation of every decision.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.command("tokens")(tokens_command)
app.command("build")(build_command)
app.command("ingest")(ingest_command)
app.command("search")(search_command)
app.command("ask")(ask_command)
app.command("chat")(chat_command)
app.command("init")(init_command)
app.command("cost-report")(cost_report_command)
app.command("mcp")(mcp_command)
app.command("serve")(serve_command)
app.command("proxy")(proxy_command)
app.add_typer(eval_app, name="eval")
app.add_typer(memory_app, name="memory")
app.add_typer(config_app, name="config")
app.add_typer(store_app, name="store")


def _version(value: bool) -> None:
    if value:
        from contextfold import __version__

        typer.echo(f"contextfold {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """contextfold decides what an LLM sees: exact token budgets, provider formats, and an
    explanation of every decision."""


def main() -> None:
    """The ``contextfold`` console script."""
    app()
