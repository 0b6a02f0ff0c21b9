"""``contextfold ask``: retrieve from the corpus, pack the five-section context under a budget,
and print the answer first (given an LLM endpoint) — or, without one, say so in one line and
show the best source's passage. ``--show context,budget,sources`` prints the rest."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.build import budget_for
from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.corpus import MODES, DbOption, TenantsOption, check_tenants, open_index
from contextfold.formats import formatter_for
from contextfold.items import ContextItem, SourceType
from contextfold.llm.base import ChatClient
from contextfold.pipeline import ContextPipeline
from contextfold.result import ContextResult
from contextfold.retrieval.base import SearchHit
from contextfold.retrieval.index import DocumentIndex, SearchMode
from contextfold.tokens import TiktokenCounter
from contextfold.window import Action

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "SHOW",
    "AskOutcome",
    "SourceRow",
    "answer_question",
    "ask_command",
    "build_answer_context",
    "chunk_label",
    "parse_show",
    "source_rows",
]

#: What ``--show`` can add after the answer (or the best passage).
SHOW = ("context", "budget", "sources")
NO_LLM = (
    "no LLM configured, so no answer (add --llm BASE_URL --model MODEL for any OpenAI-compatible "
    "endpoint, e.g. --llm http://localhost:11434/v1 --model llama3.2); the best passage:"
)

DEFAULT_INSTRUCTIONS = (
    "You answer questions from the retrieved documents in the context. Cite every document "
    "you rely on by its label, e.g. [Source 1]. If the documents do not answer the question, "
    "say so plainly. Be brief."
)


def chunk_label(n: int, hit: SearchHit) -> str:
    """How ``ask`` names hit ``n`` (1-based) everywhere a person reads it: its ``[Source n]``
    label, file, title (when the document has one) and chunk position."""
    meta = hit.metadata
    name = str(meta.get("source") or meta.get("doc_id"))
    title = meta.get("title")
    if isinstance(title, str) and title.strip():
        short = title if len(title) <= 48 else title[:47] + "…"
        name += f' "{short}"'
    chunk = meta.get("chunk_index")
    position = f" chunk {chunk + 1}" if isinstance(chunk, int) else ""
    return f"[Source {n}] {name}{position}"


def build_answer_context(
    query: str,
    hits: list[SearchHit],
    *,
    budget: str = "fixed5",
    max_tokens: int | None = None,
    system: str = DEFAULT_INSTRUCTIONS,
    memory: list[str] | None = None,
    tool_outputs: list[str] | None = None,
    format_name: str = "text",
    extra: Sequence[ContextItem] = (),
) -> ContextResult:
    """The packed context for ``query``: instructions, the query, memory notes, the hits
    (labelled ``Source n: file``, best first) and tool outputs, under the named budget;
    ``extra`` items (conversation turns, scored memory) compete in their sections too."""
    pipeline = ContextPipeline(
        budget=budget_for(budget, max_tokens),
        formatter=formatter_for(format_name),
        counter=TiktokenCounter("cl100k_base"),
    ).add_system_prompt(system)
    items = [
        ContextItem(
            id=hit.id,
            content=hit.text,
            source=SourceType.RETRIEVAL,
            score=hit.score,
            metadata={
                **hit.metadata,
                "source": f"Source {n}: {hit.metadata.get('source') or hit.metadata.get('doc_id')}",
                "match_source": hit.match_source,
                "label": chunk_label(n, hit),
            },
        )
        for n, hit in enumerate(hits, start=1)
    ]
    items += [ContextItem(content=m, source=SourceType.MEMORY) for m in memory or []]
    items += [ContextItem(content=t, source=SourceType.TOOL) for t in tool_outputs or []]
    return pipeline.add_items([*items, *extra]).build(query)


@dataclass(frozen=True)
class SourceRow:
    """One retrieved chunk as the sources table shows it: its ``[Source n]`` label, file,
    score, which signals found it, and what the packer did with it (``status``: ``kept``,
    ``⚠ truncated 212→97`` or ``dropped (reason)``)."""

    label: str
    file: str
    score: float
    match: str
    action: str
    status: str
    tokens_before: int | None
    tokens_after: int | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def source_rows(result: ContextResult, hits: list[SearchHit]) -> list[SourceRow]:
    """The sources table of ``result``: one row per hit, best first."""
    decisions = {d.item_id: d for d in result.decisions}
    rows = []
    for n, hit in enumerate(hits, start=1):
        decision = decisions.get(hit.id)
        action = "?" if decision is None else str(decision.action.value)
        status = action
        if decision is not None and decision.action == Action.TRUNCATED:
            status = f"⚠ truncated {decision.tokens_before}→{decision.tokens_after}"
        elif decision is not None and decision.action == Action.DROPPED:
            status = f"dropped ({decision.reason})"
        rows.append(
            SourceRow(
                label=f"[Source {n}]",
                file=str(hit.metadata.get("source") or hit.metadata.get("doc_id")),
                score=hit.score,
                match=hit.match_source,
                action=action,
                status=status,
                tokens_before=None if decision is None else decision.tokens_before,
                tokens_after=None if decision is None else decision.tokens_after,
            )
        )
    return rows


def _sources_table(result: ContextResult, hits: list[SearchHit]) -> Table:
    table = Table(title="Sources", title_justify="left")
    for column in ("label", "file", "score", "match", "in context"):
        table.add_column(column)
    for row in source_rows(result, hits):
        table.add_row(row.label, row.file, f"{row.score:.4f}", row.match, row.status)
    return table


@dataclass(frozen=True)
class AskOutcome:
    """What ``answer_question`` found: the hits, the packed context, and the answer (``None``
    without an LLM)."""

    hits: list[SearchHit]
    result: ContextResult
    answer: str | None


def answer_question(
    index: DocumentIndex,
    query: str,
    *,
    k: int = 8,
    mode: SearchMode = "hybrid",
    budget: str = "fixed5",
    max_tokens: int | None = None,
    system: str | None = None,
    memory: list[str] | None = None,
    tool_outputs: list[str] | None = None,
    llm: ChatClient | None = None,
    model: str | None = None,
    extra: Sequence[ContextItem] = (),
    tenants: Sequence[str] | None = None,
) -> AskOutcome:
    """Search ``index`` (only ``tenants`` when given; ``None`` is every tenant), pack the
    five-section context, and ask ``llm`` (with ``model``) when one is given: the path of
    ``contextfold ask`` (which always names its tenants) and of the dashboard's Ask page."""
    hits = index.search(query, k, mode=mode, tenants=tenants)
    result = build_answer_context(
        query,
        hits,
        budget=budget,
        max_tokens=max_tokens,
        system=system or DEFAULT_INSTRUCTIONS,
        memory=memory,
        tool_outputs=tool_outputs,
        format_name="openai" if llm is not None else "text",
        extra=extra,
    )
    answer = None
    if llm is not None and model is not None:
        answer = llm.chat(result.formatted_output["messages"], model).text
    return AskOutcome(hits=hits, result=result, answer=answer)


def parse_show(values: list[str] | None) -> list[str]:
    """The ``--show`` values, repeatable or comma-separated (``all`` is every one), in the
    order ``SHOW`` lists them."""
    wanted: set[str] = set()
    for value in values or []:
        for part in (p.strip().lower() for p in value.split(",")):
            if part == "all":
                wanted.update(SHOW)
            elif part in SHOW:
                wanted.add(part)
            elif part:
                raise InputError(
                    f"--show takes {', '.join(SHOW)} or all (repeat it or separate with "
                    f"commas), got {part!r}"
                )
    return [name for name in SHOW if name in wanted]


def _summary(result: ContextResult, hits: list[SearchHit], show: list[str]) -> str:
    d = result.diagnostics
    rows = source_rows(result, hits)
    cut = sum(r.action == Action.TRUNCATED.value for r in rows)
    dropped = sum(r.action == Action.DROPPED.value for r in rows)
    used = len(rows) - dropped
    more = [name for name in SHOW if name not in show]
    hint = f"; more: --show {','.join(more)}" if more else ""
    return (
        f"context: {d.used_tokens:,} of {d.available:,} tokens, {used} of {len(rows)} sources "
        f"in it ({cut} cut, {dropped} dropped){hint}"
    )


def _print_outcome(outcome: AskOutcome, show: list[str]) -> None:
    result, hits, answer = outcome.result, outcome.hits, outcome.answer
    if answer is not None:
        typer.echo(answer.strip())
    else:
        typer.echo(NO_LLM)
        if hits:
            best = hits[0]
            typer.echo(f"\n{chunk_label(1, best)} (score {best.score:.4f})")
            for line in best.text.strip().splitlines():  # wrapped at 100 columns, line by line
                typer.echo("\n".join(textwrap.wrap(line, 100)) if line.strip() else "")
        else:
            typer.echo("\n(no passage in the corpus matches the question)")
    typer.echo("\n" + _summary(result, hits, show))
    if "context" in show:
        typer.echo("\n" + result.text.rstrip())
    if "budget" in show:
        typer.echo("\n" + result.explain(), nl=False)
    if "sources" in show:
        typer.echo("")
        Console().print(_sources_table(result, hits))


def ask_command(
    query: Annotated[str, typer.Argument(metavar="QUESTION", help="The question to answer.")],
    budget: Annotated[
        str, typer.Option(metavar="NAME", help="fixed5 (the five fixed sections) or rag.")
    ] = "fixed5",
    max_tokens: Annotated[
        int | None, typer.Option(metavar="N", help="Window size for --budget rag (default 8,192).")
    ] = None,
    k: Annotated[int, typer.Option("-k", metavar="N", help="Chunks to retrieve.")] = 8,
    mode: Annotated[str, typer.Option(metavar="MODE", help="bm25, dense or hybrid.")] = "hybrid",
    db: DbOption = None,
    tenant: TenantsOption = None,
    system: Annotated[
        str | None, typer.Option(metavar="TEXT", help="Instructions (default: cite sources).")
    ] = None,
    memory: Annotated[
        list[str] | None, typer.Option(metavar="TEXT", help="A memory note (repeatable).")
    ] = None,
    tool_output: Annotated[
        list[str] | None, typer.Option(metavar="TEXT", help="A tool output (repeatable).")
    ] = None,
    llm: Annotated[
        str | None,
        typer.Option(
            metavar="BASE_URL",
            help="OpenAI-compatible API root (e.g. http://localhost:11434/v1) to answer with.",
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(metavar="MODEL", help="Model for --llm.")] = None,
    api_key_env: Annotated[
        str, typer.Option(metavar="VAR", help="Environment variable holding the API key.")
    ] = "OPENAI_API_KEY",
    show: Annotated[
        list[str] | None,
        typer.Option(
            metavar="WHAT",
            help="Also print context (the packed prompt), budget (the budget table and every "
            "cut or dropped item) and/or sources (the sources table); repeatable or "
            "comma-separated, or all.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Answer a question from the ingested corpus under a token budget.

    With --llm and --model it sends the packed context to that OpenAI-compatible endpoint and
    prints the answer first, with its [Source n] citations. Without an LLM it says so in one
    line and prints the best source's passage. Then one line sums up the context (tokens,
    sources kept, cut and dropped); --show context,budget,sources prints the packed prompt,
    the budget table (budget / used / % / ⚠ TRUNCATED, every cut or dropped chunk by name) and
    the sources table, each source named by its file's path under the folder ingested.

    Only the tenants given with --tenant are read, as by search; without it, the tenant
    'default' (what ingest stores without --tenant), so an answer never mixes tenants unasked.
    """
    with cli_errors():
        shown = parse_show(show)
        if budget not in ("fixed5", "rag"):
            raise InputError(f"--budget must be fixed5 or rag, got {budget!r}")
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if not query.strip():
            raise InputError("the question is empty; ask something")
        if k <= 0:
            raise InputError(f"-k must be a positive number of chunks, got {k}")
        if (llm is None) != (model is None):
            raise InputError("--llm and --model go together: name the endpoint and the model")
        index = open_index(db, embed=mode != "bm25", must_exist=True)
        options: dict[str, Any] = {
            "tenants": check_tenants(index, tenant),
            "k": k,
            "mode": mode,
            "budget": budget,
            "max_tokens": max_tokens,
            "system": system,
            "memory": memory,
            "tool_outputs": tool_output,
        }
        if llm is not None and model is not None:
            from contextfold.llm import OpenAICompatibleClient

            with OpenAICompatibleClient(llm, api_key=os.environ.get(api_key_env)) as client:
                outcome = answer_question(index, query, llm=client, model=model, **options)
        else:
            outcome = answer_question(index, query, **options)
    if json_out:
        payload = json.loads(outcome.result.to_json())
        payload["answer"] = outcome.answer
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    _print_outcome(outcome, shown)
