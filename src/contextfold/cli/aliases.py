"""``contextfold memory aliases list | suggest | add ALIAS CANONICAL | remove ALIAS``: one
spelling per topic.

An alias (``db`` → ``database``) applies to every session of the store — or, added with
``-s SESSION``, to that session only — and to every later tagging and lookup; turns already
stored keep their tags. One command with an action argument
(rather than three subcommands) keeps the whole story on one ``--help`` page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.session import ConfigOption, JsonOption, echo_json, open_engine

if TYPE_CHECKING:
    from contextfold.memory.canonical import AliasSuggestion

__all__ = ["aliases_command"]

ACTIONS = ("list", "suggest", "add", "remove")
_ARITY = {"list": 0, "suggest": 0, "add": 2, "remove": 1}
_USAGE = {"add": "add takes ALIAS CANONICAL", "remove": "remove takes ALIAS"}


def aliases_command(
    action: Annotated[str, typer.Argument(metavar="ACTION", help="list, suggest, add or remove.")],
    tags: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[ALIAS [CANONICAL]]",
            help="For add: the spelling and its tag; for remove: the spelling.",
        ),
    ] = None,
    config: ConfigOption = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            "-s",
            metavar="ID",
            help="Only this session's aliases (add, remove, list); suggest reads its tags "
            "(default: 'default').",
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """List, suggest, add or remove tag aliases (db → database).

    `list`: every store-wide alias with the tag it resolves to; with -s, also the session's own
    aliases and its split tags (an over-broad tag split into sub-tags answers for all of them).
    `suggest`: aliases proposed among the session's tags (near-identical spellings, numeronyms
    such as k8s, initialisms such as ml); nothing is applied. `add ALIAS CANONICAL`: make
    ALIAS resolve to CANONICAL from now on, in every session or, with -s, in that session
    only (stored turns keep their tags). `remove ALIAS`: forget a store-wide alias (with -s,
    one of the session's)."""
    with cli_errors():
        if action not in ACTIONS:
            raise InputError(f"unknown action {action!r}; choose one of {', '.join(ACTIONS)}")
        args = tags or []
        if len(args) != _ARITY[action]:
            usage = _USAGE.get(action, f"{action} takes no tags")
            raise InputError(f"aliases {action}: {usage}, got {len(args)} argument(s)")
        scoped = session is not None and action != "suggest"
        with open_engine(
            config, session or "default", must_exist=action == "suggest" or scoped
        ) as engine:
            where = f" in session {session!r}" if scoped else ""
            if action == "add":
                engine.add_alias(args[0], args[1], session_id=session)
                source = engine.canonicalizer.fold(args[0])
                target = engine.canonicalizer.canonical(args[1] if scoped else source)
                typer.echo(f"alias {source} → {target}{where}")
                return
            if action == "remove":
                if not engine.remove_alias(args[0], session_id=session):
                    raise InputError(f"no alias {args[0]!r}{where}")
                typer.echo(f"removed alias {engine.canonicalizer.fold(args[0])}{where}")
                return
            if action == "suggest":
                _show_suggestions(engine.canonicalizer.suggest(engine.vocabulary()), json_out)
                return
            aliases = engine.canonicalizer.aliases
            if session is not None:
                aliases = {**aliases, **engine.vocab.session_aliases(session)}
                splits = engine.vocab.splits(session)
                aliases.update({t: " | ".join(subs) for t, subs in splits.items() if subs})
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
