"""``contextfold ingest`` and ``contextfold search``: documents in, ranked chunks out.

The corpus lives in ``$CONTEXTFOLD_HOME/documents.db`` (``.contextfold/`` in the working
directory by default) unless ``--db`` names another file, or a ``postgresql://`` URL shared by
many processes and hosts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contextfold.cli.common import InputError, cli_errors
from contextfold.errors import DocumentError
from contextfold.retrieval.index import DocumentIndex, SearchMode
from contextfold.store import is_database_url
from contextfold.store.sqlite import home_dir

__all__ = ["DbOption", "ingest_command", "open_index", "search_command"]

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="FILE|URL",
        help="Corpus database: a file (default: $CONTEXTFOLD_HOME/documents.db) or a "
        "postgresql:// URL.",
    ),
]
MODES = ("bm25", "dense", "hybrid")
ON_ERROR = ("skip", "fail")


def open_index(db: str | None, *, embed: bool = True, must_exist: bool = False) -> DocumentIndex:
    """The document index at ``db`` (a file or a ``postgresql://`` URL; default the home's
    file); BM25-only when ``embed`` is off."""
    if db is not None and is_database_url(db):
        return DocumentIndex(db, embedder=None if embed else False)
    path = Path(db) if db is not None else home_dir() / "documents.db"
    if must_exist and not path.exists():
        raise InputError(
            f"no corpus at {path}; run `contextfold ingest PATH...` first (or pass --db FILE)"
        )
    return DocumentIndex(path, embedder=None if embed else False)


def ingest_command(
    paths: Annotated[
        list[str],
        typer.Argument(
            metavar="PATH...",
            help="Files or folders (.txt .md .json .jsonl; .pdf .html .htm .docx with the "
            "formats extra).",
        ),
    ],
    db: DbOption = None,
    tenant: Annotated[str, typer.Option(help="Tenant the documents belong to.")] = "default",
    chunk_size: Annotated[int, typer.Option(metavar="TOKENS", help="Chunk size in tokens.")] = 128,
    overlap: Annotated[int, typer.Option(metavar="TOKENS", help="Chunk overlap in tokens.")] = 16,
    embed: Annotated[
        bool, typer.Option("--embed/--no-embed", help="Embed chunks for dense search.")
    ] = True,
    on_error: Annotated[
        str,
        typer.Option(
            metavar="skip|fail",
            help="A file that cannot be read (no encoding fits, malformed, format extra "
            "missing): skip it and list it at the end, or stop there.",
        ),
    ] = "skip",
) -> None:
    """Chunk, embed and index documents. Idempotent: a document already stored (same text,
    same tenant) is skipped. Markdown is split at headings; the rest by paragraph and sentence.

    Text files may be in any encoding (detected; a byte-order mark is removed). PDF, HTML and
    DOCX need the formats extra: pip install "contextfold[formats]". A file that cannot be
    read is skipped and listed at the end with the reason (--on-error skip, the default), or
    stops the run (--on-error fail; the files before it stay stored)."""
    from contextfold.retrieval.chunking import MarkdownChunker, TextChunker
    from contextfold.retrieval.loaders import SUFFIXES, iter_files, load_documents

    with cli_errors():
        if on_error not in ON_ERROR:
            raise InputError(f"--on-error must be skip or fail, got {on_error!r}")
        if chunk_size <= 0 or not 0 <= overlap < chunk_size:
            raise InputError(
                "need 0 <= --overlap < --chunk-size, "
                f"got overlap {overlap}, chunk size {chunk_size}"
            )
        files = iter_files(paths)
        if not files:
            raise InputError(f"no {' '.join(SUFFIXES)} files found under the given paths")
        index = open_index(db, embed=embed)
        text_chunker = TextChunker(chunk_size=chunk_size, overlap=overlap)
        md_chunker = MarkdownChunker(chunk_size=chunk_size, overlap=overlap)
        added = skipped = chunks = stored_files = 0
        failed: list[tuple[Path, str]] = []
        console = Console(stderr=True)
        with Progress(
            TextColumn("[bold]ingest[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("", total=len(files))
            for path in files:
                progress.update(task, description=path.name)
                try:
                    docs = list(load_documents(path))
                except DocumentError as exc:
                    if on_error == "fail":
                        index.save()
                        raise DocumentError(
                            f"{exc}. Stopped at file {stored_files + len(failed) + 1} of "
                            f"{len(files)}: the {stored_files} file(s) before it are stored "
                            f"({added} new document(s)) and stay in the corpus; fix or remove "
                            "the file and run again (what is stored is skipped), or pass "
                            "--on-error skip"
                        ) from None
                    failed.append((path, str(exc)))
                    progress.advance(task)
                    continue
                chunker = md_chunker if path.suffix.lower() == ".md" else text_chunker
                results = index.add_documents(
                    [(d.text, d.metadata) for d in docs],
                    tenant=tenant,
                    source=path.name,
                    chunker=chunker,
                )
                added += sum(r.added for r in results)
                skipped += sum(not r.added for r in results)
                chunks += sum(len(r.chunk_ids) for r in results)
                stored_files += 1
                progress.advance(task)
        index.save()
        n_docs, n_chunks = index.store.count()
    typer.echo(
        f"ingested {added} new document(s) ({chunks} chunks), skipped {skipped} already stored; "
        f"corpus: {n_docs} documents, {n_chunks} chunks in {index.path}"
    )
    if failed:
        typer.echo(
            f"skipped {len(failed)} of {len(files)} file(s) that could not be read:", err=True
        )
        for _, reason in failed:
            typer.echo(f"  {reason}", err=True)


def search_command(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to search for.")],
    mode: Annotated[str, typer.Option(metavar="MODE", help="bm25, dense or hybrid.")] = "hybrid",
    k: Annotated[int, typer.Option("-k", metavar="N", help="Number of results.")] = 5,
    db: DbOption = None,
    tenant: Annotated[
        list[str] | None, typer.Option(metavar="T", help="Only these tenants (repeatable).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the hits as JSON.")] = False,
) -> None:
    """Search the ingested corpus and show each hit with its score and which signals found it."""
    with cli_errors():
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if k <= 0:
            raise InputError(f"-k must be a positive number of results, got {k}")
        index = open_index(db, embed=mode != "bm25", must_exist=True)
        mode_: SearchMode = mode  # type: ignore[assignment]
        hits = index.search(query, k, mode=mode_, tenants=tenant or None)
    if json_out:
        typer.echo(json.dumps([h.model_dump() for h in hits], indent=2, ensure_ascii=False))
        return
    if not hits:
        typer.echo("no matches")
        return
    table = Table(title=f"{mode} search: {query}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("match (ranks)")
    table.add_column("source", no_wrap=True)
    table.add_column("text", ratio=1)
    for n, hit in enumerate(hits, start=1):
        ranks = ", ".join(f"{s} {r}" for s, r in hit.ranks.items())
        table.add_row(
            str(n),
            f"{hit.score:.4f}",
            f"{hit.match_source}\n({ranks})",
            str(hit.metadata.get("source") or hit.metadata.get("doc_id")),
            _excerpt(hit.text),
        )
    Console().print(table)


def _excerpt(text: str, width: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
