"""The server on a PostgreSQL store that stops and comes back (a server of this test's own,
never the session's shared one): while it is down, the knowledge API answers 503 naming the
store and ``/healthz`` says the store is unavailable; the first request once it is back
succeeds, after a restart (stale pooled connections) as after an outage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig
from postgres_support import URL_ENV, PostgresServer

LOCAL = "http://127.0.0.1:5757"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get(URL_ENV)), reason="needs a PostgreSQL server this test can stop"
)


class StoppablePostgres(PostgresServer):
    """A ``PostgresServer`` that can be stopped and started again on the same port, its data
    kept."""

    def _pg_ctl(self, *args: str) -> None:
        assert self._root is not None
        self._run("pg_ctl", "-D", str(self._root / "data"), *args)

    def pause(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")  # open connections are terminated

    def resume(self) -> None:
        assert self._root is not None
        port = self.url.rsplit(":", 1)[1].split("/")[0]
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port}"
            f" -c unix_socket_directories={self._root / 'run'} -c fsync=off"
        )
        self._pg_ctl("-o", options, "-l", str(self._root / "log"), "-w", "-t", "60", "start")


@pytest.fixture(autouse=True)
def _health_asked_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``/healthz`` asks the stores (the server asks at most every 2 s)."""
    from contextfold.server import app

    monkeypatch.setattr(app._StoreProbe, "EVERY_S", 0.0)


@pytest.fixture
def pg() -> Iterator[StoppablePostgres]:
    with StoppablePostgres() as server:
        yield server


@pytest.fixture
def client(pg: StoppablePostgres) -> Iterator[TestClient]:
    url = pg.new_database()
    config = ServerConfig(context_api=ContextApiSettings(graph_path=url))
    app = create_app(config, memory=MemoryEngine(store=url, embedder=None))
    with TestClient(app, base_url=LOCAL) as test_client:
        yield test_client


NODE = {"tenant_id": "acme", "node_type": "faq", "title": "Refunds", "summary": "refund guide"}


def _document(i: int) -> dict[str, Any]:
    return {"tenant_id": "acme", "id": f"doc-{i}", "title": f"Policy {i}", "text": "Refunds."}


def _unavailable(response: Any) -> str:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["type"] == "store_unavailable"
    return str(error["message"])


def test_an_outage_answers_503_and_the_first_request_after_it_succeeds(
    pg: StoppablePostgres, client: TestClient
) -> None:
    assert client.post("/api/nodes", json=NODE).status_code == 201
    assert client.get("/healthz").json() == {"status": "ok", "memory": "ok", "knowledge": "ok"}

    pg.pause()
    message = _unavailable(client.get("/api/nodes"))
    assert "PostgreSQL" in message and "127.0.0.1" in message
    _unavailable(client.post("/api/context", json={"query": "refund", "tenant_ids": ["acme"]}))
    _unavailable(client.post("/api/nodes", json=NODE))
    # the host still forwards (memory skipped): 200 "degraded", 503 only when asked strictly
    health = client.get("/healthz")
    assert health.status_code == 200, health.text
    assert health.json() == {
        "status": "degraded",
        "memory": "unavailable",
        "knowledge": "unavailable",
    }
    strict = client.get("/healthz", params={"strict": "true"})
    assert strict.status_code == 503 and strict.json()["status"] == "degraded"

    pg.resume()
    listing = client.get("/api/nodes")  # the first request once it is back
    assert listing.status_code == 200, listing.text
    assert listing.json()["total"] == 1
    assert client.post("/api/nodes", json=NODE).status_code == 201
    health = client.get("/healthz")
    assert health.status_code == 200, health.text
    assert health.json()["status"] == "ok"


def test_every_request_after_a_restart_succeeds(
    pg: StoppablePostgres, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pooled connections are checked once idle 2 s (``CHECK_IDLE_S``; a connection in steady
    # use skips the round trip): here the restart is quicker than that, so every one is.
    from contextfold.store.postgres import connection

    monkeypatch.setattr(connection, "CHECK_IDLE_S", 0.0)
    for i in range(4):  # connections in the pools
        assert client.post("/api/documents", json=_document(i)).status_code == 201
    assert client.get("/healthz").status_code == 200

    pg.pause()
    pg.resume()  # every pooled connection is now stale
    for i in range(4, 14):
        response = client.post("/api/documents", json=_document(i))
        assert response.status_code == 201, response.text
    assert client.get("/api/tenants").status_code == 200
    assert len(client.get("/api/documents").json()["documents"]) == 14
    assert client.get("/healthz").json()["status"] == "ok"


def test_startup_degraded_memory_still_answers_200(tmp_path: Path) -> None:
    """``/healthz`` keeps answering 200 "degraded" when memory could not be opened at start
    (the proxy forwards unmodified): supervisors wait for a 200 to call the server up."""
    (tmp_path / "memory.db").write_bytes(b"this is not a database " * 512)
    (tmp_path / "memory.yaml").write_text(f"storage_path: {tmp_path / 'memory.db'}\n")
    config = ServerConfig(
        memory_config=str(tmp_path / "memory.yaml"),
        context_api=ContextApiSettings(graph_path=str(tmp_path / "graph.db")),
    )
    with TestClient(create_app(config), base_url=LOCAL) as client:
        health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json()["status"] == "degraded"


def test_a_graph_store_down_at_start_leaves_the_server_serving_until_it_is_back(
    pg: StoppablePostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server starts while the graph's PostgreSQL server is down (the proxy must serve
    whatever the knowledge API's store does): the API answers 503 until the server is back,
    then opens the store and serves."""
    from contextfold.server import context_api

    monkeypatch.setattr(context_api, "REOPEN_EVERY_S", 0.0)
    url = pg.new_database()
    pg.pause()
    config = ServerConfig(context_api=ContextApiSettings(graph_path=url))
    app = create_app(config, memory=MemoryEngine(store=":memory:", embedder=None))
    with TestClient(app, base_url=LOCAL) as test_client:
        assert "unavailable" in _unavailable(test_client.get("/api/nodes"))
        health = test_client.get("/healthz")
        assert health.status_code == 200 and health.json()["knowledge"] == "unavailable"
        pg.resume()
        created = test_client.post("/api/nodes", json=NODE)
        assert created.status_code == 201, created.text
        assert test_client.get("/api/nodes").json()["total"] == 1
        assert test_client.get("/healthz").json()["status"] == "ok"


def test_the_memory_store_after_a_restart_replaces_its_dropped_connections(
    pg: StoppablePostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pooled connection of the memory store is dropped by a restart: the first calls
    after it succeed (a connection idle a while is checked before use and replaced), where
    each of them failed once, an exchange the proxy then could not store among them."""
    from contextfold.items import Message
    from contextfold.store import open_memory_store
    from contextfold.store.postgres import connection

    monkeypatch.setattr(connection, "CHECK_IDLE_S", 0.0)
    store = open_memory_store(pg.new_database())
    try:
        sid = store.create_session()
        for i in range(3):  # several connections in the pool
            store.append_turns(sid, [Message(role="user", content=f"turn {i}")])
        pg.pause()
        pg.resume()
        for i in range(3, 8):
            store.append_turns(sid, [Message(role="user", content=f"turn {i}")])
            assert store.last_seq(sid) == i + 1
    finally:
        store.close()


def test_a_password_in_a_driver_error_reaches_no_response_or_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """libpq repeats a password it cannot read (``invalid percent-encoded token:
    "<password>"``): that error reaches neither the (unauthenticated) ``/healthz``, nor a 503,
    nor the log. Found by a review: it was shown on ``/healthz``."""
    url = "postgresql://app:Tr0ub%dor@127.0.0.1:1/ctx"
    config = ServerConfig(context_api=ContextApiSettings(graph_path=url))
    with pytest.raises(Exception) as raised:  # a malformed URL is no outage: refused at start
        create_app(config, memory=MemoryEngine(store=":memory:", embedder=None))
    assert "Tr0ub" not in str(raised.value) and "***" in str(raised.value)
    assert "Tr0ub" not in caplog.text
    # a reachable-looking URL that fails to connect: degraded, reason only in the log
    down = "postgresql://app:Sw0rdfish@127.0.0.1:1/ctx"
    config = ServerConfig(context_api=ContextApiSettings(graph_path=down))
    app = create_app(config, memory=MemoryEngine(store=":memory:", embedder=None))
    with TestClient(app, base_url=LOCAL) as client:
        health = client.get("/healthz")
        assert health.json()["knowledge"] == "unavailable"
        failed = client.get("/api/nodes")
        assert failed.status_code == 503
    assert "Sw0rdfish" not in health.text + failed.text + caplog.text


def test_scrub_removes_every_opened_stores_password() -> None:
    from contextfold.store.postgres.pool import remember, scrub

    remember("postgresql://u:h%40rd-pass@db/x")
    text = 'bad token "h@rd-pass" and "h%40rd-pass"; password=h@rd-pass; dsn password = \'x y\''
    assert scrub(text) == 'bad token "***" and "***"; password=***; dsn password = ***'


def test_an_exchange_during_an_outage_is_stored_once_the_server_is_back(
    pg: StoppablePostgres, fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy on a PostgreSQL store that stops: the client still gets its reply (within
    seconds), the exchange waits in the local spool, and it is in the store once the server
    is back, after the history stored before the outage."""
    import time

    from contextfold.server.config import ProxySettings
    from contextfold.server.proxy import spool
    from contextfold.store import open_memory_store
    from proxy_support import serve
    from test_proxy_durability import chat, oa

    monkeypatch.setattr(spool, "MAX_RETRY_S", 0.5)
    url = pg.new_database()
    memory = MemoryEngine(store=url, embedder=None)
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    try:
        with serve(config, memory) as served:
            api, history = oa(served.url), []
            fake_llm.reply = "Noted."
            sid = chat(api, history, "The launch is on Friday.").session
            pg.pause()
            fake_llm.reply = "Lisbon, at the river office."
            history.append({"role": "user", "content": "Where is the launch?"})
            started = time.monotonic()
            # (no session header comes back: the store could not say which turn it stored)
            answer = api.chat.completions.create(model="m", messages=history)
            assert time.monotonic() - started < 5  # (it waited 10 s for the pool before)
            assert answer.choices[0].message.content == "Lisbon, at the river office."
            assert "exchange spooled" in (served.events.recent()[-1].error or "")
            pg.resume()
            replayer = served.proxy.spool
            deadline = time.monotonic() + 30
            while replayer.replayed < 1:
                assert time.monotonic() < deadline, "the spooled exchange was not stored"
                time.sleep(0.05)
    finally:
        memory.close()
    store = open_memory_store(url)
    try:
        turns = [t.message.text() for t in store.turns(sid)]
    finally:
        store.close()
    assert turns == [
        "The launch is on Friday.",
        "Noted.",
        "Where is the launch?",
        "Lisbon, at the river office.",
    ]


def test_a_proxy_killed_during_an_outage_stores_its_spool_at_the_next_start(
    pg: StoppablePostgres, fake_llm: Any, tmp_path: Path
) -> None:
    """``python -m contextfold proxy`` on a PostgreSQL store: the server stops, a client gets
    its reply, the proxy is killed with ``kill -9``; once the server is back, the next start
    of the proxy stores the exchange the client received."""
    import signal
    import time

    from contextfold.store import open_memory_store
    from test_proxy_durability import ProxyProcess, chat, oa

    url = pg.new_database()
    process = ProxyProcess(tmp_path, fake_llm.url)
    process.memory_yaml.write_text(f"store: {url}\nrecall:\n  embedder: none\n")
    try:
        process.start()
        api, history = oa(process.url), []
        fake_llm.reply = "Noted."
        sid = chat(api, history, "The door code is 4471.").session
        pg.pause()
        fake_llm.reply = "It is 4471."
        history.append({"role": "user", "content": "What is the door code?"})
        answer = api.chat.completions.create(model="m", messages=history)
        assert answer.choices[0].message.content == "It is 4471."
        process.stop(signal.SIGKILL)
        pg.resume()
        process.start()
        store = open_memory_store(url)
        try:
            deadline = time.monotonic() + 30
            while len(store.turns(sid)) < 4:
                assert time.monotonic() < deadline, "the spooled exchange was not stored"
                time.sleep(0.1)
            turns = [t.message.text() for t in store.turns(sid)]
        finally:
            store.close()
    finally:
        if process.process is not None and process.process.poll() is None:
            process.stop(signal.SIGTERM)
    assert turns == [
        "The door code is 4471.",
        "Noted.",
        "What is the door code?",
        "It is 4471.",
    ]


def test_a_full_pool_fails_fast_in_an_outage_too(pg: StoppablePostgres) -> None:
    """A memory store whose pool had grown to its maximum before the server stopped: its
    calls fail in about a second, not after the pool's 10 s (the pool counts the connections
    it keeps trying to open again, so it looked busy, not down), and work once it is back."""
    import threading
    import time

    from contextfold.store.postgres.connection import Database
    from contextfold.store.postgres.pool import StoreUnavailable

    db = Database(pg.new_database(), min_size=1, max_size=4)
    try:
        together = threading.Barrier(4)

        def hold() -> None:
            with db.read() as conn:
                together.wait(timeout=30)
                conn.execute("SELECT pg_sleep(0.2)")

        threads = [threading.Thread(target=hold) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert db.pool.get_stats()["pool_size"] == 4
        pg.pause()
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable), db.read() as conn:
                conn.execute("SELECT 1")
            assert time.monotonic() - started < 5
        pg.resume()
        with db.read() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        db.close()


def test_two_workers_spool_an_outage_and_a_restart_stores_each_exchange_once(
    pg: StoppablePostgres, fake_llm: Any, tmp_path: Path
) -> None:
    """``serve --workers 2`` on PostgreSQL: three conversations go on while the server is
    stopped (both workers spool), the proxy is stopped before it is back, and started again
    after: each conversation is one session holding every message once, in order."""
    import signal
    import subprocess
    import sys
    import time

    import httpx
    import openai
    import psycopg

    from proxy_support import free_port

    url = pg.new_database()
    (tmp_path / "memory.yaml").write_text(f"store: {url}\nrecall:\n  embedder: none\n")
    (tmp_path / "server.yaml").write_text(f"proxy:\n  upstream: {fake_llm.url}\n")
    env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path / "home"), "CONTEXTFOLD_SECRET": "s" * 64}
    fake_llm.reply = lambda body: "Answer to " + str(body["messages"][-1]["content"])

    def start() -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        command = [sys.executable, "-m", "contextfold", "serve", "--workers", "2"]
        command += ["--port", str(port), "--config", str(tmp_path / "server.yaml")]
        command += ["--memory-config", str(tmp_path / "memory.yaml"), "--log-level", "warning"]
        with (tmp_path / "log").open("ab") as log:  # (the child keeps its own copy)
            process = subprocess.Popen(command, env=env, stderr=log, stdout=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    return process, base
            except httpx.HTTPError:
                time.sleep(0.1)
        process.kill()
        raise AssertionError((tmp_path / "log").read_text()[-3000:])

    histories: list[list[dict[str, str]]] = [[], [], []]

    def turn(base: str, i: int) -> None:
        api = openai.OpenAI(base_url=f"{base}/v1", api_key=f"sk-{i}", max_retries=0)
        histories[i].append(
            {"role": "user", "content": f"Conversation {i}, message {len(histories[i]) // 2}."}
        )
        reply = api.chat.completions.create(model="m", messages=histories[i])
        api.close()
        histories[i].append(
            {"role": "assistant", "content": reply.choices[0].message.content or ""}
        )

    process, base = start()
    try:
        for i in range(3):
            turn(base, i)
        pg.pause()
        for _ in range(3):
            for i in range(3):
                turn(base, i)
        assert httpx.get(f"{base}/healthz").json()["spooled"] == "9"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        pg.resume()
        process, base = start()
        deadline = time.monotonic() + 30
        while "spooled" in httpx.get(f"{base}/healthz").json():
            assert time.monotonic() < deadline, "the spool was not stored"
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT session_id, content_text FROM turns ORDER BY session_id, seq"
        ).fetchall()
    sessions: dict[str, list[str]] = {}
    for sid, text in found:
        sessions.setdefault(sid, []).append(text)
    assert sorted(sessions.values()) == sorted([m["content"] for m in h] for h in histories)


def test_a_knowledge_store_fails_fast_in_an_outage_and_serves_once_it_is_back(
    pg: StoppablePostgres,
) -> None:
    """The document and graph stores' pool (``pool.Pooled``) takes its connections as the
    memory store's does (``pool.Checkout``): with the server stopped a call fails in about a
    second, not after the 5 s it waited for the pool before, the calls after it at once, and
    the first call once the server is back succeeds."""
    import time

    from contextfold.store.postgres.pool import Pooled, StoreUnavailable

    db = Pooled(pg.new_database(), max_size=4)
    try:
        with db.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        pg.pause()
        waits = []
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable), db.connection() as conn:
                conn.execute("SELECT 1")
            waits.append(time.monotonic() - started)
        assert waits[0] < 3.5 and max(waits[1:]) < 1.0, waits
        assert db.unavailable(timeout=1.0) is not None
        pg.resume()
        with db.transaction() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert db.unavailable(timeout=1.0) is None
    finally:
        db.close()
