"""What the transparent proxy adds: latency, time to first streamed byte, and no lost turns.

Four processes on 127.0.0.1: the fake provider (``tests/fake_llm.py``, a real HTTP server
speaking the OpenAI wire format), the proxy (``contextfold proxy --upstream <fake>``, its own
process, memory in a SQLite file with ``recall.embedder: none`` — keyword tagging, FTS5 recall,
no embedding model), the null proxy (``null_proxy.py``: an aiohttp pass-through that streams
the reply back and does nothing else, the baseline for "what any proxy costs") and this client.
Each request goes straight to the fake, through the null proxy and through contextfold,
interleaved, with the same growing history.

* Added latency: sessions of 100 turns (the client sends its whole history, markers (if any)
  included, as chat clients do), non-streaming; per-turn proxied minus direct wall time; p50
  and p99, for contextfold and the null proxy. Bars: p50 <= 5 ms, p99 <= 25 ms.
* Time to first streamed byte: the same with ``"stream": true``, time until the first body
  byte arrives; proxied minus direct. Bar: median within 5 ms.
* Concurrent clients: 20 sessions at once, 40 growing-history requests each (JSON and
  streaming alternating), every request direct, through the null proxy and through contextfold
  in a rotating order. Bars: contextfold's added p50 <= 10x the null proxy's, added p99 <=
  50 ms. Each concurrent run is made twice: with the fake answering at once (the clients
  send as fast as they are served: a throughput test, where a proxy that spends CPU per
  request queues once 20 clients outrun one core) and with the fake taking ``--upstream-ms``
  (300 ms) to answer, as a model does (the added latency a client of a real model sees).
  Then the same with a second proxy whose memory has the default MiniLM embedder on,
  and one client with 100 requests on it. Bars: added p50 <= 50 ms (20 clients), <= 12 ms
  (one client). A client that resends its whole history leaves memory nothing to recall
  (every stored turn is in the request), and the proxy then skips ranking and the query
  embedding; so the one-client run is made again with a client that sends only its last
  6 messages, where every request's recall ranks and embeds its query. Each run also
  reports, from the proxy's dashboard records
  (``/dashboard/api/records``, the last 500), how many requests got a memory block, went
  without one, or were forwarded unmodified because the memory path failed.
* Load: 50 concurrent sessions for 60 s (streaming and not, alternating), then the proxy is
  stopped (it writes pending turns on the way out) and every user message the client saw
  answered is looked up in the store by its text (each is unique: no reply needs to name its
  session). Bars: 0 errors, 0 lost turns.

The proxy's own CPU time per request (from /proc) is reported too: on a shared machine the
wall clock also counts time other processes held the cores. Bars are reported, never fatal.

Run: ``python benchmarks/bench_proxy.py`` (``--quick`` for the smoke test;
``--skip-embedder`` leaves out the MiniLM runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import httpx

import _common as common
import _servers as servers

# Small writes go out at once on the client's connections too (as anyio's do in the proxy).
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
user_text = servers.user_text
cpu_seconds = servers.cpu_seconds
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
# A client that trims its history to the last few messages: every recall then ranks.
KEEP = 6


class Processes:
    """The fake upstream, the null proxy and one contextfold proxy (``embedder``: the default
    MiniLM embedder on, else ``recall.embedder: none``), each in its own process."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fake, self.upstream = servers.start_fake()
        self.null, self.null_url = servers.start_null_proxy(self.upstream)
        self.proxy: servers.ContextfoldProxy | None = None
        self.start_proxy("memory", embedder=False)

    def start_proxy(self, name: str, *, embedder: bool) -> None:
        self.store = self.folder / f"{name}.db"
        memory_yaml = servers.write_memory_config(
            self.folder / f"{name}.yaml", self.store, embedder=embedder
        )
        self.proxy = servers.ContextfoldProxy(
            self.upstream, memory_yaml, self.folder / "home", self.folder / f"{name}.log"
        )
        self.proxy.wait_ready()

    @property
    def url(self) -> str:
        assert self.proxy is not None
        return self.proxy.url

    @property
    def pid(self) -> int:
        assert self.proxy is not None
        return self.proxy.pid

    def stop_proxy(self) -> int | None:
        """SIGTERM (the proxy writes pending turns on the way out); its exit code."""
        assert self.proxy is not None
        code, _, _ = self.proxy.terminate(120)
        return code

    def close(self) -> None:
        for process in (self.proxy.process if self.proxy else None, self.null, self.fake):
            if process is not None:
                servers.stop(process)


def timed_post(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float, Any]:
    """(seconds to the first body byte, seconds to the end, the response)."""
    start = time.perf_counter()
    first = None
    chunks = []
    with client.stream("POST", url, json=body) as response:
        for chunk in response.iter_raw():
            if first is None:
                first = time.perf_counter() - start
            chunks.append(chunk)
        total = time.perf_counter() - start
    response._content = b"".join(chunks)
    return first if first is not None else total, total, response


def stream_text(raw: str) -> str:
    text = []
    for line in raw.splitlines():
        if line.startswith("data: {"):
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(common.percentile(values, 50), 3),
        "p90": round(common.percentile(values, 90), 3),
        "p99": round(common.percentile(values, 99), 3),
        "mean": round(statistics.fmean(values), 3),
    }


def latency(procs: Processes, sessions: int, turns: int, stream: bool) -> dict[str, Any]:
    """One client; each request goes direct, through the null proxy and through contextfold,
    one after the other with the same body."""
    direct_url = f"{procs.upstream}/v1/chat/completions"
    null_url = f"{procs.null_url}/v1/chat/completions"
    proxy_url = f"{procs.url}/v1/chat/completions"
    added, null_added, first_added, direct_total, proxy_total = [], [], [], [], []
    cpu_before = cpu_seconds(procs.pid)
    requests = 0
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(socket_options=NODELAY)) as client:
        for s in range(sessions):
            history: list[dict[str, Any]] = [SYSTEM]
            for t in range(turns):
                history.append({"role": "user", "content": user_text(1000 + s, t)})
                body = {"model": "fake", "messages": history, "stream": stream}
                d_first, d_total, _ = timed_post(client, direct_url, body)
                _, n_total, _ = timed_post(client, null_url, body)
                p_first, p_total, response = timed_post(client, proxy_url, body)
                requests += 1
                assert response.status_code == 200, response.text[:300]
                reply = (
                    stream_text(response.text)
                    if stream
                    else response.json()["choices"][0]["message"]["content"]
                )
                history.append({"role": "assistant", "content": reply})
                added.append((p_total - d_total) * 1000)
                null_added.append((n_total - d_total) * 1000)
                first_added.append((p_first - d_first) * 1000)
                direct_total.append(d_total * 1000)
                proxy_total.append(p_total * 1000)
    cpu = cpu_seconds(procs.pid) - cpu_before
    return {
        "stream": stream,
        "sessions": sessions,
        "turns_per_session": turns,
        "requests": requests,
        "added_ms": _summary(added),
        "null_proxy_added_ms": _summary(null_added),
        "first_byte_added_ms": {
            "p50": round(common.percentile(first_added, 50), 3),
            "p99": round(common.percentile(first_added, 99), 3),
        },
        "direct_ms": {
            "p50": round(common.percentile(direct_total, 50), 3),
            "p99": round(common.percentile(direct_total, 99), 3),
        },
        "proxied_ms": {
            "p50": round(common.percentile(proxy_total, 50), 3),
            "p99": round(common.percentile(proxy_total, 99), 3),
        },
        "proxy_cpu_ms_per_request": round(cpu * 1000 / max(requests, 1), 3),
    }


async def concurrent(
    procs: Processes,
    label: str,
    clients: int,
    turns: int,
    *,
    embedder: bool,
    upstream_ms: float = 0.0,
    keep: int = 0,
) -> dict[str, Any]:
    """``clients`` sessions at once, each sending ``turns`` growing-history requests (JSON and
    streaming alternating); every request goes direct, through the null proxy and through
    contextfold, in an order that rotates per turn, so all three see the same load. Added
    latency = that path's time minus the direct time of the same request. ``upstream_ms``:
    the fake takes that long to answer (0: at once, so the clients send as fast as the
    slowest path serves them — a throughput test). ``keep``: the client sends only its last
    ``keep`` messages (0: its whole history), so older turns can come only from memory and
    every request's recall ranks (and embeds its query)."""
    targets = {"direct": procs.upstream, "null": procs.null_url, "contextfold": procs.url}
    names = list(targets)
    times: dict[str, list[float]] = {name: [] for name in names}
    errors = servers.Tally()
    sessions: set[str] = set()
    cpu_before = cpu_seconds(procs.pid)
    start = time.perf_counter()

    async def one(client: aiohttp.ClientSession, c: int) -> None:
        history: list[dict[str, Any]] = [SYSTEM]
        for t in range(turns):
            history.append({"role": "user", "content": user_text(5000 + c, t)})
            shift = (c + t) % len(names)
            got: dict[str, servers.Exchange] = {}
            for name in names[shift:] + names[:shift]:
                sent = [SYSTEM, *history[1:][-keep:]] if keep else history
                exchange = await servers.chat(client, targets[name], sent, t % 2 == 1, upstream_ms)
                if exchange.error or not exchange.complete:
                    errors.add(name, exchange.error or "incomplete reply")
                    return
                got[name] = exchange
            for name in names:
                times[name].append(got[name].seconds * 1000)
            if got["contextfold"].session:
                sessions.add(got["contextfold"].session)
            history.append({"role": "assistant", "content": got["contextfold"].reply})

    async with servers.client_session(clients * len(names) + 10) as client:
        await asyncio.gather(*(one(client, c) for c in range(clients)))
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(procs.pid) - cpu_before
    direct = times["direct"]
    added = {
        name: [p - d for p, d in zip(times[name], direct, strict=True)]
        for name in ("null", "contextfold")
    }
    cf, null = _summary(added["contextfold"]), _summary(added["null"])
    assert procs.proxy is not None
    return {
        "label": label,
        "clients": clients,
        "turns_per_client": turns,
        "embedder": "minilm" if embedder else "none",
        "upstream_ms": upstream_ms,
        "messages_kept": keep or None,
        "requests_per_s": round(len(direct) / seconds, 1),
        "rounds": len(direct),
        "seconds": round(seconds, 2),
        "errors": errors.total,
        "error_samples": errors.samples,
        "direct_ms": _summary(direct),
        "null_added_ms": null,
        "contextfold_added_ms": cf,
        "ratio_added_p50": round(cf["p50"] / null["p50"], 2) if null["p50"] > 0 else None,
        "proxy_cpu_ms_per_request": round(cpu * 1000 / max(len(direct), 1), 3),
        "memory": servers.memory_share(procs.proxy.records(), sessions),
    }


async def load(procs: Processes, sessions: int, seconds: float, max_turns: int) -> dict[str, Any]:
    url = f"{procs.url}/v1/chat/completions"
    errors: list[str] = []
    # conversation -> the user messages the client saw answered (each text is unique, so the
    # store is checked by content: a reply need not name its session, markers are opt-in)
    completed: dict[str, list[str]] = {}
    deadline = time.monotonic() + seconds
    latencies: list[float] = []

    async def session_loop(client: httpx.AsyncClient, n: int) -> None:
        round_ = 0
        while time.monotonic() < deadline:
            history: list[dict[str, Any]] = []
            for t in range(max_turns):
                if time.monotonic() >= deadline:
                    break
                history.append({"role": "user", "content": user_text(n * 1000 + round_, t)})
                stream = t % 2 == 1
                start = time.perf_counter()
                try:
                    response = await client.post(
                        url, json={"model": "fake", "messages": history, "stream": stream}
                    )
                except httpx.HTTPError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                latencies.append((time.perf_counter() - start) * 1000)
                if response.status_code != 200:
                    errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
                    return
                reply = (
                    stream_text(response.text)
                    if stream
                    else response.json()["choices"][0]["message"]["content"]
                )
                history.append({"role": "assistant", "content": reply})
                completed.setdefault(f"conversation-{n}-{round_}", []).append(
                    history[-2]["content"]
                )
            round_ += 1

    limits = httpx.Limits(max_connections=sessions + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(session_loop(client, n) for n in range(sessions)))
    return {
        "errors": errors,
        "completed": completed,
        "latency_ms": {
            "p50": round(common.percentile(latencies, 50), 2),
            "p99": round(common.percentile(latencies, 99), 2),
        },
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / seconds, 1),
    }


def stored_user_texts(store: Path) -> set[str]:
    """The text of every user turn in the store."""
    with closing(sqlite3.connect(store)) as conn:
        return {r[0] for r in conn.execute("SELECT content_text FROM turns WHERE role = 'user'")}


def _paced_label(upstream_ms: float) -> str:
    return f", upstream {upstream_ms:.0f} ms" if upstream_ms else ", upstream instant"


def _bar(value: float | None, limit: float) -> dict[str, Any]:
    return {"value": value, "limit": limit, "met": value is not None and value <= limit}


def concurrent_bars(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Embedder off: added p50 within 10x the null proxy's and p99 <= 50 ms. Embedder on:
    added p50 <= 50 ms with 20 clients, <= 12 ms with one."""
    cf = run["contextfold_added_ms"]
    if run["embedder"] == "none":
        return {
            "added_p50_over_null_p50": _bar(run["ratio_added_p50"], 10.0),
            "added_p99_ms": _bar(cf["p99"], 50.0),
        }
    return {"added_p50_ms": _bar(cf["p50"], 12.0 if run["clients"] == 1 else 50.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--sessions", type=int, default=5, help="100-turn latency sessions")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--load-sessions", type=int, default=50)
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients")
    parser.add_argument(
        "--client-turns", type=int, default=40, help="requests per concurrent client"
    )
    parser.add_argument(
        "--single-turns", type=int, default=100, help="requests of the one-client embedder run"
    )
    parser.add_argument(
        "--skip-embedder", action="store_true", help="leave out the runs with MiniLM on"
    )
    parser.add_argument(
        "--upstream-ms",
        type=float,
        default=300.0,
        help="the model's answer time in the paced concurrent runs (0 leaves them out)",
    )
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.turns, args.load_sessions, args.load_seconds = 1, 10, 5, 3.0
        args.client_turns, args.single_turns = 3, 6
        args.upstream_ms = min(args.upstream_ms, 50.0)
    result = common.base_result(
        "proxy",
        "Latency the proxy adds over a direct call to the same fake upstream (and what a null "
        "aiohttp pass-through adds, measured in the same run), time to first streamed byte, "
        f"{args.clients} concurrent clients with the embedder off and on, and "
        f"{args.load_sessions} concurrent sessions with every turn checked in the store.",
        args.quick,
    )
    result["parameters"] = {
        "latency_sessions": args.sessions,
        "turns_per_session": args.turns,
        "load_sessions": args.load_sessions,
        "load_seconds": args.load_seconds,
        "concurrent_clients": args.clients,
        "paced_upstream_ms": args.upstream_ms,
        "turns_per_concurrent_client": args.client_turns,
        "single_client_embedder_turns": args.single_turns,
        "engine": "MemoryEngine, SQLite file (WAL), recall.embedder: none (keyword tags + FTS5)",
        "upstream": "tests/fake_llm.py in its own process (OpenAI wire format)",
        "proxy": "`contextfold proxy` in its own process (one uvicorn worker)",
        "null_proxy": "benchmarks/null_proxy.py: aiohttp pass-through, its own process",
    }
    paced = [0.0] + ([args.upstream_ms] if args.upstream_ms > 0 else [])
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-proxy-"))
    procs = Processes(folder)
    runs = []
    try:
        warm = latency(procs, 1, 3, False)  # tokenizer and first-request costs, not measured
        del warm
        plain = latency(procs, args.sessions, args.turns, False)
        streamed = latency(procs, args.sessions, args.turns, True)
        for upstream_ms in paced:
            label = f"{args.clients} clients, embedder none{_paced_label(upstream_ms)}"
            runs.append(
                asyncio.run(
                    concurrent(
                        procs,
                        label,
                        args.clients,
                        args.client_turns,
                        embedder=False,
                        upstream_ms=upstream_ms,
                    )
                )
            )
        loaded = asyncio.run(load(procs, args.load_sessions, args.load_seconds, args.turns))
        exit_code = procs.stop_proxy()
        stored = stored_user_texts(procs.store)
        if not args.skip_embedder:
            procs.start_proxy("embedder", embedder=True)
            asyncio.run(concurrent(procs, "warm-up", 1, 3, embedder=True))  # loads the model
            plan = [(args.clients, args.client_turns, ms, 0) for ms in paced]
            plan += [(1, args.single_turns, 0.0, 0), (1, args.single_turns, 0.0, KEEP)]
            for clients, turns, upstream_ms, keep in plan:
                label = (
                    f"{clients} client{'s' if clients > 1 else ''}, embedder minilm"
                    f"{_paced_label(upstream_ms)}"
                    + (f", client sends its last {keep} messages" if keep else "")
                )
                runs.append(
                    asyncio.run(
                        concurrent(
                            procs,
                            label,
                            clients,
                            turns,
                            embedder=True,
                            upstream_ms=upstream_ms,
                            keep=keep,
                        )
                    )
                )
            procs.stop_proxy()
    finally:
        procs.close()
    for run in runs:
        run["bars"] = concurrent_bars(run)
    lost = {
        name: {"answered_turns": len(texts), "stored_user_turns": sum(t in stored for t in texts)}
        for name, texts in loaded["completed"].items()
        if not all(t in stored for t in texts)
    }
    result["configs"] = [plain, streamed]
    result["concurrent"] = runs
    result["load"] = {
        "sessions": args.load_sessions,
        "seconds": args.load_seconds,
        "requests": loaded["requests"],
        "requests_per_s": loaded["requests_per_s"],
        "latency_ms": loaded["latency_ms"],
        "errors": len(loaded["errors"]),
        "error_samples": loaded["errors"][:5],
        "sessions_checked": len(loaded["completed"]),
        "turns_answered": sum(len(t) for t in loaded["completed"].values()),
        "lost_turn_sessions": lost,
        "proxy_exit_code": exit_code,
    }
    goals = {
        "added_p50_ms_max": 5.0,
        "added_p99_ms_max": 25.0,
        "first_byte_added_ms_max": 5.0,
    }
    result["goals"] = {
        **goals,
        "met": {
            "added_p50": plain["added_ms"]["p50"] <= goals["added_p50_ms_max"],
            "added_p99": plain["added_ms"]["p99"] <= goals["added_p99_ms_max"],
            "first_byte": streamed["first_byte_added_ms"]["p50"]
            <= goals["first_byte_added_ms_max"],
            "no_errors": not loaded["errors"],
            "no_lost_turns": not lost,
            **{
                f"{run['label']}: {name}": bar["met"]
                for run in runs
                for name, bar in run["bars"].items()
            },
        },
    }
    result["correctness"] = {
        "no_errors": not loaded["errors"],
        "every_turn_stored": not lost,
        "proxy_exited_cleanly": exit_code == 0,
        "concurrent_runs_without_errors": all(run["errors"] == 0 for run in runs),
    }
    result["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["peak_rss_mb"] = common.peak_rss_mb()
    path = common.write_result(result, args.results_dir, args.results_md)
    print(json.dumps({k: result[k] for k in ("configs", "concurrent", "load", "goals")}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
