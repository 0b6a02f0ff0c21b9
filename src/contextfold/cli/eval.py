"""``contextfold eval``: measure quality on public datasets.

``eval retrieval`` indexes a BEIR-style collection (SciFact, Cranfield) with the same
``DocumentIndex`` the library uses and reports nDCG@10 and recall@100 for BM25, dense and
hybrid over every query.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from contextfold.cli.common import InputError, cli_errors

if TYPE_CHECKING:
    from contextfold.eval.datasets import IRDataset
    from contextfold.retrieval.base import Embedder
    from contextfold.retrieval.index import DocumentIndex, SearchMode

__all__ = ["eval_app", "retrieval_index"]

eval_app = typer.Typer(
    help="Measure retrieval and memory quality on public datasets.", no_args_is_help=True
)
DATASETS = ("scifact", "cranfield")


def retrieval_index(
    dataset: IRDataset, *, embed: bool, chunk_size: int, progress: bool
) -> DocumentIndex:
    """A ``DocumentIndex`` over ``dataset``'s corpus (title + text per document), with vectors
    cached on disk under the contextfold home so a re-run does not re-embed."""
    from rich.progress import Progress

    from contextfold.retrieval.chunking import TextChunker
    from contextfold.retrieval.embedders import CachedEmbedder, MiniLMEmbedder
    from contextfold.retrieval.index import DocumentIndex
    from contextfold.store.sqlite import home_dir

    embedder: Embedder | Literal[False] = (
        CachedEmbedder(MiniLMEmbedder(), path=home_dir() / "embedding-cache.db") if embed else False
    )
    chunker = TextChunker(chunk_size=chunk_size, overlap=chunk_size // 8) if chunk_size else None
    index = DocumentIndex(embedder=embedder, chunker=chunker)
    # An empty record (Cranfield has two) cannot be indexed or retrieved; it still counts in
    # the metrics if a query judged it relevant.
    docs = [(doc_id, doc) for doc_id, doc in dataset.corpus.items() if doc.full_text.strip()]
    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task(f"indexing {dataset.name}", total=len(docs))
        for start in range(0, len(docs), 256):
            part = docs[start : start + 256]
            index.add_documents(
                [(doc.full_text, None) for _, doc in part],
                doc_ids=[doc_id for doc_id, _ in part],
                chunk=chunker is not None,
            )
            bar.advance(task, len(part))
    return index


@eval_app.command("retrieval")
def retrieval_command(
    dataset: Annotated[str, typer.Option(metavar="NAME", help="scifact or cranfield.")],
    data: Annotated[
        Path, typer.Option(metavar="PATH", help="The dataset folder (e.g. .../data/scifact).")
    ],
    split: Annotated[
        str, typer.Option(metavar="NAME", help="Query split: test, or train (SciFact only).")
    ] = "test",
    modes: Annotated[
        str, typer.Option(metavar="LIST", help="Comma-separated: bm25,dense,hybrid.")
    ] = "bm25,dense,hybrid",
    chunk_size: Annotated[
        int, typer.Option(metavar="TOKENS", help="Chunk size; 0 indexes whole documents.")
    ] = 0,
    out: Annotated[
        Path | None, typer.Option(metavar="FILE.json", help="Also write the report as JSON.")
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
) -> None:
    """nDCG@10 and recall@100 for BM25, dense and hybrid retrieval over all queries."""
    from contextfold.eval.datasets import load_dataset
    from contextfold.eval.retrieval import evaluate_retrieval

    with cli_errors():
        if dataset not in DATASETS:
            raise InputError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
        wanted = [m.strip() for m in modes.split(",") if m.strip()]
        bad = sorted(set(wanted) - {"bm25", "dense", "hybrid"})
        if bad or not wanted:
            raise InputError(f"--modes takes bm25, dense and/or hybrid, got {modes!r}")
        ds = load_dataset(dataset, data, split=split)
        index = retrieval_index(
            ds, embed=wanted != ["bm25"], chunk_size=chunk_size, progress=progress
        )

        def searcher(mode: SearchMode) -> Callable[[str, int], list[str]]:
            def run(query: str, k: int) -> list[str]:
                return [d for d, _ in index.search_documents(query, k, mode=mode)]

            return run

        report = evaluate_retrieval(
            ds,
            {m: searcher(m) for m in wanted},  # type: ignore[arg-type]
            progress=progress,
        )
    typer.echo(report.to_markdown())
    if out is not None:
        payload = json.loads(report.to_json())
        payload["settings"] = {"chunk_size": chunk_size, "data": str(data), "split": split}
        payload["created"] = datetime.now(UTC).isoformat(timespec="seconds")
        out.write_text(json.dumps(payload, indent=2))
