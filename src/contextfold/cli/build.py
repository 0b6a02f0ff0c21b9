"""``contextfold build``: pack a request's context under a budget, print the payload and, with
``--explain``, the per-section budget table and every cut or dropped item."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from contextfold.budget import (
    TokenBudget,
    default_agent_budget,
    default_chat_budget,
    default_rag_budget,
    fixed5_budget,
)
from contextfold.cli.common import InputError, cli_errors, counter_from, read_text
from contextfold.cli.request import BuildRequest, parse_request
from contextfold.formats import formatter_for
from contextfold.pipeline import ContextPipeline
from contextfold.result import ContextResult

__all__ = ["BUDGETS", "DEFAULT_MAX_TOKENS", "FORMATS", "budget_for", "build_command"]

DEFAULT_MAX_TOKENS = 8192
BUDGETS = ("fixed5", "chat", "rag", "agent")
FORMATS = ("text", "openai", "anthropic", "gemini")
_PRESETS = {"chat": default_chat_budget, "rag": default_rag_budget, "agent": default_agent_budget}


def budget_for(name: str, max_tokens: int | None) -> TokenBudget:
    """The budget preset called ``name``; ``max_tokens`` sizes chat / rag / agent."""
    if name == "fixed5":
        if max_tokens is not None:
            raise InputError(
                f"--max-tokens does not apply to --budget fixed5 (five fixed sections, "
                f"{fixed5_budget().max_tokens:,} tokens with the format's frame); use chat, rag "
                "or agent to size the window"
            )
        return fixed5_budget()
    if max_tokens is not None and max_tokens <= 0:
        raise InputError(f"--max-tokens must be a positive number of tokens, got {max_tokens:,}")
    if name not in _PRESETS:
        raise InputError(f"unknown budget {name!r}; choose one of {', '.join(BUDGETS)}")
    return _PRESETS[name](DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)


def _request(input_file: str | None, system: str | None, query: str | None) -> BuildRequest:
    request = BuildRequest()
    if input_file is not None:
        name, text = read_text(input_file)
        request = parse_request(text, name)
    query = request.query if query is None else query
    if not query.strip():
        raise InputError('no query: pass --query TEXT or put a "query" in the --input file')
    system = request.system if system is None else system
    return BuildRequest(system=system, query=query, items=request.items)


def _run(
    request: BuildRequest, budget: TokenBudget, format_name: str, model: str | None
) -> ContextResult:
    if format_name not in FORMATS:
        raise InputError(f"unknown format {format_name!r}; choose one of {', '.join(FORMATS)}")
    pipeline = ContextPipeline(
        budget=budget, formatter=formatter_for(format_name), counter=counter_from(model, None)
    )
    if request.system.strip():
        pipeline.add_system_prompt(request.system)
    pipeline.add_items(request.items)
    return pipeline.build(request.query)


def build_command(
    input_file: Annotated[
        str | None,
        typer.Option(
            "--input",
            "-i",
            metavar="FILE.json",
            help="Candidate context as JSON (system, query, memory, retrieval, tool_outputs, "
            "history); '-' reads stdin. See examples/travel_request.json.",
        ),
    ] = None,
    system: Annotated[
        str | None, typer.Option(metavar="TEXT", help="System prompt (overrides the file's).")
    ] = None,
    query: Annotated[
        str | None, typer.Option(metavar="TEXT", help="The question (overrides the file's).")
    ] = None,
    budget: Annotated[
        str, typer.Option(metavar="NAME", help="Budget preset: fixed5, chat, rag or agent.")
    ] = "chat",
    max_tokens: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help=f"Window size for chat / rag / agent (default {DEFAULT_MAX_TOKENS:,}); "
            "fixed5 is fixed.",
        ),
    ] = None,
    format_name: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            metavar="NAME",
            help="Payload format: text, openai, anthropic, gemini.",
        ),
    ] = "text",
    model: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL", help="Count tokens for this model (default: exact o200k_base)."
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Also print the budget table and every truncated or dropped item (to stderr).",
        ),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the whole result (payload + diagnostics) as JSON.")
    ] = False,
) -> None:
    """Pack context under a token budget and print the formatted payload.

    Instructions and the query are pinned; memory, retrieved chunks, tool outputs and history
    compete for their budget sections. --explain shows budget / used / status per section.
    """
    with cli_errors():
        request = _request(input_file, system, query)
        result = _run(request, budget_for(budget, max_tokens), format_name, model)
    if json_out:
        typer.echo(result.to_json())
    elif isinstance(result.formatted_output, str):
        typer.echo(result.formatted_output)
    else:
        typer.echo(json.dumps(result.formatted_output, indent=2, ensure_ascii=False))
    if explain:
        typer.echo("", err=True)
        typer.echo(result.explain(), err=True, nl=False)
