"""What the benchmark scripts share: reading the real data, timing, machine facts, the JSON
result files and the ``RESULTS.md`` table rendered from them.

The data is the read-only shared set described in ``../shared/benchmarks/README.md``; pass
``--data-dir`` or set ``CONTEXTFOLD_BENCH_DATA`` to read it from elsewhere. Nothing here touches
the network.

``python benchmarks/_common.py`` re-renders ``benchmarks/RESULTS.md`` from the newest full
(non ``--quick``) result of each benchmark in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import ast
import csv
import gc
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tokenize
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
RESULTS_DIR = BENCH_DIR / "results"
RESULTS_MD = BENCH_DIR / "RESULTS.md"
DATA_ENV = "CONTEXTFOLD_BENCH_DATA"
LIBRARIES = ("contextfold", "tiktoken", "bpe-openai", "pydantic", "langchain-core")


# --------------------------------------------------------------------------- data


def default_data_dir() -> Path:
    """``$CONTEXTFOLD_BENCH_DATA``, else ``../shared/benchmarks/data`` beside the project."""
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else ROOT.parent / "shared" / "benchmarks" / "data"


def check_data(data_dir: Path) -> None:
    needed = [data_dir / "scifact/csv/corpus_train.csv", data_dir / "locomo/locomo10.json"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        sys.exit(
            f"benchmark data not found: {', '.join(missing)}; pass --data-dir or set "
            f"{DATA_ENV} to the folder described in shared/benchmarks/README.md"
        )


def abstract_sentences(abstract: str) -> list[str]:
    """SciFact's ``abstract`` column is a numpy-style list repr with no commas between the
    string literals; ``ast.literal_eval`` would glue neighbours together, so read the literals
    one by one."""
    tokens = tokenize.generate_tokens(io.StringIO(abstract).readline)
    return [ast.literal_eval(t.string) for t in tokens if t.type == tokenize.STRING]


@dataclass(frozen=True, slots=True)
class Doc:
    doc_id: str
    title: str
    sentences: tuple[str, ...]


def scifact_docs(data_dir: Path) -> Iterator[Doc]:
    """SciFact corpus documents in file order (5,183)."""
    csv.field_size_limit(1 << 30)
    with (data_dir / "scifact/csv/corpus_train.csv").open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            sentences = tuple(s.strip() for s in abstract_sentences(row["abstract"]) if s.strip())
            yield Doc(row["doc_id"], row["title"].strip(), sentences)


def scifact_claims(data_dir: Path) -> list[str]:
    """The 300 SciFact test claims (de-duplicated by id), in file order."""
    seen: dict[str, str] = {}
    with (data_dir / "scifact/csv/claims_validation.csv").open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            seen.setdefault(row["id"], row["claim"])
    return list(seen.values())


@dataclass(frozen=True, slots=True)
class Turn:
    conversation: int  # 0-based index of the LoCoMo sample
    dia_id: str
    speaker: str
    first_speaker: bool  # spoken by the sample's speaker_a
    date: str  # the session's date_time
    text: str


def locomo_questions(data_dir: Path) -> list[str]:
    """Every LoCoMo question, conversation by conversation, in file order."""
    with (data_dir / "locomo/locomo10.json").open(encoding="utf-8") as f:
        return [qa["question"] for s in json.load(f) for qa in s["qa"]]


def locomo_turns(data_dir: Path) -> list[Turn]:
    """Every LoCoMo dialogue turn (5,882), conversation by conversation, sessions in order.
    Only the dialogue is read, never the generated summaries or observations."""
    with (data_dir / "locomo/locomo10.json").open(encoding="utf-8") as f:
        samples = json.load(f)
    turns: list[Turn] = []
    for c, sample in enumerate(samples):
        conv = sample["conversation"]
        numbers = sorted(
            int(key.removeprefix("session_"))
            for key in conv
            if key.startswith("session_") and key.removeprefix("session_").isdigit()
        )
        for n in numbers:
            date = conv.get(f"session_{n}_date_time", "")
            for t in conv[f"session_{n}"]:
                text = str(t.get("text", "")).strip()
                if text:
                    first = t["speaker"] == conv["speaker_a"]
                    turns.append(Turn(c, t["dia_id"], t["speaker"], first, date, text))
    return turns


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def timing_stats(seconds: Sequence[float], cpu_seconds: Sequence[float] = ()) -> dict[str, Any]:
    """Wall-clock statistics in ms, plus the median CPU time of this process when given (on a
    shared machine the wall clock also counts time other processes held the cores)."""
    ms = [s * 1000 for s in seconds]
    stats = {
        "median_ms": round(statistics.median(ms), 4),
        "p95_ms": round(percentile(ms, 95), 4),
        "min_ms": round(min(ms), 4),
        "max_ms": round(max(ms), 4),
        "mean_ms": round(statistics.fmean(ms), 4),
        "n": len(ms),
    }
    if cpu_seconds:
        stats["cpu_median_ms"] = round(statistics.median(cpu_seconds) * 1000, 4)
    return stats


def length_stats(values: Sequence[int]) -> dict[str, Any]:
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1) if values else 0.0,
        "p50": percentile(values, 50),
        "p95": round(percentile(values, 95), 1),
        "min": min(values, default=0),
        "max": max(values, default=0),
        "total": sum(values),
    }


@dataclass(frozen=True, slots=True)
class Timed:
    wall: float  # seconds
    cpu: float  # seconds of CPU time this process used
    value: Any


def time_call(fn: Callable[[], Any]) -> Timed:
    """Time one call of ``fn`` (garbage collected before, not during)."""
    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    value = fn()
    wall = time.perf_counter() - start
    return Timed(wall, time.process_time() - cpu, value)


class Samples:
    """Wall and CPU times of repeated runs."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def add(self, timed: Timed) -> Any:
        self.wall.append(timed.wall)
        self.cpu.append(timed.cpu)
        return timed.value

    def stats(self) -> dict[str, Any]:
        return timing_stats(self.wall, self.cpu)


# --------------------------------------------------------------------------- run facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(affinity) if affinity is not None else os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "os": platform.platform(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=10
        )
        return done.stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "-s"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def run_child(script: str, spec: dict[str, Any], *args: str) -> dict[str, Any]:
    """Run ``script --child SPEC`` (after ``args``) in a fresh interpreter, so each measured
    run starts with a clean process (its RSS, caches and imports its own); the JSON object
    it prints last is its result. A failed child stops the benchmark with its stderr."""
    done = subprocess.run(
        [sys.executable, script, *args, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{spec.get('label', spec)} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def base_result(name: str, description: str, quick: bool) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "command": " ".join(["python", *(_relative(a) for a in sys.argv)]),
        "machine": machine_info(),
        "versions": library_versions(),
        "git": git_state(),
    }


def _relative(arg: str) -> str:
    try:
        return str(Path(arg).resolve().relative_to(ROOT))
    except ValueError:
        return arg


def common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and few repeats (the smoke test)"
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="the shared benchmark data")
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON result goes"
    )
    parser.add_argument(
        "--results-md",
        type=Path,
        default=None,
        help="the markdown table to regenerate (default: benchmarks/RESULTS.md, or RESULTS.md in "
        "--results-dir when that is given, so a trial run never rewrites the committed table)",
    )


def write_result(result: dict[str, Any], results_dir: Path, results_md: Path | None) -> Path:
    """Write ``result`` as a new JSON file and regenerate the markdown table (``results_md``;
    ``None``: the committed table for the committed results, else one beside the JSON)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    if results_md is None:
        same = results_dir.resolve() == RESULTS_DIR.resolve()
        results_md = RESULTS_MD if same else results_dir / "RESULTS.md"
    stamp = result["created"].replace(":", "").replace("-", "").replace("+0000", "Z")
    suffix = "-quick" if result["quick"] else ""
    path = results_dir / f"{result['name']}-{stamp}{suffix}.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    results_md.write_text(render_results(results_dir), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- RESULTS.md


def latest_results(results_dir: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The newest full run of each benchmark (quick runs only when no full run exists)."""
    found: dict[str, tuple[tuple[bool, str], Path, dict[str, Any]]] = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        key = (not data.get("quick", False), data.get("created", ""))
        name = data.get("name", path.stem)
        if name not in found or key > found[name][0]:
            found[name] = (key, path, data)
    return {name: (path, data) for name, (_, path, data) in sorted(found.items())}


def _ms(stats: dict[str, Any], key: str) -> str:
    value = stats[key]
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def _first(measured: dict[str, Any], name: str) -> str:
    """A first recall's median ms, and the median of each first ÷ its question asked again
    (``bench_memory_scale.firsts``; runs before it have no pairs)."""
    paired = measured.get(f"{name}_paired")
    cell = f"{measured[f'{name}_ms']:,.1f}"
    return cell + (f" (×{paired:.2f} again)" if paired is not None else "")


def _flags(flags: dict[str, bool]) -> str:
    bad = [k for k, v in flags.items() if not v]
    return f"all {len(flags)} true" if not bad else "FALSE: " + ", ".join(bad)


def _machine_line(data: dict[str, Any]) -> str:
    m, v = data["machine"], data["versions"]
    libs = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    commit = (data.get("git") or {}).get("commit") or "unknown"
    dirty = " (uncommitted changes)" if (data.get("git") or {}).get("dirty") else ""
    return (
        f"{m['cpu_model']}, {m['usable_cores']} cores, Python {m['python']}, {m['os']}, "
        f"load {m.get('load_avg_1m_at_start')} at start; "
        f"{libs}; commit {commit[:10]}{dirty}; run {data['created']}"
    )


def _render_window(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    lines = [
        "## Window packing (`bench_window.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- {p['n_items']:,} candidates: "
        + ", ".join(f"{k} {v:,}" for k, v in p["items_by_section"].items())
        + f"; {p['format']} format, `{p['encoding']}` counter, max_tokens {p['max_tokens']:,}.",
        "",
        "| budget | mode | median ms | p95 ms | min ms | CPU median ms | runs | items/s | "
        "used / available | kept / cut / dropped |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in data["configs"]:
        t = c["timings"]
        lines.append(
            f"| {c['budget']} | {c['mode']} | {_ms(t, 'median_ms')} | {_ms(t, 'p95_ms')} | "
            f"{_ms(t, 'min_ms')} | {_ms(t, 'cpu_median_ms')} | {t['n']} | "
            f"{c['items_per_s']:,.0f} | "
            f"{c['used_tokens']:,} / {c['available']:,} ({c['utilisation']:.1%}) | "
            f"{c['kept']:,} / {c['truncated']:,} / {c['dropped']:,} |"
        )
    lines += ["", "Candidate lengths (tokens under the same counter, content only):", ""]
    lines += [
        "| section | items | mean | p50 | p95 | max | total |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in data["lengths"].items():
        lines.append(
            f"| {name} | {s['n']:,} | {s['mean']:,.1f} | {s['p50']:,.0f} | {s['p95']:,.0f} | "
            f"{s['max']:,} | {s['total']:,} |"
        )
    setup = data["setup"]
    lines += [
        "",
        "- Ratios: cold / warm median = "
        + ", ".join(f"{k} {v:.1f}×" for k, v in data["ratios"].items())
        + ".",
        f"- Outside the timed region: encoding load {setup['encoding_load_ms']:,.0f} ms (once "
        f"per process); building {p['n_items']:,} fresh `ContextItem`s "
        f"{setup['item_construction']['median_ms']:,.0f} ms (median).",
        f"- Goal (warm median ≤ {data['goals']['warm_median_ms_limit']} ms): "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in data["goals"]["met"].items())
        + ".",
        f"- Correctness flags: {_flags(data['correctness'])}. Peak RSS {data['peak_rss_mb']} MB.",
    ]
    return lines


def _render_history(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    lines = [
        "## History trimming vs LangChain (`bench_history_trim.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- {p['n_messages']:,} messages ("
        + ", ".join(f"{k} {v:,}" for k, v in p["messages_by_kind"].items())
        + f"), {p['input_tokens']:,} tokens, trimmed to {p['max_tokens']:,}; "
        f"`{p['encoding']}` counter shared by both sides.",
        "",
        "| implementation | median ms | p95 ms | min ms | CPU median ms | runs | "
        "langchain / ours | messages kept | tokens used | tool pairs intact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ours_median = data["configs"][0]["timings"]["median_ms"]
    for c in data["configs"]:
        t = c["timings"]
        ratio = t["median_ms"] / ours_median if ours_median else float("nan")
        lines.append(
            f"| {c['label']} | {_ms(t, 'median_ms')} | {_ms(t, 'p95_ms')} | "
            f"{_ms(t, 'min_ms')} | {_ms(t, 'cpu_median_ms')} | {t['n']} | {ratio:.2f}× | "
            f"{c['messages_kept']:,} | "
            f"{c['tokens_used']:,} | {'yes' if c['tool_pairs_intact'] else 'NO'} |"
        )
    goal = data["goals"]
    cpu = data.get("ratios_langchain_over_ours_cpu") or {}
    lines += [
        "",
        "- Ratio by CPU time: "
        + ", ".join(f"{k} {v:.2f}×" for k, v in cpu.items() if v is not None)
        + ".",
        f"- Goal (langchain / ours ≥ {goal['min_ratio']}×): "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goal["met"].items())
        + ".",
        f"- Correctness flags: {_flags(data['correctness'])}. Peak RSS {data['peak_rss_mb']} MB.",
    ]
    return lines


def _render_retrieval(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    vocab = p["vocabulary"]
    lines = [
        f"## Retrieval at {p['n_chunks']:,} chunks (`bench_retrieval.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}; load {data['machine'].get('load_avg_1m_at_end')} "
        "at end",
        f"- {p['n_chunks']:,} chunks of {p['chunk_words'][0]}–{p['chunk_words'][1]} words "
        f"(mean {p['chunk_words_mean']}) drawn from {vocab['words']:,} words of "
        f"{vocab['source']} by Zipf rank (s={p['zipf']['s']}, q={p['zipf']['q']}), seed "
        f"{p['seed']}; {p['n_queries']} queries of {p['query_words'][0]}–{p['query_words'][1]} "
        f"words ({p['query_terms_mean']} BM25 terms on average); top-{p['k']}; "
        f"{p['rounds']} interleaved rounds after {p['warmup']} warm-up calls; query embedder "
        f"`{p['embedder']}`.",
        "",
        "| section | implementation | median ms | p95 ms | min ms | CPU median ms | calls | "
        "round medians ms | note |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in data["configs"]:
        t = c["timings"]
        note = c.get("note", "")
        if "recall_at_10" in c:
            note = (
                f"recall@10 {c['recall_at_10']:.3f} (random queries), "
                f"{c['recall_at_10_near_queries']:.3f} (queries near a corpus vector)"
            )
        rounds = " / ".join(f"{m:,.2f}" for m in c.get("round_medians_ms", []))
        lines.append(
            f"| {c['group']} | {c['label']} | {_ms(t, 'median_ms')} | {_ms(t, 'p95_ms')} | "
            f"{_ms(t, 'min_ms')} | {_ms(t, 'cpu_median_ms')} | {t['n']} | {rounds} | {note} |"
        )
    r, g, hybrid = data["ratios"], data["goals"], data["hybrid"]
    met = g["met"]
    hybrid_median = g["values"]["hybrid_median_ms"]
    lines += [
        "",
        "| measure | value | goal | |",
        "|---|---:|---:|---|",
        f"| rank-bm25 / contextfold BM25 (median, same queries) | "
        f"{r['rank_bm25_over_contextfold']:,.1f}× (CPU {r['rank_bm25_over_contextfold_cpu']:,.1f}×)"
        f" | ≥ {g['rank_bm25_over_contextfold_min']}× | "
        f"{'met' if met['rank_bm25_over_contextfold'] else 'MISSED'} |",
        f"| contextfold BM25 / raw bm25s (median) | {r['contextfold_over_bm25s']:.2f}× "
        f"(CPU {r['contextfold_over_bm25s_cpu']:.2f}×) | ≤ {g['contextfold_over_bm25s_max']}× | "
        f"{'met' if met['contextfold_over_bm25s'] else 'MISSED'} |",
        f"| hybrid query median (embedding included) | {hybrid_median:,.2f} ms | "
        f"≤ {g['hybrid_median_ms_max']} ms | {'met' if met['hybrid_median_ms'] else 'MISSED'} |",
        "",
        "| build / ingest | seconds | chunks/s |",
        "|---|---:|---:|",
    ]
    for name, value in data["builds_s"].items():
        lines.append(f"| {name}, {p['n_chunks']:,} chunks | {value:,.2f} | "
                     f"{p['n_chunks'] / value:,.0f} |")  # fmt: skip
    lines += [
        f"| DocumentIndex.add_documents, {hybrid['chunks']:,} chunks, precomputed vectors | "
        f"{hybrid['ingest_s']:,.2f} | {hybrid['ingest_chunks_per_s']:,} |",
        f"| first DocumentIndex search after that ingest (builds BM25) | "
        f"{hybrid['first_search_s']:,.2f} | |",
        f"| add_document of one chunk to that index | {hybrid['add_one_document_ms'] / 1000:,.4f}"
        " | |",
        f"| first search after that add (rebuilds BM25) | "
        f"{hybrid['first_search_after_add_ms'] / 1000:,.2f} | |",
    ]
    for v in data["ingest"].values():
        what = f"with `{v['embedder']}`" if v["embedder"] else "BM25 only (`embedder=False`)"
        lines.append(
            f"| add_documents, {v['documents']:,} {p['ingest_source']} docs → {v['chunks']:,} "
            f"chunks, {what}, median of {v['runs']} | {v['add_documents_s']:,.2f} "
            f"(+{v['first_search_s']:,.2f} first search) | {v['chunks_per_s']:,.0f} "
            f"({v['chunks_per_s_to_searchable']:,.0f} to searchable) |"
        )
    lines += ["", f"- Ingest chunker: {p['ingest_chunker']}."]
    lines += [f"- {note}" for note in data.get("notes", [])]
    lines.append(
        f"- Correctness flags: {_flags(data['correctness'])}. Peak RSS {data['peak_rss_mb']} MB."
    )
    return lines


_FLOOR_COLUMNS = [
    "| split (queries) | mode | floor | nDCG@10 floor off | nDCG@10 floor on | loss | loss SE | "
    "loss + 1.645 SE | queries hurt / helped / left empty |",
    "|---|---|---:|---:|---:|---:|---:|---:|---|",
]


def _floor_rows(split: str, rows: dict[str, Any], floors: dict[str, float]) -> list[str]:
    lines = []
    for mode in ("bm25", "dense", "hybrid"):
        r = rows[mode]
        floor: object = floors[mode]
        if mode == "hybrid":
            floor = f"{floors['hybrid']} (or BM25 {floors['bm25']})"
        elif mode == "dense" and "dense_margin" in floors:
            floor = f"{floors['dense']} (margin {floors['dense_margin']})"
        lines.append(
            f"| {split} ({rows['queries']}) | {mode} | {floor} | {r['ndcg10_floor_off']:.4f} | "
            f"{r['ndcg10_floor_on']:.4f} | {r['loss']:+.4f} | {r['loss_se']:.4f} | "
            f"{r['loss_upper95']:+.4f} | {r['queries_hurt']} / {r['queries_helped']} / "
            f"{r['queries_left_empty']} |"
        )
    return lines


def _render_floor_calibration(path: Path, data: dict[str, Any]) -> list[str]:
    p, chosen = data["parameters"], data["chosen"]
    lines = [
        "## Relevance floor calibration on SciFact train (`calibrate_floor.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Split: {p['split']} ({data['queries']['tune']} tune, {data['queries']['dev']} dev "
        f"queries). Embedder `{p['embedder']}`, depth {p['depth']}, grid step {p['grid_step']}.",
        f"- Rule: {p['rule']}.",
        f"- Chosen: tolerance {chosen['tolerance_tune']} on tune → floors {chosen['floors']}"
        + ("" if chosen["any_accepted"] else " (NO tolerance met the rule: the smallest kept)")
        + ".",
        "",
        "Loss = nDCG@10 floor off − floor on (positive: the floor costs).",
        "",
        "| tolerance (tune) | floors bm25 / dense / hybrid | tune loss bm25 / dense / hybrid | "
        "dev loss bm25 / dense / hybrid | dev loss + 1.645 SE (max) | accepted |",
        "|---:|---|---|---|---:|---|",
    ]
    for c in data["candidates"]:
        f, tune, dev = c["floors"], c["tune"], c["dev"]
        modes = ("bm25", "dense", "hybrid")
        dense = f"{f['dense']} (margin {f['dense_margin']})" if "dense_margin" in f else f["dense"]
        lines.append(
            f"| {c['tolerance_tune']} | {f['bm25']} / {dense} / {f['hybrid']} | "
            + " / ".join(f"{tune[m]['loss']:+.4f}" for m in modes)
            + " | "
            + " / ".join(f"{dev[m]['loss']:+.4f}" for m in modes)
            + f" | {max(dev[m]['loss_upper95'] for m in modes):+.4f} | "
            f"{'yes' if c['accepted'] else 'no'} |"
        )
    return lines + _off_topic_rows(data)


def _off_topic_rows(data: dict[str, Any]) -> list[str]:
    """The off-topic probes' table (results written before it existed have none)."""
    if not data.get("off_topic"):
        return []
    lines = [
        "",
        "Off-topic probes over the same corpus with these floors (each should get 0 hits):",
        "",
        "| query | best cosine | hits bm25 / dense / hybrid |",
        "|---|---:|---|",
    ]
    for row in data["off_topic"]:
        hits = row["hits"]
        lines.append(
            f"| {row['query']} | {row['best_cosine']} | "
            f"{hits['bm25']} / {hits['dense']} / {hits['hybrid']} |"
        )
    return lines


def _render_floor(path: Path, data: dict[str, Any]) -> list[str]:
    if "test" not in data or "calibration" not in data:  # the first, superseded format
        return []
    cal, shipped = data["calibration"], data["shipped"]
    lines = [
        "## Relevance floor cost on SciFact (`calibrate_floor.py --test`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Shipped floors {shipped}, chosen on train by `{cal['file']}` (tolerance "
        f"{cal['tolerance_tune']} on tune); the test split was scored once, after they were "
        f"committed (commit {str(data['git']['commit'])[:12]}"
        f"{', dirty' if data['git']['dirty'] else ''}).",
        "",
        *_FLOOR_COLUMNS,
        *_floor_rows("train: tune", cal["tune"], shipped),
        *_floor_rows("train: dev", cal["dev"], shipped),
        *_floor_rows("**test**", data["test"], shipped),
        *_off_topic_rows(data),
    ]
    return lines


def _memory_floor_row(c: dict[str, Any], off: dict[str, Any]) -> str:
    floor = "off" if c["floor"] is None else f"{c['floor']:.2f}"
    names = "off" if c.get("name_floor") is None else f"{c['name_floor']:.2f}"
    return (
        f"| {floor} | {names} | {c['recall']:.4f} | {off['recall'] - c['recall']:+.4f} "
        f"| {c['real_withheld']} | {c['negative_mean_tokens']:,.1f} "
        f"| {c['negative_p95_tokens']:,.0f} | {c['negative_empty_share']:.3f} |"
    )


def _render_memory_floor(path: Path, data: dict[str, Any]) -> list[str]:
    """``calibrate_memory_floor.py``: the tune curves, or the held-out measurement."""
    q, off = data["questions"], data["off"]
    calibration = "curve" in data
    lines = [
        "## Memory relevance floors on LoCoMo "
        + (
            "tune (`calibrate_memory_floor.py`)"
            if calibration
            else "held-out (`calibrate_memory_floor.py --held-out`)"
        ),
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Split {data['split']}, budget {data['budget']:,} tokens; {q['real']:,} real questions "
        f"(categories 1–4 with evidence), {q['negative']:,} negative-set questions.",
    ]
    if "real_naming_unknown" in off:
        lines.append(
            f"- Questions naming something their conversation never stored: "
            f"{off['real_naming_unknown']} real, {off['negative_naming_unknown']} negative."
        )
    if calibration:
        chosen = data["chosen"]
        lines.append(
            f"- Chosen: {chosen['floor']:.2f}, the highest floor with tune loss ≤ "
            f"{data['tolerance']}."
        )
        if data.get("name_chosen"):
            lines.append(
                f"- Name floor chosen: {data['name_chosen']['name_floor']:.2f}, the lowest with "
                f"negative mean tokens ≤ {data['token_goal']:g}."
            )
    lines += [
        "",
        "| floor | name floor | recall 1–4 | loss | real withheld | negative mean tokens "
        "| negative p95 | negative share empty |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        _memory_floor_row(off, off),
    ]
    if calibration:
        lines += [
            _memory_floor_row(c, off)
            for c in data["curve"]
            if c["floor"] >= 0.25
            and (round(c["floor"] * 100) % 5 == 0 or c["floor"] == chosen["floor"])
        ]
        named = data.get("name_chosen")
        lines += [
            _memory_floor_row(c, off)
            for c in data.get("name_curve", [])
            if round(c["name_floor"] * 100) % 5 == 0
            or (named is not None and c["name_floor"] == named["name_floor"])
        ]
    else:
        if "floor_only" in data:
            lines.append(_memory_floor_row(data["floor_only"], off))
        lines.append(_memory_floor_row(data["on"], off))
    return lines


def _render_forwarded(path: Path, data: dict[str, Any]) -> list[str]:
    """``bench_forwarded.py``: forwarded ÷ client tokens per run."""
    lines = [
        "## Forwarded ÷ client tokens through the proxy (`bench_forwarded.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Goal: full history ≤ {data['goal']['full_history_ratio_max']:.2f}; "
        f"met: {'yes' if data['goal_met'] else 'no'}.",
        "",
        "| run | client tokens | forwarded tokens | forwarded ÷ client | per-request median "
        "| per-request p95 | requests with memory | memory tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        per = r["per_request_ratio"]
        lines.append(
            f"| {r['label']} | {r['client_tokens']:,} | {r['forwarded_tokens']:,} "
            f"| {r['ratio']:.3f} | {per['median']:.3f} | {per['p95']:.3f} "
            f"| {r['memory']['with_memory']} of {r['turns']} | {r['memory_tokens_recorded']:,} |"
        )
    return lines


def _render_long_messages(path: Path, data: dict[str, Any]) -> list[str]:
    """``bench_long_messages.py``: a question inside a long message, before and now."""
    lines = [
        "## A question inside a long message (`bench_long_messages.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Budget {data['budget']:,} tokens; pages: the first {data['pages']['sentences']} "
        f"sentences of {data['pages']['source']}.",
        "",
        "| split | asked | recall 1–4 | multi-hop | real questions withheld "
        "| negative mean tokens | negative p95 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for split, got in data["summary"].items():
        for key, m in got.items():
            if not isinstance(m, dict):
                continue
            multi = "–" if m["multi_hop"] is None else f"{m['multi_hop']:.3f}"
            neg = m["negative_mean_tokens"]
            p95 = m["negative_p95_tokens"]
            lines.append(
                f"| {split} | {key} | {m['recall']:.3f} | {multi} "
                f"| {m['real_withheld']} of {got['real_questions']} "
                f"| {'–' if neg is None else f'{neg:,.1f}'} "
                f"| {'–' if p95 is None else f'{p95:,.0f}'} |"
            )
    timed = data["timing"]
    lines += [
        "",
        f"Recall time on {timed['conversation']} ({timed['turns']:,} turns, MiniLM uncached, "
        f"{timed['questions']} questions):",
        "",
        "| asked | median ms | p95 ms | CPU median ms |",
        "|---|---:|---:|---:|",
    ]
    for key, t in timed["stats"].items():
        lines.append(
            f"| {key} | {t['median_ms']:.1f} | {t['p95_ms']:.1f} | {t['cpu_median_ms']:.1f} |"
        )
    return lines


def _render_memory(path: Path, data: dict[str, Any]) -> list[str]:
    write, recall = data["write"], data["recall"]
    rate, median = write["turns_per_second"], recall["median_ms"]
    return [
        "## Conversation memory (`bench_memory.py`)",
        "",
        data["description"],
        "",
        f"- Command: `python benchmarks/bench_memory.py` → `{path.relative_to(BENCH_DIR.parent)}`",
        f"- Machine: {_machine_line(data)}",
        "",
        "| measure | value | bar | met |",
        "|---|---:|---:|---|",
        f"| `on_turn_complete` without an LLM ({write['turns']:,} LoCoMo turns, "
        f"{write['compactions']} compactions, {write.get('store', 'in-memory store')}) "
        f"| {rate:,.0f} turns/s | ≥ 500 turns/s | {'yes' if rate >= 500 else 'NO'} |",
        f"| recall (`on_message_inbound`, 2,048 tokens) with {recall['stored_turns']:,} stored "
        f"turns, {recall['n']} questions: median / p95 | {_ms(recall, 'median_ms')} / "
        f"{_ms(recall, 'p95_ms')} ms | median ≤ 50 ms | {'yes' if median <= 50 else 'NO'} |",
    ]


def _render_decompose(path: Path, data: dict[str, Any]) -> list[str]:
    recall = data["recall"]
    off, on = recall["stats"]["off"], recall["stats"]["on"]
    return [
        "## Query decomposition's cost in a recall (`bench_decompose.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}; load {recall['load_avg_1m_at_end']} at the end",
        f"- {recall['stored_turns']:,} stored turns, {recall['questions']} questions at 2,048 "
        f"tokens ({recall['decomposed']} of them name someone and are decomposed), the two "
        "engines taking turns question by question.",
        "",
        "| `recall.decompose` | median ms | p95 ms | CPU median ms | bar (median ≤ 50 ms) |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {mode} | {_ms(s, 'median_ms')} | {_ms(s, 'p95_ms')} | "
            f"{_ms(s, 'cpu_median_ms')} | {'met' if s['median_ms'] <= 50 else 'NOT MET'} |"
            for mode, s in (("off", off), ("on (the default)", on))
        ),
        "",
        f"On ÷ off: median {recall['ratio_median']:.2f}×, p95 {recall['ratio_p95']:.2f}×.",
    ]


def _render_memory_scale(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    lines = [
        "## Memory as it grows (`bench_memory_scale.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- {p['questions']} LoCoMo questions per run at a {p['budget']:,}-token budget; turns "
        f"stored {p['chunk']} at a time and derived after each chunk; "
        f"{p['context_window']:,}-token window.",
        "- A first recall's ×: the median over its samples of each first recall ÷ the same "
        "question asked again right after it on the warm engine (the question's own cost "
        "cancels; runs before this measure have none).",
        "",
        "| run | write turns/s | recall | p50 / p95 ms | first after compaction ms | "
        "first after restart ms | RSS MB (vectors MB) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    baseline = data.get("baseline")
    tables = [("", data["runs"])]
    if baseline:
        tables.append((f"before, commit {baseline['commit'][:7]} ", baseline["runs"]))
    for name, runs in tables:
        for r in runs:
            rss = f"{r['rss_mb']['end']:,.0f} ({r['vectors_mb']:,.0f})"
            for kind in ("keyword", "dense"):
                m = r.get(kind)
                if not m:
                    lines.append(
                        f"| {name}{r['label']} | | default embedder | not run: "
                        f"{r.get('dense_skipped', '')} | | | |"
                    )
                    continue
                cpu = m["steady"].get("cpu_median_ms")
                recall = "keyword only" if kind == "keyword" else "default embedder"
                if m.get("synthetic_vectors"):
                    recall += " (random vectors)"
                lines.append(
                    f"| {name}{r['label']} | {r['write']['turns_per_s']:,.0f} | {recall} | "
                    f"{_ms(m['steady'], 'median_ms')} / {_ms(m['steady'], 'p95_ms')}"
                    + (f" (CPU p50 {cpu:,.1f})" if cpu is not None else "")
                    + f" | {_first(m, 'after_compaction')} | {_first(m, 'after_restart')} | {rss} |"
                )
    ingested = [
        (r["label"], kind, r[kind])
        for r in data["runs"]
        for kind in ("keyword", "dense")
        if r.get(kind) and "after_ingest_restart_ms" in r[kind]
    ]
    if ingested:
        lines += [
            "",
            "First recall after a restart of the session as ingested (stored and derived, "
            "never recalled; with the embedder, random vectors stored first), and ÷ the run's "
            "steady p50: "
            + "; ".join(
                f"{label} {kind} {_first(m, 'after_ingest_restart')}, "
                f"×{m['after_ingest_restart_ms'] / m['steady']['median_ms']:.2f} steady"
                for label, kind, m in ingested
            )
            + ".",
        ]
    together = data.get("side_by_side")
    if together:
        lines += [
            "",
            f"Side by side: the runs' stores reopened in one process, steady recalls in "
            f"{together['rounds']} alternating rounds (p50 / p95 ms, and p50 ÷ the first "
            "run's):",
            "",
            "| recall | " + " | ".join(together["keyword"]) + " |",
            "|---|" + "---:|" * len(together["keyword"]),
        ]
        for kind in ("keyword", "dense"):
            timings = together.get(kind)
            if not timings:
                continue
            first = next(iter(timings.values()))["median_ms"]
            cells = [
                f"{t['median_ms']:,.1f} / {t['p95_ms']:,.1f} ({t['median_ms'] / first:.2f}×)"
                if (t := timings.get(label))
                else "not run"
                for label in together["keyword"]
            ]
            name = "keyword only" if kind == "keyword" else "default embedder"
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if baseline:
        lines += ["", f"- Before: {baseline['note']}"]
    lines += ["", f"- Correctness flags: {_flags(data['correctness'])}."]
    return lines


def _render_first_recall(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    lines = [
        "## The first recall after a restart or a compaction (`bench_first_recall.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- One session, keyword-only; {p['questions']} steady recalls, {p['repeats']} first "
        f"recalls of each kind ({p['grow']} turns added before each compaction), "
        f"{p['rounds']} child process(es) per code version, alternating; medians.",
        "",
        "| turns | code | steady p50 ms (CPU) | after restart ms (CPU) | ratio wall / CPU | "
        "after compaction ms (CPU) | ratio wall / CPU |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for run in data["runs"]:
        for label, s in run["summary"].items():
            lines.append(
                f"| {run['turns']:,} | {label} | {s['steady_wall_ms']:,.1f} "
                f"({s['steady_cpu_ms']:,.1f}) | {s['after_restart_wall_ms']:,.1f} "
                f"({s['after_restart_cpu_ms']:,.1f}) | {s['after_restart_wall_ratio']}× / "
                f"{s['after_restart_cpu_ratio']}× | {s['after_compaction_wall_ms']:,.1f} "
                f"({s['after_compaction_cpu_ms']:,.1f}) | {s['after_compaction_wall_ratio']}× / "
                f"{s['after_compaction_cpu_ratio']}× |"
            )
    lines += ["", f"- Correctness flags: {_flags(data['correctness'])}."]
    return lines


def _render_turn_ann(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    lines = [
        "## Dense recall of a session's turn vectors: exact vs HNSW (`bench_turn_ann.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- Synthetic {p['dim']}-d unit vectors; top {p['limit']} (`recall.fts_limit`) per query, "
        f"{p['queries']} queries; the query vector made before each timed call. Default "
        f"`recall.ann_min_turns`: {p['ann_min_turns_default'] or 'none (always exact)'}.",
        "",
        "| turns | vectors | path | p50 / p95 ms | first query ms (vectors read) | "
        "first after restart, files ms | recall@k | build s | add "
        f"{p['grow']}: next query ms / fold s | RSS end MB (vectors MB) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        e, a = r["exact"], r.get("ann")
        rss = f"{r['rss_mb']['end']:,.0f} ({r['vectors_mb']:,.0f})"
        lines.append(
            f"| {r['turns']:,} | {r['vectors']} | exact | {_ms(e['steady'], 'median_ms')} / "
            f"{_ms(e['steady'], 'p95_ms')} | {e['first_ms']:,.1f} ({e['first_read']:,}) | "
            f"{e['restart']['first_ms']:,.1f} | 1 | | | {rss} |"
        )
        for name, q in (r.get("quantized") or {}).items():
            if name == "bytes_per_row":
                continue
            lines.append(
                f"| {r['turns']:,} | {r['vectors']} | {name} (same process) | "
                f"{_ms(q['steady'], 'median_ms')} / {_ms(q['steady'], 'p95_ms')} | | | "
                f"{q['recall_at_k']:.4f} | | | |"
            )
        if not a:
            continue
        lines.append(
            f"| {r['turns']:,} | {r['vectors']} | HNSW | {_ms(a['steady'], 'median_ms')} / "
            f"{_ms(a['steady'], 'p95_ms')} | | {a['restart']['first_ms']:,.1f} | "
            f"{a['recall_at_k']:.4f} (min {a['recall_at_k_min']:.3f}) | {a['build_s']:,.1f} | "
            f"{a['after_add_ms']:,.1f} / {a['fold_s']:,.1f} | |"
        )
    if data.get("note"):
        lines += ["", f"- {data['note']}"]
    lines += ["", f"- Correctness flags: {_flags(data['correctness'])}."]
    return lines


def _render_proxy(path: Path, data: dict[str, Any]) -> list[str]:
    p, load, goals = data["parameters"], data["load"], data["goals"]
    lines = [
        "## Proxy overhead (`bench_proxy.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}; load {data['machine'].get('load_avg_1m_at_end')} "
        "at end",
        f"- {p['latency_sessions']} sessions × {p['turns_per_session']} turns, each request "
        f"sent direct, through the null proxy (when measured) and through contextfold, "
        f"interleaved; engine: {p['engine']}.",
        "",
        "| mode | added p50 ms | added p90 ms | added p99 ms | null proxy added p50 ms | "
        "first byte added p50 ms | direct p50 ms | proxied p50 ms | proxy CPU ms / request |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in data["configs"]:
        a = c["added_ms"]
        null = c.get("null_proxy_added_ms")
        null_p50 = f"{null['p50']:.2f}" if null else "-"
        lines.append(
            f"| {'stream' if c['stream'] else 'JSON'} | {a['p50']:.2f} | {a['p90']:.2f} | "
            f"{a['p99']:.2f} | {null_p50} | "
            f"{c['first_byte_added_ms']['p50']:.2f} | "
            f"{c['direct_ms']['p50']:.2f} | {c['proxied_ms']['p50']:.2f} | "
            f"{c['proxy_cpu_ms_per_request']:.2f} |"
        )
    runs = data.get("concurrent") or []
    if runs:
        lines += [
            "",
            "Concurrent clients (growing history, JSON and streaming alternating; each request "
            "direct, through the null proxy and through contextfold in a rotating order):",
            "",
            "| run | requests | req/s | direct p50 ms | null added p50 / p99 ms | contextfold "
            "added p50 / p99 ms | contextfold / null p50 | proxy CPU ms / request | memory "
            "(with / without / failed) | bars |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in runs:
            n, cf, m = r["null_added_ms"], r["contextfold_added_ms"], r["memory"]
            bars = ", ".join(
                f"{k} {b['value']} ≤ {b['limit']} {'met' if b['met'] else 'MISSED'}"
                for k, b in r["bars"].items()
            )
            ratio = r["ratio_added_p50"]
            lines.append(
                f"| {r['label']} | {r['rounds']:,} | {r.get('requests_per_s', '-')} | "
                f"{r['direct_ms']['p50']:.2f} | "
                f"{n['p50']:.2f} / {n['p99']:.2f} | {cf['p50']:.2f} / {cf['p99']:.2f} | "
                f"{'-' if ratio is None else f'{ratio:.1f}×'} | "
                f"{r['proxy_cpu_ms_per_request']:.1f} | "
                f"{m['with_memory']} / {m['without_memory']} / "
                f"{m['memory_failed_forwarded_unmodified']} of {m['records']} records | {bars} |"
            )
    lines += [
        "",
        f"- Load: {load['sessions']} concurrent sessions for {load['seconds']:.0f} s: "
        f"{load['requests']:,} requests ({load['requests_per_s']}/s), latency p50 "
        f"{load['latency_ms']['p50']:,} ms / p99 {load['latency_ms']['p99']:,} ms, "
        f"{load['errors']} errors, {len(load['lost_turn_sessions'])} sessions with lost turns "
        f"({load['turns_answered']:,} turns checked in the store).",
        "- Goals: "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals["met"].items())
        + ".",
        f"- Correctness flags: {_flags(data['correctness'])}. Peak RSS {data['peak_rss_mb']} MB.",
    ]
    return lines


def _render_durability(path: Path, data: dict[str, Any]) -> list[str]:
    lines = [
        "## Durability (`bench_durability.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
    ]
    if data["configs"]:
        lines += [
            "",
            "| run | requests | req/s | acknowledged | missing after SIGTERM | exit s | exit code "
            "| RSS MB start / max / end | RSS max while exiting |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for c in data["configs"]:
        rss = c["rss_mb"]
        code = f"{c['exit_code']}{' (killed)' if c['killed_after_timeout'] else ''}"
        lines.append(
            f"| {c['label']}: {c['sessions']} sessions, {c['seconds']:.0f} s | "
            f"{c['requests']:,} | {c['requests_per_s']:,} | {c['acknowledged']:,} | "
            f"{c['missing_exchanges']:,} | {c['exit_seconds']:.1f} | {code} | "
            f"{rss['start']:.0f} / {rss['max']:.0f} / {rss['end']:.0f} | "
            f"{rss['max_while_exiting'] or '-'} |"
        )
    crash = data.get("crash")
    if crash:
        lines += [
            "",
            "| kill -9 trials | acknowledged | missing | trials with missing | integrity "
            "failures | compacted sessions | inconsistent tag summaries |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {crash['trials']} × {crash['sessions_per_trial']} sessions | "
            f"{crash['acknowledged']:,} | {crash['missing_exchanges']:,} | "
            f"{crash['trials_with_missing']} | {crash['integrity_failures']} | "
            f"{crash['compacted_sessions']} | {crash['inconsistent_sessions']} |",
        ]
    met = data["goals"]["met"]
    lines += [
        "",
        "- Bars: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()) + ".",
        f"- Harness checks: {_flags(data['correctness'])}.",
    ]
    return lines


def _render_warm_start(path: Path, data: dict[str, Any]) -> list[str]:
    p, s = data["parameters"], data["summary"]
    lines = [
        "## Warm start (`bench_warm_start.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- {p['turns']} stored exchanges, {p['restarts']} restarts, {p['steady']} steady "
        f"requests each; engine: {p['engine']}.",
        "",
        "| restart | start to ready s | first request added ms | steady added p50 ms | "
        "first / steady |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        lines.append(
            f"| {r['restart']} | {r['start_to_ready_s']:.2f} | {r['first_added_ms']:.2f} | "
            f"{r['steady_added_p50_ms']:.2f} | {ratio} |"
        )
    lines += [
        "",
        f"- Median first / steady: {s['ratio_median']}× (max {s['ratio_max']}×). Goals: "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in data["goals"]["met"].items())
        + ".",
    ]
    return lines


def _count(value: Any, fmt: str = ",") -> str:
    return "—" if value is None else format(value, fmt)


def _render_tool_outputs(path: Path, data: dict[str, Any]) -> list[str]:
    p, r = data["parameters"], data["ratios"]
    recorded = data["name"] == "tool_outputs_recorded"
    what = "a recorded Claude Code session" if recorded else "a synthesized session"
    window = f"; model window {p['window_tokens']:,} tokens" if "window_tokens" in p else ""
    session = p["session"] if "session_kind" in p else f"{p['session']}, {p['calls']} tool calls"
    lines = [
        f"## Tool-output compaction: {what} (`bench_tool_outputs.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        f"- Session: {session}; limit {p['limit_tokens']:,} tokens{window}, newest "
        f"{p['keep_recent']} outputs kept; counts: {p['counter']}.",
        "",
        "| strategy | total input tokens | not served by the prompt cache | largest request | "
        "last request | over the limit | over the window | prefix kept | events | "
        "prefix kept between events | invalid |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in data["strategies"].items():
        lines.append(
            f"| {name} | {s['total_tokens']:,} | {s['uncached_tokens']:,} | "
            f"{s['largest_request_tokens']:,} | {s['last_request_tokens']:,} | "
            f"{s['requests_over_limit']} | {_count(s.get('requests_over_window'))} | "
            f"{s['prefix_kept_share']:.1%} | {_count(s.get('events'))} | "
            f"{s.get('prefix_kept_between_events', '—')} | {s['invalid_count']} |"
        )
    lines.append("")
    c = data.get("compaction")
    if c:
        samples = "; ".join(
            f"request {x['request']}: {x['before']:,} → {x['after']:,} "
            f"({x['before'] / x['after']:.2f}×)"
            for x in c["samples"]
        )
        lines.append(
            f"- Compaction per request (contextfold, tokens before → after): {samples}. "
            f"{c['compacted_requests']} of {p['calls']} requests compacted (the first: request "
            f"{c['first_compacted_request']}); ratio median {c['ratio_median_compacted']}×, "
            f"last {c['ratio_last']}×, largest {c['ratio_max']}×; "
            f"{c.get('bucket_events', '—')} of the events are size-bucket crossings, the others "
            "stub the output that just left the newest ones while a bucket's savings are not "
            "reached."
        )
    x = data.get("through_proxy")
    if x:
        timing = (
            f"after the first ({x['first_seconds']} s: the whole history, new to the proxy), "
            f"{x['seconds_median']} s median per request through the proxy against "
            f"{x['direct_seconds_median']} s straight: {x['added_ms_median']} ms added "
            f"(median; at most {x['added_ms_max']} ms)"
            if "added_ms_median" in x
            else f"{x['seconds_median']} s median, {x['seconds_max']} s max per request"
        )
        lines.append(
            f"- Through a real `contextfold proxy` (memory on) to the scripted upstream, the "
            f"last {len(x['requests'])} requests in order, answered as recorded: "
            f"{x['answered']} answered, {x['valid']} valid as forwarded, "
            f"{x['stubbed_as_offline']} stubbed exactly as offline, the restore tool on "
            f"{x['restore_tool_on_compacted']} of {x['compacted']} compacted; {timing}."
        )
    lines += [
        "- Ratios: " + ", ".join(f"{k} {v}×" for k, v in r.items()) + ".",
        f"- Correctness flags: {_flags(data['correctness'])}.",
    ]
    return lines


def _render_store(path: Path, data: dict[str, Any]) -> list[str]:
    p, ratios = data["parameters"], data["ratios_postgres_over_sqlite"]
    lines = [
        "## Store backends (`bench_store.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}; PostgreSQL at `{data['postgres']}`",
        f"- {p['turns']:,} LoCoMo turns written one per call; {p['questions']} questions "
        f"recalled at {p['budget']:,} tokens; the backends take turns call by call.",
    ]
    repeats = data.get("repeats")
    if repeats:
        lines.append(
            f"- {len(repeats)} repeats, fresh stores each (the table pools them):"
            " `on_turn_complete` PostgreSQL ÷ SQLite "
            + ", ".join(f"{r['ratios']['on_turn_complete']:.2f}×" for r in repeats)
            + "; load average (1 min) at their starts "
            + ", ".join(str(r["load_avg_1m_at_start"]) for r in repeats)
            + "."
        )
    lines += [
        "",
        "| measure | SQLite p50 / p95 ms | PostgreSQL p50 / p95 ms | PostgreSQL ÷ SQLite |",
        "|---|---:|---:|---:|",
    ]
    sqlite, pg = data["configs"]
    for key, label in (
        ("on_turn_complete", "`on_turn_complete`, one message"),
        ("commit_exchange_per_turn", "`commit_exchange`, per turn of a pair"),
        ("recall", "recall (`on_message_inbound`)"),
    ):
        lines.append(
            f"| {label} | {_ms(sqlite[key], 'median_ms')} / {_ms(sqlite[key], 'p95_ms')} | "
            f"{_ms(pg[key], 'median_ms')} / {_ms(pg[key], 'p95_ms')} | {ratios[key]:.2f}× |"
        )
    locomo = data.get("locomo")
    if locomo:
        lines += ["", "| LoCoMo, contextfold system | questions | recall at 512 | at 2,048 |"]
        lines += ["|---|---:|---:|---:|"]
        for backend, r in locomo.items():
            rec = r["evidence_recall"]
            lines.append(
                f"| {backend} | {r['questions']:,} | {rec.get('512', 0):.3f} | "
                f"{rec.get('2048', 0):.3f} |"
            )
    lines += [
        "",
        f"- Goals: {_flags(data['goals'])}.",
        f"- Correctness: {_flags(data['correctness'])}.",
    ]
    return lines


def _render_scaleout(path: Path, data: dict[str, Any]) -> list[str]:
    p = data["parameters"]
    lines = [
        "## Scale-out: workers and backends (`bench_scaleout.py`)",
        "",
        data["description"],
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}; PostgreSQL at `{data['postgres']}`",
        f"- {p['clients']} concurrent clients × {p['turns_per_client']} requests (fake answering "
        f"at once); then {p['load_sessions']} sessions for {p['load_seconds']:.0f} s.",
        "",
        "| backend | workers | added p50 / p99 ms | null p50 ms | "
        "contextfold req/s (beside direct + null) | load req/s | load p50 / p99 ms | "
        "errors | lost turns |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        cf, load = r["contextfold_added_ms"], r["load"]
        lines.append(
            f"| {r['backend']} | {r['workers']} | {cf['p50']:,.1f} / {cf['p99']:,.1f} | "
            f"{r['null_added_ms']['p50']:,.1f} | {r['requests_per_s']:,.1f} | "
            f"{load['requests_per_s']:,.1f} | {load['latency_ms']['p50']:,.1f} / "
            f"{load['latency_ms']['p99']:,.1f} | {r['errors'] + load['errors']} | "
            f"{load['lost_turns']} of {load['answered_turns']:,} |"
        )
    lines += ["", f"- Correctness: {_flags(data['correctness'])}."]
    return lines


def _render_telemetry(path: Path, data: dict[str, Any]) -> list[str]:
    modes = ("absent", "api", "sdk")
    lines = [
        "## OpenTelemetry hooks (`bench_telemetry.py`)",
        "",
        "A pipeline build (300 retrieval items into 4,000 tokens) and a memory recall (a "
        f"{data['session_turns']}-turn session), each with `opentelemetry` *absent*, the *api* "
        "only (no SDK: non-recording spans) and the *sdk* recording every span into an "
        "in-memory exporter; the modes interleaved round by round in one process.",
        "",
        f"- Command: `{data['command']}` → `{_relative(str(path))}`",
        f"- Machine: {_machine_line(data)}",
        "",
        "| work | mode | median ms | p95 ms | CPU median ms | CPU ratio to absent "
        "| CPU overhead µs | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        for mode in modes:
            stats = row["stats"][mode]
            lines.append(
                f"| {row['work']} | {mode} | {_ms(stats, 'median_ms')} | {_ms(stats, 'p95_ms')} "
                f"| {_ms(stats, 'cpu_median_ms')} | {row['ratio_cpu'][mode]:.3f}× "
                f"| {row['overhead_us_cpu'][mode]:,.1f} | {stats['n']} |"
            )
    return lines


_RENDERERS = {
    "memory": _render_memory,
    "memory_scale": _render_memory_scale,
    "first_recall": _render_first_recall,
    "decompose": _render_decompose,
    "turn_ann": _render_turn_ann,
    "proxy": _render_proxy,
    "durability": _render_durability,
    "window": _render_window,
    "history_trim": _render_history,
    "retrieval": _render_retrieval,
    "retrieval_floor": _render_floor,
    "warm_start": _render_warm_start,
    "tool_outputs": _render_tool_outputs,
    "tool_outputs_recorded": _render_tool_outputs,
    "retrieval_floor_calibration": _render_floor_calibration,
    "memory_floor_calibration": _render_memory_floor,
    "memory_floor": _render_memory_floor,
    "forwarded": _render_forwarded,
    "long_messages": _render_long_messages,
    "store": _render_store,
    "scaleout": _render_scaleout,
    "telemetry": _render_telemetry,
}


def render_one(name: str, path: Path, data: dict[str, Any]) -> list[str]:
    """The markdown section of one result (empty for a benchmark without a renderer)."""
    render = _RENDERERS.get(name)
    return render(path, data) if render is not None else []


def render_results(results_dir: Path) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Generated from the JSON files in `benchmarks/results/` by `benchmarks/_common.py` "
        "(newest full run of each benchmark); do not edit by hand. Timings are wall-clock "
        "`time.perf_counter` per call, garbage collected before each call; median and p95 over "
        "the runs listed. *CPU median* is the CPU time of the benchmark process per call, which "
        "other processes on a shared machine do not inflate. Peak RSS is the whole benchmark "
        "process, data loading included. Re-run with `python benchmarks/bench_window.py`, "
        "`python benchmarks/bench_history_trim.py`, `python benchmarks/bench_retrieval.py`, "
        "`python benchmarks/bench_memory.py`, `python benchmarks/bench_memory_scale.py`, "
        "`python benchmarks/bench_turn_ann.py`, `python benchmarks/bench_first_recall.py`, "
        "`python benchmarks/bench_proxy.py`, "
        "`python benchmarks/bench_durability.py`, `python benchmarks/bench_warm_start.py`, "
        "`python benchmarks/bench_tool_outputs.py` (`--synthesized` for the synthesized "
        "session), `python benchmarks/calibrate_memory_floor.py` and "
        "`python benchmarks/bench_forwarded.py`, `python benchmarks/bench_long_messages.py`; "
        "`bench_store.py`, `bench_scaleout.py` and "
        "`bench_telemetry.py` likewise.",
        "",
    ]
    for name, (path, data) in latest_results(results_dir).items():
        section = render_one(name, path, data)
        if section:
            lines += [*section, ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    RESULTS_MD.write_text(render_results(RESULTS_DIR), encoding="utf-8")
    print(f"wrote {RESULTS_MD}")
