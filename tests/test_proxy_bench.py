"""``bench_proxy.py --quick`` and ``bench_durability.py --quick`` run (the fake upstream, the
proxy, the null proxy and this client on 127.0.0.1), write one valid result and render their
RESULTS.md sections. No timing and no bar is asserted: these are benchmarks, and the
durability bars measure the proxy, not the script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_quick(tmp_path: Path, script: str, name: str) -> tuple[dict[str, Any], str]:
    md = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick",
         "--results-dir", str(tmp_path), "--results-md", str(md)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = tmp_path.glob(f"{name}-*-quick.json")
    return json.loads(path.read_text(encoding="utf-8")), md.read_text(encoding="utf-8")


@pytest.mark.integration
def test_proxy_benchmark_quick_run(tmp_path: Path) -> None:
    result, md = run_quick(tmp_path, "bench_proxy.py", "proxy")
    assert [c["stream"] for c in result["configs"]] == [False, True]
    for config in result["configs"]:
        assert config["requests"] == 10 and config["added_ms"].keys() >= {"p50", "p99"}
        assert config["null_proxy_added_ms"].keys() >= {"p50", "p99"}
    load = result["load"]
    assert load["errors"] == 0 and load["lost_turn_sessions"] == {} and load["turns_answered"] > 0
    runs = {run["label"]: run for run in result["concurrent"]}
    assert set(runs) == {
        "20 clients, embedder none, upstream instant",
        "20 clients, embedder none, upstream 50 ms",
        "20 clients, embedder minilm, upstream instant",
        "20 clients, embedder minilm, upstream 50 ms",
        "1 client, embedder minilm, upstream instant",
        "1 client, embedder minilm, upstream instant, client sends its last 6 messages",
    }
    for run in runs.values():
        # the paced runs' model time is in every path, so it is in the direct time too
        assert run["direct_ms"]["p50"] >= run["upstream_ms"] and run["requests_per_s"] > 0
        assert run["errors"] == 0 and run["rounds"] == run["clients"] * run["turns_per_client"]
        assert run["bars"] and all(isinstance(b["met"], bool) for b in run["bars"].values())
        assert run["memory"].keys() >= {"records", "with_memory", "without_memory"}
    assert all(v is True for v in result["correctness"].values())
    assert "## Proxy overhead" in md and "Concurrent clients" in md


@pytest.mark.integration
def test_durability_benchmark_quick_run(tmp_path: Path) -> None:
    result, md = run_quick(tmp_path, "bench_durability.py", "durability")
    assert [c["label"] for c in result["configs"]] == ["load", "wide"]
    for config in result["configs"]:
        assert config["acknowledged"] > 0 and config["missing_exchanges"] >= 0
        assert config["exit_seconds"] >= 0 and config["rss_mb"]["max"] > 0
    crash = result["crash"]
    assert crash["trials"] == 3 and len(crash["trial_details"]) == 3
    assert all(isinstance(v, bool) for v in result["goals"]["met"].values())
    assert all(v is True for v in result["correctness"].values())
    assert "## Durability" in md
