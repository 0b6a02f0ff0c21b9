"""The benchmark scripts run in ``--quick`` mode, write one valid JSON result with the expected
keys, render the markdown table, and report every correctness flag true. No timing is
asserted: these are benchmarks, not timed tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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
    md = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / script),
            "--quick",
            "--results-dir",
            str(tmp_path),
            "--results-md",
            str(md),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = tmp_path.glob(f"{name}-*-quick.json")
    result = json.loads(path.read_text(encoding="utf-8"))
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
