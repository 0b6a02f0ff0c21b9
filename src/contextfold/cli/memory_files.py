"""``contextfold memory export --format markdown DIR`` and ``contextfold memory import DIR``:
memory as a folder of markdown files with YAML front-matter (one folder per session, one file
per turn, segment and tag summary; ``contextfold.store.markdown`` has the layout), read back
exactly. The store is the configured one (``store:`` / ``storage_path`` of contextfold.yaml,
``$CONTEXTFOLD_STORE_URL``) or ``--store``.

Export only reads its store: one that is not there, not a memory store, or of an older version
is an error, and never created or upgraded. Import reads and checks the whole export before it
opens its store, so a refused export leaves nothing behind (no new SQLite file, no schema in a
database); an SQLite file it made is removed again when it fails part-way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from contextfold.cli.common import InputError, cli_errors
from contextfold.cli.session import ConfigOption, print_pairs, resolve_config
from contextfold.cli.store import (
    ProgressOption,
    check_location,
    normal_location,
    open_store,
    require_memory_store,
    shown,
    transfer_progress,
)

if TYPE_CHECKING:
    from contextfold.store.protocols import MemoryStorage

__all__ = ["export_command", "import_command", "require_stored_memory"]

FORMATS = ("markdown",)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="LOCATION",
        help="The memory store: an SQLite file or a postgresql:// URL (default: the "
        "configured one — $CONTEXTFOLD_STORE_URL, else store: of the config, else "
        "$CONTEXTFOLD_HOME/memory.db).",
    ),
]
DirArgument = Annotated[Path, typer.Argument(metavar="DIR", help="The export's folder.")]


def store_location(config: Path | None, store: str | None) -> str:
    """Where the command's memory lives: ``--store``, else where the engine would look."""
    from contextfold.store import store_url
    from contextfold.store.sqlite import home_dir

    if store is not None:
        return store
    cfg, _ = resolve_config(config)
    return str(store_url(cfg.store or cfg.storage_path) or home_dir() / "memory.db")


def require_stored_memory(config: Path | None, session: str) -> None:
    """``InputError`` when the configured memory store does not exist yet: for a command that
    only reads ``session``'s memory, which would otherwise create an empty store to find
    nothing in."""
    require_memory_store(store_location(config, None), session=session)


class _OpenedOnUse:
    """A store opened when it is first used: ``import_markdown`` reads and checks the whole
    export before it asks its store anything, so an export it refuses never opens (creates,
    migrates) the store."""

    def __init__(self, opener: Callable[[], MemoryStorage]) -> None:
        self._opener = opener
        self._store: MemoryStorage | None = None

    def __getattr__(self, name: str) -> Any:
        if self._store is None:
            self._store = self._opener()
        return getattr(self._store, name)


@contextmanager
def _removed_on_failure(location: str) -> Iterator[None]:
    """On an exception, remove the SQLite file at ``location`` (its journal files, and the
    folders made for it) when it was not there before: what a failed command made, never
    what it found."""
    from contextfold.store import is_database_url

    path = Path(location)
    if is_database_url(location) or os.path.lexists(path):  # (a link, even dangling, is theirs)
        yield
        return
    made = [path.parent]  # the folders opening the store would make, innermost first
    while not made[-1].exists() and made[-1] != made[-1].parent:
        made.append(made[-1].parent)
    made.pop()  # the nearest folder that is there
    try:
        yield
    except BaseException:
        for suffix in ("", "-wal", "-shm", "-journal"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty (something else put a file there), or gone
                break
        raise


def export_command(
    folder: DirArgument,
    format: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help="markdown (the only one).")
    ] = "markdown",
    sessions: Annotated[
        list[str] | None,
        typer.Option(
            "--session",
            "-s",
            metavar="ID",
            help="Export this session (repeat for more); default: every session, with the "
            "whole cost log.",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace the session folders and store.md already in DIR (a re-export into a "
            "git checkout); without it they are an error.",
        ),
    ] = False,
    config: ConfigOption = None,
    store: StoreOption = None,
    progress: ProgressOption = True,
) -> None:
    """Write memory to DIR as markdown files with YAML front-matter.

    One folder per session: session.md (the session record, working set, a list of turns),
    turns/000001.md … (role, time, content hash, tags; the message text as the body),
    segments/, and tags/TAG/ (the turns with the tag, its summary). store.md holds the
    aliases and the cost log. Turn vectors are not written (recall computes them again).
    `contextfold memory import DIR` reads it back exactly."""
    from contextfold.store.markdown import export_markdown

    with cli_errors():
        if format not in FORMATS:
            raise InputError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{folder}: not a folder")
        where = store_location(config, store)
        if store is None:
            require_memory_store(where)
        with open_store(where, must_exist=True, only_read=True) as memory:
            known = memory.sessions()
            chosen = list(dict.fromkeys(sessions)) if sessions else known
            missing = [s for s in chosen if s not in set(known)]
            if missing:
                listed = ", ".join(known[:10]) or "none"
                raise InputError(
                    f"no session {missing[0]!r} in {shown(where)} (sessions there: {listed})"
                )
            total = sum(memory.last_seq(s) for s in chosen)
            with transfer_progress("export", len(chosen), total, enabled=progress) as bar:

                def advance(sid: str, turns: int) -> None:
                    bar.update(bar.task_ids[0], advance=1, description=f"sessions {sid}")
                    bar.update(bar.task_ids[1], advance=turns)

                report = export_markdown(
                    memory,
                    folder,
                    chosen if sessions else None,
                    overwrite=overwrite,
                    progress=advance,
                )
    print_pairs(
        f"exported {shown(where)} → {folder}",
        [
            ("sessions", f"{len(report.folders):,}"),
            ("turns", f"{report.turns:,}"),
            ("aliases", f"{report.aliases:,}"),
            ("cost entries", f"{report.costs:,}"),
            ("vectors", "not exported (recomputed from the text when recall needs them)"),
        ],
    )


def import_command(
    folder: DirArgument,
    config: ConfigOption = None,
    store: StoreOption = None,
    progress: ProgressOption = True,
) -> None:
    """Load a markdown export (`memory export --format markdown`) into the store.

    Every turn is checked first: a turn whose text or message no longer has the content hash
    in its front-matter is refused, naming the file, and nothing is imported. A session the
    store holds already is an error too. Turns not derived yet get a derive job."""
    from contextfold.store.markdown import import_markdown, session_folders

    with cli_errors():
        if not folder.is_dir():
            raise InputError(f"{folder}: no such folder")
        where = normal_location(store_location(config, store))
        check_location(where, must_exist=False)
        places = session_folders(folder)
        total = sum(len(list((p / "turns").glob("*.md"))) for p in places)
        with (
            ExitStack() as stack,
            transfer_progress("import", len(places), total, enabled=progress) as bar,
        ):
            stack.enter_context(_removed_on_failure(where))
            memory = _OpenedOnUse(lambda: stack.enter_context(open_store(where, must_exist=False)))

            def advance(sid: str, turns: int) -> None:
                bar.update(bar.task_ids[0], advance=1, description=f"sessions {sid}")
                bar.update(bar.task_ids[1], advance=turns)

            report = import_markdown(cast("MemoryStorage", memory), folder, progress=advance)
    print_pairs(
        f"imported {folder} → {shown(where)}",
        [
            ("sessions", f"{len(report.sessions):,}"),
            ("turns", f"{report.turns:,}"),
            ("aliases", f"{report.aliases:,}"),
            ("cost entries", f"{report.costs:,}"),
        ],
    )
