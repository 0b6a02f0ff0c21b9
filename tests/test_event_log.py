"""The terminal event log of a real ``contextfold proxy`` process in front of the fake LLM: one
stdout line per event (``INGEST``, ``REQUEST``, ``RESPONSE``, ``COMPLETE``, ``COMPACT``), the
turn counted in the stored conversation even when the client trims its history, and no
message text unless ``--log-content``."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextfold.memory.compactor import CompactionReport
from contextfold.server.event_log import EventLog
from fake_llm import FakeLLMServer
from proxy_support import free_port

pytestmark = pytest.mark.integration

SECRET = "zanzibar7731"  # a word only the conversation holds
TOPIC = (
    "postgres index tuning for the orders table: a btree index on customer id, vacuum "
    "settings, the query planner statistics target and the autovacuum thresholds "
)


@dataclass
class Proxy:
    process: subprocess.Popen[str]
    url: str
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def stdout(self) -> str:
        return "".join(self.out)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.stdout(), re.MULTILINE)) is None:
            assert time.monotonic() < deadline, (
                f"no {pattern!r} on stdout:\n{self.stdout()}\nstderr:\n{''.join(self.err)}"
            )
            time.sleep(0.05)
        return found


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """``start(upstream, *flags)``: a ``contextfold proxy`` process with a small window (so
    a few turns compact) and its stdout and stderr collected."""
    started: list[Proxy] = []

    def _start(upstream: str, *flags: str) -> Proxy:
        n = len(started)
        memory = tmp_path / f"contextfold-{n}.yaml"
        memory.write_text(
            f"storage_path: {tmp_path / f'memory-{n}.db'}\n"
            "context_window: 600\n"
            "recall:\n  embedder: none\n"
            "compaction:\n  soft_threshold: 0.5\n  protected_recent_turns: 2\n"
            "tagger:\n  keywords:\n    database: [postgres, index, vacuum]\n"
        )
        # A loaded machine must not turn memory off (the first request stores and derives the
        # client's history before its recall): the log is tested, not the 50 ms deadline.
        server = tmp_path / f"server-{n}.yaml"
        server.write_text("proxy:\n  memory_deadline_ms: 10000\n")
        port = free_port()
        command = [sys.executable, "-m", "contextfold", "proxy", "--upstream", upstream]
        command += ["--port", str(port), "--memory-config", str(memory), "--config", str(server)]
        command += list(flags)
        env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path)}
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        proxy = Proxy(process, f"http://127.0.0.1:{port}")
        assert process.stdout is not None and process.stderr is not None
        for stream, lines in ((process.stdout, proxy.out), (process.stderr, proxy.err)):
            reader = threading.Thread(target=lines.extend, args=(stream,), daemon=True)
            reader.start()
            proxy.readers.append(reader)
        started.append(proxy)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{proxy.url}/healthz").raise_for_status()
                return proxy
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None, "".join(proxy.err)
                time.sleep(0.1)

    yield _start
    for proxy in started:
        if proxy.process.poll() is None:
            proxy.process.terminate()
        try:
            proxy.process.wait(15)
        except subprocess.TimeoutExpired:
            proxy.process.kill()
            proxy.process.wait()
        for reader in proxy.readers:
            reader.join(5)
        assert proxy.process.stdout is not None and proxy.process.stderr is not None
        proxy.process.stdout.close()
        proxy.process.stderr.close()


def _answer(question: str) -> str:
    return f"About {question.split(':')[0]}: " + TOPIC * 2


def _reply(body: dict[str, Any]) -> str:
    return _answer(body["messages"][-1]["content"])


def _history(turns: int) -> list[dict[str, str]]:
    messages = []
    for n in range(1, turns + 1):
        question = f"question {n} {SECRET}: {TOPIC}"
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": _answer(question)})
    return messages


def _chat(proxy: Proxy, messages: list[dict[str, str]]) -> str:
    answer = httpx.post(
        f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=30
    )
    answer.raise_for_status()
    return str(answer.json()["choices"][0]["message"]["content"])


def test_every_event_is_one_line_with_the_turn_counted_in_the_store(
    start: Any, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = _reply
    proxy = start(fake_llm.url)
    history = _history(3)  # a client bringing three earlier turns
    history.append({"role": "user", "content": f"question 4 {SECRET}: {TOPIC}"})
    history.append({"role": "assistant", "content": _chat(proxy, history)})
    proxy.wait_for(r"^\[INGEST\] 3 turns from the client's history \(session=\w+\)$")
    request = proxy.wait_for(r"^\[T4\] REQUEST openai m stream=False tags=\[.*\] msgs=7 .*$")
    assert re.search(r"dropped=\d+ mem=\d+t vc=\d+\.\dms session=\w{12}$", request[0])
    proxy.wait_for(r"^\[T4\] RESPONSE status=200 stream=False llm=\d+ms total=\d+ms chars=\d+$")
    proxy.wait_for(r"^\[T4\] COMPLETE \d+ms tags=\[database.*\] \(session=\w+\)$")

    # The client keeps only its last exchange: the turns still count on from the store.
    for n in range(5, 9):
        history.append({"role": "user", "content": f"question {n} {SECRET}: {TOPIC}"})
        history.append({"role": "assistant", "content": _chat(proxy, history[-3:])})
        proxy.wait_for(rf"^\[T{n}\] COMPLETE ")
    freed = proxy.wait_for(
        r"^\[COMPACT\] (\d+) turns into (\d+) segments, freed ([\d,]+) tokens"
        r" \(([\d,]+) -> ([\d,]+), ratio [\d.]+x\) in \d+ms \(session=\w+\)$"
    )
    assert int(freed[1]) > 0 and int(freed[3].replace(",", "")) > 0
    out = proxy.stdout()
    assert "[T3]" not in out.split("[T4] REQUEST")[1]  # never "turn 3" again
    assert SECRET not in out and "question" not in out  # no message text without --log-content


def test_log_content_adds_the_query_and_reply(start: Any, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = _reply
    proxy = start(fake_llm.url, "--log-content")
    _chat(proxy, [{"role": "user", "content": f"question 1 {SECRET}: {TOPIC}"}])
    line = proxy.wait_for(r"^\[T1\] REQUEST .*$")[0]
    excerpt = line.split(" | ", 1)[1]
    assert excerpt.startswith(f"question 1 {SECRET}: postgres index tuning")
    assert len(excerpt) <= 80 and excerpt.endswith("…")  # an excerpt, not the whole text
    assert "| About question 1" in proxy.wait_for(r"^\[T1\] COMPLETE .*$")[0]


def test_no_event_log_writes_nothing(start: Any, fake_llm: FakeLLMServer) -> None:
    proxy = start(fake_llm.url, "--no-event-log")
    _chat(proxy, [{"role": "user", "content": "hello"}])
    time.sleep(1.0)
    assert proxy.stdout() == ""


def test_a_stdout_nobody_reads_holds_nothing_up_and_says_what_it_lost() -> None:
    gate = threading.Event()

    class Stuck(io.StringIO):
        def write(self, text: str) -> int:
            gate.wait(10)  # a pipe left full: the write blocks until someone reads
            return super().write(text)

    out = Stuck()
    log = EventLog(stream=out, backlog=5)
    started = time.monotonic()
    for n in range(20):
        log.ingest(f"s{n}", 2)
    assert time.monotonic() - started < 1.0  # the callers never waited on stdout
    gate.set()
    assert log.flush()
    lines = out.getvalue().splitlines()
    (said,) = [x for x in lines if x.endswith("event lines dropped: stdout was not read")]
    dropped = int(said.split()[1])
    assert dropped > 0
    assert len([x for x in lines if x.startswith("[INGEST]")]) + dropped == 20


def test_a_broken_stdout_loses_the_line_not_the_caller() -> None:
    stream = io.StringIO()
    log = EventLog(stream=stream)
    stream.close()
    log.compact(
        CompactionReport(
            session_id="s",
            level="soft",
            turns_compacted=4,
            segments_compacted=1,
            tokens_compacted=400,
            summary_tokens=100,
            tokens_freed=300,
            watermark_before=0,
            watermark_after=5,
            segment_ids=(1,),
            tag_summaries_rebuilt=(),
            duration_ms=3.0,
        )
    )  # no exception
    assert log.flush()
