#!/usr/bin/env python3
"""Write the screenshots of docs/dashboard.md: the request grid with the turn inspector open,
and the Ask page after an example question, taken in Debian's headless Chromium.

    .venv/bin/python scripts/dashboard_screenshots.py      # writes docs/dashboard-*.png

It serves the real app on 127.0.0.1 with a throwaway home: the demo policy corpus
(examples/policies) is ingested for the Ask page, and sample requests are published on the
dashboard's event bus (the proxy publishes the same records for real traffic).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contextfold.server.events import RequestRecord

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHROMIUM = os.environ.get("CONTEXTFOLD_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def sample_records() -> list[RequestRecord]:
    from contextfold.server.events import BudgetRow, InspectedMessage, RequestRecord

    start = datetime.now(UTC) - timedelta(minutes=3)
    topics = [
        ("Can I expense Uber rides during business travel?", ("ground-transport", "uber")),
        ("And the tip, is that covered too?", ("ground-transport", "tips")),
        ("What is the hotel cap in London?", ("lodging", "london")),
        ("Does that include breakfast?", ("lodging", "breakfast")),
        ("Going back to the start: what did we say about rides?", ("ground-transport",)),
        ("Summarise everything we discussed so far", ("ground-transport", "lodging")),
    ]
    records = []
    for n, (question, tags) in enumerate(topics, start=1):
        session = "b7e2c91f04aa" if n <= 4 else "5d1f7730ce12"
        records.append(
            RequestRecord(
                id=f"req-{n}",
                session_id=session,
                turn=n if n <= 4 else n - 4,
                format="anthropic" if n % 2 else "openai",
                path="/v1/messages" if n % 2 else "/v1/chat/completions",
                model="claude-sonnet-4" if n % 2 else "gpt-4o",
                created_at=start + timedelta(seconds=25 * n),
                stream=True,
                status=200,
                inbound_tags=tags,
                response_tags=None if n == 6 else (*tags, "receipts"),
                broad=n == 6,
                temporal=n == 5,
                tokens_in=1800 + 950 * n,
                tokens_forwarded=1500 + 610 * n,
                memory_tokens=90 + 20 * n,
                overhead_ms=2.1 + 0.4 * n,
                upstream_ms=None if n == 6 else 640.0 + 55 * n,
                dropped_turns=2 if n >= 3 else 0,
                dropped=("turn 1: no tag overlap", "turn 2: no tag overlap") if n >= 3 else (),
                messages=(
                    InspectedMessage(role="system", blocks=("text",), text="You help employees "),
                    InspectedMessage(role="user", blocks=("text",), text=question),
                    InspectedMessage(
                        role="assistant",
                        blocks=("thinking", "tool_use"),
                        text="find_quote(query='ride-hailing receipts')",
                    ),
                    InspectedMessage(
                        role="user",
                        blocks=("tool_result",),
                        text="turn 2: 'attach the itemised e-receipt from the app'",
                    ),
                ),
                context=(
                    '<memory topics="ground-transport, lodging">\n'
                    "[ground-transport] Ride-hailing is reimbursable when public transport is "
                    "impractical; book UberX and attach the app e-receipt; tips up to 15 %.\n"
                    "</memory>"
                ),
                budget=(
                    BudgetRow(section="system", budget=900, used=212, items=1),
                    BudgetRow(section="memory", budget=160, used=160, items=3, truncated=True),
                    BudgetRow(section="conversation", budget=5200, used=1430, items=7),
                    BudgetRow(section="tools", budget=700, used=96, items=2),
                ),
            )
        )
    return records


def main() -> int:
    import uvicorn
    from playwright.sync_api import sync_playwright
    from typer.testing import CliRunner

    from contextfold.cli import app as cli
    from contextfold.memory.engine import MemoryEngine
    from contextfold.server.app import create_app
    from contextfold.server.config import DashboardSettings, ServerConfig

    home = Path(tempfile.mkdtemp(prefix="contextfold-shots-"))
    db = home / "documents.db"
    ingest = CliRunner().invoke(
        cli, ["ingest", str(ROOT / "examples" / "policies"), "--db", str(db)]
    )
    if ingest.exit_code:
        print(ingest.output, file=sys.stderr)
        return 1
    memory = MemoryEngine(store=home / "memory.db", embedder=None)
    memory.on_turn_complete(
        [
            {"role": "user", "content": "Can I expense Uber rides during business travel?"},
            {"role": "assistant", "content": "Yes: UberX with the itemised app e-receipt."},
            {"role": "user", "content": "What is the hotel cap in London?"},
            {"role": "assistant", "content": "EUR 220 per night including breakfast."},
        ],
        session_id="b7e2c91f04aa",
    )
    app = create_app(ServerConfig(dashboard=DashboardSettings(corpus=str(db))), memory=memory)
    for record in sample_records():
        app.state.contextfold.events.publish(record)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1500})
            page.goto(f"{url}/dashboard")
            page.locator("#grid tbody tr").nth(3).click()
            page.locator("#session-panel .tag").first.wait_for()
            page.screenshot(path=str(DOCS / "dashboard-grid.png"))
            page.goto(f"{url}/dashboard/ask")
            page.get_by_role(
                "button", name="Can I expense Uber rides during business travel?"
            ).click()
            page.locator("#results").wait_for()
            page.screenshot(path=str(DOCS / "dashboard-ask.png"), full_page=True)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(5)
    print(f"wrote {DOCS / 'dashboard-grid.png'} and {DOCS / 'dashboard-ask.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
