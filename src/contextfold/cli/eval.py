"""``contextfold eval``: measure quality on public datasets.

``eval retrieval`` indexes a BEIR-style collection (SciFact, Cranfield) with the same
``DocumentIndex`` the library uses and reports nDCG@10 and recall@100 for BM25, dense and
hybrid over every query. ``eval locomo`` feeds each LoCoMo conversation to memory systems
(the baselines, and any registered with ``contextfold.eval.locomo_systems.register_system``)
and reports evidence recall and answer containment per token budget.
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

__all__ = ["eval_app", "locomo_command", "retrieval_index"]

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


def _budgets(text: str) -> list[int]:
    parts = [p.strip().replace("_", "") for p in text.split(",") if p.strip()]
    try:
        budgets = [int(p) for p in parts]
    except ValueError:
        budgets = []
    if not budgets or any(b < 1 for b in budgets):
        raise InputError(
            f"--budget takes comma-separated whole token counts >= 1 (e.g. 512,1024), got {text!r}"
        )
    return budgets


LOCOMO_SYSTEM_MODULES = ("contextfold.eval.locomo_memory",)
"""Modules that register more LoCoMo systems when imported (the memory engine's is one);
imported only when ``--systems`` names a system the baselines module does not register."""


def _import_system_modules() -> None:
    import importlib

    for module in LOCOMO_SYSTEM_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # the module exists but one of its imports is missing
                raise


@eval_app.command("locomo")
def locomo_command(
    data: Annotated[
        Path,
        typer.Option(metavar="PATH", help="locomo10.json, or the folder holding it."),
    ],
    budget: Annotated[
        str, typer.Option(metavar="LIST", help="Comma-separated token budgets (cl100k_base).")
    ] = "512,1024,2048,4096",
    systems: Annotated[
        str,
        typer.Option(metavar="LIST", help="Comma-separated registered systems."),
    ] = "truncation,bm25,dense,rrf,oracle",
    out: Annotated[
        Path,
        typer.Option(metavar="DIR", help="Where locomo.json, locomo.md and locomo.png go."),
    ] = Path("benchmarks/results/locomo"),
    conversations: Annotated[
        int | None,
        typer.Option(
            metavar="N", min=1, help="Only the first N conversations (a smoke run; partial)."
        ),
    ] = None,
    audit: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="The audit's errors.json (default: <data dir>/audit/errors.json)."
        ),
    ] = None,
    per_question: Annotated[
        bool, typer.Option("--per-question", help="Keep every question's scores in the JSON.")
    ] = False,
    split: Annotated[
        str,
        typer.Option(
            metavar="SPLIT",
            help="tune (conversations 1–5 in file order), held-out (6–10) or all. Defaults "
            "are tuned on tune only; held-out is reported, never tuned on.",
        ),
    ] = "all",
    negative: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            help="Also ask each conversation up to N questions of the split's other "
            "conversations it cannot answer, and report the tokens injected (0: off).",
        ),
    ] = 0,
    store: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="Memory store of the contextfold system: a postgresql:// URL or an SQLite "
            "file, one store for the run (default: in-memory SQLite per conversation).",
        ),
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
) -> None:
    """Evidence recall and answer containment on LoCoMo, per system and token budget."""
    from contextfold.eval.locomo import SPLITS, load_locomo, split_conversations
    from contextfold.eval.locomo_report import PLOT_HINT, plot_available, write_report
    from contextfold.eval.locomo_run import run_locomo
    from contextfold.eval.locomo_systems import SYSTEMS, SystemContext
    from contextfold.store.sqlite import home_dir

    with cli_errors():
        budgets = _budgets(budget)
        names = [s.strip() for s in systems.split(",") if s.strip()]
        if any(n not in SYSTEMS for n in names):
            _import_system_modules()
        unknown = [n for n in names if n not in SYSTEMS]
        if unknown or not names:
            raise InputError(
                f"--systems: unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                f"choose from {', '.join(SYSTEMS)}"
            )
        if split not in SPLITS:
            raise InputError(f"--split: {split!r}; choose from {', '.join(SPLITS)}")
        if not data.exists():
            raise InputError(f"{data}: no such file or folder (expected locomo10.json)")
        if not plot_available():  # said before the run, not after it
            typer.echo(
                f"warning: {PLOT_HINT}; locomo.json and locomo.md will be written without it",
                err=True,
            )
        loaded = split_conversations(load_locomo(data, audit_path=audit), split)
        chosen = loaded[:conversations] if conversations else loaded
        ctx = SystemContext(embedding_cache=home_dir() / "embedding-cache.db", memory_store=store)
        try:
            report = run_locomo(
                chosen,
                list(dict.fromkeys(names)),
                budgets,
                progress=progress,
                context=ctx,
                partial_of=len(loaded),
                per_question=per_question,
                split=split,
                negative_per_conversation=negative,
            )
        finally:
            ctx.close()
        paths = write_report(report, out)
    typer.echo(report.to_markdown())
    typer.echo("\nwrote " + ", ".join(str(p) for p in paths.values()), err=True)
