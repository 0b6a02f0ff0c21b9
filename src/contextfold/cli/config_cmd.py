"""``contextfold config validate``, ``contextfold init`` and ``contextfold cost-report``: the
memory engine's configuration file, and what its LLM calls cost."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.session import (
    DEFAULT_CONFIG,
    ConfigOption,
    JsonOption,
    echo_json,
    open_engine,
    print_pairs,
)

if TYPE_CHECKING:
    from contextfold.memory.config import MemoryConfig

__all__ = ["config_app", "cost_report_command", "init_command", "summary_rows"]

config_app = typer.Typer(help="Check a contextfold.yaml.", no_args_is_help=True)


def summary_rows(cfg: MemoryConfig) -> list[tuple[str, str]]:
    """The settings that matter most, one line each."""
    c, a = cfg.compaction, cfg.assembly
    llm = f"{cfg.llm.provider} {cfg.llm.model}" if cfg.llm else "none (offline)"
    return [
        ("context window", f"{cfg.context_window:,} tokens ({cfg.encoding})"),
        (
            "compaction",
            f"at {c.soft_threshold:.0%} / {c.hard_threshold:.0%} of the window, "
            f"{c.summarizer} summaries, newest {c.protected_recent_turns} turns protected",
        ),
        (
            "tagging",
            f"{cfg.tagger.type} (inbound: {cfg.tagger.inbound}), {len(cfg.tag_rules)} rules",
        ),
        ("recall", f"embedder {cfg.recall.embedder}, memory budget {a.memory_budget:,} tokens"),
        (
            "paging",
            f"{cfg.paging.mode}, {cfg.paging.budget:,} tokens" if cfg.paging.enabled else "off",
        ),
        ("llm", llm),
        ("storage", cfg.storage_path or "$CONTEXTFOLD_HOME/memory.db"),
    ]


@config_app.command("validate")
def validate_command(
    file: Annotated[
        Path | None,
        typer.Argument(metavar="FILE", help="The file to check (default: ./contextfold.yaml)."),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Validate a contextfold.yaml.

    Prints `ok` and a summary of the main settings, or each problem (YAML syntax errors with
    their line, unknown keys, values out of range) and exits 2."""
    from contextfold.memory.config import load_config

    path = file or DEFAULT_CONFIG
    with cli_errors():
        cfg = load_config(path)
    if json_out:
        echo_json({"ok": True, "file": str(path), "config": cfg.model_dump(mode="json")})
        return
    typer.echo(f"ok: {path}")
    print_pairs("", summary_rows(cfg))


def init_command(
    kind: Annotated[str, typer.Argument(metavar="KIND", help="chat, coding or rag.")],
    path: Annotated[Path, typer.Option(metavar="FILE", help="Where to write it.")] = DEFAULT_CONFIG,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter contextfold.yaml (chat, coding or rag).

    Every key is shown with its default and what it does. Refuses to overwrite a file unless
    --force."""
    from contextfold.memory.config import template

    with cli_errors():
        text = template(kind)
        if path.is_dir():
            raise InputError(f"{path}: is a directory; pass --path FILE")
        if path.exists() and not force:
            raise InputError(f"{path} already exists; pass --force to overwrite it")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    typer.echo(
        f"wrote {path} ({kind} template); check it with `contextfold config validate {path}`"
    )


def cost_report_command(
    session: Annotated[
        str | None,
        typer.Option("--session", "-s", metavar="ID", help="One session (default: 'default')."),
    ] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Every session together.")] = False,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """What the memory engine's LLM calls cost, in total and by kind.

    Calls, tokens and dollars of tagging, summaries and chat replies, from the store's cost
    log. Prices come from the `llm:` section (prompt_price_per_million,
    completion_price_per_million)."""
    with cli_errors():
        if all_sessions and session is not None:
            raise InputError("pass --session ID or --all, not both")
        sid = session or "default"
        with open_engine(config, sid) as engine:
            report = engine.cost_report(session_id=sid, all_sessions=all_sessions)
    if json_out:
        echo_json(report.model_dump())
        return
    scope = "all sessions" if all_sessions else f"session {sid!r}"
    if not report.calls:
        typer.echo(f"no LLM calls logged for {scope}")
        return
    print_pairs(
        f"LLM cost for {scope}",
        [
            ("calls", f"{report.calls:,}"),
            ("prompt tokens", f"{report.prompt_tokens:,}"),
            ("completion tokens", f"{report.completion_tokens:,}"),
            ("cost", f"${report.cost_usd:,.4f}"),
        ],
    )
    if report.by_kind:
        table = Table(title="by kind", title_justify="left")
        table.add_column("kind")
        table.add_column("cost", justify="right")
        for kind, cost in report.by_kind.items():
            table.add_row(kind, f"${cost:,.4f}")
        Console().print(table)
