"""Exchanges the store could not take are spooled on local disk before the client has its
reply, and stored once the store takes writes again: in order, once, even when the
conversation's next request stored them first, and by a server started later when the one
that spooled them stopped.

The store's failure is an SQLite ``OperationalError`` from its ``commit_exchange`` (a file
locked past its timeout, a full disk); ``test_postgres_outage`` stops a real PostgreSQL server
under the proxy."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextfold.items import Message
from contextfold.memory.engine import MemoryEngine
from contextfold.server.proxy import spool as spool_module
from contextfold.server.proxy.spool import ExchangeSpool, store_key
from contextfold.store.sqlite import home_dir
from fake_llm import FakeLLMServer
from fake_responses import ResponsesFake
from proxy_support import make_engine, serve
from test_proxy_durability import chat, config, oa, rows, texts


class Outage:
    """Makes the engine's store refuse ``commit_exchange`` while ``down`` is set."""

    def __init__(self, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = threading.Event()
        self.refused = 0
        store = engine.store
        commit = store.commit_exchange

        def refusing(*args: Any, **kwargs: Any) -> list[int]:
            if self.down.is_set():
                self.refused += 1
                raise sqlite3.OperationalError("database is locked")
            return commit(*args, **kwargs)

        monkeypatch.setattr(store, "commit_exchange", refusing)


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_module, "MAX_RETRY_S", 0.2)
    monkeypatch.setattr(spool_module, "FIRST_RETRY_S", 0.05)


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def spooled_rows() -> int:
    path = home_dir() / "spool.db"
    if not path.exists():
        return 0
    return len(rows(path, "SELECT id FROM exchanges"))


def attempts() -> int:
    return max(a for (a,) in rows(home_dir() / "spool.db", "SELECT attempts FROM exchanges"))


def sessions(db: Path) -> list[tuple[Any, ...]]:
    return rows(db, "SELECT session_id, COUNT(*) FROM turns GROUP BY session_id")


@pytest.mark.parametrize("stream", [False, True])
def test_exchanges_the_store_refuses_are_spooled_then_stored_in_order(
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    outage = Outage(engine, monkeypatch)
    db = tmp_path / "memory.db"
    with serve(config(fake_llm), engine) as served:
        api, history = oa(served.url), []
        fake_llm.reply = "Noted: the budget is 3,200 euros."
        chat(api, history, "Our budget is 3,200 euros.", stream=stream)
        outage.down.set()
        fake_llm.reply = "The venue is Lisbon."
        chat(api, history, "Where is the venue?", stream=stream)
        fake_llm.reply = "Ten people."
        chat(api, history, "How many are coming?", stream=stream)
        # Both replies reached the client; neither is in the store; both are on disk.
        assert outage.refused >= 2
        assert texts(db)[2:] == []
        assert spooled_rows() == 2
        health = httpx.get(f"{served.url}/healthz").json()
        assert health["spooled"] == "2"
        # An outage is retried for as long as it lasts, past the attempts a failing row gets.
        wait_for(lambda: attempts() > spool_module.MAX_ATTEMPTS)
        assert spooled_rows() == 2
        served.drain()
        errors = [r.error or "" for r in served.events.recent()[-2:]]
        assert all("exchange spooled" in e and "database is locked" in e for e in errors), errors
        outage.down.clear()
        wait_for(lambda: spooled_rows() == 0)
        served.drain()
        assert "spooled" not in httpx.get(f"{served.url}/healthz").json()
    assert texts(db) == [
        "Our budget is 3,200 euros.",
        "Noted: the budget is 3,200 euros.",
        "Where is the venue?",
        "The venue is Lisbon.",
        "How many are coming?",
        "Ten people.",
    ]
    assert len(sessions(db)) == 1


def test_a_replay_after_the_next_request_stored_the_exchange_writes_nothing(
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store comes back and the conversation's next request, resending the history,
    stores the spooled exchange before the replayer does: the replay then finds it stored
    (no duplicate turns, no forked branch)."""
    outage = Outage(engine, monkeypatch)
    db = tmp_path / "memory.db"
    with serve(config(fake_llm), engine) as served:
        replayer = served.proxy.spool
        assert replayer is not None
        with monkeypatch.context() as held:
            held.setattr(replayer, "round", lambda: True)  # no replay until the block ends
            api, history = oa(served.url), []
            fake_llm.reply = "Hello."
            chat(api, history, "Hi there.")
            outage.down.set()
            fake_llm.reply = "It is on Friday."
            chat(api, history, "When is the launch?")
            assert spooled_rows() == 1
            outage.down.clear()
            fake_llm.reply = "At noon."
            chat(api, history, "What time?")
            served.drain()
            stored = texts(db)
            assert stored[2:4] == ["When is the launch?", "It is on Friday."]
        replayer.wake()
        wait_for(lambda: replayer.replayed == 1)
        assert spooled_rows() == 0
        served.drain()
    assert texts(db) == stored
    assert len(sessions(db)) == 1


def test_an_exchange_that_cannot_be_stored_is_given_up_and_holds_up_no_other(
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row whose replay keeps failing with an error that is not an outage (a defect, a row
    the store refuses) is given up after ``MAX_ATTEMPTS``, kept in the file and counted on
    ``/healthz``; the rows after it are stored."""
    monkeypatch.setattr(spool_module, "MAX_ATTEMPTS", 2)
    outage = Outage(engine, monkeypatch)
    store = engine.store
    commit = store.commit_exchange

    def refusing_one(session_id: str, messages: Any, **kwargs: Any) -> list[int]:
        if any("cannot be stored" in m.text() for m in messages):
            raise ValueError("this exchange cannot be stored")
        return commit(session_id, messages, **kwargs)

    with serve(config(fake_llm), engine) as served:
        outage.down.set()
        chat(oa(served.url), [], "This one cannot be stored.")
        chat(oa(served.url), [], "This one can.")
        assert spooled_rows() == 2
        monkeypatch.setattr(store, "commit_exchange", refusing_one)
        outage.down.clear()
        wait_for(lambda: "This one can." in texts(tmp_path / "memory.db"))
        health = httpx.get(f"{served.url}/healthz").json()
        assert health.get("spool_given_up") == "1" and "spooled" not in health
    (kept,) = rows(home_dir() / "spool.db", "SELECT given_up, errors, last_error FROM exchanges")
    assert kept == (1, 2, "ValueError: this exchange cannot be stored")


def test_a_replay_while_the_next_request_is_upstream_stores_each_turn_once(
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store is back; the conversation's next request (resending the spooled exchange)
    finds its place before the replay stores that exchange, and commits after it: the
    request continues after the replayed exchange (it forked at its stale place before, the
    exchange then stored twice on two branches)."""
    outage = Outage(engine, monkeypatch)
    db = tmp_path / "memory.db"
    with serve(config(fake_llm), engine) as served:
        replayer = served.proxy.spool
        assert replayer is not None
        api, history = oa(served.url), []
        fake_llm.reply = "Hello."
        chat(api, history, "Hi there.")
        with monkeypatch.context() as held:
            held.setattr(replayer, "round", lambda: True)  # its timer has not fired yet
            outage.down.set()
            fake_llm.reply = "It is on Friday."
            chat(api, history, "When is the launch?")
            assert spooled_rows() == 1
            outage.down.clear()

            def upstream(body: dict[str, Any]) -> str:
                type(replayer).round(replayer)  # the replay, while this request is upstream
                return "At noon."

            fake_llm.reply = upstream
            chat(api, history, "What time?")
        assert spooled_rows() == 0
        served.drain()
    assert sessions(db) == [(sessions(db)[0][0], 6)]
    assert texts(db) == [
        "Hi there.",
        "Hello.",
        "When is the launch?",
        "It is on Friday.",
        "What time?",
        "At noon.",
    ]


def test_the_spool_is_readable_by_its_owner_only(
    fake_llm: FakeLLMServer, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It holds whole prompts and replies (as the secret beside it, 0600)."""
    outage = Outage(engine, monkeypatch)
    old = os.umask(0o022)
    try:
        with serve(config(fake_llm), engine) as served:
            outage.down.set()
            chat(oa(served.url), [], "My account number is 12-3456-7.")
            modes = {
                p.name: stat.S_IMODE(p.stat().st_mode)
                for p in home_dir().iterdir()
                if p.name.startswith("spool.db")
            }
            outage.down.clear()
    finally:
        os.umask(old)
    assert "spool.db" in modes
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes


def test_a_spool_file_removed_while_the_proxy_runs_is_made_again(
    fake_llm: FakeLLMServer, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator deletes the file (say, to drop a row given up); the next exchange the
    store refuses is still spooled."""
    outage = Outage(engine, monkeypatch)
    with serve(config(fake_llm), engine) as served:
        outage.down.set()
        chat(oa(served.url), [], "First.")
        for path in list(home_dir().iterdir()):
            if path.name.startswith("spool.db"):
                path.unlink()
        chat(oa(served.url), [], "Second.")
        served.drain()
        error = served.events.recent()[-1].error or ""
        assert spooled_rows() == 1
        outage.down.clear()
    assert "exchange spooled" in error, error


def test_a_home_that_cannot_be_made_leaves_the_proxy_without_a_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store, the graph and the secret all elsewhere (a read-only root): the server
    starts, without a spool, and says so."""
    from contextfold.server.app import create_app
    from contextfold.server.config import ContextApiSettings, ProxySettings, ServerConfig

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CONTEXTFOLD_HOME", str(blocker / "home"))  # cannot be made
    monkeypatch.setenv("CONTEXTFOLD_SECRET", "s" * 64)
    with make_engine(tmp_path) as memory:
        app = create_app(
            ServerConfig(
                port=0,
                context_api=ContextApiSettings(graph_path=str(tmp_path / "graph.db")),
                proxy=ProxySettings(upstream="http://127.0.0.1:9"),
            ),
            memory=memory,
        )
        assert app.state.proxy.spool is None
    assert "without a spool" in caplog.text


def test_a_spool_written_before_the_give_up_columns_is_read(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "CREATE TABLE exchanges (id INTEGER PRIMARY KEY AUTOINCREMENT, store_key TEXT NOT"
            " NULL, spooled_at TEXT NOT NULL, format TEXT NOT NULL, principal TEXT NOT NULL,"
            " header TEXT, body TEXT NOT NULL, reply TEXT NOT NULL, partial INTEGER NOT NULL,"
            " exchange_time TEXT NOT NULL, new_session TEXT, response_id TEXT,"
            " attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT)"
        )
        conn.execute(
            "INSERT INTO exchanges (store_key, spooled_at, format, principal, body, reply,"
            " partial, exchange_time) VALUES ('k', '2026-11-27T00:00:00+00:00', 'openai', 'p',"
            " '{}', ?, 0, '2026-11-27T00:00:00+00:00')",
            (Message(role="assistant", content="Hi.").model_dump_json(),),
        )
        conn.commit()
    spool = ExchangeSpool(path, "k")
    (kept,) = spool.oldest()
    assert (kept.errors, kept.reply.text()) == (0, "Hi.")
    assert spool.pending() == 1 and spool.pending(given_up=True) == 0


def test_a_spooled_responses_reply_continues_its_chain(
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``/v1/responses`` chained by ``previous_response_id`` (the body holds only the new
    input): the spooled exchange is stored after the chain's turns, and its response's id
    names the stored reply, so the next request chained on it continues the same session."""
    ResponsesFake(fake_llm)
    outage = Outage(engine, monkeypatch)
    with serve(config(fake_llm), engine) as served:
        client = oa(served.url)
        fake_llm.reply = "It is sunny in Oslo."
        first = client.responses.create(model="m", input="Weather in Oslo?")
        outage.down.set()
        fake_llm.reply = "Take sunglasses."
        second = client.responses.create(
            model="m", previous_response_id=first.id, input="What to pack?"
        )
        assert spooled_rows() == 1
        outage.down.clear()
        wait_for(lambda: spooled_rows() == 0)
        fake_llm.reply = "Yes, a light one."
        client.responses.create(model="m", previous_response_id=second.id, input="A jacket?")
        served.drain()
    assert texts(tmp_path / "memory.db") == [
        "Weather in Oslo?",
        "It is sunny in Oslo.",
        "What to pack?",
        "Take sunglasses.",
        "A jacket?",
        "Yes, a light one.",
    ]
    assert len(sessions(tmp_path / "memory.db")) == 1


def test_a_server_started_later_stores_what_a_stopped_one_spooled(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "memory.db"
    with make_engine(tmp_path) as first:
        outage = Outage(first, monkeypatch)
        outage.down.set()
        with serve(config(fake_llm), first) as served:
            fake_llm.reply = "Your order ships on Monday."
            chat(oa(served.url), [], "When does my order ship?")
            assert spooled_rows() == 1
    assert spooled_rows() == 1  # the stop left it on disk
    with make_engine(tmp_path) as second, serve(config(fake_llm), second) as served:
        wait_for(lambda: spooled_rows() == 0)
        served.drain()
    assert texts(db) == ["When does my order ship?", "Your order ships on Monday."]


def test_servers_sharing_a_home_replay_only_their_own_stores_exchanges(
    fake_llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with make_engine(tmp_path / "a") as first:
        outage = Outage(first, monkeypatch)
        outage.down.set()
        with serve(config(fake_llm), first) as served:
            chat(oa(served.url), [], "Kept for store a.")
    with make_engine(tmp_path / "b") as other, serve(config(fake_llm), other) as served:
        time.sleep(0.5)  # its replayer's first round has run
        assert served.proxy.spool.replayed == 0
    assert spooled_rows() == 1
    assert texts(tmp_path / "b" / "memory.db") == []


def test_a_store_in_memory_gets_no_spool(fake_llm: FakeLLMServer) -> None:
    memory = MemoryEngine(store=":memory:", embedder=None)
    with serve(config(fake_llm), memory) as served:
        assert served.proxy.spool is None
    memory.close()


def test_one_process_at_a_time_replays(tmp_path: Path) -> None:
    spool = ExchangeSpool(tmp_path / "spool.db", "k")
    other = ExchangeSpool(tmp_path / "spool.db", "k")  # another open file, as another process
    with spool.replaying() as mine:
        assert mine
        with other.replaying() as theirs:
            assert not theirs
    with other.replaying() as theirs:
        assert theirs


def test_a_spooled_exchange_keeps_what_the_replay_needs(tmp_path: Path) -> None:
    spool = ExchangeSpool(tmp_path / "spool.db", "k")
    reply = Message(role="assistant", content="Sure — naïve café ☕")
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}
    spool.add(
        format="openai",
        principal="p",
        header="h",
        body=body,
        reply=reply,
        partial=True,
        exchange_time=None,
        new_session="s",
        response_id=None,
    )
    (kept,) = spool.oldest()
    assert (kept.body, kept.reply, kept.partial, kept.new_session) == (body, reply, True, "s")
    assert ExchangeSpool(tmp_path / "spool.db", "other").pending() == 0
    spool.failed(kept.id, "down")
    assert spool.oldest()[0].attempts == 1
    spool.done(kept.id)
    assert spool.pending() == 0


def test_store_keys() -> None:
    assert store_key(":memory:") is None
    assert store_key("") is None
    assert store_key("memory.db") == store_key(str(Path("memory.db").resolve()))
    assert store_key("postgresql://u:***@h/db") != store_key("postgresql://u:***@h/other")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[MemoryEngine]:
    with make_engine(tmp_path) as memory:
        yield memory
