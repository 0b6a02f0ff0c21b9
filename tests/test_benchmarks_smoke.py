"""The benchmark scripts run in ``--quick`` mode, write one valid JSON result with the expected
keys, render the markdown table, and report every correctness flag true. No timing is
asserted: these are benchmarks, not timed tests."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _load_common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_common", BENCHMARKS / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


common = _load_common()
DATA = common.default_data_dir()
needs_data = pytest.mark.skipif(
    not (DATA / "locomo/locomo10.json").is_file(),
    reason=f"shared benchmark data not found at {DATA}; set {common.DATA_ENV}",
)

COMMON_KEYS = {
    "name",
    "description",
    "created",
    "quick",
    "command",
    "parameters",
    "machine",
    "versions",
    "git",
    "configs",
    "goals",
    "correctness",
    "peak_rss_mb",
}
TIMING_KEYS = {"median_ms", "p95_ms", "min_ms", "max_ms", "mean_ms", "n"}


def run_quick(tmp_path: Path, script: str, name: str, *extra: str) -> tuple[dict[str, Any], Path]:
    """Run ``script --quick`` (and ``extra`` arguments) into ``tmp_path``; its JSON result and
    the markdown it wrote (beside the JSON by default: a trial run never rewrites the
    committed table)."""
    md = tmp_path / "RESULTS.md"
    committed = common.RESULTS_MD.read_bytes()
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / script),
            "--quick",
            "--results-dir",
            str(tmp_path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert common.RESULTS_MD.read_bytes() == committed
    (path,) = tmp_path.glob(f"{name}-*-quick.json")
    return json.loads(path.read_text(encoding="utf-8")), md


@needs_data
@pytest.mark.parametrize(
    ("script", "name", "extra_keys", "config_keys"),
    [
        (
            "bench_window.py",
            "window",
            {"lengths", "setup", "ratios"},
            {"budget", "mode", "items_per_s", "used_tokens", "available", "kept"},
        ),
        (
            "bench_history_trim.py",
            "history_trim",
            {"ratios_langchain_over_ours"},
            {"label", "messages_kept", "tokens_used", "tool_pairs_intact"},
        ),
    ],
)
def test_benchmark_quick_run(
    tmp_path: Path, script: str, name: str, extra_keys: set[str], config_keys: set[str]
) -> None:
    result, md = run_quick(tmp_path, script, name)
    assert COMMON_KEYS | extra_keys <= result.keys()
    assert result["name"] == name and result["quick"] is True
    assert {"cores", "cpu_model", "python", "os"} <= result["machine"].keys()
    for config in result["configs"]:
        assert config_keys <= config.keys()
        assert config["timings"].keys() >= TIMING_KEYS and config["timings"]["n"] >= 1
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    assert md.read_text(encoding="utf-8").startswith("# Benchmark results")


def test_scifact_abstract_literals_are_read_one_by_one() -> None:
    # numpy-style repr without commas: ast.literal_eval would glue the sentences together
    abstract = "['First sentence (n = 17).'\n 'Second, with \\'quotes\\'.'\n \"Third's.\"]"
    assert common.abstract_sentences(abstract) == [
        "First sentence (n = 17).",
        "Second, with 'quotes'.",
        "Third's.",
    ]


def test_retrieval_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_retrieval.py`` needs no shared data (it falls back to a built-in word list), so
    this one is not skipped without it."""
    result, md = run_quick(tmp_path, "bench_retrieval.py", "retrieval")
    extra = {"builds_s", "bm25", "dense", "hybrid", "ingest", "ratios", "notes"}
    assert COMMON_KEYS | extra <= result.keys()
    assert result["name"] == "retrieval" and result["quick"] is True
    assert {"n_chunks", "n_queries", "embedder", "vocabulary"} <= result["parameters"].keys()
    labels = {c["label"] for c in result["configs"]}
    assert {
        "contextfold BM25Index.search",
        "bm25s tokenize + retrieve",
        "rank_bm25 BM25Okapi.get_top_n",
        "contextfold NumpyVectorIndex (exact)",
        "contextfold USearchVectorIndex (HNSW)",
        "DocumentIndex.search hybrid",
    } <= labels
    for config in result["configs"]:
        timings = config["timings"]
        assert timings.keys() >= TIMING_KEYS and timings["n"] >= 1
        assert timings["median_ms"] > 0 and timings["p95_ms"] >= timings["median_ms"]
        assert config["round_medians_ms"] and config["group"] in {"bm25", "dense", "hybrid"}
    assert all(seconds > 0 for seconds in result["builds_s"].values())
    assert 0 <= result["dense"]["usearch_recall_at_10"] <= 1
    assert result["hybrid"]["ingest_chunks_per_s"] > 0
    for ingest in result["ingest"].values():
        assert ingest["chunks"] >= ingest["documents"] > 0 and ingest["chunks_per_s"] > 0
    assert all(r > 0 for r in result["ratios"].values())
    assert set(result["goals"]["met"]) == {
        "rank_bm25_over_contextfold",
        "contextfold_over_bm25s",
        "hybrid_median_ms",
    }
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    assert result["peak_rss_mb"] > 0
    assert "## Retrieval at" in md.read_text(encoding="utf-8")


def test_warm_start_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_warm_start.py`` restarts a real proxy process on a stored conversation and
    compares its first request with the steady state."""
    result, md = run_quick(tmp_path, "bench_warm_start.py", "warm_start")
    assert result.keys() >= (COMMON_KEYS - {"configs"}) | {"runs", "summary", "parameters"}
    assert len(result["runs"]) == result["parameters"]["restarts"] == 2
    for run in result["runs"]:
        assert run["first_added_ms"] > 0 and run["steady_added_p50_ms"] > 0
        expected = run["first_added_ms"] / run["steady_added_p50_ms"]
        assert run["ratio"] == pytest.approx(expected, abs=0.02)
    assert result["correctness"]["every restart answered"] is True
    assert "## Warm start" in md.read_text(encoding="utf-8")


def test_tool_outputs_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_tool_outputs.py`` replays a synthesized agent session through the compaction
    and two baselines."""
    result, md = run_quick(tmp_path, "bench_tool_outputs.py", "tool_outputs")
    strategies = result["strategies"]
    assert set(strategies) == {"none", "contextfold", "clear-old"}
    none, ours = strategies["none"], strategies["contextfold"]
    assert none["requests"] == ours["requests"] == result["parameters"]["calls"] == 60
    assert none["prefix_kept_share"] == 1.0 and none["invalid_count"] == 0
    assert ours["invalid_count"] == 0 and ours["total_tokens"] < none["total_tokens"]
    assert result["ratios"]["total_none_over_contextfold"] == round(
        none["total_tokens"] / ours["total_tokens"], 2
    )
    assert ours["prefix_kept_between_events_share"] == 1.0 and none["events"] == 0
    assert len(ours["per_request_tokens"]) == 60
    assert result["compaction"]["compacted_requests"] > 0
    assert "## Tool-output compaction" in md.read_text(encoding="utf-8")


def test_tool_outputs_benchmark_replays_a_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recording in ``record_agent_session.py``'s delta-coded format (here the synthesized
    session written through its writer) reads back body for body, and the benchmark replays
    it as a recorded session."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_tool_outputs
    import record_agent_session

    bodies = bench_tool_outputs.synthesized_session(12, seed=3)
    bodies[5] = {**bodies[5], "max_tokens": 100}  # a top-level field that changes
    path = tmp_path / "session.jsonl.gz"
    with path.open("wb") as raw:
        writer = record_agent_session.DeltaWriter(raw)
        writer.line({"recording": {"client": "test", "version": "0", "tool_calls": 12}})
        for body in bodies:
            writer.write(body)
        writer.close()
    meta, back = record_agent_session.read_recording(path)
    assert back == bodies and [list(b) for b in back] == [list(b) for b in bodies]
    assert meta["client"] == "test"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_tool_outputs.py"),
            "--quick",
            "--session",
            str(path),
            "--results-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (result_path,) = tmp_path.glob("tool_outputs_recorded-*-quick.json")
    result = json.loads(result_path.read_text(encoding="utf-8"))
    assert result["parameters"]["session_kind"] == "recorded"
    assert result["strategies"]["none"]["requests"] == 12
    assert "a recorded Claude Code session" in (tmp_path / "RESULTS.md").read_text()


@needs_data
def test_memory_scale_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_memory_scale.py`` grows a session and many sessions through the engine's own
    API and times recall, keyword-only and with the default embedder."""
    result, md = run_quick(tmp_path, "bench_memory_scale.py", "memory_scale")
    assert result.keys() >= (COMMON_KEYS - {"configs", "goals"}) | {"runs", "parameters"}
    assert len(result["runs"]) == 2
    for run in result["runs"]:
        assert run["write"]["turns"] == run["sessions"] * run["turns_per_session"]
        assert run["write"]["turns_per_s"] > 0 and run["rss_mb"]["end"] > 0
        for kind in ("keyword", "dense"):
            timings = run[kind]["steady"]
            assert timings.keys() >= TIMING_KEYS and timings["n"] == 5
            assert run[kind]["after_compaction_ms"] > 0 and run[kind]["after_restart_ms"] > 0
            for first in ("after_compaction", "after_restart"):
                samples = run[kind][f"{first}_samples_ms"]
                assert len(samples) == 3 and sorted(samples)[1] == run[kind][f"{first}_ms"]
                again = run[kind][f"{first}_again_samples_ms"]
                ratios = sorted(f / a for f, a in zip(samples, again, strict=True))
                assert len(again) == 3 and run[kind][f"{first}_paired"] == ratios[1]
        assert run["dense"]["unranked_turns_at_start"] == 0
        # As ingested (never recalled): keyword only without random vectors, 3 first recalls.
        ingested = run["keyword"]["after_ingest_restart_samples_ms"]
        assert (
            len(ingested) == 3 and sorted(ingested)[1] == run["keyword"]["after_ingest_restart_ms"]
        )
        assert "after_ingest_restart_ms" not in run["dense"]
        assert "stored" not in run  # the kept stores' paths and questions stay internal
    together = result["side_by_side"]
    assert together["rounds"] == 3
    for kind in ("keyword", "dense"):
        labels = [run["label"] for run in result["runs"]]
        assert list(together[kind]) == labels
        assert all(t.keys() >= TIMING_KEYS and t["n"] == 5 for t in together[kind].values())
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    text = md.read_text(encoding="utf-8")
    assert "## Memory as it grows" in text and "Side by side: the runs' stores" in text
    assert "restart of the session as ingested" in text


@needs_data
def test_first_recall_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_first_recall.py`` repeats the first recall after a restart and after a
    compaction beside the steady one, in child processes on copies of one stored session."""
    result, md = run_quick(tmp_path, "bench_first_recall.py", "first_recall")
    assert result.keys() >= (COMMON_KEYS - {"configs", "goals"}) | {"runs", "parameters"}
    (run,) = result["runs"]
    assert run["turns"] == 300 and run["build"]["tags"] > 0
    (measured,) = run["sides"]["this checkout"]
    assert measured["steady"].keys() >= TIMING_KEYS and measured["steady"]["n"] == 3
    assert measured["after_restart"]["n"] == measured["after_compaction"]["n"] == 2
    summary = run["summary"]["this checkout"]
    assert summary["after_restart_wall_ratio"] > 0 and summary["after_compaction_cpu_ratio"] > 0
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    assert "## The first recall after a restart or a compaction" in md.read_text(encoding="utf-8")


@needs_data
def test_decompose_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_decompose.py`` times recall with ``recall.decompose`` off and on, side by side
    on the same questions."""
    result, md = run_quick(tmp_path, "bench_decompose.py", "decompose")
    recall = result["recall"]
    assert recall["stored_turns"] == 400 and recall["questions"] == 20
    assert 0 < recall["decomposed"] <= recall["questions"]
    for mode in ("off", "on"):
        stats = recall["stats"][mode]
        assert stats.keys() >= TIMING_KEYS and stats["n"] == 20
    assert recall["ratio_median"] == pytest.approx(
        recall["stats"]["on"]["median_ms"] / recall["stats"]["off"]["median_ms"], abs=1e-3
    )
    assert "## Query decomposition's cost in a recall" in md.read_text(encoding="utf-8")


@needs_data
def test_memory_floor_calibration_quick_run(tmp_path: Path) -> None:
    result, md = run_quick(tmp_path, "calibrate_memory_floor.py", "memory_floor_calibration")
    assert result["split"] == "tune" and result["quick"] is True
    assert result["questions"]["real"] > 0 and result["questions"]["negative"] > 0
    conversations = {row["conversation"] for row in result["rows"]["real"]}
    assert conversations <= {"conv-26", "conv-30", "conv-41", "conv-42", "conv-43"}
    assert result["chosen"]["recall"] >= result["off"]["recall"] - result["tolerance"]
    # The name floor's curve: stricter floors never inject more, nor recall more.
    curve = result["name_curve"]
    assert curve and all(c["floor"] == curve[0]["floor"] for c in curve)
    for low, high in itertools.pairwise(curve):
        assert high["negative_mean_tokens"] <= low["negative_mean_tokens"]
        assert high["recall"] <= low["recall"]
    chosen = result["name_chosen"]
    if chosen is not None:
        assert chosen["negative_mean_tokens"] <= result["token_goal"]
    assert "Memory relevance floors on LoCoMo tune" in md.read_text(encoding="utf-8")


@needs_data
def test_long_messages_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_long_messages.py`` asks LoCoMo questions alone and inside a pasted page,
    without and with the long message's asking sentences (``question_focus``)."""
    result, md = run_quick(tmp_path, "bench_long_messages.py", "long_messages")
    summary = result["summary"]
    assert set(summary) == {"tune", "held-out", "all"}
    for got in summary.values():
        assert got["real_questions"] > 0 and got["negative_questions"] > 0
        for form in result["forms"]:
            before, now = got[f"{form}, before"], got[f"{form}, now"]
            for m in (before, now, got["alone"]):
                assert 0 <= m["recall"] <= 1 and m["negative_mean_tokens"] >= 0
            assert now["real_withheld"] <= before["real_withheld"]
        # The page drowns the question: judged whole, most of it is withheld.
        assert sum(got[f"{f}, now"]["real_withheld"] for f in result["forms"]) < sum(
            got[f"{f}, before"]["real_withheld"] for f in result["forms"]
        )
    rows = result["rows"]
    assert {r["split"] for r in rows} == {"tune", "held-out"}
    assert "## A question inside a long message" in md.read_text(encoding="utf-8")


@needs_data
def test_forwarded_tokens_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_forwarded.py`` drives a real proxy process through a conversation, three ways,
    and counts what the client sent against what the fake upstream received."""
    result, md = run_quick(tmp_path, "bench_forwarded.py", "forwarded")
    labels = [r["label"] for r in result["runs"]]
    assert labels == ["full history", "last 6 messages", "full history, 4k window"]
    for run in result["runs"]:
        assert run["turns"] == 12
        assert run["ratio"] == pytest.approx(
            run["forwarded_tokens"] / run["client_tokens"], abs=1e-4
        )
        assert run["memory"]["memory_failed_forwarded_unmodified"] == 0
    full = result["runs"][0]
    # A client sending its whole history holds every stored turn: nothing to recall.
    assert full["memory"]["with_memory"] == 0 and full["ratio"] == 1.0
    assert result["correctness"]["every request reached the upstream"] is True
    assert "## Forwarded ÷ client tokens" in md.read_text(encoding="utf-8")


@needs_data
def test_store_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_store.py`` writes and recalls through the engine on SQLite and on a real
    PostgreSQL server, and runs LoCoMo on both."""
    result, md = run_quick(tmp_path, "bench_store.py", "store")
    sqlite, pg = result["configs"]
    assert (sqlite["label"], pg["label"]) == ("sqlite", "postgres")
    for config in (sqlite, pg):
        for key in ("on_turn_complete", "commit_exchange_per_turn", "recall"):
            assert config[key].keys() >= TIMING_KEYS and config[key]["n"] >= 1
    ratios = result["ratios_postgres_over_sqlite"]
    assert ratios["on_turn_complete"] == round(
        pg["on_turn_complete"]["median_ms"] / sqlite["on_turn_complete"]["median_ms"], 2
    )
    repeats = result["repeats"]
    assert len(repeats) == result["parameters"]["repeats"] >= 1
    assert all(r["ratios"].keys() == ratios.keys() for r in repeats)
    assert set(result["locomo"]) == {"sqlite", "postgres"}
    assert result["locomo"]["sqlite"]["questions"] > 0
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    assert "## Store backends" in md.read_text(encoding="utf-8")


def test_scaleout_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_scaleout.py`` runs the proxy with 1 and 2 workers on SQLite and PostgreSQL and
    finds every answered turn in the store."""
    result, md = run_quick(tmp_path, "bench_scaleout.py", "scaleout")
    runs = {(r["backend"], r["workers"]) for r in result["runs"]}
    assert runs == {("sqlite", 1), ("sqlite", 2), ("postgres", 1), ("postgres", 2)}
    for run in result["runs"]:
        assert run["load"]["answered_turns"] > 0 and run["load"]["lost_turns"] == 0
        assert run["contextfold_added_ms"]["p50"] is not None
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    assert "## Scale-out" in md.read_text(encoding="utf-8")


def test_turn_ann_benchmark_quick_run(tmp_path: Path) -> None:
    """``bench_turn_ann.py`` times the dense signal on a session's turn vectors, exact and
    through the HNSW index, from a fresh process and after a restart from the vector files,
    and the quantized scans beside the float32 one (the int8 copy's recall@k in
    ``correctness``)."""
    result, md = run_quick(tmp_path, "bench_turn_ann.py", "turn_ann", "--quantized")
    expected = (COMMON_KEYS - {"configs", "goals", "peak_rss_mb"}) | {"runs", "parameters"}
    assert result.keys() >= expected  # each run reports its own process's peak RSS
    assert all("peak_rss_mb" in run for run in result["runs"])
    assert result["correctness"] and all(v is True for v in result["correctness"].values())
    assert result["runs"]
    for run in result["runs"]:
        exact = run["exact"]
        assert exact["first_read"] == run["turns"]  # a fresh process reads every vector
        assert exact["steady"].keys() >= TIMING_KEYS and exact["steady"]["n"] > 0
        # A restart maps the files and reads only the rows it checks from the store.
        assert exact["restart"]["read_from_store"] < run["turns"]
        if "ann" in run:
            assert 0.0 <= run["ann"]["recall_at_k"] <= 1.0 and run["ann"]["answered_by_index"]
        int8 = run["quantized"]["session int8 copy + rescore"]
        assert int8["steady"]["n"] > 0 and 0.99 <= int8["recall_at_k"] <= 1.0
    assert "int8 copy recall@k >= 0.99 (clustered)" in result["correctness"]
    assert "## Dense recall of a session's turn vectors" in md.read_text(encoding="utf-8")
