"""``bench_proxy.py --quick`` runs (three processes on 127.0.0.1), writes one valid result with
every correctness flag true, and renders its RESULTS.md section. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_proxy_benchmark_quick_run(tmp_path: Path) -> None:
    md = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_proxy.py"), "--quick",
         "--results-dir", str(tmp_path), "--results-md", str(md)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = tmp_path.glob("proxy-*-quick.json")
    result = json.loads(path.read_text(encoding="utf-8"))
    assert [c["stream"] for c in result["configs"]] == [False, True]
    for config in result["configs"]:
        assert config["requests"] == 10 and config["added_ms"].keys() >= {"p50", "p99"}
    load = result["load"]
    assert load["errors"] == 0 and load["lost_turn_sessions"] == {} and load["turns_answered"] > 0
    assert all(v is True for v in result["correctness"].values())
    assert "## Proxy overhead" in md.read_text(encoding="utf-8")
