"""``contextfold store``: the memory store as a whole. ``migrate SRC DST`` copies every
session, the tag aliases and the cost log from one store to another — an SQLite file to a
``postgresql://`` database, back, or file to file — and checks the copy.

``open_store`` (also used by ``memory export`` / ``memory import``) opens a store named on the
command line with one clear error line for a path or URL that cannot be one.
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

__all__ = ["open_store", "shown", "store_app", "transfer_progress"]

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


@contextmanager
def open_store(location: str, *, must_exist: bool, what: str = "store") -> Iterator[MemoryStorage]:
    """The memory store at ``location`` (an SQLite file or a ``postgresql://`` URL), closed on
    exit. ``must_exist``: an SQLite file that is not there is an input error instead of a new,
    empty store."""
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
        if must_exist and not path.is_file():
            raise InputError(f"{what} {location}: no such file")
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
        str, typer.Argument(metavar="SRC", help="The store to copy: an SQLite file or a URL.")
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
    segments, tag summaries, working set, turn vectors, branch and watermark. SRC is only read.
    The check compares the session count and each session's last turn and its content hash;
    on a difference the command fails (exit status 1). A deployment then points at DST
    (CONTEXTFOLD_STORE_URL or `store:` in contextfold.yaml)."""
    from contextfold.store.transfer import migrate

    with cli_errors():
        if src == dst or ("://" not in src + dst and Path(src).resolve() == Path(dst).resolve()):
            raise InputError("SRC and DST are the same store")
        with (
            open_store(src, must_exist=True, what="source") as source,
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
