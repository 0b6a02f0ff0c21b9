"""Dense recall of one session's turn vectors at 1k, 10k and 100k turns: exact scan vs HNSW.

Each size runs in a fresh child process (its RSS is its own) on a SQLite file holding one
session of N turns with synthetic 384-d unit vectors (real embedding runs at 8-15 turns/s on
this machine, so 100k real vectors are out of reach): by default *clustered* (one centre per
100 turns, each vector its centre plus Gaussian noise of 0.8 per dimension, queries drawn
alike), closer to real sentence embeddings than uniform noise; ``--random`` draws uniform
random unit vectors too, the worst case for an HNSW graph. Through ``Recaller._dense``, the
dense signal a recall fuses (the query vector handed in; MiniLM's own query embedding is not
counted:
it is made before each timed call), with ``limit`` = ``recall.fts_limit`` (300). Reported per size:

* exact: the first dense recall on a fresh process (every vector read from the store), then
  p50/p95 over the queries;
* ANN (``ann_min_turns`` forced to 1,000 so every size gets an index): the background build,
  p50/p95, recall@300 against exact over the queries; 600 vectors then appended: the next
  query (they are scanned exactly beside the index) and the time to fold them in;
* restart with the files beside the database (``<db>.vectors/``, written at ``close``): the
  time to write them, the first query of a fresh process and the vectors it read from the
  store; the same for the exact path (files, no index);
* RSS after each phase, and the vectors' own size;
* quantized exact scans (``--quantized``; the candidates of a smaller copy of the matrix,
  rescored in float32) beside the float32 scan, in the same process over the same rows and
  queries: the session's own scans (``SessionVectors.search`` on one thread, float32, and
  over the int8 copy it keeps from ``recall.quantize_min_turns`` with ``2 x limit``
  candidates rescored), usearch's exact search over int8 and float16 copies (``4 x limit``
  candidates), and a numpy sign-bit (1 bit a dimension) Hamming prefilter (``10 x limit``
  candidates); p50 and recall@300 against the float32 scan.

Run: ``python benchmarks/bench_turn_ann.py`` (``--quick``: 1k and 3k).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import _common as common
from contextfold.items import Message
from contextfold.memory.config import ANN_MIN_TURNS, RecallSettings
from contextfold.memory.recall import Recaller
from contextfold.memory.turn_index import SessionVectors
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import CharCounter

DIM = 384
GROW = 600  # vectors appended after the index is built
LIMIT = RecallSettings().fts_limit  # the dense candidates a recall fuses


def rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return common.peak_rss_mb()


class Vectors:
    """Seeded synthetic unit vectors (``kind``: ``clustered`` or ``random``)."""

    def __init__(self, kind: str, n: int, seed: int = 22) -> None:
        self.kind = kind
        self.rng = np.random.default_rng(seed)
        self.centres = self.rng.standard_normal((max(1, n // 100), DIM)).astype(np.float32)

    def draw(self, count: int) -> np.ndarray:
        if self.kind == "random":
            rows = self.rng.standard_normal((count, DIM)).astype(np.float32)
        else:
            pick = self.rng.integers(0, len(self.centres), count)
            noise = self.rng.standard_normal((count, DIM)).astype(np.float32)
            rows = self.centres[pick] + 0.8 * noise
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class QueryEmbedder:
    """Hands the recaller the query vectors drawn for the run (``text`` is ``"q <n>"``)."""

    name = "synthetic-384"

    def __init__(self, queries: np.ndarray) -> None:
        self.queries = queries

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.queries[int(t.split()[1])] for t in texts])


def counting(store: MemoryStore) -> list[int]:
    """Count the vectors ``store.turn_vectors`` returns from now on."""
    read: list[int] = []
    original = store.turn_vectors

    def spy(session_id: str, model: str, *, after: int = 0) -> Any:
        seqs, rows = original(session_id, model, after=after)
        read.append(len(seqs))
        return seqs, rows

    store.turn_vectors = spy  # type: ignore[method-assign]
    return read


def dense(r: Recaller, text: str) -> list[tuple[int, float]]:
    """``r._dense`` for ``text``, its query vector made beforehand (not timed)."""
    return r._dense("s", [text], LIMIT)[0]


def timed_dense(r: Recaller, text: str) -> common.Timed:
    r.prefetch(text)
    r._prefetched[text].result()
    return common.time_call(lambda: dense(r, text))


def _best(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest scores, best first."""
    if len(scores) <= k:
        return np.argsort(-scores)
    part = np.argpartition(-scores, k)[:k]
    ordered: np.ndarray = part[np.argsort(-scores[part])]
    return ordered


def run_quantized(matrix: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """Quantized exact scans with float32 rescoring against the float32 scan (see the module
    docstring), over the same rows and queries."""
    import onnxruntime  # noqa: F401  (loaded before usearch, as memory/turn_index does)
    from usearch.index import MetricKind
    from usearch.index import search as exact_search

    scale = 127.0 / float(np.abs(matrix).max())
    as_i8 = np.round(matrix * scale).astype(np.int8)
    as_f16 = matrix.astype(np.float16)
    bits = np.packbits(matrix > 0, axis=1)
    words = bits.view(np.uint64) if bits.shape[1] % 8 == 0 else bits

    def rescored(candidates: np.ndarray, q: np.ndarray) -> np.ndarray:
        rows = np.einsum("ij,j->i", matrix[candidates], q)
        return candidates[_best(rows, LIMIT)]

    def usearch_scan(data: np.ndarray, convert: Any) -> Any:
        def scan(q: np.ndarray) -> np.ndarray:
            found = exact_search(
                data, convert(q), min(4 * LIMIT, len(data)), MetricKind.IP, exact=True, threads=1
            )
            return rescored(np.asarray(found.keys, np.int64), q)

        return scan

    def hamming(q: np.ndarray) -> np.ndarray:
        mine = np.packbits(q > 0)
        mine_words = mine.view(np.uint64) if words is not bits else mine
        distance = np.bitwise_count(words ^ mine_words).sum(axis=1, dtype=np.int32)
        m = min(10 * LIMIT, len(distance) - 1)
        return rescored(np.argpartition(distance, m)[:m], q)

    seqs = list(range(1, len(matrix) + 1))
    plain, coded = SessionVectors(), SessionVectors()
    plain.append(seqs, matrix)
    coded.append(seqs, matrix)
    coded.code()

    def session_scan(entry: SessionVectors) -> Any:
        def scan(q: np.ndarray) -> np.ndarray:
            found, _ = entry.search(q[None, :], LIMIT, 0, ann=False)
            return np.asarray([seq - 1 for seq, _ in found[0]], np.int64)

        return scan

    variants: dict[str, Any] = {
        "float32 scan": lambda q: _best(np.einsum("ij,j->i", matrix, q), LIMIT),
        "session float32 scan": session_scan(plain),
        "session int8 copy + rescore": session_scan(coded),
        "usearch int8 + rescore": usearch_scan(
            as_i8, lambda q: np.round(q * scale).astype(np.int8)
        ),
        "usearch float16 + rescore": usearch_scan(as_f16, lambda q: q.astype(np.float16)),
        "sign bits + rescore": hamming,
    }
    truth = [set(variants["float32 scan"](q).tolist()) for q in queries]
    out: dict[str, Any] = {
        "bytes_per_row": {"float32": 4 * DIM, "int8": DIM, "float16": 2 * DIM, "bits": DIM // 8}
    }
    for name, scan in variants.items():
        samples, recall = common.Samples(), []
        for q, want in zip(queries, truth, strict=True):
            timed = common.time_call(functools.partial(scan, q))
            samples.add(timed)
            recall.append(len(want & set(timed.value.tolist())) / len(want))
        out[name] = {"steady": samples.stats(), "recall_at_k": float(np.mean(recall))}
    return out


def run_size(
    n: int, kind: str, queries: int, with_ann: bool = True, quantized: bool = False
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-ann-"))
    path = folder / "memory.db"
    out: dict[str, Any] = {"turns": n, "vectors": kind, "rss_mb": {"start": rss_mb()}}
    try:
        source = Vectors(kind, n)
        qs = source.draw(queries + 1)
        store = MemoryStore(path, counter=CharCounter())
        store.create_session("s")
        for at in range(0, n, 5_000):
            count = min(5_000, n - at)
            store.append_turns(
                "s", [Message(role="user", content=f"t{at + i}") for i in range(count)]
            )
            store.add_turn_vectors(
                "s", QueryEmbedder.name, list(range(at + 1, at + count + 1)), source.draw(count)
            )
        out["rss_mb"]["after_write"] = rss_mb()
        texts = [f"q {i}" for i in range(queries)]

        def recaller(**kw: Any) -> Recaller:
            r = Recaller(MemoryStore(path, counter=CharCounter()), embedder=QueryEmbedder(qs), **kw)
            r.read_later_min = None  # a cold read is timed in the recall, as PostgreSQL's was
            return r

        def steady(r: Recaller) -> tuple[dict[str, Any], list[set[int]]]:
            samples, tops = common.Samples(), []
            for t in texts:
                hits = samples.add(timed_dense(r, t))
                tops.append({seq for seq, _ in hits})
            return samples.stats(), tops

        # exact, no files: the first recall reads every vector
        exact = recaller(ann_min_turns=None, vector_dir=str(path) + ".vectors")
        exact.files_min_turns = 10**9  # the files are written at close
        read = counting(exact.store)
        first = timed_dense(exact, "q 0").wall * 1000
        stats, truth = steady(exact)
        out["exact"] = {"first_ms": first, "first_read": sum(read), "steady": stats}
        if quantized:
            out["quantized"] = run_quantized(
                exact._vectors["s"].rows(0).copy(), qs[:queries].astype(np.float32)
            )
        exact.files_min_turns = 1
        exact.close()
        out["rss_mb"]["after_exact"] = rss_mb()
        out["ann"] = run_ann(n, path, source, recaller, steady, truth, store) if with_ann else None
        # restart with the files: ANN, then exact (no index: the rows file only)
        modes = [("ann", {"ann_min_turns": 1_000})] if with_ann else []
        for name, kw in [*modes, ("exact", {"ann_min_turns": None})]:
            again = recaller(vector_dir=str(path) + ".vectors", **kw)
            read = counting(again.store)
            first = timed_dense(again, "q 2").wall * 1000
            stats, _ = steady(again)
            out[name]["restart"] = {
                "first_ms": first,
                "read_from_store": sum(read[:1]),
                "steady": stats,
                "answered_by_index": bool(again.last_dense.get("ann")),
            }
            again.files_min_turns = 10**9
            again._worker.close()
        out["rss_mb"]["end"] = rss_mb()
        grown = GROW if with_ann else 0
        out["vectors_mb"] = round((n + grown) * DIM * 4 / 2**20, 1)
        out["files_mb"] = round(
            sum(p.stat().st_size for p in (folder / "memory.db.vectors").iterdir()) / 2**20, 1
        )
        out["peak_rss_mb"] = common.peak_rss_mb()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def run_ann(
    n: int,
    path: Path,
    source: Vectors,
    recaller: Any,
    steady: Any,
    truth: list[set[int]],
    store: MemoryStore,
) -> dict[str, Any]:
    """Build the index (forced), time it against ``truth``, grow it, write its files."""
    ann = recaller(ann_min_turns=1_000, vector_dir=str(path) + ".vectors")
    ann.files_min_turns = 10**9  # files are written at close, timed apart
    dense(ann, "q 0")
    started = time.perf_counter()
    ann.settle()
    build = time.perf_counter() - started
    stats, got = steady(ann)
    recall = [len(a & b) / max(1, len(b)) for a, b in zip(got, truth, strict=True)]
    result: dict[str, Any] = {
        "build_s": build,
        "steady": stats,
        "recall_at_k": float(np.mean(recall)),
        "recall_at_k_min": float(np.min(recall)),
        "k": LIMIT,
        "answered_by_index": bool(ann.last_dense.get("ann")),
    }
    result["rss_mb_after_build"] = rss_mb()
    store.append_turns("s", [Message(role="user", content=f"g{i}") for i in range(GROW)])
    grown = list(range(n + 1, n + GROW + 1))
    store.add_turn_vectors("s", QueryEmbedder.name, grown, source.draw(GROW))
    result["after_add_ms"] = timed_dense(ann, "q 1").wall * 1000
    started = time.perf_counter()
    ann.settle()
    result["fold_s"] = time.perf_counter() - started
    result["indexed_after_fold"] = ann._vectors["s"].indexed
    ann.files_min_turns = 1
    started = time.perf_counter()
    ann.close()
    result["write_files_s"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.common_arguments(parser)
    parser.add_argument("--sizes", default=None, help="comma-separated turn counts")
    parser.add_argument("--random", action="store_true", help="uniform random vectors too")
    parser.add_argument("--random-sizes", default="10000", help="sizes for --random")
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument(
        "--ann-sizes", default=None, help="sizes that also build an index (default: all)"
    )
    parser.add_argument(
        "--quantized", action="store_true", help="time quantized scans beside float32"
    )
    parser.add_argument("--note", default=None, help="a line for RESULTS.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        spec = json.loads(args.child)
        run = run_size(
            spec["n"],
            spec["kind"],
            spec["queries"],
            spec.get("ann", True),
            spec.get("quantized", False),
        )
        print(json.dumps(run))
        return
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([1_000, 3_000] if args.quick else [1_000, 10_000, 100_000])
    )
    queries = args.queries or (10 if args.quick else 50)
    specs: list[dict[str, Any]] = [
        {"n": n, "kind": "clustered", "queries": queries, "quantized": args.quantized}
        for n in sizes
    ]
    if args.random:
        specs += [
            {"n": int(n), "kind": "random", "queries": queries}
            for n in args.random_sizes.split(",")
        ]
    if args.ann_sizes is not None:
        with_ann = {int(n) for n in args.ann_sizes.split(",") if n}
        for spec in specs:
            spec["ann"] = spec["n"] in with_ann
    runs = []
    for spec in specs:
        run = common.run_child(__file__, spec)
        runs.append(run)
        print(summary(run), flush=True)
    result = common.base_result("turn_ann", __doc__.splitlines()[0], args.quick)
    result["parameters"] = {
        "dim": DIM,
        "limit": LIMIT,
        "queries": queries,
        "grow": GROW,
        "ann_min_turns_default": ANN_MIN_TURNS,
    }
    result["runs"] = runs
    if args.note:
        result["note"] = args.note
    result["correctness"] = {
        "ANN recall@k >= 0.99 (clustered)": all(
            r["ann"]["recall_at_k"] >= 0.99
            for r in runs
            if r["vectors"] == "clustered" and r["ann"]
        ),
        "int8 copy recall@k >= 0.99 (clustered)": all(
            r["quantized"]["session int8 copy + rescore"]["recall_at_k"] >= 0.99
            for r in runs
            if r["vectors"] == "clustered" and r.get("quantized")
        ),
        "restart read only the files' last rows and newer": all(
            r[m]["restart"]["read_from_store"] <= 8 for r in runs for m in ("ann", "exact") if r[m]
        ),
    }
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {Path(path).name}")


def summary(r: dict[str, Any]) -> str:
    e, a = r["exact"], r["ann"]
    line = (
        f"{r['turns']:,} {r['vectors']}: exact p50 {e['steady']['median_ms']:.2f} ms (first "
        f"{e['first_ms']:.0f} ms, restart {e['restart']['first_ms']:.1f})"
    )
    if a:
        line += (
            f"; ANN p50 {a['steady']['median_ms']:.2f} ms recall@{a['k']} "
            f"{a['recall_at_k']:.4f} build {a['build_s']:.1f} s, restart "
            f"{a['restart']['first_ms']:.1f} ms"
        )
    for name, q in (r.get("quantized") or {}).items():
        if name != "bytes_per_row":
            line += (
                f"; {name} p50 {q['steady']['median_ms']:.2f} ms recall@{LIMIT} "
                f"{q['recall_at_k']:.4f}"
            )
    return line + f"; RSS {r['rss_mb']}"


if __name__ == "__main__":
    main()
