"""The dashboard's JSON API, its SSE stream and the Ask endpoint, without a browser: Starlette's
``TestClient`` (as a loopback client) and, for SSE, the app served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from contextfold.server.dashboard import STATIC_FILES, static_dir
from dashboard_support import (
    LiveServer,
    completed,
    make_app,
    memory_engine,
    memory_with_one_exchange,
    record,
    shared_corpus,
)
from fake_llm import FakeLLMServer

pytestmark = pytest.mark.integration

UBER = "Can I expense Uber rides during business travel?"


def client(app: FastAPI) -> TestClient:
    return TestClient(app, base_url="http://127.0.0.1:5757", client=("127.0.0.1", 50000))


@pytest.fixture
def app() -> FastAPI:
    memory = memory_with_one_exchange()
    app = make_app(memory=memory)
    bus = app.state.contextfold.events
    bus.publish(record(1))
    bus.publish(record(2, session="sess-b", error="tagger timed out", status=502))
    bus.publish(completed(record(3)))
    return app


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_corpus(tmp_path_factory)


def test_records_are_newest_first_and_filter_by_session(app: FastAPI) -> None:
    c = client(app)
    assert [r["id"] for r in c.get("/dashboard/api/records").json()] == [
        "req-sess-a-3",
        "req-sess-b-2",
        "req-sess-a-1",
    ]
    only_b = c.get("/dashboard/api/records", params={"session_id": "sess-b"}).json()
    assert [r["turn"] for r in only_b] == [2]
    one = c.get("/dashboard/api/records/req-sess-a-3").json()
    assert one["response_tags"] == ["uber", "receipts"]
    assert one["budget"][1] == {
        "section": "memory",
        "budget": 120,
        "used": 120,
        "items": 3,
        "truncated": True,
    }
    missing = c.get("/dashboard/api/records/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]


def test_stats_count_requests_latencies_and_errors(app: FastAPI) -> None:
    stats = client(app).get("/dashboard/api/stats").json()
    assert stats["requests"] == 3 and stats["sessions"] == 2
    assert stats["completed"] == 1 and stats["errors"] == 1
    assert stats["avg_overhead_ms"] == 3.5 and stats["avg_upstream_ms"] == 812.0
    assert stats["tokens_in"] == 1001 + 1002 + 1003
    assert stats["dropped_turns"] == 6


def test_session_shows_memory_status_and_unknown_sessions_are_not_created(app: FastAPI) -> None:
    c = client(app)
    session = c.get("/dashboard/api/sessions/sess-a").json()
    memory = session["memory"]
    assert memory["turns"] == 2 and memory["live_tokens"] > 0
    assert memory["compaction_watermark"] == 0
    assert "uber" in memory["tags"]
    assert session["requests"] == 2
    seen_only = c.get("/dashboard/api/sessions/sess-b").json()  # proxied, not yet in memory
    assert seen_only["memory"] is None and seen_only["requests"] == 1
    assert c.get("/dashboard/api/sessions/ghost").status_code == 404
    assert "ghost" not in app.state.contextfold.memory.store.sessions()
    assert c.get("/dashboard/api/sessions").json() == [
        {"session_id": "sess-a", "requests": 2},
        {"session_id": "sess-b", "requests": 1},
    ]


def test_export_is_a_json_attachment_with_records_stats_and_sessions(app: FastAPI) -> None:
    response = client(app).get("/dashboard/api/export")
    assert response.status_code == 200
    disposition = response.headers["content-disposition"]
    assert disposition.startswith('attachment; filename="contextfold-dashboard-')
    body = response.json()
    assert len(body["records"]) == 3 and body["stats"]["requests"] == 3
    assert body["sessions"]["sess-a"]["turns"] == 2
    assert body["sessions"]["sess-b"] is None


@pytest.fixture
def live(app: FastAPI) -> Iterator[LiveServer]:
    with LiveServer(app) as server:
        yield server


def _events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """``(event, data)`` pairs from SSE lines; comments (pings) are skipped."""
    event, data = "message", ""
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and data:
            yield event, json.loads(data)
            event, data = "message", ""


def test_sse_sends_a_snapshot_then_new_and_updated_records(app: FastAPI, live: LiveServer) -> None:
    bus = app.state.contextfold.events
    with (
        httpx.Client(base_url=live.url, timeout=10) as http,
        http.stream("GET", "/dashboard/api/events") as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = _events(stream.iter_lines())
        kind, snapshot = next(events)
        assert kind == "snapshot" and len(snapshot) == 3
        bus.publish(record(4))
        kind, new = next(events)
        assert (kind, new["id"], new["response_tags"]) == ("record", "req-sess-a-4", None)
        bus.publish(completed(record(4), tags=("hotel",)))
        kind, update = next(events)
        assert (update["id"], update["response_tags"]) == ("req-sess-a-4", ["hotel"])
        assert len(bus._subscribers) == 1
    deadline = time.monotonic() + 5  # the client went away: its subscription ends
    while bus._subscribers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not bus._subscribers


def test_closing_the_bus_ends_open_streams_after_their_queued_records(
    app: FastAPI, live: LiveServer
) -> None:
    bus = app.state.contextfold.events
    with (
        httpx.Client(base_url=live.url, timeout=10) as http,
        http.stream("GET", "/dashboard/api/events") as stream,
    ):
        events = _events(stream.iter_lines())
        assert next(events)[0] == "snapshot"
        bus.publish(record(4))
        bus.close()  # what the Runner does when the server stops
        assert [(kind, data["id"]) for kind, data in events] == [("record", "req-sess-a-4")]
        with http.stream("GET", "/dashboard/api/events") as late:  # opened while stopping
            assert [kind for kind, _ in _events(late.iter_lines())] == ["snapshot"]
    assert not bus._subscribers
    assert bus.get("req-sess-a-4") is not None


def test_static_files_are_served_and_nothing_is_loaded_from_elsewhere(app: FastAPI) -> None:
    c = client(app)
    for name, media_type in STATIC_FILES.items():
        response = c.get(f"/dashboard/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"] == media_type
    assert c.get("/dashboard/static/app.py").status_code == 404
    assert c.get("/dashboard/static/..%2Fapp.py").status_code == 404
    remote = re.compile(r"""(?:src|href)=["'](?:https?:)?//|url\(["']?(?:https?:)?//|@import""")
    for path in static_dir().iterdir():  # no CDN, no remote fonts: every asset is local
        assert not remote.search(path.read_text(encoding="utf-8")), path.name
    page = c.get("/dashboard")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["referrer-policy"] == "no-referrer"


def test_the_dashboard_can_be_switched_off() -> None:
    c = client(make_app(enabled=False))
    assert c.get("/dashboard").status_code == 404
    assert c.get("/dashboard/api/records").status_code == 404


# -- Ask ---------------------------------------------------------------------------------------


def test_ask_info_lists_presets_examples_and_that_no_llm_is_configured(corpus: Path) -> None:
    info = client(make_app(corpus=corpus)).get("/dashboard/api/ask").json()
    assert info["budgets"] == ["fixed5", "chat", "rag", "agent"]
    assert UBER in info["examples"]
    assert info["corpus_exists"] is True
    assert info["llm"]["configured"] is False and "No LLM is configured" in info["llm"]["message"]


def test_ask_returns_context_sources_and_a_truncated_budget_table(corpus: Path) -> None:
    response = client(make_app(corpus=corpus)).post("/dashboard/api/ask", json={"question": UBER})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["answer"] is None and body["llm"]["configured"] is False
    rows = {r["section"]: r for r in body["budget_table"]}
    assert list(rows) == ["instructions", "goal", "memory", "retrieval", "tool_outputs"]
    assert (rows["retrieval"]["budget"], rows["retrieval"]["status_text"]) == (550, "⚠ TRUNCATED")
    assert rows["retrieval"]["used"] <= 550
    assert rows["instructions"]["status_text"].endswith("%")
    assert body["truncated_sections"] == ["retrieval"]
    scores = [s["score"] for s in body["sources"]]
    assert len(scores) == 8 and scores == sorted(scores, reverse=True)
    assert body["sources"][0]["label"] == "[Source 1]"
    assert {s["action"] for s in body["sources"]} >= {"kept", "dropped"}
    assert "Source 1: " in body["context"] and UBER in body["context"]
    assert body["totals"]["used"] <= body["totals"]["available"]


def test_ask_bm25_under_the_rag_preset(corpus: Path) -> None:
    request = {"question": "hotel cap in London", "budget": "rag", "max_tokens": 4096}
    body = client(make_app(corpus=corpus)).post(
        "/dashboard/api/ask", json={**request, "mode": "bm25", "k": 3}
    )
    assert body.status_code == 200, body.text
    result = body.json()
    assert [s["match"] for s in result["sources"]] == ["bm25"] * 3
    assert result["totals"]["max_tokens"] == 4096
    assert any("220" in s["text"] for s in result["sources"])


def test_ask_answers_with_the_configured_llm(corpus: Path, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = "Yes, UberX is reimbursable [Source 1]."
    llm = {"provider": "openai", "model": "fake-model", "base_url": fake_llm.base_url}
    app = make_app(corpus=corpus, memory=memory_engine(llm=llm))
    body = client(app).post("/dashboard/api/ask", json={"question": UBER}).json()
    assert body["answer"] == fake_llm.reply
    assert body["llm"] == {"configured": True, "provider": "openai", "model": "fake-model"}
    sent = fake_llm.requests[-1].body
    assert sent["model"] == "fake-model" and sent["messages"][0]["role"] == "system"


def test_ask_reports_an_llm_failure_as_502(corpus: Path, fake_llm: FakeLLMServer) -> None:
    llm = {"provider": "openai", "model": "fake-model", "base_url": fake_llm.base_url}
    app = make_app(corpus=corpus, memory=memory_engine(llm=llm))
    fake_llm.fail_next(401)
    response = client(app).post("/dashboard/api/ask", json={"question": UBER})
    assert response.status_code == 502
    assert response.json()["error"]["message"].startswith("the LLM failed:")


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"question": ""}, 422, "question"),
        ({"question": "x", "budget": "huge"}, 422, "budget"),
        ({"question": "x", "mode": "fuzzy"}, 422, "mode"),
        ({"question": "x", "k": 0}, 422, "k"),
        ({"question": "x", "max_tokens": 4096}, 422, "does not apply to the fixed5 budget"),
        ({"question": "x", "surprise": 1}, 422, "surprise"),
    ],
)
def test_ask_rejects_bad_input_with_a_message(
    corpus: Path, body: dict[str, Any], status: int, fragment: str
) -> None:
    response = client(make_app(corpus=corpus)).post("/dashboard/api/ask", json=body)
    assert response.status_code == status
    assert fragment in json.dumps(response.json())


def test_ask_without_a_corpus_says_how_to_make_one(tmp_path: Path) -> None:
    app = make_app(corpus=tmp_path / "none.db")
    response = client(app).post("/dashboard/api/ask", json={"question": UBER})
    assert response.status_code == 404
    assert "contextfold ingest" in response.json()["error"]["message"]
    assert not (tmp_path / "none.db").exists()


def test_sse_unsubscribes_a_client_that_leaves_before_any_record(
    app: FastAPI, live: LiveServer
) -> None:
    bus = app.state.contextfold.events
    with (
        httpx.Client(base_url=live.url, timeout=10) as http,
        http.stream("GET", "/dashboard/api/events") as stream,
    ):
        kind, _ = next(_events(stream.iter_lines()))
        assert kind == "snapshot" and len(bus._subscribers) == 1
    deadline = time.monotonic() + 5
    while bus._subscribers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not bus._subscribers
