"""The chat terminal (``contextfold chat``) driven by Textual's own pilot against the fake LLM:
a 10-turn chat with brief mode, the turn list, the tag panel, the budget bar, the inspector,
``/compact`` and the session export (which ``--replay`` reads back). Screenshots are saved as
SVG in ``test-artifacts/tui/`` (or ``$CONTEXTFOLD_TEST_ARTIFACTS``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, ListView, Static
from typer.testing import CliRunner

from contextfold.cli import app as cli
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.tui.app import ChatApp, InspectorScreen
from contextfold.tui.session import BRIEF, ChatSession
from fake_llm import FakeLLMServer
from proxy_support import closed_after_test

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("CONTEXTFOLD_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "tui"
QUESTIONS = [
    "How do I tune the postgres index on orders?",
    "Should vacuum run more often on that table?",
    "Which flight gets me to Lisbon on Monday?",
    "Is there a hotel near the Lisbon office?",
    "What btree fillfactor suits the orders index?",
    "Can the train replace the flight to Porto?",
    "Does autovacuum need its own postgres settings?",
    "Book the hotel for two nights please.",
    "Summarize the postgres index advice again.",
    "And the Lisbon travel plan?",
]


def _reply(body: dict[str, Any]) -> str:
    asked = str(body["messages"][-1]["content"]).split("\n")[0]
    return f"On '{asked}': " + "here is a detailed answer with the steps to follow. " * 4


def _engine(tmp_path: Path, fake_llm: FakeLLMServer) -> MemoryEngine:
    config = MemoryConfig.model_validate(
        {
            "context_window": 800,
            "recall": {"embedder": "none"},
            "compaction": {"protected_recent_turns": 2},
            "tagger": {
                "keywords": {
                    "database": ["postgres", "vacuum", "btree", "index"],
                    "travel": ["flight", "hotel", "lisbon", "train"],
                }
            },
            "llm": {"provider": "openai", "model": "fake-model", "base_url": fake_llm.base_url},
        }
    )
    return closed_after_test(MemoryEngine(config, store=tmp_path / "chat.db", embedder=None))


async def _say(pilot: Any, app: ChatApp, text: str) -> None:
    box = app.query_one("#input")
    box.value = text  # what typing leaves in the box (the pilot then presses Enter in it)
    box.focus()
    await pilot.press("enter")
    await app.workers.wait_for_complete()
    await pilot.pause()


def _shot(app: ChatApp, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return Path(app.save_screenshot(filename=f"{name}.svg", path=str(ARTIFACTS)))


async def test_a_ten_turn_chat_with_compact(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = _reply
    session = ChatSession(_engine(tmp_path, fake_llm))
    export = tmp_path / "vc-session.json"
    app = ChatApp(session, export_path=export)
    async with app.run_test(size=(170, 50)) as pilot:
        for n, question in enumerate(QUESTIONS, start=1):
            if n == 9:
                await pilot.press("ctrl+t")  # brief mode for the last two turns
            await _say(pilot, app, question)
            assert len(session.turns) == n, f"turn {n} did not complete"
        turns = app.query_one("#turns", ListView)
        assert len(turns.children) == 10
        assert "database" in str(turns.children[0].query_one("Label").render())

        # Brief mode reached the model, never the stored turn.
        sent = fake_llm.requests[-1].body["messages"][-1]["content"]
        assert sent == QUESTIONS[-1] + BRIEF
        assert session.history[-2].text() == QUESTIONS[-1]

        table = app.query_one("#tags", DataTable)
        tags = {str(table.get_row_at(i)[0]): table.get_row_at(i) for i in range(table.row_count)}
        assert set(tags) == set(session.engine.status().tags)
        assert str(tags["travel"][2]) == "active" and int(tags["database"][1]) >= 4
        bar = str(app.query_one("#budget", Static).render())
        last = session.turns[-1].budget
        assert f"{last.used:,} / 800 tokens" in bar
        assert last.core > 0 and last.conversation > 0
        assert session.compactions  # the window filled: memory took the older turns
        assert any(t.budget.hint + t.budget.tags > 0 for t in session.turns)
        _shot(app, "chat-ten-turns")

        before = len(session.compactions)
        live_before = session.engine.status().live_turns
        await _say(pilot, app, "/compact")
        assert len(session.compactions) == before + 1
        assert session.engine.status().live_turns < live_before
        notes = " ".join(str(s.render()) for s in app.query("#log .note"))
        assert "/compact: " in notes and "freed" in notes

        await pilot.press("ctrl+b", "ctrl+b", "f2")  # two turns back, then the inspector
        await pilot.pause()
        assert isinstance(app.screen, InspectorScreen) and app.screen.turn.turn == 8
        payload = str(app.screen.query_one("#payload", Static).render())
        assert QUESTIONS[7] in payload and '"role": "system"' in payload
        _shot(app, "chat-inspector")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, InspectorScreen)

        await pilot.press("ctrl+s")
        await pilot.pause()
    saved = json.loads(export.read_text())
    assert [t["turn"] for t in saved["turns"]] == list(range(1, 11))
    assert len(saved["compactions"]) == len(session.compactions)
    assert saved["turns"][8]["brief"] and not saved["turns"][7]["brief"]

    # The export replays headless (seed 001's --headless flag) into another session.
    config = tmp_path / "contextfold.yaml"
    config.write_text(f"storage_path: {tmp_path / 'chat.db'}\nrecall: {{embedder: none}}\n")
    replay = CliRunner().invoke(
        cli,
        ["chat", "--headless", "--replay", str(export), "-c", str(config), "-s", "copy", "--json"],
    )
    assert replay.exit_code == 0, replay.output
    assert [t["reply_source"] for t in json.loads(replay.stdout)["turns"]] == ["file"] * 10


async def test_commands_and_errors_are_shown_not_raised(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    session = ChatSession(_engine(tmp_path, fake_llm))
    app = ChatApp(session, export_path=tmp_path / "no-such-dir" / "x.json")
    async with app.run_test(size=(120, 40)) as pilot:
        await _say(pilot, app, "/inspect")
        await _say(pilot, app, "/compact")
        await _say(pilot, app, "/nope")
        fake_llm.fail_next(500, times=10)
        await _say(pilot, app, "hello")
        await pilot.press("ctrl+s")
        await pilot.pause()
        notes = [str(s.render()) for s in app.query("#log .note")]
    assert notes[0] == "no turn to inspect yet"
    assert notes[1].startswith("/compact: nothing to compact")
    assert notes[2].startswith("unknown command /nope")
    assert notes[3].startswith("error: ") and not session.turns
    assert notes[4].startswith("export failed: ")


def test_headless_needs_a_file() -> None:
    result = CliRunner().invoke(cli, ["chat", "--headless"])
    assert result.exit_code == 2 and "--replay FILE" in result.stderr
