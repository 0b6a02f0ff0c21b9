"""``contextfold store``: the memory store as a whole. ``migrate SRC DST`` copies every
session, the tag aliases and the cost log from one store to another — an SQLite file to a
``postgresql://`` database, back, or file to file — and checks the copy.

``open_store`` (also used by ``memory export`` / ``memory import``) opens a store named on the
command line with one clear error line for a path or URL that cannot be one; a store that is
only to be read (migrate's SRC) is checked first, by reading it only, to be a memory store of
this version (``check_memory_store``): opening one creates or upgrades its schema.
"""

from __future__ import annotations

import re
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

__all__ = ["check_memory_store", "open_store", "shown", "store_app", "transfer_progress"]

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
    try:
        with psycopg.connect(
            location,
            autocommit=True,
            connect_timeout=30,
            options="-c default_transaction_read_only=on",
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


def check_memory_store(location: str, *, what: str = "store") -> None:
    """``InputError`` unless ``location`` (an existing SQLite file or a ``postgresql://`` URL)
    holds a contextfold memory store with this version's schema, found by reading it only:
    opening a store creates and migrates its schema, which a store that is only to be read
    must not have done to it."""
    from contextfold.store import is_database_url

    if is_database_url(location):
        from contextfold.store.postgres.schema import MIGRATIONS as PG_MIGRATIONS

        names = PG_MIGRATIONS.names
        applied = _postgres_migrations(location, what, PG_MIGRATIONS.name)
    else:
        from contextfold.store.sqlite.memory_schema import MIGRATIONS

        names = MIGRATIONS.names
        applied = _sqlite_migrations(location, what, MIGRATIONS.name)
    if not applied:
        raise InputError(f"{what} {shown(location)}: not a contextfold memory store")
    pending = [n for n in names if n not in applied]
    if pending:
        raise InputError(
            f"{what} {shown(location)}: written by an older contextfold ({len(pending)} schema "
            f"migration(s) not run, from {pending[0]}); it is only read here, so upgrade it "
            "first by opening it once with this version (`contextfold memory export --store "
            "SRC DIR` does), then migrate it"
        )


@contextmanager
def open_store(
    location: str, *, must_exist: bool, what: str = "store", only_read: bool = False
) -> Iterator[MemoryStorage]:
    """The memory store at ``location`` (an SQLite file or a ``postgresql://`` URL), closed on
    exit. ``must_exist``: an SQLite file that is not there is an input error instead of a new,
    empty store. ``only_read``: the store is read, never created or migrated: ``location``
    must hold a memory store of this version already (``check_memory_store``)."""
    from contextfold.store import is_database_url, open_memory_store
    from contextfold.tokens import CharCounter

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
