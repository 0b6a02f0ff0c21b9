"""``contextfold store``: the memory store as a whole. ``migrate SRC DST`` copies every
session, the tag aliases and the cost log from one store to another — an SQLite file to a
``postgresql://`` database, back, or file to file — and checks the copy.

``open_store`` (also used by ``memory export`` / ``memory import``) opens a store named on the
command line with one clear error line for a path or URL that cannot be one (``check_location``
checks that alone, opening nothing); a store that is only to be read (migrate's SRC, export's
store) is checked first, by reading it only, to be a memory store of this version
(``check_memory_store``): opening one creates or upgrades its schema. ``require_memory_store``
tells a command that only reads memory through the engine that its store is not there yet,
before opening it would create it.
"""

from __future__ import annotations

import re
import shlex
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from contextfold.cli.common import EXIT_RUNTIME, InputError, cli_errors, fail
from contextfold.cli.session import print_pairs
from contextfold.errors import StoreError

if TYPE_CHECKING:
    from contextfold.store.protocols import MemoryStorage

__all__ = [
    "check_location",
    "check_memory_store",
    "open_store",
    "require_memory_store",
    "shown",
    "store_app",
    "transfer_progress",
]

store_app = typer.Typer(
    help="The memory store as a whole: migrate it to another store (SQLite or PostgreSQL).",
    no_args_is_help=True,
)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def shown(location: str) -> str:
    """``location`` fit to print: a URL's password masked."""
    if not _SCHEME.match(location):
        return location
    parts = urlsplit(location)
    if parts.password is None:
        return location
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _sqlite_migrations(location: str, what: str, schema: str) -> set[str]:
    """The migrations of ``schema`` applied in the SQLite file ``location``, read on a
    read-only connection (empty when it has none: not that store)."""
    try:
        conn = sqlite3.connect(f"{Path(location).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise InputError(f"cannot open the {what} {location}: {exc}") from None
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_migrations" not in tables:
            return set()
        rows = conn.execute("SELECT name FROM schema_migrations WHERE schema = ?", (schema,))
        return {str(r[0]) for r in rows}
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{what} {location}: not an SQLite database ({exc})") from None
    finally:
        conn.close()


def _postgres_migrations(location: str, what: str, schema: str) -> set[str]:
    """The migrations of ``schema`` applied in the database at ``location``, read in
    read-only transactions (empty when it has none: not that store)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - depends on the install
        raise InputError(
            "a postgresql:// store needs psycopg: pip install 'contextfold[postgres]'"
        ) from None
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        # Read-only beside the URL's own options (a search_path), which a keyword would replace.
        given = conninfo_to_dict(location).get("options") or ""
        read_only = f"{given} -c default_transaction_read_only=on".strip()
        with psycopg.connect(
            make_conninfo(location, options=read_only),
            autocommit=True,
            connect_timeout=30,
        ) as conn:
            row = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
            if row is None or row[0] is None:
                return set()
            rows = conn.execute(
                "SELECT name FROM schema_migrations WHERE schema = %s", (schema,)
            ).fetchall()
            return {str(r[0]) for r in rows}
    except psycopg.Error as exc:
        raise InputError(
            f"cannot open the {what} {shown(location)}: {type(exc).__name__}: {exc}"
        ) from None


def _memory_migrations(location: str, what: str) -> tuple[list[str], set[str]]:
    """This version's memory migrations, and those applied in the store at ``location``
    (an existing SQLite file or a ``postgresql://`` URL), read only."""
    from contextfold.store import is_database_url

    if is_database_url(location):
        from contextfold.store.postgres.schema import MIGRATIONS as PG_MIGRATIONS

        applied = _postgres_migrations(location, what, PG_MIGRATIONS.name)
        return list(PG_MIGRATIONS.names), applied
    from contextfold.store.sqlite.memory_schema import MIGRATIONS

    return list(MIGRATIONS.names), _sqlite_migrations(location, what, MIGRATIONS.name)


def upgrade_hint(location: str) -> str:
    """A command that opens the store at ``location`` once with this version, which creates
    its missing tables and runs its pending migrations (a command that reads only does not)."""
    return f"CONTEXTFOLD_STORE_URL={shlex.quote(shown(location))} contextfold memory aliases list"


def check_memory_store(location: str, *, what: str = "store") -> None:
    """``InputError`` unless ``location`` (an existing SQLite file or a ``postgresql://`` URL)
    holds a contextfold memory store with this version's schema, found by reading it only:
    opening a store creates and migrates its schema, which a store that is only to be read
    must not have done to it."""
    names, applied = _memory_migrations(location, what)
    if not applied:
        raise InputError(f"{what} {shown(location)}: not a contextfold memory store")
    pending = [n for n in names if n not in applied]
    if pending:
        raise InputError(
            f"{what} {shown(location)}: written by an older contextfold ({len(pending)} schema "
            f"migration(s) not run, from {pending[0]}); it is only read here, so upgrade it "
            f"first by opening it once with this version (`{upgrade_hint(location)}` does), "
            "then run this again"
        )


def _could_be_made(path: Path) -> bool:
    """Whether opening the SQLite file ``path``, which is not there, would make it: its
    nearest existing folder is a folder (a file there instead is an error opening it)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir()


def require_memory_store(location: str, *, session: str | None = None) -> None:
    """``InputError`` when the memory store at ``location`` (a command's configured one) does
    not exist yet, found without creating it: a command that only reads memory says so
    (naming the ``session`` it wanted) instead of making an empty store. A store an older
    version wrote passes (the engine that opens it upgrades it, as the deployment does)."""
    from contextfold.store import is_database_url

    location = normal_location(location, "memory store")
    if location == ":memory:":
        return
    wanted = f", so no session {session!r}" if session is not None else ""
    missing = (
        f"no memory store at {shown(location)} yet{wanted}; it is created by the first "
        "conversation (memory compact -i FILE, chat, the proxy, or memory import)"
    )
    if not is_database_url(location):
        path = Path(location)
        if not path.exists() and _could_be_made(path):
            raise InputError(missing)
        if not path.is_file():
            return  # not a file that can be read: opening it says why
    _, applied = _memory_migrations(location, "memory store")
    if not applied:
        if is_database_url(location):
            raise InputError(missing)
        raise InputError(f"memory store {location}: not a contextfold memory store")


def normal_location(location: str, what: str = "store") -> str:
    """``location`` as the stores read it (``store.database_location``): a PostgreSQL URL in
    any of its spellings (``postgres://``, ``postgresql+psycopg://``, any case, white space
    around it) as ``postgresql://…``; another URL scheme is an ``InputError`` that masks its
    password; anything else as given."""
    from contextfold.errors import ConfigError
    from contextfold.store import database_location

    if not location.strip():
        return location
    try:
        return str(database_location(location))
    except ConfigError as exc:
        raise InputError(str(exc).replace("store ", f"{what} ", 1)) from None


def check_location(
    location: str, *, must_exist: bool, what: str = "store", only_read: bool = False
) -> None:
    """``InputError`` when ``location`` cannot be the store ``open_store`` is asked for: an
    empty name, another URL scheme, ``:memory:``, a directory; with ``must_exist`` or
    ``only_read``, an SQLite file that is not there. Nothing is opened or created."""
    from contextfold.store import is_database_url

    if not location.strip():
        raise InputError(f"the {what} is empty; name an SQLite file or a postgresql:// URL")
    scheme = _SCHEME.match(location)
    if scheme and not is_database_url(location):
        raise InputError(
            f"{what} {shown(location)}: unsupported URL scheme {scheme.group(1)!r}; name an "
            "SQLite file or a postgresql:// URL"
        )
    if location == ":memory:":
        raise InputError(f"the {what} cannot be :memory: (it would vanish on exit)")
    if not is_database_url(location):
        path = Path(location)
        if path.is_dir():
            raise InputError(f"{what} {location}: is a directory, not an SQLite file")
        if (must_exist or only_read) and not path.is_file():
            raise InputError(f"{what} {location}: no such file")


@contextmanager
def open_store(
    location: str, *, must_exist: bool, what: str = "store", only_read: bool = False
) -> Iterator[MemoryStorage]:
    """The memory store at ``location`` (an SQLite file or a ``postgresql://`` URL), closed on
    exit. ``must_exist``: an SQLite file that is not there is an input error instead of a new,
    empty store. ``only_read``: the store is read, never created or migrated: ``location``
    must hold a memory store of this version already (``check_memory_store``)."""
    from contextfold.store import open_memory_store
    from contextfold.tokens import CharCounter

    location = normal_location(location, what)
    check_location(location, must_exist=must_exist, what=what, only_read=only_read)
    if only_read:
        check_memory_store(location, what=what)
    # Turns, segments and summaries keep the token counts they were stored with, so this
    # store counts nothing: a cheap counter spares loading an encoding.
    try:
        store = open_memory_store(location, counter=CharCounter())
    except NotImplementedError:  # a backend still being written: not the user's input
        raise
    except (OSError, sqlite3.Error, StoreError) as exc:
        raise InputError(f"cannot open the {what} {shown(location)}: {exc}") from None
    except Exception as exc:  # a database driver's own errors (unreachable host, bad login)
        raise InputError(
            f"cannot open the {what} {shown(location)}: {type(exc).__name__}: {exc}"
        ) from None
    try:
        yield store
    finally:
        store.close()


@contextmanager
def transfer_progress(
    label: str, sessions: int, turns: int, *, enabled: bool = True
) -> Iterator[Progress]:
    """Two bars on stderr: sessions and turns (hidden when stderr is not a terminal)."""
    console = Console(stderr=True)
    with Progress(
        TextColumn(f"[bold]{label}[/bold] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not (enabled and console.is_terminal),
    ) as bar:
        bar.add_task("sessions", total=sessions)
        bar.add_task("turns", total=turns)
        yield bar


ProgressOption = Annotated[
    bool, typer.Option("--progress/--no-progress", help="Progress bars on stderr.")
]


@store_app.command("migrate")
def migrate_command(
    src: Annotated[
        str,
        typer.Argument(
            metavar="SRC",
            help="The memory store to copy, only read: an SQLite file or a postgresql:// URL.",
        ),
    ],
    dst: Annotated[
        str,
        typer.Argument(
            metavar="DST",
            help="The store to copy into: an SQLite file (made when missing) or a "
            "postgresql:// URL.",
        ),
    ],
    skip_existing: Annotated[
        bool,
        typer.Option(
            "--skip-existing",
            help="Leave the sessions DST holds already as they are and copy the others "
            "(resumes a migration that stopped). Without it, DST holding any of them is an "
            "error and nothing is copied.",
        ),
    ] = False,
    progress: ProgressOption = True,
) -> None:
    """Copy every session, the tag aliases and the cost log from SRC to DST, then check them.

    Each session moves whole: its raw turns with their seqs, content hashes and times, tags,
    segments, tag summaries, working set, turn vectors, branch and watermark. SRC is only read,
    never created or upgraded: anything but a memory store of this version (another SQLite
    file, an empty database, a store an older version wrote) is an error. The check compares
    the session count and each session's last turn and its content hash; on a difference the
    command fails (exit status 1). A deployment then points at DST (CONTEXTFOLD_STORE_URL or
    `store:` in contextfold.yaml)."""
    from contextfold.store.transfer import migrate

    with cli_errors():
        src, dst = normal_location(src, "source"), normal_location(dst, "destination")
        if src == dst or ("://" not in src + dst and Path(src).resolve() == Path(dst).resolve()):
            raise InputError("SRC and DST are the same store")
        with (
            open_store(src, must_exist=True, what="source", only_read=True) as source,
            open_store(dst, must_exist=False, what="destination") as target,
        ):
            sessions = source.sessions()
            total = sum(source.last_seq(s) for s in sessions)
            with transfer_progress("migrate", len(sessions), total, enabled=progress) as bar:

                def advance(sid: str, turns: int) -> None:
                    bar.update(bar.task_ids[0], advance=1, description=f"sessions {sid}")
                    bar.update(bar.task_ids[1], advance=turns)

                report = migrate(source, target, skip_existing=skip_existing, progress=advance)
    print_pairs(
        f"migrated {shown(src)} → {shown(dst)}",
        [
            ("sessions", f"{len(report.copied):,} copied, {len(report.skipped):,} skipped"),
            ("turns", f"{report.turns:,}"),
            ("aliases", f"{report.aliases:,}"),
            ("cost entries", f"{report.costs:,}"),
            (
                "check",
                "FAILED"
                if report.problems
                else f"all {len(sessions):,} sessions in DST; each copy's last turn and its "
                "content hash match",
            ),
        ],
    )
    for line in report.warnings:
        typer.echo(f"warning: {line}", err=True)
    if report.problems:
        for line in report.problems[1:]:
            typer.echo(f"error: {line}", err=True)
        fail(f"the copy does not match the source: {report.problems[0]}", EXIT_RUNTIME)
