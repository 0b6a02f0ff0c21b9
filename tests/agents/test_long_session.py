"""Tool-output compaction with the real Claude Code (issue 20, point 5): a short version of the
recorded long session (``long_session.py``: 30 real tool calls over a copy of ``src/``) runs
straight to the scripted upstream, then through a real ``contextfold proxy`` whose
``tool_outputs`` budget is small enough that the session's later requests are compacted.

Through the proxy the client's run is the same (exit code, output, edited files, commits,
the model requests it makes), the requests over the budget reach the upstream with their
oldest outputs stubbed and the ``contextfold_restore`` tool offered, and every request the
upstream receives is one the provider accepts (``contextfold.testing.payload_problem``).

Run alone: ``scripts/install-agents && pytest -m agents tests/agents/test_long_session.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent_harness import (
    ARTIFACTS,
    ROOT,
    AgentRun,
    ClaudeCode,
    Invocation,
    ProxyProcess,
    Workspace,
    pair_requests,
)
from agent_upstream import ScriptedUpstream
from contextfold.server.proxy.outputs import RESTORE_TOOL
from contextfold.testing import payload_problem
from long_session import FINAL, PROMPT, long_task, prepare_repository

pytestmark = pytest.mark.agents

CALLS = 30
#: Claude Code's tools and system prompt alone are about 17,000 tokens (estimated as the
#: proxy does, 3 characters a token); 30 calls reach about 60,000.
BUDGET = {"compact_above": 30_000, "keep_recent": 4}
STUB = "[contextfold: tool output "


@dataclass
class Runs:
    control: AgentRun
    proxied: AgentRun


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    client = ClaudeCode("claude-latest")
    ws = Workspace(tmp_path_factory.mktemp("long-session"))
    with ScriptedUpstream() as upstream:

        def run(label: str, base_url: str, proxy: ProxyProcess | None = None) -> AgentRun:
            ws.fresh()
            steps = long_task(ws, prepare_repository(ws, ROOT / "src"), CALLS)
            upstream.reset(steps)
            done = client.run(
                label,
                ws,
                upstream,
                base_url,
                "sk-long-session",
                [Invocation(PROMPT)],
                steps,
                proxy=proxy,
                fresh=False,
            )
            done.save(ARTIFACTS / "long-session")
            return done

        control = run("control", upstream.url)
        proxy = ProxyProcess(upstream.url, tmp_path_factory.mktemp("cf-home"), BUDGET)
        try:
            proxied = run("proxied", proxy.url, proxy)
        finally:
            proxy.stop()
        yield Runs(control, proxied)


def _main(run: AgentRun) -> list[dict[str, Any]]:
    return [r.body for r in run.requests if r.answer.startswith("step")]


def _stubs(body: dict[str, Any]) -> int:
    return sum(
        1
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "tool_result"
        and isinstance(block.get("content"), str)
        and block["content"].startswith(STUB)
    )


def test_the_session_runs_its_tool_calls(runs: Runs) -> None:
    control = runs.control
    assert control.rcs == [0] and FINAL in control.stdouts[0], control.stderrs
    assert not [r for r in control.requests if r.answer == "unscripted"]
    main = _main(control)
    results = sum(
        1
        for m in main[-1]["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    )
    assert results == CALLS, f"{results} tool results in the last request"
    assert not any(_stubs(body) for body in main)


def test_client_outcome_identical_through_the_compacting_proxy(runs: Runs) -> None:
    control, proxied = runs.control, runs.proxied
    assert proxied.rcs == control.rcs, proxied.stderrs
    assert proxied.visible == control.visible
    assert proxied.files == control.files
    assert proxied.commits == control.commits
    _, unmatched = pair_requests(control.requests, proxied.requests)
    assert not unmatched, unmatched


def test_requests_over_the_budget_are_compacted(runs: Runs) -> None:
    main = _main(runs.proxied)
    compacted = [i for i, body in enumerate(main) if _stubs(body)]
    assert len(compacted) >= len(main) // 3, f"compacted: {compacted} of {len(main)}"
    assert compacted == list(range(compacted[0], len(main))), "once over, always compacted"
    for i in compacted:
        tools = [t.get("name") for t in main[i].get("tools") or []]
        assert RESTORE_TOOL in tools, f"request {i}: no {RESTORE_TOOL} tool beside the stubs"
    last = len(str(main[-1])), len(str(_main(runs.control)[-1]))
    assert last[0] < last[1] * 0.75, f"the last request: {last[0]:,} chars, straight {last[1]:,}"


def test_every_request_the_upstream_receives_is_valid(runs: Runs) -> None:
    bodies = [
        r.body for r in runs.proxied.requests if isinstance(r.body, dict) and r.body.get("messages")
    ]
    problems = [
        f"request {i}: {problem}"
        for i, body in enumerate(bodies)
        if (problem := payload_problem("anthropic", body, inline_system=True))
    ]
    assert bodies and not problems, "\n".join(problems)
