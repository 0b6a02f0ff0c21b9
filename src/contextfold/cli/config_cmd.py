"""``contextfold config validate``, ``contextfold init`` and ``contextfold cost-report``: the
memory engine's configuration file, and what its LLM calls cost."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from contextfold.cli.common import EXIT_INPUT, InputError, cli_errors
from contextfold.cli.session import (
    DEFAULT_CONFIG,
    ConfigOption,
    JsonOption,
    echo_json,
    open_engine,
    print_pairs,
)
from contextfold.errors import ConfigError
from contextfold.store import describe_store

if TYPE_CHECKING:
    from contextfold.memory.config import MemoryConfig
    from contextfold.server.config import ServerConfig

__all__ = [
    "config_app",
    "config_kind",
    "cost_report_command",
    "init_command",
    "server_summary_rows",
    "summary_rows",
]

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
        ("storage", describe_store(cfg.store or cfg.storage_path)),
    ]


def server_summary_rows(cfg: ServerConfig) -> list[tuple[str, str]]:
    """A server config's main settings, one line each."""
    instances = ", ".join(f"{i.name} :{i.port} -> {i.upstream}" for i in cfg.proxy.instances)
    keys = cfg.context_api.api_keys
    return [
        ("listens on", f"{cfg.host}:{cfg.port}"),
        ("proxy upstream", cfg.proxy.upstream or "none (set proxy.upstream or --upstream)"),
        ("more ports", instances or "none"),
        ("context API keys", f"{len(keys)} ({', '.join(keys)})" if keys else "none"),
        ("dashboard", "on" if cfg.dashboard.enabled else "off"),
        ("memory config", cfg.memory_config or "defaults"),
    ]


def config_kind(path: Path) -> str:
    """``server`` when the file's top-level keys are all server-config keys (or it is one
    ``server:`` mapping, which the server check then explains), else ``memory``."""
    import yaml

    from contextfold.server.config import ServerConfig

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "memory"  # the memory loader reports the problem
    if not isinstance(data, dict) or not data:
        return "memory"
    keys = set(data)
    return "server" if keys <= set(ServerConfig.model_fields) or keys == {"server"} else "memory"


@config_app.command("validate")
def validate_command(
    file: Annotated[
        Path | None,
        typer.Argument(metavar="FILE", help="The file to check (default: ./contextfold.yaml)."),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print JSON, also when the file is invalid: {"ok": false, "message": ...}.',
        ),
    ] = False,
) -> None:
    """Validate a contextfold.yaml or a server config (contextfold serve --config FILE).

    The kind is told by the top-level keys: a file of only server keys (host, port, proxy,
    context_api, dashboard, limits, ...) is a server config; the memory config it names
    (memory_config, relative to the server config's folder) is checked too. Prints `ok` and a
    summary of the main settings, or each problem (YAML syntax errors with their line, unknown
    keys, values out of range, an API key pasted where a variable name belongs — never echoed)
    and exits 2. With --json the answer is JSON either way."""
    from contextfold.memory.config import load_config
    from contextfold.server.config import load_server_config

    path = file or DEFAULT_CONFIG
    kind = config_kind(path) if path.is_file() else "memory"
    try:
        cfg: Any = load_server_config(path) if kind == "server" else load_config(path)
        if kind == "server" and cfg.memory_config:
            _check_memory_config(path, cfg.memory_config)
    except ConfigError as exc:
        if not json_out:
            with cli_errors():
                raise
        message = str(exc)
        echo_json(
            {
                "ok": False,
                "file": str(path),
                "kind": kind,
                "error": type(exc).__name__,
                "message": message,
                "problems": [line.strip() for line in message.splitlines()[1:]],
            }
        )
        raise typer.Exit(EXIT_INPUT) from None
    if json_out:
        echo_json(
            {"ok": True, "file": str(path), "kind": kind, "config": cfg.model_dump(mode="json")}
        )
        return
    if kind == "server":
        typer.echo(f"ok: {path} (server config)")
        print_pairs("", server_summary_rows(cfg))
        return
    typer.echo(f"ok: {path}")
    print_pairs("", summary_rows(cfg))


def _check_memory_config(path: Path, memory_config: str) -> None:
    """``ConfigError`` naming ``memory_config`` when the memory config a server config names
    cannot be loaded (missing, unreadable or invalid): `serve` would refuse to start."""
    from contextfold.memory.config import load_config

    try:
        load_config(memory_config)
    except ConfigError as exc:
        first, _, rest = str(exc).partition("\n")
        raise ConfigError(
            f"{path}: memory_config {memory_config!r}: {first}" + (f"\n{rest}" if rest else "")
        ) from None


def init_command(
    kind: Annotated[
        str | None,
        typer.Argument(metavar="KIND", help="chat, coding or rag (not with --from)."),
    ] = None,
    path: Annotated[Path, typer.Option(metavar="FILE", help="Where to write it.")] = DEFAULT_CONFIG,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="FILE",
            help="Convert a virtual-context.yaml (seed 001's config) instead of a template: "
            "its memory keys into --path, its proxy instances into --server-path.",
        ),
    ] = None,
    server_path: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --from: where the server config goes (default: server.yaml beside "
            "--path), for `contextfold proxy -c FILE`.",
        ),
    ] = None,
) -> None:
    """Write a commented starter contextfold.yaml (chat, coding or rag), or convert one.

    Every key is shown with its default and what it does. With --from virtual-context.yaml,
    its keys are converted (proxy instances, `label` -> `name`, go to a server config that
    `contextfold proxy -c server.yaml` starts without --upstream) and every key that could
    not be carried over is listed. Refuses to overwrite a file unless --force."""
    from contextfold.memory.config import template

    with cli_errors():
        if source is not None:
            if kind is not None:
                raise InputError("pass a template KIND or --from FILE, not both")
            _init_from(source, path, server_path, force)
            return
        if kind is None:
            raise InputError("pass a template KIND (chat, coding or rag) or --from FILE")
        text = template(kind)
        _check_target(path, force)
        _write(path, text)
    typer.echo(
        f"wrote {path} ({kind} template); check it with `contextfold config validate {path}`"
    )


def _check_target(path: Path, force: bool) -> None:
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass --path FILE")
    if path.exists() and not force:
        raise InputError(f"{path} already exists; pass --force to overwrite it")


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _validated(model: type[Any], data: dict[str, Any], what: str, source: Path) -> None:
    from pydantic import ValidationError

    try:
        model.model_validate(data)
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise InputError(
            f"{source}: converted to an invalid {what}; fix these keys in it:\n" + "\n".join(lines)
        ) from None


def _init_from(source: Path, path: Path, server_path: Path | None, force: bool) -> None:
    """``init --from``: convert ``source``, validate both results, then write them."""
    import yaml

    from contextfold.cli.convert import convert
    from contextfold.memory.config import MemoryConfig, SplittingSettings
    from contextfold.server.config import ServerConfig

    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping at the top level")
    splitting = tuple(
        k
        for k in (
            "enabled",
            "frequency_threshold",
            "frequency_pct_threshold",
            "max_splits_per_turn",
        )
        if k in SplittingSettings.model_fields
    )
    memory, server, notes = convert(data, splitting_keys=splitting)
    _validated(MemoryConfig, memory, "contextfold.yaml", source)
    header = f"# converted from {source} by `contextfold init --from`\n"
    targets = [(path, header + yaml.safe_dump(memory, sort_keys=False, allow_unicode=True))]
    if server is not None:
        server_file = server_path or path.parent / "server.yaml"
        server = {**server, "memory_config": str(path.resolve())}
        _validated(ServerConfig, server, "server config", source)
        targets.append(
            (server_file, header + yaml.safe_dump(server, sort_keys=False, allow_unicode=True))
        )
    for target, _ in targets:
        _check_target(target, force)
    for target, text in targets:
        _write(target, text)
        typer.echo(f"wrote {target}")
    for note in notes:
        typer.echo(f"  note: {note}")
    if server is not None:
        typer.echo(f"start the proxy instances with `contextfold proxy -c {targets[1][0]}`")


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
    from contextfold.cli.memory_files import store_location
    from contextfold.store import is_database_url
    from contextfold.store.models import CostReport

    with cli_errors():
        if all_sessions and session is not None:
            raise InputError("pass --session ID or --all, not both")
        sid = session or "default"
        location = store_location(config, None)
        if not is_database_url(location) and not Path(location).exists() and location != ":memory:":
            # no store yet: nothing was logged (and a report creates none)
            report = CostReport(
                calls=0, prompt_tokens=0, completion_tokens=0, cost_usd=0.0, by_kind={}
            )
        else:
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
