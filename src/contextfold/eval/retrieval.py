"""Run every judged query of a collection through named searchers and report quality and speed.

A searcher is any ``(query_text, k) -> [doc_id, ...]`` callable returning ids best first; the
runner asks each for ``max(k_ndcg, k_recall)`` ids, times every call with a monotonic clock,
and scores the rankings with :mod:`contextfold.eval.metrics`. Queries without a relevant
document are not run (their scores are undefined); the report counts them.

>>> from contextfold.eval.datasets import IRDataset, IRDoc
>>> ds = IRDataset(
...     name="toy",
...     corpus={"a": IRDoc(text="cats purr"), "b": IRDoc(text="dogs bark")},
...     queries={"q1": "purring cats"},
...     qrels={"q1": {"a": 1}},
... )
>>> report = evaluate_retrieval(ds, {"oracle": lambda q, k: ["a", "b"]}, progress=False)
>>> report.modes[0].ndcg
1.0
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from contextfold.errors import ConfigError
from contextfold.eval.datasets import IRDataset
from contextfold.eval.metrics import QueryMetric, ndcg_at_k, recall_at_k

__all__ = ["ModeResult", "RetrievalReport", "Searcher", "evaluate_retrieval"]

Searcher = Callable[[str, int], list[str]]
"""``(query_text, k) -> doc ids, best first`` (at most ``k`` are scored)."""


class ModeResult(BaseModel):
    """One searcher's scores (means over the judged queries) and per-query latency."""

    model_config = ConfigDict(frozen=True)
    mode: str
    ndcg: float
    recall: float
    n_queries: int
    median_ms: float
    p95_ms: float
    ndcg_per_query: dict[str, float]
    recall_per_query: dict[str, float]


class RetrievalReport(BaseModel):
    """What :func:`evaluate_retrieval` measured, printable as JSON, markdown or a rich table."""

    model_config = ConfigDict(frozen=True)
    dataset: str
    n_docs: int
    n_queries: int
    n_unjudged_queries: int
    k_ndcg: int
    k_recall: int
    modes: tuple[ModeResult, ...]

    def to_json(self, *, per_query: bool = True) -> str:
        """The report as indented JSON; ``per_query=False`` leaves out the per-query scores."""
        exclude = (
            None if per_query else {"modes": {"__all__": {"ndcg_per_query", "recall_per_query"}}}
        )
        return json.dumps(self.model_dump(exclude=exclude), indent=2)

    def _rows(self) -> list[tuple[str, str, str, str, str]]:
        return [
            (m.mode, f"{m.ndcg:.4f}", f"{m.recall:.4f}", f"{m.median_ms:.2f}", f"{m.p95_ms:.2f}")
            for m in self.modes
        ]

    def _headers(self) -> tuple[str, str, str, str, str]:
        return ("mode", f"nDCG@{self.k_ndcg}", f"recall@{self.k_recall}", "median ms", "p95 ms")

    def _caption(self) -> str:
        return f"{self.dataset}: {self.n_docs:,} documents, {self.n_queries:,} judged queries" + (
            f" ({self.n_unjudged_queries:,} without relevant documents not run)"
            if self.n_unjudged_queries
            else ""
        )

    def to_markdown(self) -> str:
        """A markdown table, one row per mode, under a one-line caption.

        >>> report = RetrievalReport(dataset="toy", n_docs=2, n_queries=1, n_unjudged_queries=0,
        ...     k_ndcg=10, k_recall=100, modes=())
        >>> print(report.to_markdown())
        toy: 2 documents, 1 judged queries
        <BLANKLINE>
        | mode | nDCG@10 | recall@100 | median ms | p95 ms |
        |---|---:|---:|---:|---:|
        """
        lines = [
            self._caption(),
            "",
            "| " + " | ".join(self._headers()) + " |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self._rows()]
        return "\n".join(lines)

    def to_rich_table(self) -> Table:
        """The same table for a rich console (``Console().print(report)`` works too)."""
        table = Table(title=self._caption())
        for n, header in enumerate(self._headers()):
            table.add_column(header, justify="left" if n == 0 else "right")
        for row in self._rows():
            table.add_row(*row)
        return table

    def __rich__(self) -> Table:
        return self.to_rich_table()


def _percentile(values: Sequence[float], q: float) -> float:
    """Linearly interpolated percentile ``q`` in [0, 100] of a non-empty sequence."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _per_query(
    metric: QueryMetric,
    runs: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    k: int,
) -> dict[str, float]:
    """Per-query scores of queries that all have a relevant document (so none is None)."""
    scores: dict[str, float] = {}
    for qid, judged in qrels.items():
        score = metric(runs[qid], judged, k)
        assert score is not None, f"query {qid} has no relevant document"
        scores[qid] = score
    return scores


def _run_mode(
    name: str,
    search: Searcher,
    queries: Mapping[str, str],
    k: int,
    advance: Callable[[], None],
) -> tuple[dict[str, list[str]], list[float]]:
    runs: dict[str, list[str]] = {}
    latencies: list[float] = []
    for qid, text in queries.items():
        start = time.perf_counter()
        ranked = search(text, k)
        latencies.append((time.perf_counter() - start) * 1000)
        wrong = [doc_id for doc_id in ranked if not isinstance(doc_id, str)]
        if wrong:
            raise ConfigError(
                f"searcher {name!r} returned {len(wrong)} non-string ids for query {qid!r} "
                f"(first: {wrong[0]!r}); return the corpus doc ids as str"
            )
        runs[qid] = list(ranked[:k])
        advance()
    return runs, latencies


def evaluate_retrieval(
    dataset: IRDataset,
    searchers: Mapping[str, Searcher],
    *,
    k_ndcg: int = 10,
    k_recall: int = 100,
    progress: bool = True,
) -> RetrievalReport:
    """Run each judged query of ``dataset`` through each searcher, in the given order, and
    report mean nDCG@``k_ndcg``, mean recall@``k_recall`` and median / p95 latency per mode.

    A rich progress bar goes to stderr when ``progress`` is true. Searcher exceptions
    propagate unchanged.
    """
    if not searchers:
        raise ConfigError("evaluate_retrieval needs at least one searcher")
    if k_ndcg < 1 or k_recall < 1:
        raise ConfigError(f"k_ndcg and k_recall must be >= 1, got {k_ndcg} and {k_recall}")
    queries = {qid: text for qid, text in dataset.queries.items() if dataset.qrels.get(qid)}
    if not queries:
        raise ConfigError(f"dataset {dataset.name!r} has no query with a relevant document")
    k = max(k_ndcg, k_recall)
    qrels = {qid: dataset.qrels[qid] for qid in queries}
    results: list[ModeResult] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(
        *columns, console=Console(stderr=True), disable=not progress, transient=False
    ) as bar:
        for name, search in searchers.items():
            task = bar.add_task(f"{dataset.name} · {name}", total=len(queries))
            runs, latencies = _run_mode(name, search, queries, k, partial(bar.advance, task))
            ndcg = _per_query(ndcg_at_k, runs, qrels, k_ndcg)
            recall = _per_query(recall_at_k, runs, qrels, k_recall)
            results.append(
                ModeResult(
                    mode=name,
                    ndcg=math.fsum(ndcg.values()) / len(ndcg),
                    recall=math.fsum(recall.values()) / len(recall),
                    n_queries=len(queries),
                    median_ms=statistics.median(latencies),
                    p95_ms=_percentile(latencies, 95),
                    ndcg_per_query=ndcg,
                    recall_per_query=recall,
                )
            )
    return RetrievalReport(
        dataset=dataset.name,
        n_docs=len(dataset.corpus),
        n_queries=len(queries),
        n_unjudged_queries=len(dataset.queries) - len(queries),
        k_ndcg=k_ndcg,
        k_recall=k_recall,
        modes=tuple(results),
    )
