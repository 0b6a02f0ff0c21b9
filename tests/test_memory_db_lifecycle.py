"""The lifetime of a SQLite memory store's connections: a thread's own connection ends with
the thread (a server that serves each request on a short-lived thread must not run out of
files), ``close()`` closes every one still open, and nothing may use or reopen the store
after ``close()`` (a clear ``StoreError`` instead)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from contextfold.errors import StoreError
from contextfold.items import Message
from contextfold.memory import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.store.sqlite.memory_db import MemoryDb
from contextfold.tokens import CharCounter


def _open_fds(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path`` itself."""
    target = str(path.resolve())
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if str(fd.readlink()) == target:
                count += 1
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return count


def _in_threads(n: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(i)`` on ``n`` short-lived threads, one after another; their errors."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    for i in range(n):
        thread = threading.Thread(target=run, args=(i,))
        thread.start()
        thread.join()
    return errors


pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc/self/fd"
)


def test_short_lived_threads_leave_no_connections_open(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = MemoryStore(path, counter=CharCounter())
    sid = store.create_session("s")

    def work(i: int) -> None:
        store.append_turns(sid, [Message(role="user", content=f"turn {i}")])
        assert len(list(store.turns(sid))) == i + 1

    assert _in_threads(60, work) == []
    gc.collect()
    assert _open_fds(path) <= 2  # the creating thread's connection, nothing per thread
    assert len(store._db._connections) <= 1
    assert len(list(store.turns(sid))) == 60  # every thread's write was committed
    store.close()
    assert _open_fds(path) == 0


def test_an_engine_served_from_a_thread_per_request_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    engine = MemoryEngine(store=str(path), embedder=None)
    engine.on_turn_complete([{"role": "user", "content": "The boiler is serviced in May."}])

    def request(_: int) -> None:
        engine.on_message_inbound("When is the boiler serviced?")

    assert _in_threads(80, request) == []
    gc.collect()
    assert _open_fds(path) <= 4
    engine.close()
    assert _open_fds(path) == 0


def test_close_closes_the_connections_of_threads_still_running(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    db = MemoryDb(str(path))
    used, closed, errors = threading.Event(), threading.Event(), []

    def worker() -> None:
        db.conn.execute("SELECT 1")
        used.set()
        closed.wait(10)
        try:
            db.conn.execute("SELECT 1")
        except StoreError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert used.wait(10)
    assert _open_fds(path) == 2
    db.close()
    assert _open_fds(path) == 0
    closed.set()
    thread.join(10)
    assert len(errors) == 1 and "closed" in str(errors[0])
    gc.collect()
    assert _open_fds(path) == 0  # the worker's later use reopened nothing


@pytest.mark.parametrize("where", [":memory:", "file"])
def test_a_closed_store_refuses_every_use(where: str, tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = MemoryStore(where if where == ":memory:" else path, counter=CharCounter())
    sid = store.create_session("s")
    store.append_turns(sid, [Message(role="user", content="before close")])
    store.close()
    store.close()  # closing twice is harmless
    with pytest.raises(StoreError, match="memory store is closed"):
        store.append_turns(sid, [Message(role="user", content="after close")])
    with pytest.raises(StoreError, match="memory store is closed"):
        list(store.turns(sid))
    with pytest.raises(StoreError, match="memory store is closed"), store._db.tx():
        pass
    assert _open_fds(path) == 0


@pytest.mark.parametrize("where", [":memory:", "file"])
def test_a_closed_engine_raises_store_error_and_reopens_nothing(where: str, tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    engine = MemoryEngine(store=":memory:" if where == ":memory:" else str(path), embedder=None)
    engine.on_turn_complete([{"role": "user", "content": "before close"}])
    engine.close()
    with pytest.raises(StoreError, match="memory store is closed"):
        engine.on_turn_complete([{"role": "user", "content": "after close"}], new_only=True)
    with pytest.raises(StoreError, match="memory store is closed"):
        engine.on_message_inbound("what was said?")
    gc.collect()
    assert _open_fds(path) == 0
    if where == "file":
        reopened = MemoryStore(path, counter=CharCounter())
        assert [t.message.text() for t in reopened.turns("default")] == ["before close"]
        reopened.close()


@pytest.mark.parametrize("where", [":memory:", "file"])
def test_a_thread_inside_a_read_when_the_store_closes_gets_store_error(
    where: str, tmp_path: Path
) -> None:
    """A thread that took its connection before ``close()`` and uses it after gets the
    store's error, not sqlite3's ``ProgrammingError``."""
    db = MemoryDb(where if where == ":memory:" else str(tmp_path / "m.db"))
    taken, closed, errors = threading.Event(), threading.Event(), []

    def reader() -> None:
        conn = db.conn
        taken.set()
        closed.wait(10)
        try:
            conn.execute("SELECT 1")
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    assert taken.wait(10)
    db.close()
    closed.set()
    thread.join(10)
    assert len(errors) == 1
    assert isinstance(errors[0], StoreError) and "closed" in str(errors[0])
