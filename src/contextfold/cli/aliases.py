"""``contextfold memory aliases list | suggest | add ALIAS CANONICAL``: one spelling per topic.

An alias (``db`` → ``database``) applies to every session of the store and to every later
tagging and lookup; turns already stored keep their tags. One command with an action argument
(rather than three subcommands) keeps the whole story on one ``--help`` page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.session import ConfigOption, JsonOption, SessionOption, echo_json, open_engine

if TYPE_CHECKING:
    from contextfold.memory.canonical import AliasSuggestion

__all__ = ["aliases_command"]

ACTIONS = ("list", "suggest", "add")


def aliases_command(
    action: Annotated[str, typer.Argument(metavar="ACTION", help="list, suggest or add.")],
    tags: Annotated[
        list[str] | None,
        typer.Argument(metavar="ALIAS CANONICAL", help="For add: the spelling and its tag."),
    ] = None,
    config: ConfigOption = None,
    session: SessionOption = "default",
    json_out: JsonOption = False,
) -> None:
    """List, suggest or add tag aliases (db → database).

    `list`: every alias with the tag it resolves to. `suggest`: aliases proposed among the
    session's tags (near-identical spellings, numeronyms such as k8s, initialisms such as ml);
    nothing is applied. `add ALIAS CANONICAL`: make ALIAS resolve to CANONICAL from now on, in
    every session (stored turns keep their tags)."""
    with cli_errors():
        if action not in ACTIONS:
            raise InputError(f"unknown action {action!r}; choose one of {', '.join(ACTIONS)}")
        args = tags or []
        if (action == "add") != bool(args) or (args and len(args) != 2):
            usage = "add takes ALIAS CANONICAL" if action == "add" else f"{action} takes no tags"
            raise InputError(f"aliases {action}: {usage}, got {len(args)} argument(s)")
        with open_engine(config, session, must_exist=action == "suggest") as engine:
            if action == "add":
                engine.add_alias(args[0], args[1])
                source = engine.canonicalizer.fold(args[0])
                typer.echo(f"alias {source} → {engine.canonicalizer.canonical(source)}")
                return
            if action == "suggest":
                _show_suggestions(engine.canonicalizer.suggest(engine.vocabulary()), json_out)
                return
            aliases = engine.canonicalizer.aliases
    if json_out:
        echo_json(aliases)
    elif not aliases:
        typer.echo("no aliases; add one with `contextfold memory aliases add ALIAS CANONICAL`")
    else:
        for alias, canonical in aliases.items():
            typer.echo(f"{alias} → {canonical}")


def _show_suggestions(suggestions: list[AliasSuggestion], json_out: bool) -> None:
    if json_out:
        echo_json([s.model_dump() for s in suggestions])
        return
    if not suggestions:
        typer.echo("no suggestions: no two tags look like spellings of one topic")
        return
    table = Table(title="alias suggestions", title_justify="left")
    for column in ("alias", "canonical", "reason", "apply with"):
        table.add_column(column)
    for s in suggestions:
        apply = f"contextfold memory aliases add {s.alias} {s.canonical}"
        table.add_row(s.alias, s.canonical, s.reason, apply)
    Console().print(table)
