"""Warm start: what the first request a freshly started proxy serves costs, against the steady
state (issue 20: the first request's added latency within 2x the steady state).

A conversation of ``--turns`` exchanges is stored through one ``contextfold proxy`` process
(default MiniLM embedder on). Then, ``--restarts`` times, a new proxy process is started on
the same store, and as soon as ``/healthz`` answers the client continues the conversation by
its ``x-contextfold-session`` header, sending only the system prompt, the last exchange and a
new question (so every request recalls: the history no longer holds the stored turns).
Each request goes straight to the fake upstream and then through the proxy; the added latency
is the difference. The first request of each restart is compared with the median of the
following ``--steady`` requests.

Run: ``python benchmarks/bench_warm_start.py`` (``--quick``: fewer turns and restarts).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import _common as common
import _servers as servers

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
THINGS = ["red apple", "blue car", "green tree", "yellow kite", "silver spoon"]


def _post(
    client: httpx.Client, url: str, messages: list[dict[str, Any]], header: str | None = None
) -> tuple[float, httpx.Response]:
    headers = {servers.HEADER: header} if header else {}
    start = time.perf_counter()
    response = client.post(
        f"{url}/v1/chat/completions",
        json={"model": "fake", "messages": messages},
        headers=headers,
    )
    response.raise_for_status()
    return time.perf_counter() - start, response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.common_arguments(parser)
    parser.add_argument("--turns", type=int, default=60, help="exchanges stored before restarts")
    parser.add_argument("--restarts", type=int, default=5, help="fresh proxy processes")
    parser.add_argument("--steady", type=int, default=20, help="requests after the first")
    parser.add_argument("--keyword-only", action="store_true", help="recall.embedder: none")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.restarts, args.steady = 8, 2, 5

    result = common.base_result("warm_start", __doc__.split("\n\n")[0], args.quick)
    tmp = Path(tempfile.mkdtemp(prefix="cf-warm-"))
    fake, fake_url = servers.start_fake()
    memory_yaml = servers.write_memory_config(
        tmp / "memory.yaml", tmp / "store.db", embedder=not args.keyword_only
    )
    client = httpx.Client(timeout=120)
    runs: list[dict[str, Any]] = []
    try:
        proxy = servers.ContextfoldProxy(fake_url, memory_yaml, tmp / "home", tmp / "build.log")
        proxy.wait_ready()
        history = [SYSTEM]
        token: str | None = None
        for i in range(args.turns):
            thing = THINGS[i % len(THINGS)]
            history.append(
                {"role": "user", "content": f"Note {i}: item {i} is a {thing}, number {i * 7}."}
            )
            _, response = _post(client, proxy.url, history)
            token = response.headers.get(servers.HEADER) or token
            history.append(response.json()["choices"][0]["message"])
        proxy.terminate(60)  # its pending derive jobs resume in the next process
        for restart in range(args.restarts):
            started = time.monotonic()
            proxy = servers.ContextfoldProxy(
                fake_url, memory_yaml, tmp / "home", tmp / f"restart-{restart}.log"
            )
            ready_s = proxy.wait_ready(120)
            added: list[float] = []
            for i in range(args.steady + 1):
                question = f"Question {restart}.{i}: what was item {(i * 3) % args.turns}?"
                messages = [*history[:1], *history[-2:], {"role": "user", "content": question}]
                direct, _ = _post(client, fake_url, messages)
                proxied, _ = _post(client, proxy.url, messages, token)
                added.append((proxied - direct) * 1000)
            proxy.terminate(60)
            steady = statistics.median(added[1:])
            runs.append(
                {
                    "restart": restart,
                    "start_to_ready_s": round(ready_s, 3),
                    "first_added_ms": round(added[0], 2),
                    "steady_added_p50_ms": round(steady, 2),
                    "ratio": round(added[0] / steady, 2) if steady > 0 else None,
                    "seconds": round(time.monotonic() - started, 2),
                }
            )
            print(runs[-1], flush=True)
    finally:
        client.close()
        servers.stop(fake)

    ratios = [r["ratio"] for r in runs if r["ratio"] is not None]
    result.update(
        parameters={
            "turns": args.turns,
            "restarts": args.restarts,
            "steady": args.steady,
            "engine": "keyword + FTS5" if args.keyword_only else "MiniLM + keyword + FTS5",
        },
        runs=runs,
        summary={
            "first_added_ms_median": round(statistics.median(r["first_added_ms"] for r in runs), 2),
            "steady_added_p50_ms_median": round(
                statistics.median(r["steady_added_p50_ms"] for r in runs), 2
            ),
            "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
        },
        goals={
            "met": {
                "first request within 2x steady (median)": bool(
                    ratios and statistics.median(ratios) <= 2.0
                )
            }
        },
        correctness={"every restart answered": len(runs) == args.restarts},
        peak_rss_mb=common.peak_rss_mb(),
    )
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
