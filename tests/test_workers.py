"""Many server processes on one store (``contextfold serve --workers N``, or several hosts
behind a load balancer): whichever process a request reaches, it sees what the others wrote.

The cross-process tests run real servers — ``python -m contextfold proxy`` on two ports, both
on one store, in front of the fake LLM — and pin each request to one of them, as two hosts
behind a load balancer would be. They are parametrized over where the store lives: an SQLite
file, and PostgreSQL (``STORES``). The in-process tests put two engines (two connections, as
two processes have) on one file and check each per-process cache against the other's writes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from contextfold.items import Message
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.turnkeys import TurnKeys, key_of
from contextfold.server.events import EventBus, RequestRecord
from contextfold.server.proxy.responses import Link, ResponseChains
from contextfold.server.proxy.session import SESSION_HEADER, strip_markers
from contextfold.store import open_memory_store
from contextfold.store.protocols import MemoryStorage
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import CharCounter
from fake_llm import FakeLLMServer
from fake_responses import ResponsesFake
from proxy_support import closed_after_test, free_port

SECRET = "9f" * 32  # both servers sign and verify session markers with it, as hosts would

#: Where the shared store lives.
STORES = ["sqlite", "postgres"]


@pytest.fixture(params=STORES)
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The shared store's location (migrated once, as ``serve --workers`` does)."""
    if request.param == "postgres":
        location: str = request.getfixturevalue("postgres_url")
    else:
        location = str(tmp_path / "memory.db")
    open_memory_store(location, counter=CharCounter()).close()
    return location


class Server:
    """``python -m contextfold proxy`` on a free port, its memory in the store at ``store``."""

    def __init__(
        self, folder: Path, name: str, upstream: str, store: str, *, workers: int = 1
    ) -> None:
        self.folder, self.name, self.upstream, self.store = folder, name, upstream, store
        self.workers = workers
        yaml = folder / f"{name}.yaml"
        if store.startswith("postgres"):
            yaml.write_text("recall:\n  embedder: none\n")
            extra = {"CONTEXTFOLD_STORE_URL": store}
        else:
            yaml.write_text(f"storage_path: {store}\nrecall:\n  embedder: none\n")
            extra = {}
        self.memory_yaml = yaml
        # A loaded machine must not turn memory off: what is tested is what the store holds,
        # not how fast recall answers (the default 50 ms deadline is for production latency).
        self.server_yaml = folder / f"{name}-server.yaml"
        self.server_yaml.write_text("proxy:\n  memory_deadline_ms: 10000\n")
        self.env = {
            **os.environ,
            "CONTEXTFOLD_HOME": str(folder / "home"),
            "CONTEXTFOLD_SECRET": SECRET,
            **extra,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.logfile = folder / f"{name}.log"

    def start(self, timeout: float = 60, port: int | None = None) -> Server:
        port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "contextfold", "proxy", "--upstream", self.upstream]
        command += ["--port", str(port), "--memory-config", str(self.memory_yaml)]
        command += ["--config", str(self.server_yaml)]
        command += ["--workers", str(self.workers), "--log-level", "warning"]
        with self.logfile.open("ab") as log:
            self.process = subprocess.Popen(command, env=self.env, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise AssertionError(f"{self.name} did not start:\n{self.log()}")

    def log(self) -> str:
        return self.logfile.read_text(errors="replace")[-4000:]

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def records(self, session_id: str | None = None) -> list[dict[str, Any]]:
        params = {"session_id": session_id} if session_id else {}
        response = httpx.get(f"{self.url}/dashboard/api/records", params=params, timeout=10)
        assert response.status_code == 200, response.text
        records: list[dict[str, Any]] = response.json()
        return records


@pytest.fixture
def servers(
    fake_llm: FakeLLMServer, tmp_path: Path, store_at: str
) -> Iterator[tuple[Server, Server]]:
    """Two single-worker servers on one store: "host A" and "host B"."""
    a = Server(tmp_path, "a", fake_llm.url, store_at)
    b = Server(tmp_path, "b", fake_llm.url, store_at)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        for server in (a, b):
            if server.process is not None and server.process.poll() is None:
                server.stop(signal.SIGKILL)


def oa(url: str, api_key: str = "sk-test", **kwargs: Any) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, **kwargs)
    )


def chat(
    api: openai.OpenAI, history: list[Any], text: str, *, stream: bool = False
) -> tuple[str, str]:
    """Send ``history`` plus the user message ``text``; append both and the reply as the
    client received it (markers left in: a chat resends them). (reply, session header)."""
    history.append({"role": "user", "content": text})
    raw = api.chat.completions.with_raw_response.create(model="m", messages=history, stream=stream)
    if stream:
        reply = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        reply = raw.parse().choices[0].message.content or ""
    assert reply
    history.append({"role": "assistant", "content": reply})
    return reply, str(raw.headers[SESSION_HEADER])


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def reader(location: str) -> MemoryStorage:
    return closed_after_test(open_memory_store(location, counter=CharCounter()))


def texts(store: MemoryStorage, session_id: str) -> list[str]:
    return [strip_markers(t.message.text()) for t in store.turns(session_id)]


def derived(store: MemoryStorage) -> bool:
    """No job pending or running, and every session derived up to its last turn."""
    if store.jobs.pending_jobs():
        return False
    return all(store.session(s).derived_seq == store.last_seq(s) for s in store.sessions())


# --------------------------------------------------------------------------- two hosts


def test_a_turn_written_through_one_worker_is_recalled_through_another(
    servers: tuple[Server, Server], fake_llm: FakeLLMServer, store_at: str
) -> None:
    a, b = servers
    fake_llm.reply = "Noted."
    history: list[Any] = []
    # B knows the conversation first (its caches hold the session), then A adds to it.
    chat(oa(b.url), history, "I am planning a trip to Lisbon in June.")
    _, token = chat(oa(a.url), history, "My gym locker code is 4417, remember it.")
    for i in range(3):
        _, token = chat(oa(a.url), history, f"Unrelated chatter number {i} about the weather.")
    store = reader(store_at)
    assert wait_for(lambda: derived(store), 20)
    # A client that keeps no history: only the question, and the session its header names.
    fake_llm.reply = "It is 4417."
    raw = oa(b.url).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "What was my gym locker code?"}],
        extra_headers={SESSION_HEADER: token},
    )
    assert raw.headers[SESSION_HEADER].split(".")[0] == token.split(".")[0]
    forwarded = json.dumps(fake_llm.requests[-1].body)
    assert "4417" in forwarded, forwarded


def test_a_branch_made_through_one_worker_is_continued_through_another(
    servers: tuple[Server, Server], fake_llm: FakeLLMServer, store_at: str
) -> None:
    a, b = servers
    fake_llm.reply = lambda body: "Answer to " + str(body["messages"][-1]["content"])[:40]
    history: list[Any] = []
    _, first = chat(oa(a.url), history, "Plan a dinner for six.")
    chat(oa(a.url), history, "Make it vegetarian.")
    chat(oa(a.url), history, "Add a dessert.")
    trunk = first.split(".")[0]
    # The client edits its second message: a branch, through A.
    edited = history[:2]
    _, branch_token = chat(oa(a.url), edited, "Make it vegan.")
    branch = branch_token.split(".")[0]
    assert branch != trunk
    # The branch goes on through B.
    _, token = chat(oa(b.url), edited, "And no nuts, please.")
    assert token.split(".")[0] == branch
    store = reader(store_at)
    assert texts(store, branch) == [strip_markers(m["content"]) for m in edited]
    assert store.session(branch).parent_id == trunk
    assert texts(store, trunk)[-2] == "Add a dessert."
    assert wait_for(lambda: derived(store), 20)


def test_a_responses_chain_started_through_one_worker_goes_on_through_another(
    servers: tuple[Server, Server], fake_llm: FakeLLMServer, store_at: str
) -> None:
    a, b = servers
    ResponsesFake(fake_llm)
    fake_llm.reply = "Noted."
    raw = oa(a.url).responses.with_raw_response.create(
        model="m", input="My gym locker code is 4417."
    )
    first, sid = raw.parse(), raw.headers[SESSION_HEADER].split(".")[0]
    fake_llm.reply = "Sure."
    raw = oa(b.url).responses.with_raw_response.create(
        model="m", previous_response_id=first.id, input="Thanks, that is all."
    )
    assert raw.headers[SESSION_HEADER].split(".")[0] == sid
    store = reader(store_at)
    assert texts(store, sid) == [
        "My gym locker code is 4417.",
        "Noted.",
        "Thanks, that is all.",
        "Sure.",
    ]
    assert wait_for(lambda: len(b.records(sid)) == 2, 10)
    sources = sorted(r["extra"]["session_source"] for r in b.records(sid))
    assert sources == ["new", "previous_response_id"]


def test_each_dashboard_lists_and_streams_the_records_of_the_other(
    servers: tuple[Server, Server], fake_llm: FakeLLMServer
) -> None:
    a, b = servers
    fake_llm.reply = "Fine."
    _, token = chat(oa(a.url), [], "Book a table for two.")
    sid = token.split(".")[0]
    assert wait_for(lambda: len(b.records(sid)) == 1, 10), b.records()
    (listed,) = b.records(sid)
    # Its reply tags come once the exchange is derived, whichever process ran the job.
    assert wait_for(lambda: b.records(sid)[0]["response_tags"] is not None, 15), b.records(sid)
    detail = httpx.get(f"{b.url}/dashboard/api/records/{listed['id']}", timeout=10).json()
    assert detail["session_id"] == sid and detail["status"] == 200
    # B's live stream carries what A publishes after it opened.
    with (
        httpx.Client(base_url=b.url, timeout=15) as http,
        http.stream("GET", "/dashboard/api/events") as stream,
    ):
        lines = stream.iter_lines()
        kind, data = _next_event(lines)
        assert kind == "snapshot" and listed["id"] in {r["id"] for r in data}
        _, other = chat(oa(a.url), [], "Book a taxi for eight.")
        other_sid = other.split(".")[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kind, data = _next_event(lines)
            if kind == "record" and data["session_id"] == other_sid:
                break
        else:
            raise AssertionError("B's stream never carried A's record")
    stats = httpx.get(f"{b.url}/dashboard/api/stats", timeout=10).json()
    assert stats["sessions"] >= 2


def _next_event(lines: Iterator[str]) -> tuple[str, Any]:
    event, data = "message", ""
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and data:
            return event, json.loads(data)
    raise AssertionError("the stream ended")


def converse(url: str, number: int, history: list[Any], received: list[tuple[str, str]]) -> None:
    """Go on with ``history`` until the server goes away; every exchange whose reply arrived
    whole is appended to ``received``."""
    api = oa(url, f"sk-thread-{number}", timeout=10)
    while True:
        text = f"Thread {number}, message {len(history) // 2}: {random.random():.12f}"
        try:
            reply, _ = chat(api, list(history), text, stream=number % 2 == 0)
        except Exception:  # the server was killed: the client sees a broken connection
            return
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        received.append((text, strip_markers(reply)))


def test_killing_one_worker_mid_load_loses_nothing_and_the_other_finishes_its_jobs(
    servers: tuple[Server, Server], fake_llm: FakeLLMServer, store_at: str
) -> None:
    a, b = servers
    fake_llm.reply = lambda body: "Answer to " + str(body["messages"][-1]["content"])
    histories: list[list[Any]] = [[] for _ in range(4)]
    received: list[tuple[str, str]] = []
    threads = [
        threading.Thread(target=converse, args=(a.url, n, histories[n], received)) for n in range(4)
    ]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: len(received) > 8, 30)
    time.sleep(random.uniform(0.05, 0.4))
    a.stop(signal.SIGKILL)
    for thread in threads:
        thread.join(15)
    store = reader(store_at)
    stored = {strip_markers(t.message.text()) for s in store.sessions() for t in store.turns(s)}
    assert [pair for pair in received if not set(pair) <= stored] == []
    # Each conversation goes on through B, on the same sessions.
    for n, history in enumerate(histories):
        if history:
            chat(oa(b.url, f"sk-thread-{n}"), list(history), "Still there?")
    # B gives back what A held (its process is gone) and derives everything.
    assert wait_for(lambda: derived(store), 30), store.jobs.job_counts()
    assert store.jobs.job_counts() == {}


# --------------------------------------------------------------------------- serve --workers


def test_serve_with_two_workers_serves_and_stops_cleanly_on_sigterm(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    fake_llm.reply = "Sure."
    store = str(tmp_path / "memory.db")
    server = Server(tmp_path, "w", fake_llm.url, store, workers=2).start()
    try:
        history: list[Any] = []
        sessions = {chat(oa(server.url), history, f"Step {i}.")[1].split(".")[0] for i in range(6)}
        assert len(sessions) == 1
        pids = {
            httpx.get(f"{server.url}/dashboard/api/records", timeout=10).status_code
            for _ in range(4)
        }
        assert pids == {200}
        assert server.stop(signal.SIGTERM) == 0
    finally:
        if server.process is not None and server.process.poll() is None:
            server.stop(signal.SIGKILL)
    log = server.log()
    assert "(2 workers)" in log and "stopped; worker exit statuses [0, 0]" in log, log
    assert texts(reader(store), sessions.pop()) == [
        text for i in range(6) for text in (f"Step {i}.", "Sure.")
    ]


def test_serve_with_two_workers_replaces_a_worker_killed_with_sigkill(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    fake_llm.reply = "Sure."
    server = Server(tmp_path, "w", fake_llm.url, str(tmp_path / "memory.db"), workers=2).start()
    try:
        assert server.process is not None
        children = _children(server.process.pid)
        assert len(children) >= 2
        os.kill(children[-1], signal.SIGKILL)
        assert wait_for(lambda: "starting another" in server.log(), 10), server.log()
        assert wait_for(lambda: len(_children(server.process.pid)) >= 2, 10)  # type: ignore[union-attr]
        chat(oa(server.url), [], "Still serving?")
        assert server.stop(signal.SIGTERM) == 0
    finally:
        if server.process is not None and server.process.poll() is None:
            server.stop(signal.SIGKILL)


def test_workers_stop_when_their_supervisor_is_killed_and_a_restart_can_bind(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """``kill -9`` of the supervisor: nothing would stop its workers, which would go on
    serving the port and the store for ever, and a new server could not bind. Each worker
    notices its supervisor is gone and stops as on SIGTERM (requests in flight finish)."""
    fake_llm.reply = "Sure."
    store = str(tmp_path / "memory.db")
    server = Server(tmp_path, "w", fake_llm.url, store, workers=2).start()
    assert server.process is not None
    supervisor = server.process.pid
    # (the server answers once one worker does; the other may still be starting)
    wait_for(lambda: len(_children(supervisor)) >= 2, 20)
    workers = _children(supervisor)
    try:
        assert len(workers) == 2
        chat(oa(server.url), [], "Before the supervisor dies.")
        server.stop(signal.SIGKILL)
        assert wait_for(lambda: all(_gone(pid) for pid in workers), 20), [
            pid for pid in workers if not _gone(pid)
        ]
        port = int(server.url.rsplit(":", 1)[1])
        # A new server on the same port and store answers, the conversation's turn kept.
        restarted = Server(tmp_path, "w2", fake_llm.url, store, workers=2).start(port=port)
        try:
            chat(oa(restarted.url), [], "After the restart.")
            assert restarted.stop(signal.SIGTERM) == 0
        finally:
            if restarted.process is not None and restarted.process.poll() is None:
                restarted.stop(signal.SIGKILL)
        stored = reader(store)
        assert any("Before the supervisor dies." in texts(stored, sid) for sid in stored.sessions())
    finally:
        for pid in workers:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not reaped yet counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _children(pid: int) -> list[int]:
    """The worker processes of the supervisor ``pid`` (not multiprocessing's helper)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"multiprocessing.spawn" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def test_workers_refuse_an_in_memory_store(tmp_path: Path) -> None:
    yaml = tmp_path / "contextfold.yaml"
    yaml.write_text("storage_path: ':memory:'\n")
    env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path / "home")}
    env.pop("CONTEXTFOLD_STORE_URL", None)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "contextfold", "serve", "--workers", "2"),
            *("--port", str(free_port()), "--memory-config", str(yaml)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert ":memory:" in done.stderr and "--workers" in done.stderr, done.stderr


# --------------------------------------------------------------------------- per-process caches


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[MemoryEngine, MemoryEngine]]:
    """Two engines on one file: each has its own connections and caches, as two worker
    processes do."""
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=HashEmbedder()) as one,
        MemoryEngine(store=tmp_path / "m.db", embedder=HashEmbedder()) as other,
    ):
        yield one, other


def _say(engine: MemoryEngine, sid: str, *texts: str) -> None:
    engine.on_turn_complete(
        [
            Message(role="user" if i % 2 == 0 else "assistant", content=t)
            for i, t in enumerate(texts)
        ],
        session_id=sid,
        new_only=True,
    )


def test_the_vocabulary_follows_tags_another_process_derived(
    two: tuple[MemoryEngine, MemoryEngine],
) -> None:
    one, other = two
    _say(one, "s", "Let us talk about the database migration.", "Sure, the migration.")
    assert "migration" in other.vocabulary("s")
    _say(one, "s", "Now the kubernetes cluster upgrade.", "The kubernetes upgrade, noted.")
    assert "kubernetes" in other.vocabulary("s")  # its cached counts were stale
    tagged = other.tag_message("How is the kubernetes upgrade going?", session_id="s")
    assert "kubernetes" in tagged.tags


def test_a_session_deleted_and_written_again_elsewhere_is_read_again(
    two: tuple[MemoryEngine, MemoryEngine],
) -> None:
    one, other = two
    _say(one, "s", "The red fox jumps.", "A red fox indeed.")
    assert other.recaller._session_vectors("s").seqs == [1, 2]
    keys = TurnKeys(other.store)
    assert keys.seqs_matching("s", {key_of(Message(role="user", content="The red fox jumps."))})
    assert other.store.turn_keys("s", 1, 2)
    # Deleted and written again, through the other engine, with the same last turn.
    one.store.delete_session("s")
    _say(one, "s", "A blue whale sings.", "A red fox indeed.")
    vectors = other.recaller._session_vectors("s")
    fresh_seqs, fresh = one.store.turn_vectors("s", other.recaller._model)
    assert vectors.seqs == fresh_seqs and np.array_equal(vectors.rows(0), fresh)
    assert not keys.seqs_matching("s", {key_of(Message(role="user", content="The red fox jumps."))})
    assert keys.seqs_matching("s", {key_of(Message(role="user", content="A blue whale sings."))})
    assert other.store.turn_keys("s", 1, 1) == one.store.turn_keys("s", 1, 1)
    assert "fox" not in other.vocabulary("s") or other.vocabulary("s")["fox"] == 1


def test_a_session_deleted_elsewhere_is_created_again_by_the_next_write(
    two: tuple[MemoryEngine, MemoryEngine],
) -> None:
    """The writing engine takes a session it has cached to exist (no read to check it): the
    write finds it gone, creates it again and stores the turns there, tagged."""
    one, other = two
    _say(one, "s", "The red fox jumps.", "A red fox indeed.")
    other.store.delete_session("s")
    _say(one, "s", "A blue whale sings.", "The whale sings in the deep ocean.")
    turns = one.store.turns("s")
    assert [t.message.text() for t in turns] == [
        "A blue whale sings.",
        "The whale sings in the deep ocean.",
    ]
    assert one.store.session("s").derived_seq == 2 and all(t.tags for t in turns)
    assert "fox" not in one.vocabulary("s") and "whale" in one.vocabulary("s")
    assert one.store.jobs.pending_jobs() == 0


def test_session_versions_move_with_derived_writes_and_never_repeat(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db", counter=CharCounter())
    other = MemoryStore(tmp_path / "m.db", counter=CharCounter())
    try:
        store.create_session("s")
        born, generation = store.session_version("s") or (0, 0)
        assert born == generation > 0
        store.append_turns("s", [Message(role="user", content="hello there")])
        assert other.session_version("s") == (born, generation)  # appends draw nothing
        store.set_tags_many("s", {1: ({"greeting": 1.0}, ())})
        after_tags = other.session_version("s")
        assert after_tags is not None and after_tags[0] == born and after_tags[1] > generation
        store.paging.upsert_tag_summary("s", "greeting", "They said hello.", 1)
        assert (other.session_version("s") or (0, 0))[1] > after_tags[1]
        store.delete_session("s")
        assert other.session_version("s") is None
        store.create_session("s")
        again = other.session_version("s")
        assert again is not None and again[0] > after_tags[1]
        assert store.session("s").born == again[0]
    finally:
        store.close()
        other.close()


def test_a_responses_chain_named_through_one_process_is_known_to_another(
    tmp_path: Path,
) -> None:
    first, second = (MemoryStore(tmp_path / "m.db", counter=CharCounter()) for _ in range(2))
    try:
        first.create_session("s", principal="p")
        first.append_turns("s", [Message(role="user", content="hi")] * 2)
        one, other = ResponseChains(store=first), ResponseChains(store=second)
        one.remember("p", "resp_1", Link("s", 2, 1))
        assert other.link("p", {"previous_response_id": "resp_1"}) == Link("s", 2, 1)
        assert other.link("q", {"previous_response_id": "resp_1"}) is None  # another caller
        first.delete_session("s")
        assert ResponseChains(store=second).link("p", {"previous_response_id": "resp_1"}) is None
    finally:
        first.close()
        second.close()


# --------------------------------------------------------------------------- records


def _record(n: int, session: str = "s", size: int = 0) -> RequestRecord:
    return RequestRecord(id=f"r{n}", session_id=session, turn=n, context="x" * size)


def test_records_published_by_one_bus_are_read_by_another_on_the_same_store(
    tmp_path: Path,
) -> None:
    first, second = (MemoryStore(tmp_path / "m.db", counter=CharCounter()) for _ in range(2))
    one, other = EventBus(), EventBus()
    one.attach(first)
    other.attach(second)
    try:
        one.publish(_record(1))
        assert [r.id for r in one.recent()] == ["r1"]  # not written yet: read from pending
        assert one.flush()
        assert [r.id for r in other.recent()] == ["r1"]
        one.publish(_record(1).model_copy(update={"status": 200}))
        one.flush()
        found = other.get("r1")
        assert found is not None and found.status == 200
        assert other.get("nope") is None
    finally:
        one.detach()
        other.detach()
        first.close()
        second.close()


def test_stored_records_keep_the_newest_within_their_count_and_bytes(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db", counter=CharCounter())
    try:
        bus = EventBus(keep=5, max_bytes=20_000)
        bus.attach(store)
        for n in range(12):
            bus.publish(_record(n))
            bus.flush()
        assert [r.id for r in store.records.recent_records(100)] == [
            f"r{n}" for n in range(11, 6, -1)
        ]
        for n in range(12, 16):
            bus.publish(_record(n, size=6000))
            bus.flush()
        kept = store.records.recent_records(100)
        assert sum(len(r.body) for r in kept) <= 20_000
        assert [r.id for r in kept][:3] == ["r15", "r14", "r13"]
        bus.publish(_record(99, size=50_000))  # alone over the bytes: the newest always stays
        bus.flush()
        assert [r.id for r in store.records.recent_records(100)] == ["r99"]
        bus.detach()
    finally:
        store.close()


def test_records_survive_a_restart(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db", counter=CharCounter())
    bus = EventBus()
    bus.attach(store)
    bus.publish(_record(7))
    bus.detach()  # the stop writes what was pending
    store.close()
    reopened = MemoryStore(tmp_path / "m.db", counter=CharCounter())
    try:
        bus = EventBus()
        bus.attach(reopened)
        assert [r.id for r in bus.recent()] == ["r7"]
        bus.detach()
    finally:
        reopened.close()
