"""``contextfold ask``: retrieve from the corpus, pack the five-section context under a budget,
show it with the budget table and the sources — and, given an LLM endpoint, the answer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.build import budget_for
from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.corpus import MODES, DbOption, open_index
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
    "AskOutcome",
    "SourceRow",
    "answer_question",
    "ask_command",
    "build_answer_context",
    "source_rows",
]

DEFAULT_INSTRUCTIONS = (
    "You answer questions from the retrieved documents in the context. Cite every document "
    "you rely on by its label, e.g. [Source 1]. If the documents do not answer the question, "
    "say so plainly. Be brief."
)


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
) -> ContextResult:
    """The packed context for ``query``: instructions, the query, memory notes, the hits
    (labelled ``Source n: file``, best first) and tool outputs, under the named budget."""
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
            },
        )
        for n, hit in enumerate(hits, start=1)
    ]
    items += [ContextItem(content=m, source=SourceType.MEMORY) for m in memory or []]
    items += [ContextItem(content=t, source=SourceType.TOOL) for t in tool_outputs or []]
    return pipeline.add_items(items).build(query)


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
) -> AskOutcome:
    """Search ``index``, pack the five-section context, and ask ``llm`` (with ``model``) when
    one is given: the path of ``contextfold ask`` and of the dashboard's Ask page."""
    hits = index.search(query, k, mode=mode)
    result = build_answer_context(
        query,
        hits,
        budget=budget,
        max_tokens=max_tokens,
        system=system or DEFAULT_INSTRUCTIONS,
        memory=memory,
        tool_outputs=tool_outputs,
        format_name="openai" if llm is not None else "text",
    )
    answer = None
    if llm is not None and model is not None:
        answer = llm.chat(result.formatted_output["messages"], model).text
    return AskOutcome(hits=hits, result=result, answer=answer)


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
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Answer a question from the ingested corpus under a token budget.

    Prints the assembled context (instructions, goal, memory, retrieval, tool outputs), the
    budget table (budget / used / % / ⚠ TRUNCATED) and the sources. With --llm and --model
    it sends the context to that endpoint and prints the answer with its [Source n] citations.
    """
    with cli_errors():
        if budget not in ("fixed5", "rag"):
            raise InputError(f"--budget must be fixed5 or rag, got {budget!r}")
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if k <= 0:
            raise InputError(f"-k must be a positive number of chunks, got {k}")
        if (llm is None) != (model is None):
            raise InputError("--llm and --model go together: name the endpoint and the model")
        index = open_index(db, embed=mode != "bm25", must_exist=True)
        options: dict[str, Any] = {
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
        result, hits, answer = outcome.result, outcome.hits, outcome.answer
    if json_out:
        payload = json.loads(result.to_json())
        payload["answer"] = answer
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    console = Console()
    typer.echo(result.text)
    typer.echo("")
    typer.echo(result.explain(), nl=False)
    console.print(_sources_table(result, hits))
    if answer is not None:
        typer.echo("\nAnswer:\n" + answer)
