"""The processes the proxy benchmarks run, and how they look at them from the outside.

``bench_proxy.py`` and ``bench_durability.py`` treat ``contextfold proxy`` as a black box: they
talk to it over HTTP, signal it, read its RSS from ``/proc`` and read the turns it stored
with plain ``sqlite3`` from its store file. Nothing here imports contextfold, so the
benchmarks keep working whatever happens inside the proxy (in-process queue, jobs in the store).

* ``start_fake`` — ``tests/fake_llm.py`` in its own process; it answers
  ``"Answer to: <the last line of the last message> - noted, with details."`` (the client's
  last line: a memory block the proxy appended after it is not read), after
  ``fake_delay_ms`` milliseconds when the request body asks for them (a model's think time;
  both proxies forward the field unchanged);
* ``start_null_proxy`` — ``null_proxy.py``, the pass-through baseline;
* ``ContextfoldProxy`` — ``python -m contextfold proxy`` with a memory config and a store file;
* ``chat`` — one ``/v1/chat/completions`` exchange over aiohttp (JSON or SSE), its reply text;
* ``nonce_message`` / ``stored_nonces`` — each user message carries a unique nonce that the
  fake echoes, so "is this acknowledged exchange stored?" is a lookup in ``turns``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import httpx

import _common as common
from contextfold.testing import proxy_command

TESTS = common.ROOT / "tests"
BENCH = common.ROOT / "benchmarks"
HEADER = "x-contextfold-session"
MARKER = re.compile(r"\n*<!-- contextfold:session=[^>]*-->")
NONCE = re.compile(r"nonce-([0-9a-f]{32})")

# The fake keeps every request it saw; a long load run would grow it without bound, so its
# list is emptied every second.
FAKE = """
import sys, time
sys.path.insert(0, {tests!r})
from fake_llm import FakeLLMServer
def reply(body):
    if body.get("fake_delay_ms"):  # a model's time to answer, asked for by the client
        time.sleep(body["fake_delay_ms"] / 1000)
    last = body["messages"][-1]["content"]
    text = last if isinstance(last, str) else str(last)
    for block in ("\\n\\n<context-topics>", "\\n\\n<memory"):  # the proxy's, after the client's
        text = text.split(block)[0]
    return "Answer to: " + text.split("\\n")[-1][:200] + " - noted, with details."
server = FakeLLMServer(reply=reply).start()
print(server.url, flush=True)
while True:
    time.sleep(1)
    with server._lock:
        server.requests.clear()
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


def nonce_message(label: str, text: str) -> tuple[str, str]:
    """(nonce, a user message whose last line carries it): the fake echoes the last line."""
    nonce = uuid.uuid4().hex
    return nonce, f"{text}\nmsg {label} nonce-{nonce}"


def strip_markers(text: str) -> str:
    return MARKER.sub("", text)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _first_line(process: subprocess.Popen[str], what: str) -> str:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("http"):
        raise SystemExit(f"{what} did not start (exit code {process.poll()})")
    return line


def start_fake() -> tuple[subprocess.Popen[str], str]:
    # Its stderr would show http.server's tracebacks for clients (the proxy) that went away.
    process = subprocess.Popen(
        [sys.executable, "-c", FAKE.format(tests=str(TESTS))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return process, _first_line(process, "the fake upstream")


def start_null_proxy(upstream: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, str(BENCH / "null_proxy.py"), "--upstream", upstream],
        stdout=subprocess.PIPE,
        text=True,
    )
    return process, _first_line(process, "the null proxy")


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)
    if process.stdout is not None:
        process.stdout.close()


def write_memory_config(
    path: Path, store: Path | str, *, embedder: bool = False, extra: str = ""
) -> Path:
    """A memory config storing in ``store`` (a file, or a ``postgresql://`` URL); without
    ``embedder`` recall runs on keyword tags and full-text only (``recall.embedder: none``),
    with it the default MiniLM embedder."""
    lines = [f"storage_path: {store}"]
    if not embedder:
        lines += ["recall:", "  embedder: none"]
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- /proc


def rss_mb(pid: int) -> float | None:
    """The process's resident set (``VmRSS``) in MB; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds on a thread until it exits or
    ``stop()``; ``samples`` are (seconds since start, MB)."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            mb = rss_mb(self.pid)
            if mb is None:
                return
            self.samples.append((round(time.monotonic() - self._start, 2), mb))
            self._stop.wait(self.interval)

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


# --------------------------------------------------------------------------- contextfold proxy


class ContextfoldProxy:
    """``python -m contextfold proxy`` in its own process, its log in ``log``."""

    def __init__(
        self,
        upstream: str,
        memory_yaml: Path,
        home: Path,
        log: Path,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        home.mkdir(parents=True, exist_ok=True)
        self._log_file: IO[bytes] = log.open("ab")
        self.process = subprocess.Popen(
            proxy_command(
                upstream,
                self.port,
                "--memory-config",
                str(memory_yaml),
                "--log-level",
                "warning",
                *extra,
            ),
            env={**os.environ, "CONTEXTFOLD_HOME": str(home), **(env or {})},
            stdout=self._log_file,
            stderr=self._log_file,
        )
        self.pid = self.process.pid
        self.term_at = 0.0

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds until ``/healthz`` answered."""
        start = time.monotonic()
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            if time.monotonic() - start > timeout or self.process.poll() is not None:
                raise SystemExit(f"the proxy did not start; its log: {self.log}")
            time.sleep(0.05)

    def send_term(self) -> None:
        """SIGTERM now; ``wait_exit`` times the exit from this moment."""
        self.term_at = time.monotonic()
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float) -> tuple[int | None, float, bool]:
        """(exit code, seconds from SIGTERM to exit, whether it had to be killed after
        ``timeout`` seconds)."""
        try:
            code: int | None = self.process.wait(timeout)
            killed = False
        except subprocess.TimeoutExpired:
            self.process.kill()
            code, killed = self.process.wait(10), True
        self._log_file.close()
        return code, round(time.monotonic() - self.term_at, 3), killed

    def terminate(self, timeout: float) -> tuple[int | None, float, bool]:
        """SIGTERM, then ``wait_exit``."""
        self.send_term()
        return self.wait_exit(timeout)

    def kill(self) -> int:
        self.process.kill()
        code = self.process.wait(10)
        self._log_file.close()
        return code

    def records(self) -> list[dict[str, Any]]:
        """The dashboard's recent request records (it keeps the last few hundred)."""
        response = httpx.get(f"{self.url}/dashboard/api/records", timeout=30)
        response.raise_for_status()
        return list(response.json())


def log_lines(log: Path, *needles: str) -> dict[str, int]:
    """How many lines of ``log`` contain each of ``needles``."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    return {n: sum(n in line for line in text.splitlines()) for n in needles}


def memory_share(records: list[dict[str, Any]], sessions: set[str] | None = None) -> dict[str, Any]:
    """What the dashboard records say about memory: requests that got a memory block, went
    without one, or were forwarded unmodified because the memory path failed (``error``)."""
    chosen = [r for r in records if sessions is None or r.get("session_id") in sessions]
    failed = [r for r in chosen if r.get("error")]
    notes: dict[str, int] = {}
    for r in chosen:
        for note in (r.get("extra") or {}).get("notes", []):
            notes[note] = notes.get(note, 0) + 1
    errors: dict[str, int] = {}
    for r in failed:
        key = str(r["error"])[:120]
        errors[key] = errors.get(key, 0) + 1
    return {
        "records": len(chosen),
        "with_memory": sum(1 for r in chosen if (r.get("memory_tokens") or 0) > 0),
        "without_memory": sum(
            1 for r in chosen if not r.get("error") and not (r.get("memory_tokens") or 0)
        ),
        "memory_failed_forwarded_unmodified": len(failed),
        "replies_tagged": sum(1 for r in chosen if r.get("response_tags") is not None),
        "notes": notes,
        "errors": errors,
    }


# --------------------------------------------------------------------------- the client


@dataclass
class Exchange:
    status: int
    reply: str  # the reply text as received, session marker included (a client resends it)
    seconds: float
    session: str | None = None  # the session id the proxy returned, if any
    complete: bool = True  # a stream that ended with [DONE]
    error: str | None = None

    @property
    def text(self) -> str:
        """The reply without session markers."""
        return strip_markers(self.reply)


@dataclass
class Tally:
    """Errors by kind, a few samples of each."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)

    def add(self, kind: str, detail: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if len(self.samples) < 8:
            self.samples.append(f"{kind}: {detail[:200]}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def sse_text(raw: str) -> tuple[str, bool]:
    """(the streamed reply text, whether the stream ended with ``[DONE]``)."""
    text, done = [], False
    for line in raw.splitlines():
        if line.startswith("data: {"):
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            text.append((choice.get("delta") or {}).get("content") or "")
        elif line.strip() == "data: [DONE]":
            done = True
    return "".join(text), done


async def chat(
    client: aiohttp.ClientSession,
    url: str,
    messages: list[dict[str, Any]],
    stream: bool,
    delay_ms: float = 0.0,
) -> Exchange:
    """POST one chat request and read the whole reply (the fake takes ``delay_ms`` to answer);
    connection errors come back in ``error`` with status 0."""
    body: dict[str, Any] = {"model": "fake", "messages": messages, "stream": stream}
    if delay_ms:
        body["fake_delay_ms"] = delay_ms
    start = time.perf_counter()
    try:
        async with client.post(f"{url}/v1/chat/completions", json=body) as response:
            raw = await response.text()
            seconds = time.perf_counter() - start
            token = response.headers.get(HEADER)
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Exchange(0, "", time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")
    session = token.split(".")[0] if token else None
    if status != 200:
        return Exchange(status, raw[:300], seconds, session, error=f"HTTP {status}")
    if stream:
        text, complete = sse_text(raw)
    else:
        try:
            text, complete = json.loads(raw)["choices"][0]["message"]["content"], True
        except (ValueError, KeyError, IndexError):
            text, complete = "", False
    return Exchange(status, text, seconds, session, complete)


def client_session(connections: int, timeout: float = 120.0) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


# --------------------------------------------------------------------------- the store


def open_store(store: Path) -> sqlite3.Connection:
    """The store file opened read-only (its WAL included), as any outside reader would."""
    return sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)


def stored_nonces(store: Path) -> dict[str, set[str]]:
    """The nonces found in stored turns, by role (``user``, ``assistant``)."""
    found: dict[str, set[str]] = {"user": set(), "assistant": set()}
    if not store.is_file():
        return found
    conn = open_store(store)
    try:
        rows = conn.execute(
            "SELECT role, content_text FROM turns WHERE instr(content_text, 'nonce-') > 0"
        )
        for role, text in rows:
            found.setdefault(role, set()).update(NONCE.findall(text))
    finally:
        conn.close()
    return found


def missing_exchanges(store: Path, acknowledged: set[str]) -> dict[str, int]:
    """Acknowledged exchanges (by nonce) whose user turn, reply, or both are not stored."""
    stored = stored_nonces(store)
    no_user = acknowledged - stored["user"]
    no_reply = acknowledged - stored["assistant"]
    return {
        "missing_exchanges": len(no_user | no_reply),
        "missing_user_turns": len(no_user),
        "missing_replies": len(no_reply),
    }
