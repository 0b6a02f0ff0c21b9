"""The dashboard and the Ask page in headless Chromium (Debian's ``/usr/bin/chromium`` driven by
Playwright), against the real app served by uvicorn on 127.0.0.1.

Records are published on the app's own ``EventBus`` while the page is open, so the grid must
show them over SSE without a reload. Screenshots are kept in ``test-artifacts/dashboard/``
(or ``$CONTEXTFOLD_TEST_ARTIFACTS``). Without Chromium these tests FAIL (never skip): install it
with ``apt-get install -y chromium`` (``.ci/run`` does so in CI).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from dashboard_support import (
    ROOT,
    TOKEN,
    LiveServer,
    completed,
    make_app,
    memory_engine,
    memory_with_one_exchange,
    record,
    shared_corpus,
)
from fake_llm import FakeLLMServer

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CHROMIUM = os.environ.get("CONTEXTFOLD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ARTIFACTS = (
    Path(os.environ.get("CONTEXTFOLD_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "dashboard"
)
TIMEOUT_MS = 15_000
Serve = Callable[[FastAPI], LiveServer]
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: the dashboard tests need Debian's chromium "
            "(apt-get install -y chromium; .ci/run installs it when CI=true) or "
            "CONTEXTFOLD_CHROMIUM=/path/to/chromium. `playwright install` does not work here."
        )
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start an app on 127.0.0.1; stopped after the test's page has closed (an open SSE
    stream would otherwise hold uvicorn's graceful shutdown)."""
    started: list[LiveServer] = []

    def start(app: FastAPI) -> LiveServer:
        server = LiveServer(app).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


@pytest.fixture
def page(browser: Browser, serve: Serve) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1500, "height": 950}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # An HTTP error the test provokes is logged as "Failed to load resource"; anything else
    # on the console (and any uncaught exception) is a bug in the page.
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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_corpus(tmp_path_factory)


def shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_grid_shows_published_records_live_and_fills_in_response_tags(
    page: Page, serve: Serve
) -> None:
    app = make_app()
    bus = app.state.contextfold.events
    bus.publish(record(1))  # before the page opens: arrives in the snapshot
    server = serve(app)
    page.goto(f"{server.url}/dashboard")
    expect(page.locator("#live")).to_have_text("● live")
    rows = page.locator("#grid tbody tr")
    expect(rows).to_have_count(1)
    page.evaluate("window.__loaded = true")  # gone if the page reloads

    bus.publish(record(2))
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_attribute("data-id", "req-sess-a-2")  # newest on top
    expect(rows.first.locator("td.response")).to_have_text("pending…")

    bus.publish(completed(record(2)))
    expect(rows.first.locator("td.response")).to_have_text("uberreceipts")
    expect(rows).to_have_count(2)  # the update replaced its row
    expect(rows.first).to_contain_text("812.0 ms")
    expect(rows.first).to_contain_text("1,002 → 702")
    expect(page.locator('[data-stat="requests"] .value')).to_have_text("2")
    assert page.evaluate("window.__loaded") is True
    shot(page, "grid")


def test_inspector_shows_messages_context_budget_and_session(page: Page, serve: Serve) -> None:
    memory = memory_with_one_exchange()
    app = make_app(memory=memory)
    app.state.contextfold.events.publish(completed(record(3)))
    server = serve(app)
    page.goto(f"{server.url}/dashboard")
    page.locator("#grid tbody tr").first.click()
    inspector = page.locator("#inspector")
    expect(inspector.locator("h2")).to_contain_text("Turn 3")
    messages = inspector.locator(".message")
    expect(messages).to_have_count(4)
    expect(messages.nth(2).locator(".role")).to_have_text("assistant")
    expect(messages.nth(2).locator(".block")).to_have_text(["thinking", "tool_use"])
    expect(messages.nth(3).locator(".block")).to_have_text(["tool_result"])
    expect(inspector.locator("pre.context")).to_contain_text("Summary for turn 3")
    memory_row = inspector.locator('table.budget tr[data-section="memory"]')
    expect(memory_row).to_contain_text("⚠ TRUNCATED")
    expect(memory_row).to_have_class("truncated")
    expect(inspector.locator('table.budget tr[data-section="system"]')).to_contain_text("8%")
    expect(inspector.locator(".dropped li")).to_have_count(2)
    session = inspector.locator("#session-panel")
    expect(session).to_contain_text("turns2")
    expect(session.locator(".tag").first).to_be_visible()
    shot(page, "inspector")


def test_export_downloads_the_records_as_json(page: Page, serve: Serve, tmp_path: Path) -> None:
    app = make_app()
    for n in (1, 2):
        app.state.contextfold.events.publish(record(n, session=f"s{n}"))
    server = serve(app)
    page.goto(f"{server.url}/dashboard")
    expect(page.locator("#grid tbody tr")).to_have_count(2)
    with page.expect_download() as info:
        page.locator("#export").click()
    download = info.value
    assert download.suggested_filename.startswith("contextfold-dashboard-")
    target = tmp_path / "export.json"
    download.save_as(target)
    exported = json.loads(target.read_text())
    assert [r["id"] for r in exported["records"]] == ["req-s2-2", "req-s1-1"]
    assert exported["stats"]["requests"] == 2
    assert set(exported["sessions"]) == {"s1", "s2"}


def test_token_in_the_url_is_kept_for_api_and_sse_calls(
    page: Page, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTFOLD_DASHBOARD_TOKEN", TOKEN)
    app = make_app(host="0.0.0.0")  # not loopback: the token is required
    bus = app.state.contextfold.events
    server = serve(app)
    response = page.goto(f"{server.url}/dashboard")
    assert response is not None and response.status == 401
    page.goto(f"{server.url}/dashboard?token={TOKEN}")
    expect(page.locator("#live")).to_have_text("● live")
    assert "token" not in page.url  # taken out of the address bar, kept for the tab
    bus.publish(record(5))
    expect(page.locator("#grid tbody tr")).to_have_count(1)
    expect(page.locator('[data-stat="requests"] .value')).to_have_text("1")
    page.locator('nav a[href^="/dashboard/ask"]').click()
    expect(page.locator("#examples .example").first).to_be_visible()


def ask_and_wait(page: Page, example: str) -> None:
    page.get_by_role("button", name=example).click()
    expect(page.locator("#results")).to_be_visible()


def test_ask_page_example_question_shows_context_sources_and_budget(
    page: Page, serve: Serve, corpus: Path
) -> None:
    server = serve(make_app(corpus=corpus))
    page.goto(f"{server.url}/dashboard/ask")
    expect(page.locator("#llm-status")).to_have_text("no LLM configured")
    ask_and_wait(page, "Can I expense Uber rides during business travel?")
    expect(page.locator("#question")).to_have_value(
        "Can I expense Uber rides during business travel?"
    )
    expect(page.locator("#answer .notice")).to_contain_text("No LLM is configured")
    expect(page.locator("#context")).to_contain_text("## Instructions")
    expect(page.locator("#context")).to_contain_text("Source 1:")
    sources = page.locator("#sources tbody tr")
    expect(sources.first).to_contain_text("[Source 1]")
    assert sources.count() == 8
    score = float(sources.first.locator("td.num").inner_text())
    assert 0 < score <= 1
    table = page.locator("#budget-table table.budget")
    expect(table.locator("tbody tr")).to_have_count(5)
    expect(table.locator('tr[data-section="retrieval"]')).to_contain_text("⚠ TRUNCATED")
    expect(table.locator('tr[data-section="retrieval"]')).to_contain_text("550")
    expect(table.locator('tr[data-section="instructions"]')).to_contain_text("255")
    expect(page.locator("#truncation-warning")).to_contain_text("retrieval")
    shot(page, "ask")


def test_ask_page_shows_the_answer_from_the_configured_llm(
    page: Page, serve: Serve, corpus: Path, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Yes: standard-tier rides such as UberX are reimbursable [Source 1]."
    llm: dict[str, Any] = {
        "provider": "openai",
        "model": "fake-model",
        "base_url": fake_llm.base_url,
    }
    app = make_app(corpus=corpus, memory=memory_engine(llm=llm))
    server = serve(app)
    page.goto(f"{server.url}/dashboard/ask")
    expect(page.locator("#llm-status")).to_have_text("LLM: openai · fake-model")
    page.locator("#budget").select_option("rag")
    page.locator("#max-tokens").fill("2048")
    ask_and_wait(page, "What is the hotel cap in London?")
    expect(page.locator("#answer .answer-text")).to_have_text(fake_llm.reply)
    expect(page.locator("#budget-table tbody tr").first).to_contain_text("system")
    shot(page, "ask-llm")
    sent = fake_llm.requests[-1].body
    assert sent["model"] == "fake-model"
    assert any("London" in str(m["content"]) for m in sent["messages"])


def test_ask_page_reports_a_missing_corpus(page: Page, serve: Serve, tmp_path: Path) -> None:
    server = serve(make_app(corpus=tmp_path / "none.db"))
    page.goto(f"{server.url}/dashboard/ask")
    expect(page.locator("#corpus")).to_contain_text("No corpus at")
    page.get_by_role("button", name="What is the hotel cap in London?").click()
    expect(page.locator("#error")).to_contain_text("404: no corpus at")
    expect(page.locator("#results")).to_be_hidden()


def test_api_docs_render_offline(page: Page, serve: Serve) -> None:
    """/docs renders the spec with every request to anything but this server blocked."""
    server = serve(make_app())
    outside: list[str] = []

    def only_local(route: Any) -> None:
        url = route.request.url
        if url.startswith(server.url):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(f"{server.url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("contextfold")
    expect(page.locator(".opblock-summary-path", has_text="/api/context").first).to_be_visible()
    assert outside == []


# --------------------------------------------------------------------------- the Ask page as a chat
# Seed 004's demo (issue 17, point 3): the conversation history fills the goal section, a fact
# from turn 1 comes back in turn 6's memory section, the memory tool fills tool outputs.

CHAT_QUESTIONS = [
    "Please remember: my cost centre is KX-42 for every travel booking.",
    "Can I expense Uber rides during business travel?",
    "What is the hotel cap in London?",
    "Can I fly business class to Singapore?",
    "Do I need receipts for meals under 10 euros?",
    "Which cost centre should I charge my London hotel to?",
]


def chat_ask(page: Page, turn: int, text: str) -> None:
    page.locator("#question").fill(text)
    page.locator("#ask").click()
    expect(page.locator(f'#transcript li[data-turn="{turn}"]')).to_be_visible()


def section_used(page: Page, section: str) -> int:
    cells = page.locator(f'#budget-table tr[data-section="{section}"] td.num')
    return int(cells.nth(1).inner_text().replace(",", ""))


def test_a_fact_from_turn_1_is_in_turn_6s_memory_section(
    page: Page, serve: Serve, corpus: Path, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Noted, thank you."
    llm: dict[str, Any] = {
        "provider": "openai",
        "model": "fake-model",
        "base_url": fake_llm.base_url,
    }
    memory = memory_engine(llm=llm)
    server = serve(make_app(corpus=corpus, memory=memory))
    page.goto(f"{server.url}/dashboard/ask")
    expect(page.locator("#llm-status")).to_have_text("LLM: openai · fake-model")

    for turn, text in enumerate(CHAT_QUESTIONS[:-1], start=1):
        chat_ask(page, turn, text)
        expect(page.locator("#answer .answer-text")).to_have_text(fake_llm.reply)
    assert "KX-42" not in page.locator("#chat-memory").inner_text()

    chat_ask(page, 6, CHAT_QUESTIONS[-1])
    expect(page.locator("#transcript li")).to_have_count(6)
    expect(page.locator("#chat-memory")).to_contain_text("KX-42")
    expect(page.locator("#chat-memory")).to_contain_text("History in the goal section: 4 messages")
    context = page.locator("#context")
    expect(context).to_contain_text("KX-42")
    expect(context).to_contain_text(CHAT_QUESTIONS[4])  # the recent history, in the goal section
    assert CHAT_QUESTIONS[1] not in context.inner_text()  # older history is memory's, not goal's

    for section in ("instructions", "goal", "memory", "retrieval", "tool_outputs"):
        assert section_used(page, section) > 0, section  # all five sections are live
    expect(page.locator("#sources tbody tr").first).to_contain_text("[Source 1]")
    shot(page, "ask-chat")

    sent = fake_llm.requests[-1].body
    assert "KX-42" in str(sent["messages"])  # the model got the recalled fact
    stored = memory.store.turns(memory.store.sessions()[0])
    assert [t.message.text() for t in stored if t.message.role == "user"] == CHAT_QUESTIONS

    page.locator("#new-chat").click()
    expect(page.locator("#chat-panel")).to_be_hidden()
    chat_ask(page, 1, "What did I say my cost centre was?")
    expect(page.locator("#chat-memory")).not_to_contain_text("KX-42")  # a new conversation
