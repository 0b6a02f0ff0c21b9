"""What the transparent proxy adds: latency, time to first streamed byte, and no lost turns.

Three processes on 127.0.0.1: the fake provider (``tests/fake_llm.py``, a real HTTP server
speaking the OpenAI wire format), the proxy (``contextfold proxy --upstream <fake>``, its own
process, memory in a SQLite file with ``recall.embedder: none`` — keyword tagging, FTS5 recall,
no embedding model), and this client. Each request goes once straight to the fake and once
through the proxy, interleaved, with the same growing history.

* Added latency: sessions of 100 turns (the client sends its whole history, markers
  included, as chat clients do), non-streaming; per-turn proxied minus direct wall time; p50
  and p99. Bars: p50 <= 5 ms, p99 <= 25 ms.
* Time to first streamed byte: the same with ``"stream": true``, time until the first body
  byte arrives; proxied minus direct. Bar: median within 5 ms.
* Load: 50 concurrent sessions for 60 s (streaming and not, alternating), then the proxy is
  stopped (it writes pending turns on the way out) and every session's turns are counted in
  the store. Bars: 0 errors, 0 lost turns.

The proxy's own CPU time per request (from /proc) is reported too: on a shared machine the
wall clock also counts time other processes held the cores.

Run: ``python benchmarks/bench_proxy.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import _common as common

TESTS = common.ROOT / "tests"
HEADER = "x-contextfold-session"
# Small writes go out at once on the client's connections too (as anyio's do in the proxy).
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

FAKE = """
import sys, time
sys.path.insert(0, {tests!r})
from fake_llm import FakeLLMServer
def reply(body):
    last = body["messages"][-1]["content"]
    text = last if isinstance(last, str) else str(last)
    return "Answer to: " + text.split("\\n")[-1][:200] + " - noted, with details."
server = FakeLLMServer(reply=reply).start()
print(server.url, flush=True)
while True:
    time.sleep(3600)
"""

TOPICS = [
    "the kitchen renovation budget of {n} euros",
    "training for the half marathon, week {n}",
    "the Henninger filing deadline moved to day {n}",
    "sourdough starter feeding at {n} grams",
    "the database migration step {n} for the billing service",
    "planning the Lisbon trip, day {n}",
]


def user_text(session: int, turn: int) -> str:
    topic = TOPICS[(session + turn) % len(TOPICS)].format(n=turn * 7 + session)
    return f"Session {session}, turn {turn}: let us talk about {topic}."


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Processes:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        env = {**os.environ, "CONTEXTFOLD_HOME": str(folder / "home")}
        self.fake = subprocess.Popen(
            [sys.executable, "-c", FAKE.format(tests=str(TESTS))],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.fake.stdout is not None
        self.upstream = self.fake.stdout.readline().strip()
        self.store = folder / "memory.db"
        memory_yaml = folder / "contextfold.yaml"
        memory_yaml.write_text(f"storage_path: {self.store}\nrecall:\n  embedder: none\n")
        with socket_port() as port:
            self.port = port
        self.proxy = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from contextfold.cli import main; main()",
                "proxy",
                "--upstream",
                self.upstream,
                "--port",
                str(self.port),
                "--memory-config",
                str(memory_yaml),
                "--log-level",
                "warning",
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proxy.poll() is not None:
                raise SystemExit("the proxy did not start")
            time.sleep(0.1)

    def stop_proxy(self) -> int:
        self.proxy.send_signal(signal.SIGINT)
        return self.proxy.wait(120)

    def close(self) -> None:
        for process in (self.proxy, self.fake):
            if process.poll() is None:
                process.kill()
                process.wait(10)


class socket_port:
    def __enter__(self) -> int:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


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


def latency(procs: Processes, sessions: int, turns: int, stream: bool) -> dict[str, Any]:
    direct_url = f"{procs.upstream}/v1/chat/completions"
    proxy_url = f"{procs.url}/v1/chat/completions"
    added, first_added, direct_total, proxy_total = [], [], [], []
    cpu_before = cpu_seconds(procs.proxy.pid)
    requests = 0
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(socket_options=NODELAY)) as client:
        for s in range(sessions):
            history: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a helpful assistant."}
            ]
            for t in range(turns):
                history.append({"role": "user", "content": user_text(1000 + s, t)})
                body = {"model": "fake", "messages": history, "stream": stream}
                d_first, d_total, _ = timed_post(client, direct_url, body)
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
                first_added.append((p_first - d_first) * 1000)
                direct_total.append(d_total * 1000)
                proxy_total.append(p_total * 1000)
    cpu = cpu_seconds(procs.proxy.pid) - cpu_before
    return {
        "stream": stream,
        "sessions": sessions,
        "turns_per_session": turns,
        "requests": requests,
        "added_ms": {
            "p50": round(common.percentile(added, 50), 3),
            "p90": round(common.percentile(added, 90), 3),
            "p99": round(common.percentile(added, 99), 3),
            "mean": round(statistics.fmean(added), 3),
        },
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


async def load(procs: Processes, sessions: int, seconds: float, max_turns: int) -> dict[str, Any]:
    url = f"{procs.url}/v1/chat/completions"
    errors: list[str] = []
    completed: dict[str, int] = {}  # session id -> turns the client saw answered
    deadline = time.monotonic() + seconds
    latencies: list[float] = []

    async def session_loop(client: httpx.AsyncClient, n: int) -> None:
        round_ = 0
        while time.monotonic() < deadline:
            history: list[dict[str, Any]] = []
            sid = None
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
                sid = response.headers[HEADER].split(".")[0]
                reply = (
                    stream_text(response.text)
                    if stream
                    else response.json()["choices"][0]["message"]["content"]
                )
                history.append({"role": "assistant", "content": reply})
                completed[sid] = t + 1
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


def stored_turns(store: Path) -> dict[str, int]:
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT session_id, COUNT(*) FROM turns GROUP BY session_id")
        return dict(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--sessions", type=int, default=5, help="100-turn latency sessions")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--load-sessions", type=int, default=50)
    parser.add_argument("--load-seconds", type=float, default=60.0)
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.turns, args.load_sessions, args.load_seconds = 1, 10, 5, 3.0
    result = common.base_result(
        "proxy",
        "Latency the proxy adds over a direct call to the same fake upstream, time to first "
        "streamed byte, and 50 concurrent sessions with every turn checked in the store.",
        args.quick,
    )
    result["parameters"] = {
        "latency_sessions": args.sessions,
        "turns_per_session": args.turns,
        "load_sessions": args.load_sessions,
        "load_seconds": args.load_seconds,
        "engine": "MemoryEngine, SQLite file (WAL), recall.embedder: none (keyword tags + FTS5)",
        "upstream": "tests/fake_llm.py in its own process (OpenAI wire format)",
        "proxy": "`contextfold proxy` in its own process (one uvicorn worker)",
    }
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-proxy-"))
    procs = Processes(folder)
    try:
        warm = latency(procs, 1, 3, False)  # tokenizer and first-request costs, not measured
        del warm
        plain = latency(procs, args.sessions, args.turns, False)
        streamed = latency(procs, args.sessions, args.turns, True)
        loaded = asyncio.run(load(procs, args.load_sessions, args.load_seconds, args.turns))
        exit_code = procs.stop_proxy()
        stored = stored_turns(procs.store)
    finally:
        procs.close()
    lost = {
        sid: {"answered_turns": n, "stored_messages": stored.get(sid, 0)}
        for sid, n in loaded["completed"].items()
        if stored.get(sid, 0) != 2 * n
    }
    result["configs"] = [plain, streamed]
    result["load"] = {
        "sessions": args.load_sessions,
        "seconds": args.load_seconds,
        "requests": loaded["requests"],
        "requests_per_s": loaded["requests_per_s"],
        "latency_ms": loaded["latency_ms"],
        "errors": len(loaded["errors"]),
        "error_samples": loaded["errors"][:5],
        "sessions_checked": len(loaded["completed"]),
        "turns_answered": sum(loaded["completed"].values()),
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
        },
    }
    result["correctness"] = {
        "no_errors": not loaded["errors"],
        "every_turn_stored": not lost,
        "proxy_exited_cleanly": exit_code == 0,
    }
    result["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["peak_rss_mb"] = common.peak_rss_mb()
    path = common.write_result(result, args.results_dir, args.results_md)
    print(json.dumps({k: result[k] for k in ("configs", "load", "goals")}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
