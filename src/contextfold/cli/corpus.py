"""``contextfold ingest`` and ``contextfold search``: documents in, ranked chunks out.

The corpus lives in ``$CONTEXTFOLD_HOME/documents.db`` (``.contextfold/`` in the working
directory by default) unless ``--db`` names another file, or a ``postgresql://`` URL shared by
many processes and hosts.

Every document belongs to one tenant (``--tenant``, ``default`` when not given), and ``search``
and ``ask`` read the tenants they are given — ``default`` when none is, never every tenant at
once. A document is named by its file's path under the folder that was ingested (the bare name
for a file at its top or given by itself) and remembers the file's absolute path
(``ingested_from``), so ingesting the file again replaces the version stored before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contextfold.cli.common import InputError, cli_errors
from contextfold.errors import DocumentError
from contextfold.retrieval.base import content_hash
from contextfold.retrieval.index import DocumentIndex, SearchMode, document_id
from contextfold.store import is_database_url
from contextfold.store.sqlite import home_dir

if TYPE_CHECKING:
    from contextfold.retrieval.base import Chunker
    from contextfold.store.document_models import DocumentRecord

__all__ = [
    "DEFAULT_TENANT",
    "DbOption",
    "TenantsOption",
    "check_tenants",
    "ingest_command",
    "open_index",
    "search_command",
]

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="FILE|URL",
        help="Corpus database: a file (default: $CONTEXTFOLD_HOME/documents.db) or a "
        "postgresql:// URL.",
    ),
]
#: The tenant ``ingest`` stores into, and ``search`` / ``ask`` read, when ``--tenant`` is not given.
DEFAULT_TENANT = "default"
TenantsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--tenant",
        metavar="T",
        help="Only these tenants (repeatable). Default: the tenant ingest uses without "
        "--tenant, 'default' — never every tenant at once.",
    ),
]
MODES = ("bm25", "dense", "hybrid")
ON_ERROR = ("skip", "fail")
#: The metadata key that holds the absolute path of the file a document was ingested from.
FROM = "ingested_from"


def open_index(db: str | None, *, embed: bool = True, must_exist: bool = False) -> DocumentIndex:
    """The document index at ``db`` (a file or a ``postgresql://`` URL; default the home's
    file); BM25-only when ``embed`` is off."""
    from contextfold.cli.store import normal_location

    if db is not None:
        db = normal_location(db, "--db")  # (another URL scheme: an error, never a file)
    if db is not None and is_database_url(db):
        return DocumentIndex(db, embedder=None if embed else False)
    path = Path(db) if db is not None else home_dir() / "documents.db"
    if must_exist and not path.exists():
        raise InputError(
            f"no corpus at {path}; run `contextfold ingest PATH...` first (or pass --db FILE)"
        )
    return DocumentIndex(path, embedder=None if embed else False)


def check_tenants(index: DocumentIndex, tenants: list[str] | None) -> list[str]:
    """The tenants ``search`` / ``ask`` read (``--tenant``, else ``default``); an error when
    a name is empty, or when none of them holds a document (another tenant's never count)."""
    chosen = list(dict.fromkeys(tenants or [DEFAULT_TENANT]))
    if any(not t.strip() for t in chosen):
        raise InputError("--tenant needs a tenant name, got an empty one")
    if not index.store.matching_chunks(tenants=chosen):
        names = ", ".join(repr(t) for t in chosen)
        held = "holds" if len(chosen) == 1 else "hold"
        raise InputError(
            f"tenant {names} {held} no documents in {index.store.path}; pass --tenant T with "
            "the tenant given to `contextfold ingest --tenant T` (without --tenant only "
            f"{DEFAULT_TENANT!r} is read)"
        )
    return chosen


def _named_files(paths: Sequence[str]) -> dict[Path, str]:
    """Every file to ingest, with the name it is stored under: its path under the folder given
    (POSIX separators), or its bare name when it is at the top of that folder or given by
    itself. A file reached twice keeps the first name."""
    from contextfold.retrieval.loaders import iter_files

    named: dict[Path, str] = {}
    for raw in paths:
        root = Path(raw)
        for file in iter_files([raw]):
            name = file.relative_to(root).as_posix() if root.is_dir() else file.name
            named.setdefault(file, name)
    return named


def _claim(origin: str, digest: str) -> str:
    """The id under which the file ``origin`` names a text stored first for another file
    (``f``, 15 hex digits of the path, 16 of the text): a document goes only with its last id,
    so the text stays while any file still names it."""
    return f"f{hashlib.sha256(origin.encode()).hexdigest()[:15]}{digest[:16]}"


def _primary(tenant: str, record: DocumentRecord) -> bool:
    """Whether ``record`` is listed under the id its text was first stored with (the index's
    content-derived id), not under a file's claim on it (``_claim``)."""
    return record.id == document_id(tenant, record.content_hash)


class _Replacer:
    """What each file stored before in one tenant (by its absolute path), so ingesting the file
    again replaces it: in the transaction that stores the new documents, the ids the file held
    and no longer needs are removed. A text stored once for two files is named by both (the
    first's id and the other's claim), and a document goes only with its last id: one file
    changing never removes text another still holds. Documents stored before paths were kept
    have no path and are left as they are."""

    def __init__(self, index: DocumentIndex, tenant: str) -> None:
        self.index, self.tenant = index, tenant
        self.by_file: dict[str, list[DocumentRecord]] = {}  # path -> its documents' ids
        self.claims: dict[str, list[DocumentRecord]] = {}  # path digest -> its claims
        for record in index.store.documents(tenant):
            origin = record.metadata.get(FROM)
            if _primary(tenant, record):
                if isinstance(origin, str):
                    self.by_file.setdefault(origin, []).append(record)
            elif record.id.startswith("f") and len(record.id) == 32:
                self.claims.setdefault(record.id[1:16], []).append(record)
        self.replaced = 0

    def store(
        self,
        path: Path,
        name: str,
        docs: list[tuple[str, dict[str, Any]]],
        chunker: Chunker,
    ) -> list[tuple[bool, int]]:
        """Store ``docs`` (one file's documents) and remove the ids the file held before and
        needs no longer, in one transaction; ``(added, chunks)`` per document."""
        origin = str(path.resolve())
        before = self.by_file.pop(origin, [])
        before += self.claims.pop(_claim(origin, "")[1:16], [])
        own = {r.id for r in before}
        digests = [content_hash(text) for text, _ in docs]
        # embedded first: the transaction holds the database's write lock, for short
        ahead = self.index.embedded_ahead([t for t, _ in docs], tenant=self.tenant, chunker=chunker)
        with ahead, self.index.store.atomic():
            results = self.index.add_documents(
                [(text, {**meta, FROM: origin}) for text, meta in docs],
                tenant=self.tenant,
                source=name,
                chunker=chunker,
            )
            needed: set[str] = set()
            for (text, meta), digest, result in zip(docs, digests, results, strict=True):
                if result.added or result.doc_id in own:
                    needed.add(result.doc_id)
                    continue
                claim = _claim(origin, digest)  # stored for another file: this one names it too
                needed.add(claim)
                if claim not in own:
                    self.index.add_documents(
                        [(text, {**meta, FROM: origin})],
                        tenant=self.tenant,
                        doc_ids=[claim],
                        source=name,
                        chunker=chunker,
                    )
            for record in before:
                if record.id not in needed:
                    self.replaced += self.index.remove_document(record.id)
        return [(r.added, len(r.chunk_ids)) for r in results]


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
    tenant: Annotated[
        str, typer.Option(metavar="T", help="Tenant the documents belong to.")
    ] = DEFAULT_TENANT,
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
    same tenant) is skipped; a file ingested before (same tenant, same file) that changed
    replaces its earlier version. Markdown is split at headings; the rest by paragraph and
    sentence.

    A document is named by its file's path under the folder given (x/policy.txt), or by its
    bare name when the file is at the top of that folder or given by itself. Re-ingesting a
    file stores what changed and removes the text it no longer holds (chunks and vectors),
    in one transaction on SQLite.

    Text files may be in any encoding (detected; a byte-order mark is removed). PDF, HTML and
    DOCX need the formats extra: pip install "contextfold[formats]". A file that cannot be
    read is skipped and listed at the end with the reason (--on-error skip, the default), or
    stops the run (--on-error fail; the files before it stay stored)."""
    from contextfold.retrieval.chunking import MarkdownChunker, TextChunker
    from contextfold.retrieval.loaders import SUFFIXES, load_documents

    with cli_errors():
        if on_error not in ON_ERROR:
            raise InputError(f"--on-error must be skip or fail, got {on_error!r}")
        if not tenant.strip():
            raise InputError("--tenant needs a tenant name, got an empty one")
        if chunk_size <= 0 or not 0 <= overlap < chunk_size:
            raise InputError(
                "need 0 <= --overlap < --chunk-size, "
                f"got overlap {overlap}, chunk size {chunk_size}"
            )
        named = _named_files(paths)
        files = list(named)
        if not files:
            raise InputError(f"no {' '.join(SUFFIXES)} files found under the given paths")
        index = open_index(db, embed=embed)
        replacer = _Replacer(index, tenant)
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
                name = named[path]
                for was_added, n_chunks in replacer.store(
                    path, name, [(d.text, _renamed(d.metadata, path, name)) for d in docs], chunker
                ):
                    added += was_added
                    skipped += not was_added
                    chunks += n_chunks
                stored_files += 1
                progress.advance(task)
        index.save()
        n_docs, n_chunks = index.store.count()
    replaced = f", replaced {replacer.replaced} earlier version(s)" if replacer.replaced else ""
    typer.echo(
        f"ingested {added} new document(s) ({chunks} chunks), skipped {skipped} already stored"
        f"{replaced}; corpus: {n_docs} documents, {n_chunks} chunks in {index.path}"
    )
    if failed:
        typer.echo(
            f"skipped {len(failed)} of {len(files)} file(s) that could not be read:", err=True
        )
        for _, reason in failed:
            typer.echo(f"  {reason}", err=True)


def _renamed(metadata: dict[str, Any], path: Path, name: str) -> dict[str, Any]:
    """A loaded document's metadata with the file's stored name as its ``source`` (unless the
    document named its own)."""
    if metadata.get("source") == path.name:
        return {**metadata, "source": name}
    return dict(metadata)


def search_command(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to search for.")],
    mode: Annotated[str, typer.Option(metavar="MODE", help="bm25, dense or hybrid.")] = "hybrid",
    k: Annotated[int, typer.Option("-k", metavar="N", help="Number of results.")] = 5,
    db: DbOption = None,
    tenant: TenantsOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the hits as JSON.")] = False,
) -> None:
    """Search the ingested corpus and show each hit with its score and which signals found it.

    Only the tenants given with --tenant are searched; without it, the tenant 'default' (what
    ingest stores without --tenant), so one tenant's documents never show up unasked."""
    with cli_errors():
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if not query.strip():
            raise InputError("the query is empty; search for something")
        if k <= 0:
            raise InputError(f"-k must be a positive number of results, got {k}")
        index = open_index(db, embed=mode != "bm25", must_exist=True)
        tenants = check_tenants(index, tenant)
        mode_: SearchMode = mode  # type: ignore[assignment]
        hits = index.search(query, k, mode=mode_, tenants=tenants)
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
