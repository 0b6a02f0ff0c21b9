"""``contextfold memory domains``: every tag of a conversation with its turn count, its
segments and its summary — the whole vocabulary memory has built, and what each topic holds.

A tag's summary is its tag summary (built when its turns are compacted); a tag whose turns are
all still live has none yet, and says so.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.common import cli_errors
from contextfold.cli.memory_files import require_stored_memory
from contextfold.cli.session import (
    ConfigOption,
    JsonOption,
    SessionOption,
    echo_json,
    excerpt,
    open_engine,
)

__all__ = ["domains_command"]

NO_SUMMARY = "(no summary yet: its turns are not compacted)"


def domains_command(
    config: ConfigOption = None,
    session: SessionOption = "default",
    full: Annotated[
        bool, typer.Option("--full", help="Whole summaries (default: the first 200 characters).")
    ] = False,
    json_out: JsonOption = False,
) -> None:
    """Every tag with its turn count, segments and summary (most used first).

    The summary is the tag summary built at compaction; "stale" when turns with the tag
    arrived after it was built."""
    with cli_errors():
        require_stored_memory(config, session)
        with open_engine(config, session, must_exist=True) as engine:
            counts = engine.status().tags
            summaries = engine.store.paging.tag_summaries(session)
            segments: dict[str, int] = {}
            for segment in engine.store.segments(session, full_text=False):
                for tag in segment.tags:
                    segments[tag] = segments.get(tag, 0) + 1
    rows: list[dict[str, Any]] = []
    for tag, turns in counts.items():
        summary = summaries.get(tag)
        rows.append(
            {
                "tag": tag,
                "turns": turns,
                "segments": segments.get(tag, 0),
                "summary": summary.summary if summary is not None else None,
                "summary_tokens": summary.tokens if summary is not None else 0,
                "stale": bool(summary is not None and summary.stale),
            }
        )
    if json_out:
        echo_json(rows)
        return
    if not rows:
        typer.echo(f"no tags yet in session {session!r}")
        return
    table = Table(title=f"domains of session {session!r}", title_justify="left", expand=True)
    table.add_column("tag", no_wrap=True)
    table.add_column("turns", justify="right")
    table.add_column("segments", justify="right")
    table.add_column("summary", ratio=1)
    for row in rows:
        text = row["summary"]
        if text is None:
            shown = NO_SUMMARY
        else:
            shown = text if full else excerpt(text, 200)
            shown += f" [{row['summary_tokens']} tokens{', stale' if row['stale'] else ''}]"
        table.add_row(str(row["tag"]), str(row["turns"]), str(row["segments"]), shown)
    Console(width=max(120, Console().width)).print(table)
