"""Stopping ``contextfold proxy``: a real process, real signals. One Ctrl-C (or SIGTERM) stops
it within seconds even with a dashboard tab's event stream open, requests already in flight
get their whole reply, a stuck one cannot hang the stop, and a second Ctrl-C exits at once."""

from __future__ import annotations

import os
import signal
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

from fake_llm import FakeLLMServer
from proxy_support import free_port

pytestmark = pytest.mark.integration

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Proxy:
    """A ``contextfold proxy`` process and the lines it has written to stderr so far."""

    process: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, fragment: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while fragment not in self.stderr():
            assert time.monotonic() < deadline, f"no {fragment!r} in stderr:\n{self.stderr()}"
            time.sleep(0.02)

    def stop(self, sig: int) -> float:
        """Send ``sig``; the seconds until the process exited (at most 15)."""
        started = time.monotonic()
        self.process.send_signal(sig)
        self.process.wait(15)
        return time.monotonic() - started


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """``start(upstream, **server_config)``: a running proxy in front of ``upstream``."""
    started: list[Proxy] = []

    def _start(upstream: str, **server: object) -> Proxy:
        memory = tmp_path / "contextfold.yaml"
        memory.write_text(f"storage_path: {tmp_path / 'memory.db'}\nrecall:\n  embedder: none\n")
        config = tmp_path / "server.yaml"
        config.write_text("".join(f"{key}: {value}\n" for key, value in server.items()))
        port = free_port()
        command = [sys.executable, "-m", "contextfold", "proxy", "--upstream", upstream]
        command += ["--port", str(port), "--memory-config", str(memory), "--config", str(config)]
        env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path)}
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        proxy = Proxy(process, f"http://127.0.0.1:{port}")
        assert process.stderr is not None
        proxy.reader = threading.Thread(target=proxy.lines.extend, args=(process.stderr,))
        proxy.reader.start()
        started.append(proxy)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{proxy.url}/healthz").raise_for_status()
                return proxy
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None, proxy.stderr()
                time.sleep(0.1)

    yield _start
    for proxy in started:
        if proxy.process.poll() is None:
            proxy.process.kill()
        proxy.process.wait()
        assert proxy.reader is not None and proxy.process.stderr is not None
        proxy.reader.join()
        proxy.process.stderr.close()


def slow_reply(seconds: float, text: str = "the whole slow reply") -> Any:
    def reply(body: dict[str, Any]) -> str:
        time.sleep(seconds)
        return text

    return reply


def post_in_background(proxy: Proxy, fake: FakeLLMServer, body: dict[str, Any]) -> list[Any]:
    """Post ``body`` on a thread; once the upstream has it, the list the response (or the
    transport error) lands in."""
    outcome: list[Any] = []

    def post() -> None:
        try:
            outcome.append(httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30))
        except httpx.TransportError as exc:
            outcome.append(exc)

    threading.Thread(target=post, daemon=True).start()
    deadline = time.monotonic() + 10
    while not fake.requests:
        assert time.monotonic() < deadline, "the request did not reach the upstream"
        time.sleep(0.01)
    return outcome


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_stops_the_server_with_a_dashboard_stream_open(start: Any, sig: int) -> None:
    proxy = start(f"http://127.0.0.1:{free_port()}")  # nothing listens upstream
    with httpx.stream("GET", f"{proxy.url}/dashboard/api/events", timeout=30) as events:
        assert events.status_code == 200
        lines = events.iter_lines()
        assert next(lines) == "event: snapshot"
        took = proxy.stop(sig)
        rest = list(lines)  # the stream ends cleanly: no error, no hang
    assert proxy.process.returncode == 0, proxy.stderr()
    assert took < 5, f"took {took:.1f} s to stop:\n{proxy.stderr()}"
    assert rest[0].startswith("data: ")
    stopping = proxy.stderr().split("stopping: ")[1]
    assert stopping.startswith("1 open connection") and "stopped" in stopping


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_request_in_flight_gets_its_whole_reply_during_the_stop(
    start: Any, fake_llm: FakeLLMServer, stream: bool
) -> None:
    fake_llm.reply = "the whole slow reply" if stream else slow_reply(1.5)
    fake_llm.stream_delay = 0.3 if stream else 0.0  # a word per event: 1.2 s or more
    proxy = start(fake_llm.url)
    outcome = post_in_background(proxy, fake_llm, {**CHAT, "stream": stream})
    took = proxy.stop(signal.SIGINT)
    assert proxy.process.returncode == 0, proxy.stderr()
    assert took < 5, f"took {took:.1f} s to stop:\n{proxy.stderr()}"
    reply = outcome[0]
    assert isinstance(reply, httpx.Response) and reply.status_code == 200
    assert all(word in reply.text for word in ["the", "whole", "slow", "reply"])
    assert reply.headers["x-contextfold-session"]  # the session goes on (no marker by default)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_stuck_request_cannot_hang_the_stop(
    start: Any, fake_llm: FakeLLMServer, stream: bool
) -> None:
    if stream:
        fake_llm.stream_gate = lambda index: time.sleep(30)  # the first word, then nothing
    else:
        fake_llm.reply = slow_reply(30)
    proxy = start(fake_llm.url, shutdown_timeout=1)
    outcome = post_in_background(proxy, fake_llm, {**CHAT, "stream": stream})
    took = proxy.stop(signal.SIGINT)
    assert proxy.process.returncode == 0, proxy.stderr()
    assert 1 <= took < 4, f"took {took:.1f} s to stop:\n{proxy.stderr()}"
    deadline = time.monotonic() + 5
    while not outcome:
        assert time.monotonic() < deadline, "the client is still waiting"
        time.sleep(0.01)
    if stream:  # cut off mid-reply: the client must not take it for a complete one
        assert isinstance(outcome[0], httpx.RemoteProtocolError)
    else:
        assert outcome[0].status_code == 503
        assert outcome[0].json()["error"]["type"] == "server_stopping"
    assert "Traceback" not in proxy.stderr()


def test_a_second_ctrl_c_exits_at_once(start: Any, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = slow_reply(30)
    proxy = start(fake_llm.url, shutdown_timeout=60)
    post_in_background(proxy, fake_llm, CHAT)
    proxy.process.send_signal(signal.SIGINT)
    proxy.wait_for_line("stopping: ")
    time.sleep(0.5)
    assert proxy.process.poll() is None  # still waiting for the stuck request
    took = proxy.stop(signal.SIGINT)
    assert took < 1, f"took {took:.1f} s to exit:\n{proxy.stderr()}"
    assert proxy.process.returncode == 128 + signal.SIGINT
    assert "forced" in proxy.stderr()
