"""``contextfold memory``: look inside a conversation's memory and drive its hooks by hand.

``status``, ``tags``, ``domains`` (``contextfold.cli.domains``), ``recall`` and ``quote`` read
what is stored; ``compact`` ingests a
message file and compacts it; ``retrieve`` and ``transform`` run the inbound hook on one
message (what a request would get); ``aliases`` lists, suggests and adds tag aliases;
``export`` / ``import`` write memory to a folder of markdown files and read it back
(``contextfold.cli.memory_files``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.aliases import aliases_command
from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.domains import domains_command
from contextfold.cli.memory_files import export_command, import_command, require_stored_memory
from contextfold.cli.session import (
    ConfigOption,
    JsonOption,
    SessionOption,
    echo_json,
    excerpt,
    open_engine,
    print_pairs,
    read_messages,
)

if TYPE_CHECKING:
    from contextfold.memory.compactor import CompactionReport
    from contextfold.memory.engine import AssembledContext, MemoryEngine

__all__ = ["memory_app"]

memory_app = typer.Typer(
    help="Inspect a conversation's memory: status, tags, summaries, recall, aliases, quotes; "
    "export it to markdown files and import it back.",
    no_args_is_help=True,
)

MessageOption = Annotated[
    str, typer.Option("--message", "-m", metavar="MSG", help="The user message to answer.")
]


def _check_limit(limit: int) -> None:
    """A ``--limit`` below 0 is an input error (0 means all where a command allows it)."""
    if limit < 0:
        raise InputError(f"--limit must be 0 or more, got {limit}")


@memory_app.command("status")
def status_command(
    config: ConfigOption = None, session: SessionOption = "default", json_out: JsonOption = False
) -> None:
    """Turns, live window, compaction state, segments, tag summaries, working set.

    The live turns are those not compacted yet; the level says whether they cross the soft or
    hard compaction threshold of the context window."""
    with cli_errors():
        require_stored_memory(config, session)
        with open_engine(config, session, must_exist=True) as engine:
            status = engine.status()
            thresholds = engine.config.compaction
    if json_out:
        echo_json(status.model_dump(mode="json"))
        return
    share = status.live_tokens / status.context_window
    working = ", ".join(f"{t} ({d})" for t, d in status.working_set.items()) or "—"
    print_pairs(
        f"memory of session {status.session_id!r}",
        [
            ("turns", f"{status.turns:,}"),
            ("live", f"{status.live_turns:,} turns, {status.live_tokens:,} tokens"),
            ("window", f"{status.context_window:,} tokens ({share:.0%} used)"),
            (
                "level",
                f"{status.level} (soft {thresholds.soft_threshold:.0%}, "
                f"hard {thresholds.hard_threshold:.0%})",
            ),
            ("watermark", f"turn {status.compaction_watermark:,} (older turns are compacted)"),
            ("segments", f"{status.segments:,}"),
            ("tags", f"{len(status.tags):,}"),
            (
                "tag summaries",
                f"{status.tag_summaries:,} ({status.stale_tag_summaries:,} stale)",
            ),
            ("working set", working),
        ],
    )


@memory_app.command("tags")
def tags_command(
    config: ConfigOption = None,
    session: SessionOption = "default",
    limit: Annotated[int, typer.Option(metavar="N", help="Show the N most used tags; 0: all.")] = 0,
    json_out: JsonOption = False,
) -> None:
    """The session's tags with their turn counts and tag-summary state.

    Most used first. A summary is stale when newer turns with the tag arrived after it was
    built."""
    with cli_errors():
        _check_limit(limit)
        require_stored_memory(config, session)
        with open_engine(config, session, must_exist=True) as engine:
            counts = engine.status().tags
            summaries = engine.store.paging.tag_summaries(session)
    rows = [
        {
            "tag": tag,
            "turns": count,
            "summary": tag in summaries,
            "stale": tag in summaries and summaries[tag].stale,
        }
        for tag, count in list(counts.items())[: limit or None]
    ]
    if json_out:
        echo_json(rows)
        return
    if not rows:
        typer.echo("no tags yet")
        return
    table = Table(title=f"tags of session {session!r}", title_justify="left")
    table.add_column("tag")
    table.add_column("turns", justify="right")
    table.add_column("summary")
    for row in rows:
        summary = ("stale" if row["stale"] else "yes") if row["summary"] else "—"
        table.add_row(str(row["tag"]), str(row["turns"]), summary)
    Console().print(table)


def _most_used(vocabulary: dict[str, int]) -> list[str]:
    """The tags by turn count, most used first (ties by name), as ``memory tags`` lists them."""
    return [tag for tag, _ in sorted(vocabulary.items(), key=lambda kv: (-kv[1], kv[0]))]


def _resolve_tag(engine: MemoryEngine, tag: str, vocabulary: dict[str, int]) -> str:
    for candidate in (engine.canonicalizer.canonical(tag), engine.canonicalizer.fold(tag)):
        if candidate in vocabulary:
            return candidate
    wanted = engine.canonicalizer.canonical(tag) or tag
    close = difflib.get_close_matches(wanted, list(vocabulary), n=5, cutoff=0.6)
    close += [t for t in vocabulary if wanted and wanted in t and t not in close][: 5 - len(close)]
    hint = (
        f"close matches: {', '.join(close)}"
        if close
        else f"most used tags: {', '.join(_most_used(vocabulary)[:8]) or 'none yet'}"
    )
    raise InputError(f"unknown tag {tag!r} in session {engine.session_id!r}; {hint}")


@memory_app.command("recall")
def recall_command(
    tag: Annotated[str, typer.Argument(metavar="TAG", help="A tag (any spelling or alias).")],
    config: ConfigOption = None,
    session: SessionOption = "default",
    json_out: JsonOption = False,
) -> None:
    """The stored tag summary of TAG and the summaries of every segment tagged with it."""
    with cli_errors():
        require_stored_memory(config, session)
        with open_engine(config, session, must_exist=True) as engine:
            name = _resolve_tag(engine, tag, engine.vocabulary())
            summary = engine.store.paging.tag_summaries(session).get(name)
            segments = engine.store.segments(session, tag=name, full_text=False)
    if json_out:
        echo_json(
            {
                "tag": name,
                "summary": summary.model_dump(mode="json") if summary else None,
                "segments": [s.model_dump(mode="json", exclude={"full_text"}) for s in segments],
            }
        )
        return
    if summary is None:
        typer.echo(f"no tag summary for {name!r} yet (its turns are still live)")
    else:
        state = "stale: newer turns since" if summary.stale else "up to date"
        typer.echo(f"tag summary of {name!r} ({summary.tokens} tokens, {state}):")
        typer.echo(summary.summary)
    typer.echo(f"\n{len(segments)} segment(s) tagged {name!r}:")
    for seg in segments:
        tags = ", ".join(seg.tags[:6]) + (", …" if len(seg.tags) > 6 else "")
        typer.echo(
            f"\n#{seg.id}  turns {seg.first_seq}–{seg.last_seq}  "
            f"{seg.summary_tokens} tokens  [{tags}]"
        )
        typer.echo(seg.summary)


def _report_rows(report: CompactionReport) -> list[tuple[str, str]]:
    return [
        ("level", report.level),
        ("turns compacted", f"{report.turns_compacted:,}"),
        ("segments", f"{report.segments_compacted:,}"),
        ("tokens compacted", f"{report.tokens_compacted:,}"),
        ("summary tokens", f"{report.summary_tokens:,}"),
        ("tokens freed", f"{report.tokens_freed:,}"),
        ("watermark", f"{report.watermark_before} → {report.watermark_after}"),
        ("tag summaries rebuilt", f"{len(report.tag_summaries_rebuilt):,}"),
        ("time", f"{report.duration_ms:,.0f} ms"),
    ]


@memory_app.command("compact")
def compact_command(
    input: Annotated[
        str | None,
        typer.Option(
            "--input",
            "-i",
            metavar="FILE",
            help='Messages to ingest first: a JSON list of {"role", "content"} or '
            '{"messages": [...]}; - reads stdin.',
        ),
    ] = None,
    config: ConfigOption = None,
    session: SessionOption = "default",
    json_out: JsonOption = False,
) -> None:
    """Ingest a conversation, then compact now, whatever the thresholds say.

    Turns already stored are skipped. Raw turns are kept; segment and tag summaries are
    added. The newest turns (compaction.protected_recent_turns) are never compacted."""
    reports: dict[str, CompactionReport] = {}
    with cli_errors():
        messages = read_messages(input) if input is not None else None
        if messages is None:  # nothing to store: the store must hold the session already
            require_stored_memory(config, session)
        with open_engine(config, session, must_exist=messages is None, llm=True) as engine:
            before = engine.store.last_seq(session)
            if messages is not None and (report := engine.ingest_history(messages)):
                reports["ingest"] = report
            if (report := engine.compact()) is not None:
                reports["forced"] = report
            stored = engine.store.last_seq(session) - before
    if json_out:
        echo_json({"turns_stored": stored, **{k: r.model_dump() for k, r in reports.items()}})
        return
    if messages is not None:
        typer.echo(f"stored {stored} new turn(s) of {len(messages)} message(s) in {session!r}")
    if not reports:
        typer.echo("nothing to compact: the live turns are all among the protected recent ones")
    for phase, report in reports.items():
        title = "compaction while ingesting" if phase == "ingest" else "forced compaction"
        print_pairs(title, _report_rows(report))


def _inbound(
    config: Path | None, session: str, message: str, budget: int | None, *, show: int = 0
) -> tuple[AssembledContext, dict[int, tuple[str, str]]]:
    """The inbound hook's result for ``message``, and ``(role, text)`` of the ``show`` best
    recalled turns."""
    if not message.strip():
        raise InputError("--message is empty")
    if budget is not None and budget < 64:
        raise InputError(f"--budget must be at least 64 tokens, got {budget}")
    require_stored_memory(config, session)
    with open_engine(config, session, must_exist=True) as engine:
        ctx = engine.on_message_inbound(message, budget=budget)
        turns: dict[int, tuple[str, str]] = {
            t.seq: (t.message.role, t.message.text())
            for r in ctx.recalled[:show]
            for t in engine.store.turns(session, start=r.seq, end=r.seq)
        }
    return ctx, turns


BudgetOption = Annotated[
    int | None,
    typer.Option(metavar="TOKENS", help="Memory budget (default: assembly.memory_budget)."),
]


@memory_app.command("retrieve")
def retrieve_command(
    message: MessageOption,
    config: ConfigOption = None,
    session: SessionOption = "default",
    limit: Annotated[int, typer.Option(metavar="N", help="Show the N best recalled turns.")] = 10,
    budget: BudgetOption = None,
) -> None:
    """Tag MSG and recall stored turns for it, as JSON.

    As the inbound hook would: the matched tags, the broad / temporal flags, each recalled turn
    with its fused score and the rank every signal gave it, and where the memory budget went.
    Like a real request, it may page matched topics in."""
    with cli_errors():
        _check_limit(limit)
        ctx, turns = _inbound(config, session, message, budget, show=limit)
    recalled = [
        {
            "seq": r.seq,
            "score": round(r.score, 6),
            "signals": r.ranks,
            "role": turns.get(r.seq, ("?", ""))[0],
            "text": excerpt(turns.get(r.seq, ("", ""))[1], 160),
        }
        for r in ctx.recalled[:limit]
    ]
    echo_json(
        {
            "message": message,
            "matched_tags": list(ctx.matched_tags),
            "related_tags": list(ctx.related_tags),
            "broad": ctx.broad,
            "temporal": ctx.temporal,
            "tagger": ctx.tagger,
            "recalled_total": len(ctx.recalled),
            "recalled": recalled,
            "expired": {"tags": list(ctx.expired_tags), "turns_held_back": ctx.expired_turns},
            "budget": ctx.budget.model_dump(),
        }
    )


@memory_app.command("transform")
def transform_command(
    message: MessageOption,
    config: ConfigOption = None,
    session: SessionOption = "default",
    budget: BudgetOption = None,
    json_out: JsonOption = False,
) -> None:
    """The memory block a request for MSG would get, and its budget.

    Tag, recall and assemble: ``prepend_text`` on stdout, the budget breakdown on stderr."""
    with cli_errors():
        ctx, _ = _inbound(config, session, message, budget)
    if json_out:
        echo_json(
            {
                "prepend_text": ctx.prepend_text,
                "matched_tags": list(ctx.matched_tags),
                "broad": ctx.broad,
                "temporal": ctx.temporal,
                "budget": ctx.budget.model_dump(),
                "expired": {"tags": list(ctx.expired_tags), "turns_held_back": ctx.expired_turns},
            }
        )
        return
    typer.echo(ctx.prepend_text or "(memory adds nothing for this message)")
    b = ctx.budget
    flags = [f for f, on in (("broad", ctx.broad), ("temporal", ctx.temporal)) if on]
    typer.echo(
        f"memory: {b.used:,} of {b.budget:,} tokens; tags: "
        + (", ".join(ctx.matched_tags) or "none")
        + (f" ({', '.join(flags)})" if flags else ""),
        err=True,
    )
    print_pairs(
        "",
        [
            ("topic hint", f"{b.hint:,}"),
            ("paged topics", f"{b.paged:,}"),
            ("summaries", f"{b.summaries:,}"),
            ("recalled turns", f"{b.turns:,} ({b.turns_recalled} in, {b.turns_skipped} skipped)"),
            ("total", f"{b.used:,} / {b.budget:,}"),
            *(
                [
                    (
                        "expired (held back)",
                        f"{ctx.expired_turns:,} turn(s) of {', '.join(ctx.expired_tags)}",
                    )
                ]
                if ctx.expired_tags
                else []
            ),
        ],
        stderr=True,
    )


@memory_app.command("quote")
def quote_command(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="Words to find verbatim.")],
    config: ConfigOption = None,
    session: SessionOption = "default",
    limit: Annotated[int, typer.Option("-k", metavar="N", help="Number of results.")] = 5,
    json_out: JsonOption = False,
) -> None:
    """Full-text search of the raw stored turns, compacted or not, bypassing tags."""
    with cli_errors():
        if limit <= 0:
            raise InputError(f"-k must be a positive number of results, got {limit}")
        require_stored_memory(config, session)
        with open_engine(config, session, must_exist=True) as engine:
            quotes = engine.find_quote(query, limit=limit)
    if json_out:
        echo_json([q.model_dump() for q in quotes])
        return
    if not quotes:
        typer.echo("no matches")
        return
    table = Table(title=f"quotes: {query}", title_justify="left")
    table.add_column("turn", justify="right")
    table.add_column("where", no_wrap=True)
    table.add_column("tags", max_width=22)
    table.add_column("excerpt", ratio=1)
    for q in quotes:
        where = f"{q.role}\n" + (f"segment #{q.segment_id}" if q.compacted else "live")
        table.add_row(str(q.seq), where, ", ".join(q.tags[:3]), q.excerpt)
    Console().print(table)


memory_app.command("domains")(domains_command)
memory_app.command("aliases")(aliases_command)
memory_app.command("export")(export_command)
memory_app.command("import")(import_command)
