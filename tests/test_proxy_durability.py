"""What the proxy keeps: every exchange a client received is in the store, once, before the
reply's last byte; derived work survives a stop or a crash as rows in the jobs table; memory
that is slow, broken or busy with another session never holds a request up.

In-process tests run the real app under uvicorn (``proxy_support.serve``); the crash and
restart tests run ``python -m contextfold proxy`` as a real process and read its SQLite file
directly."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.jobs import JobWorker
from contextfold.server.proxy.session import SESSION_HEADER, strip_markers
from contextfold.testing import HashEmbedder
from fake_llm import FakeLLMServer
from proxy_support import Served, closed_after_test, free_port, serve


def config(fake: FakeLLMServer, **proxy: Any) -> ServerConfig:
    return ServerConfig(port=0, proxy=ProxySettings(upstream=fake.url, **proxy))


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    with serve(config(fake_llm), engine) as served:
        yield served


def oa(url: str, api_key: str = "sk-test", **kwargs: Any) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, **kwargs)
    )


class Said(str):
    """A reply's text as the client received it, with the session its header named."""

    session: str


def chat(api: openai.OpenAI, history: list[Any], text: str, *, stream: bool = False) -> Said:
    """Send ``history`` plus the user message ``text``, append both and the reply as the
    client received it; returns the reply text (and its session, ``Said.session``)."""
    history.append({"role": "user", "content": text})
    raw = api.chat.completions.with_raw_response.create(model="m", messages=history, stream=stream)
    if stream:
        reply = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        reply = raw.parse().choices[0].message.content or ""
    assert reply
    history.append({"role": "assistant", "content": reply})
    said = Said(reply)
    said.session = str(raw.headers[SESSION_HEADER]).split(".")[0]
    return said


def session_of(reply: Said) -> str:
    return reply.session


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """``sql`` on a connection of its own (not the engine's)."""
    with closing(sqlite3.connect(db, timeout=10)) as conn:
        return conn.execute(sql, params).fetchall()


def texts(db: Path, session_id: str | None = None) -> list[str]:
    if session_id is None:
        return [r[0] for r in rows(db, "SELECT content_text FROM turns ORDER BY id")]
    sql = "SELECT content_text FROM turns WHERE session_id = ? ORDER BY seq"
    return [r[0] for r in rows(db, sql, session_id)]


# --------------------------------------------------------------------------- new turns, once


@pytest.mark.parametrize("stream", [False, True])
def test_four_identical_exchanges_store_eight_turns(
    proxy: Served, fake_llm: FakeLLMServer, tmp_path: Path, stream: bool
) -> None:
    fake_llm.reply = "Sure."
    api, history = oa(proxy.url), []
    replies = [chat(api, history, "ok", stream=stream) for _ in range(4)]
    sids = {session_of(r) for r in replies}
    assert len(sids) == 1
    assert texts(tmp_path / "memory.db", sids.pop()) == ["ok", "Sure."] * 4


def test_a_client_that_strips_the_marker_but_sends_the_header_stores_each_turn_once(
    proxy: Served, fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    fake_llm.reply = "Fine."
    api, history, token = oa(proxy.url), [], None
    for text in ["Book a table.", "For four people.", "At eight."]:
        history.append({"role": "user", "content": text})
        headers = {SESSION_HEADER: token} if token else {}
        raw = api.chat.completions.with_raw_response.create(
            model="m", messages=history, extra_headers=headers
        )
        token = raw.headers[SESSION_HEADER]
        reply = raw.parse().choices[0].message.content or ""
        history.append({"role": "assistant", "content": strip_markers(reply)})
    assert token is not None
    assert "contextfold" not in fake_llm.requests[-1].raw.decode()
    assert rows(tmp_path / "memory.db", "SELECT session_id, COUNT(*) FROM turns GROUP BY 1") == [
        (token.split(".")[0], 6)
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_the_exchange_is_stored_before_the_client_has_its_reply(
    proxy: Served, fake_llm: FakeLLMServer, tmp_path: Path, stream: bool
) -> None:
    fake_llm.reply = "The meeting moved to Thursday."
    reply = chat(oa(proxy.url), [], "When is the meeting?", stream=stream)
    # No drain: a second connection on the file sees the exchange the moment the client
    # has read the whole reply.
    stored = texts(tmp_path / "memory.db", session_of(reply))
    assert stored == ["When is the meeting?", "The meeting moved to Thursday."]


# --------------------------------------------------------------------------- stop and resume


def test_a_stop_leaves_pending_derived_work_in_the_store(
    fake_llm: FakeLLMServer, engine: MemoryEngine, tmp_path: Path
) -> None:
    stopped, resume = threading.Event(), threading.Event()
    tag = engine.tagger.tag

    def slow_tag(text: str, **kwargs: Any) -> Any:
        time.sleep(0.5)
        if stopped.is_set():  # the old worker's thread, left running: hold it out of the way
            resume.wait(30)
        return tag(text, **kwargs)

    engine.tagger.tag = slow_tag  # type: ignore[method-assign]
    history: list[Any] = []
    with serve(config(fake_llm), engine) as served:
        api = oa(served.url)
        sid = session_of([chat(api, history, f"Step {i} of the plan.") for i in range(10)][-1])
        began = time.monotonic()
    took, db = time.monotonic() - began, tmp_path / "memory.db"
    stopped.set()
    try:
        assert took < 5.0
        assert len(texts(db, sid)) == 20
        assert rows(db, "SELECT state FROM jobs WHERE session_id = ?", sid) == [("pending",)]
        assert engine.store.session(sid).derived_seq < 20
        # Another engine on the same file picks the work up and finishes it.
        with MemoryEngine(store=db, embedder=None) as fresh:
            worker = JobWorker(fresh)
            worker.start()
            try:
                assert wait_for(lambda: fresh.store.session(sid).derived_seq == 20, 20)
                assert wait_for(lambda: fresh.store.jobs.pending_jobs() == 0, 5)
            finally:
                worker.stop()
    finally:
        resume.set()
        for thread in threading.enumerate():
            if thread.name.startswith("contextfold-jobs"):
                thread.join(10)


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --------------------------------------------------------------------------- memory off the path


def test_memory_past_its_deadline_forwards_unmodified_and_still_stores(
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inbound = engine.on_message_inbound
    release = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:  # memory held until the reply has come back
        release.wait(60)
        return inbound(*args, **kwargs)

    with serve(config(fake_llm, memory_deadline_ms=50), engine) as served:
        history: list[Any] = []
        sid = session_of(chat(oa(served.url), history, "Our budget is 3,200 euros."))
        monkeypatch.setattr(engine, "on_message_inbound", slow)
        history.append({"role": "user", "content": "What was the budget?"})
        raw = json.dumps({"model": "m", "messages": history}).encode()
        # A proxy that waited for the memory would not answer before the client's timeout.
        response = httpx.post(
            f"{served.url}/v1/chat/completions",
            content=raw,
            headers={"authorization": "Bearer sk-test", "content-type": "application/json"},
            timeout=20,
        )
        assert response.status_code == 200
        assert fake_llm.requests[-1].raw == raw
        release.set()
        served.drain()
        record = served.events.recent()[-1]
        assert "deadline" in (record.error or "")
        # Its record still says what it carried and which conversation it continued.
        assert record.tokens_in > 10 and record.tokens_forwarded == record.tokens_in
        assert record.extra["session_source"] == "history"
    assert texts(tmp_path / "memory.db", sid)[2:] == [
        "What was the budget?",
        "Hello from the fake LLM.",
    ]


@contextmanager
def small_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: Callable[[], None]
) -> Iterator[MemoryEngine]:
    """An engine for a 1,000-token window whose recall runs ``first`` before it recalls (a
    slow or failing memory step)."""
    with MemoryEngine(
        MemoryConfig.model_validate({"context_window": 1000}),
        store=tmp_path / "memory.db",
        embedder=None,
    ) as engine:
        inbound = engine.on_message_inbound

        def troubled(*args: Any, **kwargs: Any) -> Any:
            first()
            return inbound(*args, **kwargs)

        monkeypatch.setattr(engine, "on_message_inbound", troubled)
        yield engine


def test_a_request_that_may_not_fit_the_window_waits_for_its_memory(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory slower than its 50 ms deadline: a request small beside the model's window goes
    upstream unmodified, as before; one whose body may not fit the window unmodified (2 bytes
    a token or more) waits for its memory, up to ``fit_deadline_ms``: forwarded as sent, it
    would overflow the window."""
    with small_window(tmp_path, monkeypatch, lambda: time.sleep(0.3)) as engine:
        settings = config(fake_llm, memory_deadline_ms=50, fit_deadline_ms=5000)
        with serve(settings, engine) as served:
            api, history = oa(served.url), []
            chat(api, history, "Hello.")  # (a new conversation recalls nothing)
            chat(api, history, "A short question?")
            served.drain()
            small = served.events.recent()[-1]
            chat(api, history, "A pasted log: " + "GET /api/items 200 12ms " * 100)
            served.drain()
            large = served.events.recent()[-1]
    assert "deadline (50 ms) passed" in (small.error or "")
    assert large.error is None, large.error
    notes = large.extra.get("notes", [])
    assert any("waited for, as the request" in note for note in notes), notes


def test_a_request_that_may_not_fit_waits_for_its_memory_even_when_it_starts_late(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's memory threads all busy (other requests' work, a backlog): a request that
    may not fit the window unmodified waits for its memory work to start and run, up to
    ``fit_deadline_ms``, instead of going upstream over the window after 50 ms (it did, with
    the record saying the window-fit deadline passed though it had waited 50 ms)."""
    from concurrent.futures import ThreadPoolExecutor

    with small_window(tmp_path, monkeypatch, lambda: None) as engine:
        settings = config(fake_llm, memory_deadline_ms=50, fit_deadline_ms=5000)
        with serve(settings, engine) as served:
            api, history = oa(served.url), []
            chat(api, history, "Hello.")
            chat(api, history, "A short question?")
            served.drain()
            busy = ThreadPoolExecutor(1)  # one memory thread, taken for 0.4 s
            monkeypatch.setattr(served.proxy, "_pool", busy)
            busy.submit(time.sleep, 0.4)
            chat(api, history, "A pasted log: " + "GET /api/items 200 12ms " * 100)
            served.drain()
            large = served.events.recent()[-1]
            busy.shutdown()
    assert large.error is None, large.error
    notes = large.extra.get("notes", [])
    assert any("waited for, as the request" in note for note in notes), notes


@pytest.mark.parametrize("trouble", ["slower than the fit deadline", "its own timeout"])
def test_memory_that_fails_the_fit_wait_forwards_unmodified_and_says_why(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trouble: str
) -> None:
    """A request that may not fit the window waits up to ``fit_deadline_ms``, no longer; a
    ``TimeoutError`` the memory work raises itself (a socket, a database) is that error, not
    a deadline."""

    def trouble_first() -> None:
        if trouble == "its own timeout":
            raise TimeoutError("the database did not answer")
        time.sleep(0.5)

    with small_window(tmp_path, monkeypatch, trouble_first) as engine:
        settings = config(fake_llm, memory_deadline_ms=50, fit_deadline_ms=150)
        with serve(settings, engine) as served:
            api, history = oa(served.url), []
            chat(api, history, "Hello.")
            chat(api, history, "A pasted log: " + "GET /api/items 200 12ms " * 100)
            served.drain()
            error = served.events.recent()[-1].error or ""
    if trouble == "its own timeout":
        assert "TimeoutError: the database did not answer" in error, error
        assert "deadline" not in error
    else:
        assert "the window-fit deadline (150 ms) passed" in error, error


def test_a_slow_session_holds_up_no_other(
    proxy: Served, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = oa(proxy.url)
    slow_history: list[Any] = []
    slow_sid = session_of(chat(api, slow_history, "Slow conversation."))
    fast_history: list[Any] = []
    fast_sid = session_of(chat(api, fast_history, "Fast conversation."))
    while engine.lock(fast_sid) is engine.lock(slow_sid):  # one lock stripe in 256: another
        fast_history = []
        fast_sid = session_of(chat(api, fast_history, "Fast conversation."))
    tag, inside = engine.tag_message, threading.Event()

    def slow_tag(text: str, *, session_id: str | None = None) -> Any:
        if session_id == slow_sid:  # inside the session's lock
            inside.set()
            time.sleep(1.0)
        return tag(text, session_id=session_id)

    monkeypatch.setattr(engine, "tag_message", slow_tag)
    timings: dict[str, float] = {}

    def timed(name: str, history: list[Any], text: str) -> None:
        began = time.perf_counter()
        chat(api, history, text)
        timings[name] = time.perf_counter() - began

    slow = threading.Thread(target=timed, args=("slow", slow_history, "Still there?"))
    slow.start()
    assert inside.wait(5)
    timed("fast", fast_history, "And me?")
    slow.join(10)
    assert timings["slow"] >= 1.0
    assert timings["fast"] < 0.5


class _ThreadEmbedder(HashEmbedder):
    """Records which thread embedded each text."""

    def __init__(self) -> None:
        super().__init__()
        self.by: list[tuple[str, str]] = []

    def embed(self, texts: Sequence[str]) -> Any:
        self.by += [(threading.current_thread().name, text) for text in texts]
        return super().embed(texts)


def test_a_request_embeds_its_query_and_never_the_stored_turns(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored turns get their vectors from the derive jobs: a recall never embeds a backlog
    (held here: the jobs wait until the conversation is over)."""
    embedder = _ThreadEmbedder()
    with MemoryEngine(store=tmp_path / "memory.db", embedder=embedder) as engine:
        derive, release = engine.derive, threading.Event()

        def held(*args: Any, **kwargs: Any) -> Any:
            assert release.wait(30)
            return derive(*args, **kwargs)

        monkeypatch.setattr(engine, "derive", held)
        with serve(config(fake_llm), engine) as served:
            api, history = oa(served.url), []
            asked, replies = ["The harbour opens at six.", "Boats leave at nine.", "When?"], []
            for i, text in enumerate(asked):
                fake_llm.reply = f"Noted, reply {i} about the harbour schedule."
                replies.append(fake_llm.reply)
                chat(api, history, text)
            before = list(embedder.by)
            release.set()
            served.drain()
        requests = [(thread, text) for thread, text in before if text != "warm up"]
        assert sorted(text for _, text in requests) == sorted(asked)  # each query, once
        assert {thread for thread, _ in requests} == {"contextfold-embed"}
        for reply in replies:  # embedded once the jobs ran, by them
            assert [t for t, text in embedder.by if text == reply] == ["contextfold-jobs-0"]


def test_llm_tagging_usage_is_logged_under_the_requests_session(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    def answer(body: dict[str, Any]) -> str:
        if body.get("model") == "tagger":
            return '{"tags": ["banking"], "primary": "banking", "related_tags": []}'
        return "Noted."

    fake_llm.reply = answer
    memory_config = MemoryConfig.model_validate(
        {
            "tagger": {"type": "llm"},
            "llm": {"provider": "openai", "model": "tagger", "base_url": fake_llm.base_url},
        }
    )
    with (
        MemoryEngine(memory_config, store=tmp_path / "memory.db", embedder=None) as engine,
        serve(config(fake_llm), engine) as served,
    ):
        history: list[Any] = []
        chat(oa(served.url), history, "Open a savings account.")
        sid = session_of(chat(oa(served.url), history, "With a monthly transfer."))
        served.drain()
        assert served.proxy.jobs.errors == []
    assert any(r.body.get("model") == "tagger" for r in fake_llm.requests)
    logged = rows(tmp_path / "memory.db", "SELECT session_id, kind FROM cost_log")
    assert logged and set(logged) == {(sid, "tagging")}
    assert rows(tmp_path / "memory.db", "SELECT COUNT(*) FROM jobs") == [(0,)]
    assert texts(tmp_path / "memory.db", sid)[-1] == "Noted."


# --------------------------------------------------------------------------- a real process


class ProxyProcess:
    """``python -m contextfold proxy`` on a free port, its memory in ``folder/memory.db``."""

    def __init__(self, folder: Path, upstream: str, **env: str) -> None:
        self.folder, self.upstream = folder, upstream
        self.db = folder / "memory.db"
        self.memory_yaml = folder / "contextfold.yaml"
        self.memory_yaml.write_text(f"storage_path: {self.db}\nrecall:\n  embedder: none\n")
        self.env = {**os.environ, "CONTEXTFOLD_HOME": str(folder / "home"), **env}
        self.env.pop("CONTEXTFOLD_SECRET", None)
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> ProxyProcess:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "contextfold", "proxy", "--upstream", self.upstream]
        command += ["--port", str(port), "--memory-config", str(self.memory_yaml)]
        self.log = (self.folder / "proxy.log").open("ab")
        self.process = subprocess.Popen(
            [*command, "--log-level", "warning"], env=self.env, stderr=self.log
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop(signal.SIGKILL)
        log = (self.folder / "proxy.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"the proxy did not start:\n{log}")

    def stop(self, sig: signal.Signals) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(15)
        self.log.close()
        return code

    def jobs_done(self, seconds: float = 20) -> bool:
        return wait_for(lambda: rows(self.db, "SELECT COUNT(*) FROM jobs") == [(0,)], seconds)


@pytest.fixture
def process(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[ProxyProcess]:
    proc = ProxyProcess(tmp_path, fake_llm.url)
    yield proc
    if proc.process is not None and proc.process.poll() is None:
        proc.stop(signal.SIGKILL)


#: Per session: how far its turns are derived, and its last turn.
DERIVED = (
    "SELECT s.derived_seq, MAX(t.seq) FROM sessions s JOIN turns t ON t.session_id = s.id"
    " GROUP BY s.id"
)


def converse(url: str, number: int, history: list[Any], received: list[tuple[str, str]]) -> None:
    """Go on with ``history`` until the proxy goes away; every exchange whose reply arrived
    whole is appended to ``received`` (threads 0 and 1 stream, 2 and 3 do not)."""
    api = oa(url, f"sk-thread-{number}", timeout=10)
    while True:
        text = f"Thread {number}, message {len(history) // 2}: {random.random():.12f}"
        try:
            reply = chat(api, list(history), text, stream=number < 2)
        except Exception:  # the proxy was killed: the client sees a broken connection
            return
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        received.append((text, strip_markers(reply)))


def test_kill_9_loses_no_exchange_a_client_received(
    process: ProxyProcess, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = lambda body: "Answer to " + str(body["messages"][-1]["content"])
    histories: list[list[Any]] = [[] for _ in range(4)]
    received: list[tuple[str, str]] = []
    draw = random.Random(7)
    for _ in range(3):
        process.start()
        if received:  # after a crash: the work left behind resumes
            assert process.jobs_done(), rows(process.db, "SELECT * FROM jobs")
            assert all(done == last for done, last in rows(process.db, DERIVED))
        before = len(received)
        threads = [
            threading.Thread(target=converse, args=(process.url, n, histories[n], received))
            for n in range(4)
        ]
        for thread in threads:
            thread.start()
        # Kill mid-run: once replies flow (a fresh process's first ones are slow), after a
        # random while.
        assert wait_for(lambda n=before: len(received) > n, 15)
        time.sleep(draw.uniform(0.05, 0.5))
        process.stop(signal.SIGKILL)
        for thread in threads:
            thread.join(15)
        assert rows(process.db, "PRAGMA integrity_check") == [("ok",)]
        stored = set(texts(process.db))
        lost = [pair for pair in received if not set(pair) <= stored]
        assert lost == []
    process.start()
    assert process.jobs_done(), rows(process.db, "SELECT * FROM jobs")
    assert all(done == last for done, last in rows(process.db, DERIVED))
    process.stop(signal.SIGTERM)


def test_a_restart_keeps_sessions_and_the_secret(
    process: ProxyProcess, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Noted."
    history: list[Any] = []
    process.start()
    said = chat(oa(process.url), history, "My flight is on May 4.")
    (first,) = rows(process.db, "SELECT DISTINCT session_id FROM turns")
    assert session_of(said) == first[0]
    assert process.stop(signal.SIGTERM) == 0
    process.start()
    chat(oa(process.url), history, "Which day was my flight?")
    process.stop(signal.SIGTERM)
    assert rows(process.db, "SELECT session_id, COUNT(*) FROM turns GROUP BY 1") == [(first[0], 4)]
    secret = process.folder / "home" / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_corrupt_store_at_start_up_leaves_a_plain_proxy(
    process: ProxyProcess, fake_llm: FakeLLMServer
) -> None:
    process.db.write_bytes(b"this is not a database " * 512)
    process.start()
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "Hello"}]}'
    response = httpx.post(
        f"{process.url}/v1/chat/completions",
        content=raw,
        headers={"authorization": "Bearer sk-test", "content-type": "application/json"},
    )
    assert response.status_code == 200
    assert fake_llm.requests[-1].raw == raw
    health = httpx.get(f"{process.url}/healthz").json()
    assert health.get("memory", "ok") != "ok", health
