"""Where a store lives, spelled as people spell it: every spelling of a PostgreSQL URL opens
PostgreSQL (never an SQLite file named after the URL, its password in the path), any other URL
is an error that names the supported forms without the password, and ``mcp --store URL``
reaches the database the URL names."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from typer.testing import CliRunner

from contextfold.cli import app
from contextfold.errors import ConfigError
from contextfold.memory.config import load_config
from contextfold.server.config import load_server_config
from contextfold.store import (
    STORE_URL_ENV,
    database_location,
    describe_store,
    is_database_url,
    masked_location,
    open_catalogue,
    open_document_store,
    open_graph_store,
    open_memory_store,
    store_url,
)
from contextfold.tokens import CharCounter

CONTEXTFOLD = Path(sys.executable).with_name("contextfold")

MESSAGES = [
    {"role": "user", "content": "hello kitchen budget"},
    {"role": "assistant", "content": "ok noted"},
]


def _spellings(url: str) -> list[str]:
    """``url`` (``postgresql://...``) as people write it: the SQLAlchemy driver form, any case,
    the short scheme, surrounding white space."""
    rest = url.removeprefix("postgresql://")
    return [
        f"postgresql+psycopg://{rest}",
        f"POSTGRESQL://{rest}",
        f"PostgreSQL://{rest}",
        f"postgres://{rest}",
        f" postgresql://{rest}",
        f"postgresql://{rest}\n",
    ]


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# -- spellings, without a server -----------------------------------------------------------


@pytest.mark.parametrize("spelled", _spellings("postgresql://app:s3cret@db.internal:5432/memory"))
def test_every_postgresql_spelling_is_one_url_psycopg_reads(spelled: str) -> None:
    assert database_location(spelled) == "postgresql://app:s3cret@db.internal:5432/memory"
    assert is_database_url(database_location(spelled))


@pytest.mark.parametrize(
    "location",
    ["memory.db", "/var/lib/contextfold/memory.db", ":memory:", Path("a/b.db"), "C:/data/m.db"],
)
def test_a_file_path_is_left_as_it_is(location: str | Path) -> None:
    assert not is_database_url(location)
    assert database_location(location) == location


@pytest.mark.parametrize(
    ("location", "scheme"),
    [
        ("mysql://app:s3cret@x/y", "mysql"),
        ("sqlite://app:s3cret@/m.db", "sqlite"),
        (" MySQL://app:s3cret@x/y", "mysql"),
        ("http://app:s3cret@x/y", "http"),
        ("postgresql:/app:s3cret@x/y", "postgresql"),  # a URL whose // a Path() collapsed
        (Path("mysql://app:s3cret@x/y"), "mysql"),
    ],
)
def test_another_url_is_an_error_naming_the_supported_forms_never_the_password(
    location: str | Path, scheme: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        database_location(location)
    message = str(raised.value)
    assert "s3cret" not in message and "***" in message
    assert scheme in message.lower() and "postgresql://" in message and "SQLite" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "opener",
    [
        lambda where: open_memory_store(where, counter=CharCounter()),
        open_document_store,
        open_graph_store,
        open_catalogue,
    ],
)
def test_no_store_opens_a_file_for_another_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opener: object
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="mysql"):
        opener("mysql://app:s3cret@x/y")  # type: ignore[operator]
    assert _files(tmp_path) == set()


def test_masked_location_masks_any_url_and_keeps_its_spelling() -> None:
    assert masked_location("mysql://app:s3cret@x/y") == "mysql://app:***@x/y"
    assert masked_location("postgresql://app:s3cret@[::1]:5432/m") == (
        "postgresql://app:***@[::1]:5432/m"
    )
    assert masked_location("postgresql://app@h/m?password=s3cret&sslmode=require") == (
        "postgresql://app@h/m?password=***&sslmode=require"
    )
    assert masked_location("postgresql://app@Host/m") == "postgresql://app@Host/m"


def test_the_environment_url_is_normalised_and_another_scheme_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(STORE_URL_ENV, " POSTGRESQL://app:s3cret@h/m ")
    assert store_url("memory.db") == "postgresql://app:s3cret@h/m"
    monkeypatch.setenv(STORE_URL_ENV, "mysql://app:s3cret@h/m")
    with pytest.raises(ConfigError, match=STORE_URL_ENV):
        store_url(None)
    assert describe_store(None) == "mysql://app:***@h/m"  # describing never raises


@pytest.mark.parametrize("key", ["store", "storage_path"])
def test_a_memory_config_with_another_url_is_invalid(tmp_path: Path, key: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(f'{key}: "mysql://app:s3cret@x/y"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert key in str(raised.value) and "mysql" in str(raised.value)
    assert "s3cret" not in str(raised.value)
    result = CliRunner().invoke(app, ["config", "validate", str(path)])
    assert result.exit_code == 2 and key in result.stderr and "s3cret" not in result.output


def test_a_memory_config_url_is_normalised(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("store: postgresql+psycopg://app:s3cret@h/m\n", encoding="utf-8")
    assert load_config(path).store == "postgresql://app:s3cret@h/m"


@pytest.mark.parametrize("section", ["context_api: {graph_path: %s}", "dashboard: {corpus: %s}"])
def test_a_server_config_with_another_url_is_invalid(tmp_path: Path, section: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(section % '"mysql://app:s3cret@x/y"' + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_server_config(path)
    assert "mysql" in str(raised.value) and "s3cret" not in str(raised.value)
    path.write_text(section % '"POSTGRESQL://app:s3cret@h/m"' + "\n", encoding="utf-8")
    cfg = load_server_config(path)
    assert "postgresql://app:s3cret@h/m" in (cfg.context_api.graph_path, cfg.dashboard.corpus)


# -- the CLI, with a real PostgreSQL -------------------------------------------------------


def _compact(folder: Path) -> list[str]:
    (folder / "m.yaml").write_text("recall:\n  embedder: none\n", encoding="utf-8")
    (folder / "msgs.json").write_text(json.dumps(MESSAGES), encoding="utf-8")
    return ["memory", "compact", "-i", "msgs.json", "--config", "m.yaml"]


def _texts(url: str, session: str) -> list[str]:
    store = open_memory_store(url, counter=CharCounter())
    try:
        return [turn.message.text() for turn in store.turns(session)]
    finally:
        store.close()


def test_every_spelling_in_the_environment_stores_in_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    args = _compact(tmp_path)
    before = _files(tmp_path)
    for n, spelled in enumerate(_spellings(postgres_url)):
        monkeypatch.setenv(STORE_URL_ENV, spelled)
        result = CliRunner().invoke(app, [*args, "--session", f"s{n}"])
        assert result.exit_code == 0, result.output
        assert _texts(postgres_url, f"s{n}") == [m["content"] for m in MESSAGES], spelled
    assert _files(tmp_path) == before  # no SQLite file named after the URL


@pytest.mark.parametrize("where", ["env", "config"])
def test_another_scheme_is_a_one_line_error_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.chdir(tmp_path)
    args = _compact(tmp_path)
    if where == "env":
        monkeypatch.setenv(STORE_URL_ENV, "mysql://app:s3cret@x/y")
    else:
        (tmp_path / "m.yaml").write_text(
            'store: "mysql://app:s3cret@x/y"\nrecall:\n  embedder: none\n', encoding="utf-8"
        )
    before = _files(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    if where == "env":
        assert result.stderr.count("\n") == 1 and STORE_URL_ENV in result.stderr
    else:  # a config file's errors are listed one key a line, as always
        assert "m.yaml" in result.stderr and "  store: " in result.stderr
    assert "mysql" in result.stderr and "postgresql://" in result.stderr
    assert "s3cret" not in result.output
    assert _files(tmp_path) == before


def test_mcp_store_option_takes_a_postgresql_url(tmp_path: Path, postgres_url: str) -> None:
    """``mcp --store URL``: the URL reaches PostgreSQL whole (a ``Path`` would collapse its
    ``//`` into an SQLite file), and it wins over ``$CONTEXTFOLD_STORE_URL``."""
    (tmp_path / "m.yaml").write_text("recall:\n  embedder: none\n", encoding="utf-8")
    params = StdioServerParameters(
        command=str(CONTEXTFOLD),
        args=[
            *("mcp", "--session", "viamcp", "--store", postgres_url),
            *("--config", "m.yaml", "--no-embed"),
        ],
        env={
            "CONTEXTFOLD_HOME": str(tmp_path / "home"),
            "PATH": os.environ.get("PATH", ""),
            STORE_URL_ENV: str(tmp_path / "elsewhere.db"),
        },
        cwd=str(tmp_path),
    )
    with (
        (tmp_path / "stderr.log").open("w", encoding="utf-8") as errlog,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60)
        ) as client,
    ):
        result = portal.call(client.call_tool, "compact_context", {"messages": MESSAGES})
        assert not result.is_error, result.content
    assert _texts(postgres_url, "viamcp") == [m["content"] for m in MESSAGES]
    assert _files(tmp_path) == {"m.yaml", "stderr.log"}, (tmp_path / "stderr.log").read_text()


@pytest.mark.parametrize(
    ("store", "message"),
    [
        (" ", "--store is empty"),
        ("mysql://app:s3cret@x/y", "unsupported URL scheme 'mysql'"),
    ],
)
def test_mcp_refuses_a_bad_store_before_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_text("recall:\n  embedder: none\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["mcp", "--store", store, "--config", "m.yaml"])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and message in result.stderr and "s3cret" not in result.stderr
    assert _files(tmp_path) == {"m.yaml"}


def test_store_commands_read_every_spelling_and_refuse_another_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    """`store migrate`, `memory export --store` and `ingest --db` take a URL in any of its
    spellings, and refuse another scheme in one line that never shows the password (they
    checked the bare `postgresql://` prefix, and `ingest` printed a mysql URL whole)."""
    monkeypatch.chdir(tmp_path)
    args = _compact(tmp_path)
    monkeypatch.setenv(STORE_URL_ENV, postgres_url)
    assert CliRunner().invoke(app, [*args, "--session", "s"]).exit_code == 0
    monkeypatch.delenv(STORE_URL_ENV)
    shouted = _spellings(postgres_url)[1]  # POSTGRESQL://
    copied = CliRunner().invoke(
        app, ["store", "migrate", shouted, str(tmp_path / "copy.db"), "--no-progress"]
    )
    assert copied.exit_code == 0, copied.output
    exported = CliRunner().invoke(
        app, ["memory", "export", str(tmp_path / "out"), "--store", shouted, "-s", "s"]
    )
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "out").is_dir()
    (tmp_path / "a.txt").write_text("Refunds take fourteen days.\n", encoding="utf-8")
    before = _files(tmp_path)
    for command in (
        ["store", "migrate", "mysql://app:s3cret@x/y", str(tmp_path / "x.db")],
        ["memory", "export", str(tmp_path / "o2"), "--store", "mysql://app:s3cret@x/y"],
        ["ingest", "a.txt", "--db", "mysql://app:s3cret@x/y", "--no-embed"],
        ["search", "refunds", "--db", "mysql://app:s3cret@x/y"],
    ):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, command
        assert "unsupported URL scheme 'mysql'" in result.stderr, command
        assert "s3cret" not in result.output, command
    assert _files(tmp_path) == before
