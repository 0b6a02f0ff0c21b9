"""What the operator sees on the dashboard of a real proxy in front of the fake LLM, in headless
Chromium: the turn column counted in the stored conversation while the client trims its
history, the ingested-history grid, compactions in the stats, the raw bodies sent upstream
(opt-in, credentials redacted, a bounded ring), and ``/api/context`` rows that are complete."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from contextfold.server.config import DashboardSettings, ProxySettings, ServerConfig
from contextfold.server.dashboard import stats
from contextfold.server.events import RequestRecord
from dashboard_support import LiveServer, make_app, record
from fake_llm import FakeLLMServer
from proxy_support import make_engine, serve
from test_dashboard_browser import TIMEOUT_MS, browser, playwright, shot  # noqa: F401

KEY = "sk-live-abcdefghijklmnop1234"  # a credential a client put in its body
TOPICS = {
    "database": "postgres index tuning for the orders table with vacuum settings and btree",
    "travel": "flight and hotel booking for the Lisbon offsite with the train connection",
}


def _question(n: int) -> str:
    topic = "database" if n % 2 else "travel"
    return f"question {n}: {TOPICS[topic]}"


def _answer(question: str) -> str:
    return f"answer to {question.split(':')[0]}: " + question.split(": ", 1)[1] * 3


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # The browser's own favicon request is a 404 ("Failed to load resource"); anything else on
    # the console is a bug in the page.
    page.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    yield page
    context.close()
    assert not errors, f"the page logged errors: {errors}"


@pytest.mark.browser
@pytest.mark.integration
def test_a_trimmed_30_turn_conversation_as_the_operator_sees_it(
    page: Page, fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    fake_llm.reply = lambda body: _answer(body["messages"][-1]["content"])
    engine = make_engine(
        tmp_path,
        context_window=800,
        compaction={"soft_threshold": 0.5, "protected_recent_turns": 2},
        tagger={"keywords": {"database": ["postgres", "vacuum"], "travel": ["flight", "hotel"]}},
    )
    config = ServerConfig(
        port=0,
        proxy=ProxySettings(upstream=fake_llm.url),
        dashboard=DashboardSettings(capture=True, capture_keep=20),
    )
    with engine, serve(config, engine) as served:
        history: list[dict[str, str]] = []
        for n in range(1, 4):  # three earlier turns the client brings with its first request
            history += [
                {"role": "user", "content": _question(n)},
                {"role": "assistant", "content": _answer(_question(n))},
            ]
        for n in range(4, 31):
            history.append({"role": "user", "content": _question(n)})
            sent = history if n == 4 else history[-3:]  # then only the last exchange
            body = {"model": "m", "messages": sent, "metadata": {"api_key": KEY}}
            reply = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
            history.append(
                {"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]}
            )
        served.drain()

        page.goto(f"{served.url}/dashboard")
        rows = page.locator("#grid tbody tr")
        expect(rows).to_have_count(27)
        turns = sorted(int(t) for t in rows.locator("td:nth-child(2)").all_inner_texts())
        assert turns == list(range(4, 31))  # not "turn 2" on every row

        ingested = page.locator("#ingested-grid tbody tr")
        expect(ingested).to_have_count(3)
        expect(ingested.nth(0).locator("td.tags")).to_contain_text("database")
        expect(ingested.nth(1).locator("td.tags")).to_contain_text("travel")
        expect(ingested.nth(2)).to_contain_text("question 3: postgres index tuning")

        api = httpx.get(f"{served.url}/dashboard/api/stats").json()
        assert api["compactions"] >= 1 and api["tokens_freed"] > 0
        assert api["compression_ratio"] > 1.0
        expect(page.locator('[data-stat="compactions"] .value')).to_have_text(
            str(api["compactions"])
        )
        expect(page.locator('[data-stat="freed"] .value')).to_have_text(f"{api['tokens_freed']:,}")
        expect(page.locator('[data-stat="ratio"] .value')).to_have_text(
            f"{api['compression_ratio']:.2f}×"
        )

        rows.first.click()  # the newest request: turn 30
        capture = page.locator("#capture-panel pre.capture")
        expect(capture).to_contain_text("question 30")
        expect(capture).to_contain_text("[redacted]")
        assert KEY not in capture.inner_text()
        shot(page, "operator-turns-ingested-capture")

        kept = httpx.get(f"{served.url}/dashboard/api/captures").json()
        assert kept["enabled"] and len(kept["captures"]) == 20  # the ring's size
        assert [c["turn"] for c in kept["captures"]] == list(range(30, 10, -1))


@pytest.mark.browser
@pytest.mark.integration
def test_a_context_call_row_is_complete_not_pending(page: Page) -> None:
    app = make_app()
    # As an earlier version stored it: its tags never set, which read "pending…" for ever.
    old = record(1, session="api:key", kind="context", format="context", response_tags=None)
    app.state.contextfold.events.publish(old)
    with LiveServer(app) as server:
        page.goto(f"{server.url}/dashboard")
        row = page.locator("#grid tbody tr")
        expect(row).to_have_count(1)
        expect(row.locator("td.response")).to_have_text("–")
        row.click()
        expect(page.locator("#inspector .response-tags")).to_contain_text("–")
        expect(page.locator("#inspector")).not_to_contain_text("pending…")


def test_stats_count_compactions_tokens_freed_and_the_ratio() -> None:
    def compaction(n: int, compacted: int, summary: int) -> RequestRecord:
        return RequestRecord(
            id=f"c{n}",
            session_id="s",
            kind="compaction",
            extra={
                "tokens_compacted": compacted,
                "summary_tokens": summary,
                "tokens_freed": compacted - summary,
                "turns_compacted": 4,
            },
        )

    records = [record(1), record(2), compaction(1, 900, 300), compaction(2, 600, 200)]
    out = stats(records, started=0.0)
    assert out["requests"] == 2  # compactions are not requests
    assert (out["compactions"], out["turns_compacted"], out["tokens_freed"]) == (2, 8, 1000)
    assert out["compression_ratio"] == 3.0
    assert stats([record(1)], started=0.0)["compression_ratio"] is None


def test_capture_is_off_unless_asked(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    with engine, serve(config, engine) as served:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
        served.drain()
        kept = httpx.get(f"{served.url}/dashboard/api/captures").json()
        assert kept == {"enabled": False, "keep": 50, "captures": []}
        (rec,) = httpx.get(f"{served.url}/dashboard/api/records").json()
        missing = httpx.get(f"{served.url}/dashboard/api/captures/{rec['id']}")
        assert missing.status_code == 404 and "capture is off" in missing.text


def test_ingested_history_and_compactions_survive_a_restart(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    fake_llm.reply = lambda body: _answer(body["messages"][-1]["content"])
    settings: dict[str, Any] = {
        "context_window": 600,
        "compaction": {"soft_threshold": 0.5, "protected_recent_turns": 2},
    }
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    messages: list[dict[str, str]] = []
    for n in range(1, 6):
        messages += [
            {"role": "user", "content": _question(n)},
            {"role": "assistant", "content": _answer(_question(n))},
        ]
    messages.append({"role": "user", "content": _question(6)})
    seen: list[Any] = []
    for restart in (False, True):
        engine = make_engine(tmp_path, **settings)
        with engine, serve(config, engine) as served:
            if not restart:
                body = {"model": "m", "messages": messages}
                httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
                served.drain()
            ingested = httpx.get(f"{served.url}/dashboard/api/ingested").json()
            counts = httpx.get(f"{served.url}/dashboard/api/stats").json()
            seen.append(([len(c["turns"]) for c in ingested], counts["compactions"]))
    assert seen[0] == seen[1] and seen[0][0] == [5] and seen[0][1] >= 1
