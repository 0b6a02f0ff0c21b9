"""The proxy scaled out: 1 and 2 workers, on SQLite (one file, WAL) and on PostgreSQL.

The same processes as ``bench_proxy.py`` (the fake provider, the null proxy, this client; see
its docstring), with ``contextfold proxy --workers N`` on one store: an SQLite file, or a
database on a real PostgreSQL server (``tests/postgres_support.py``; ``--postgres URL`` for a
server of your own). Keyword recall (``recall.embedder: none``). For each of the four
configurations:

* **50 concurrent clients** (``--clients``), each sending growing-history requests (JSON and
  streaming alternating) direct, through the null proxy and through contextfold in a rotating
  order, the fake answering at once: contextfold's added p50/p99 over the direct call, beside
  the null proxy's, and the requests per second the three paths sustained together;
* **sustained load**: 50 sessions sending back to back through contextfold for
  ``--load-seconds``, requests/s and latency; then the proxy is stopped (SIGTERM: each worker
  writes what it holds) and every user message the client saw answered is looked up in the
  store. Bars: 0 errors, 0 lost turns.

The machine's cores are shared by everything here — the workers, PostgreSQL, the fake, the
null proxy and the client — so a second worker buys what the cores left over allow; the JSON
records the core count beside the numbers.

Run: ``python benchmarks/bench_scaleout.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

import _common as common
import _servers as servers
import bench_proxy

sys.path.insert(0, str(common.ROOT / "tests"))
from contextfold.store import masked_location
from postgres_support import PostgresServer


class ScaledProcesses(bench_proxy.Processes):
    """``bench_proxy.Processes`` with the proxy run as ``--workers N`` on a given store."""

    def __init__(self, folder: Path, store: str, workers: int) -> None:
        self.location, self.workers = store, workers
        super().__init__(folder)

    def start_proxy(self, name: str, *, embedder: bool) -> None:
        memory_yaml = servers.write_memory_config(
            self.folder / f"{name}.yaml", self.location, embedder=embedder
        )
        self.proxy = servers.ContextfoldProxy(
            self.upstream,
            memory_yaml,
            self.folder / "home",
            self.folder / f"{name}.log",
            extra=("--workers", str(self.workers)),
            env={"CONTEXTFOLD_SECRET": "bench-scaleout-shared-secret"},
        )
        self.proxy.wait_ready(120)


def stored_user_texts(location: str) -> set[str]:
    """The text of every user turn in the store at ``location`` (a file or a database URL)."""
    query = "SELECT content_text FROM turns WHERE role = 'user'"
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location) as conn:
            return {r[0] for r in conn.execute(query)}
    with closing(sqlite3.connect(location)) as conn:
        return {r[0] for r in conn.execute(query)}


def run_one(
    folder: Path, backend: str, location: str, workers: int, args: argparse.Namespace
) -> dict[str, Any]:
    procs = ScaledProcesses(folder, location, workers)
    try:
        asyncio.run(bench_proxy.concurrent(procs, "warm-up", 2, 2, embedder=False))
        label = f"{backend}, {workers} worker{'s' if workers > 1 else ''}"
        run = asyncio.run(
            bench_proxy.concurrent(procs, label, args.clients, args.client_turns, embedder=False)
        )
        loaded = asyncio.run(
            bench_proxy.load(procs, args.load_sessions, args.load_seconds, args.turns)
        )
        exit_code = procs.stop_proxy()
    finally:
        procs.close()
    stored = stored_user_texts(location)
    answered = [t for texts in loaded["completed"].values() for t in texts]
    lost = sum(t not in stored for t in answered)
    run.pop("proxy_cpu_ms_per_request")  # the supervisor's CPU only: not the workers'
    return {
        **run,
        "backend": backend,
        "workers": workers,
        "load": {
            "sessions": args.load_sessions,
            "seconds": args.load_seconds,
            "requests": loaded["requests"],
            "requests_per_s": loaded["requests_per_s"],
            "latency_ms": loaded["latency_ms"],
            "errors": len(loaded["errors"]),
            "error_samples": loaded["errors"][:5],
            "answered_turns": len(answered),
            "lost_turns": lost,
            "exit_code": exit_code,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL instead of a local one")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients")
    parser.add_argument("--client-turns", type=int, default=10, help="requests per client")
    parser.add_argument("--load-sessions", type=int, default=50)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    parser.add_argument("--turns", type=int, default=20, help="turns per load conversation")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.client_turns, args.load_sessions, args.load_seconds = 4, 2, 4, 2.0
    result = common.base_result("scaleout", __doc__.splitlines()[0], args.quick)
    result["parameters"] = {
        "clients": args.clients,
        "turns_per_client": args.client_turns,
        "load_sessions": args.load_sessions,
        "load_seconds": args.load_seconds,
        "upstream": "tests/fake_llm.py, answering at once",
        "engine": "recall.embedder: none (keyword tags + full-text)",
    }
    runs = []
    server = PostgresServer()
    if args.postgres:
        server.url = args.postgres
    with server, tempfile.TemporaryDirectory(prefix="cf-bench-scaleout-") as tmp:
        result["postgres"] = masked_location(server.url)
        for backend in ("sqlite", "postgres"):
            for workers in (1, 2):
                folder = Path(tmp) / f"{backend}-{workers}"
                folder.mkdir()
                location = (
                    str(folder / "memory.db") if backend == "sqlite" else server.new_database()
                )
                run = run_one(folder, backend, location, workers, args)
                runs.append(run)
                cf, load = run["contextfold_added_ms"], run["load"]
                print(
                    f"{run['label']}: added p50 {cf['p50']:.1f} ms p99 {cf['p99']:.1f} ms "
                    f"(null p50 {run['null_added_ms']['p50']:.1f}); load "
                    f"{load['requests_per_s']:.0f} req/s, errors {load['errors']}, lost "
                    f"{load['lost_turns']}/{load['answered_turns']}",
                    flush=True,
                )
    result["runs"] = runs
    result["correctness"] = {
        "no errors": all(r["errors"] == 0 and r["load"]["errors"] == 0 for r in runs),
        "no lost turns": all(r["load"]["lost_turns"] == 0 for r in runs),
        "every load run answered": all(r["load"]["answered_turns"] > 0 for r in runs),
    }
    result["peak_rss_mb"] = common.peak_rss_mb()
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {Path(path).name}")


if __name__ == "__main__":
    main()
