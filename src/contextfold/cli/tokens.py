"""``contextfold tokens``: count the tokens of a file (or stdin) exactly, offline."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from contextfold.cli.common import cli_errors, counter_from, read_text

__all__ = ["tokens_command"]


def tokens_command(
    file: Annotated[
        str, typer.Argument(metavar="FILE", help="A UTF-8 text file; '-' reads stdin.")
    ],
    model: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL", help="Count for this model: gpt-4o, gpt-4, a Claude or a Gemini model."
        ),
    ] = None,
    encoding: Annotated[
        str | None,
        typer.Option(
            metavar="ENCODING",
            help="Count with this encoding: o200k_base (default) or cl100k_base.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Count the tokens of FILE with an exact offline tokenizer.

    Claude and Gemini have no public tokenizer: their counts are o200k_base plus a safety
    margin and are reported as estimated.
    """
    with cli_errors():
        counter = counter_from(model, encoding)
        name, text = read_text(file)
        count = counter.count(text)
    facts = {
        "file": name,
        "tokens": count,
        "encoding": counter.encoding_name,
        "counter": counter.name,
        "estimated": counter.estimated,
        "characters": len(text),
        "model": model,
    }
    if json_out:
        typer.echo(json.dumps(facts, indent=2))
        return
    typer.echo(f"{name}")
    typer.echo(f"  tokens      {count:,}" + ("  (estimated)" if counter.estimated else "  (exact)"))
    typer.echo(f"  encoding    {counter.name}" + (f"  for {model}" if model else ""))
    typer.echo(f"  characters  {len(text):,}")
