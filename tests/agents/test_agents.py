"""The real coding agents through the proxy (issue 20): Claude Code (the newest release and
a 2.0.x), Codex CLI and aider, each pinned in ``versions.txt`` and installed by
``scripts/install-agents``, perform a tiny scripted coding task against the scripted fake
upstream (``agent_upstream``): once straight to it (the control run), once through a real
``contextfold proxy`` process. The proxied run must be indistinguishable to the client and to
the provider, except for the memory the proxy adds at the injection point:

- the client-visible output, exit codes, edited files and commits equal the control run's;
- no ``contextfold:session`` marker in any output, file, commit or upstream request;
- the model requests are the same ones, each body JSON-equal to the control's up to the
  injection point (after the last ``cache_control`` breakpoint, in the last user message);
- every ``cache_control`` breakpoint survives, and the (fake) prompt cache is read as much
  (Anthropic);
- nothing the request already holds (its prompts, its in-flight tool loop, an older version
  of a file it holds) is injected again;
- the proxy understood every request (a record without an error: memory was not turned
  off), and a resumed session (``claude --continue``, ``codex exec resume --last``,
  ``aider --restore-chat-history``) continues its stored conversation;
- a fact told in one session is in what the proxy forwards in a new session of the same
  client, whose own history does not hold it.

Each scenario runs once per module (``AgentRuns``); its runs are written to
``test-artifacts/agents/<client>/`` (outputs, files, every upstream request) for reading after
a failure.

Run alone: ``scripts/install-agents && pytest -m agents``. Without the clients installed the
tests are skipped, except with ``CI=true``, where they fail (CI must run them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agent_harness import AgentRun, breakpoints, injection_diff, pair_requests
from agent_scenarios import (
    ANTHROPIC,
    CHANGE,
    CLIENTS,
    CREATE,
    DONE,
    FACT,
    HELLO,
    HELLO_WORLD,
    AgentRuns,
)
from agent_upstream import ScriptedUpstream, all_text, latest_text

pytestmark = pytest.mark.agents


@pytest.fixture(scope="module")
def agent_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRuns]:
    """One scripted upstream and (started on first use) one ``contextfold proxy`` process in
    front of it for the module; each scenario is run once and shared by the tests that check
    it. (Here rather than in a conftest.py: a second conftest.py basename under tests/ would
    clash with tests/conftest.py in pytest's doctest collection.)"""
    with ScriptedUpstream() as upstream:
        runs = AgentRuns(upstream, tmp_path_factory)
        try:
            yield runs
        finally:
            runs.close()


def _explain(run: AgentRun) -> str:
    """What a failing check shows: the run's exit codes, outputs, requests and proxy log."""
    lines = [f"--- {run.label}: exit codes {run.rcs}, seconds {run.seconds}"]
    for i, (out, err) in enumerate(zip(run.stdouts, run.stderrs, strict=True)):
        lines.append(f"stdout {i + 1}: {out[-1500:]!r}")
        if err.strip():
            lines.append(f"stderr {i + 1}: {err[-800:]!r}")
    for i, r in enumerate(run.requests):
        latest = latest_text(r.body).replace("\n", " ")[:90]
        lines.append(f"request {i}: {r.method} {r.path} -> {r.answer}; latest {latest!r}")
    log = [line for line in run.proxy_log.splitlines() if not line.startswith("INFO:")]
    if log:
        lines.append("proxy log:\n  " + "\n  ".join(log[-15:]))
    return "\n".join(lines)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_control_run_does_the_task(agent_runs: AgentRuns, client_id: str) -> None:
    """The harness itself: straight to the fake upstream, the agent does the scripted task."""
    control = agent_runs.pair(client_id).control
    assert control.rcs == [0, 0], _explain(control)
    assert control.files.get("hello.py") == HELLO_WORLD, _explain(control)
    assert not [r for r in control.requests if r.answer == "unscripted"], _explain(control)
    if client_id != "aider":
        assert DONE in json.dumps(control.visible[-1]), _explain(control)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_exit_codes_and_output_identical(agent_runs: AgentRuns, client_id: str) -> None:
    pair = agent_runs.pair(client_id)
    assert pair.proxied.rcs == pair.control.rcs, _explain(pair.proxied)
    for i, (want, got) in enumerate(zip(pair.control.visible, pair.proxied.visible, strict=True)):
        assert got == want, (
            f"invocation {i + 1}: the client shows {got!r} through the proxy, {want!r} without "
            f"it\n{_explain(pair.proxied)}"
        )


@pytest.mark.parametrize("client_id", CLIENTS)
def test_edited_files_and_commits_identical(agent_runs: AgentRuns, client_id: str) -> None:
    pair = agent_runs.pair(client_id)
    assert pair.proxied.files == pair.control.files, _explain(pair.proxied)
    assert pair.proxied.commits == pair.control.commits, _explain(pair.proxied)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_no_marker_anywhere(agent_runs: AgentRuns, client_id: str) -> None:
    """0 occurrences of ``contextfold:session`` in outputs, files (the work tree, the client's
    home: transcripts, ``.aider.chat.history.md``), commit messages, upstream requests."""
    proxied = agent_runs.pair(client_id).proxied
    hits = proxied.marker_hits()
    assert not hits, "markers found:\n  " + "\n  ".join(hits)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_same_model_requests(agent_runs: AgentRuns, client_id: str) -> None:
    """Through the proxy the client makes the same model requests (main and side calls)."""
    pair = agent_runs.pair(client_id)
    _, unmatched = pair_requests(pair.control.requests, pair.proxied.requests)
    assert not unmatched, "\n".join(unmatched) + "\n" + _explain(pair.proxied)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_upstream_bodies_identical_up_to_injection(agent_runs: AgentRuns, client_id: str) -> None:
    """Each body the upstream got through the proxy is the control run's body, JSON-equal up
    to the injection point, with memory only added after it."""
    pair = agent_runs.pair(client_id)
    pairs, _ = pair_requests(pair.control.requests, pair.proxied.requests)
    assert pairs, _explain(pair.proxied)
    problems = []
    for what, control, proxied in pairs:
        diff = injection_diff(control.body, proxied.body)
        if diff is not None:
            problems.append(f"{what}: {diff}")
    assert not problems, f"{len(problems)} of {len(pairs)} requests:\n" + "\n".join(problems)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_proxy_understood_every_request(agent_runs: AgentRuns, client_id: str) -> None:
    """Every model request went through memory (a dashboard record without an error): a
    client's new wire feature must not turn memory off for the conversation."""
    proxied = agent_runs.pair(client_id).proxied
    records = [r for batch in proxied.records for r in batch]
    model_requests = [r for r in proxied.requests if r.answer.startswith(("step", "side"))]
    assert records, (
        f"the proxy kept no record of the {len(model_requests)} model requests "
        f"({sorted({r.path for r in model_requests})}): passed through without memory"
    )
    failed = sorted({str(r.get("error")) for r in records if r.get("error")})
    assert not failed, f"{len(failed)} kinds of memory failure:\n" + "\n".join(failed)
    main = [r for r in model_requests if r.answer.startswith("step")]
    assert len(records) >= len(main), (
        f"{len(records)} records for the {len(main)} requests of the conversation"
    )


@pytest.mark.parametrize("client_id", CLIENTS)
def test_resumed_session_continues(agent_runs: AgentRuns, client_id: str) -> None:
    """The task's second invocation resumes the first session (``claude --continue``,
    ``codex exec resume --last``, ``aider --restore-chat-history``): the proxy continues the
    stored conversation instead of starting a new one, in place: one session for both."""
    proxied = agent_runs.pair(client_id).proxied
    assert len(proxied.records) == 2 and all(proxied.records), (
        f"records per invocation: {[len(b) for b in proxied.records]} (no memory route?)"
    )

    def main(batch: list[dict[str, object]]) -> dict[str, object]:
        # The conversation's record: the latest turn, and of equal turns one with a
        # session (Claude Code's concurrent side requests carry none, in any order).
        return max(batch, key=lambda r: (int(str(r.get("turn") or 0)), bool(r.get("session_id"))))

    first, second = main(proxied.records[0]), main(proxied.records[1])
    summary = [
        [
            (
                str(r.get("session_id"))[:8],
                r.get("turn"),
                (r.get("extra") or {}).get("session_source"),
            )
            for r in batch
        ]
        for batch in proxied.records
    ]
    assert first.get("session_id") and second.get("session_id") == first.get("session_id"), (
        f"the resumed session was stored as another conversation: records (session, turn, "
        f"source) per invocation: {summary}"
    )
    # and no request of it was taken for an edit that forks it (Claude Code resends each
    # Edit call with the tool's defaults filled in: that forked the session at every edit)
    sessions = {r["session_id"] for batch in proxied.records for r in batch if r.get("session_id")}
    assert len(sessions) == 1, (
        f"the conversation was split over {len(sessions)} sessions: records (session, turn, "
        f"source) per invocation: {summary}"
    )


@pytest.mark.parametrize("client_id", CLIENTS)
def test_nothing_injected_twice(agent_runs: AgentRuns, client_id: str) -> None:
    """Memory never repeats what the request already holds: the prompts and tool calls of
    the session (an agent's in-flight tool loop is history), nor an older version of a file
    the request holds (hello.py before its edit). Each of these texts occurs in the forwarded
    body no more often than in the client's."""
    pair = agent_runs.pair(client_id)
    pairs, _ = pair_requests(pair.control.requests, pair.proxied.requests)
    assert pairs, _explain(pair.proxied)
    needles = [CREATE, CHANGE, HELLO.strip(), HELLO_WORLD.strip()]
    repeated = []
    for what, control, proxied in pairs:
        client_text, forwarded_text = all_text(control.body), all_text(proxied.body)
        for needle in needles:
            want, got = client_text.count(needle), forwarded_text.count(needle)
            if got > want:
                repeated.append(
                    f"{what}: {needle!r} {want}x in the client's body, {got}x forwarded"
                )
    assert not repeated, "injected again:\n" + "\n".join(repeated)


@pytest.mark.parametrize("client_id", ANTHROPIC)
def test_cache_breakpoints_preserved(agent_runs: AgentRuns, client_id: str) -> None:
    pair = agent_runs.pair(client_id)
    pairs, _ = pair_requests(pair.control.requests, pair.proxied.requests)
    assert pairs, _explain(pair.proxied)
    counts = [(what, breakpoints(c.body), breakpoints(p.body)) for what, c, p in pairs]
    changed = [f"{what}: {c} -> {p}" for what, c, p in counts if c != p]
    assert not changed, "cache_control breakpoints changed:\n" + "\n".join(changed)


@pytest.mark.parametrize("client_id", ANTHROPIC)
def test_prompt_cache_reads_not_fewer(agent_runs: AgentRuns, client_id: str) -> None:
    """Each request of the conversation reads the fake's prompt cache (its prefixes up to
    each breakpoint) as much through the proxy as without it. (Side calls run concurrently,
    so which of two alike writes the cache first varies: they are left out.)"""
    pair = agent_runs.pair(client_id)
    pairs, _ = pair_requests(pair.control.requests, pair.proxied.requests)
    pairs = [(what, c, p) for what, c, p in pairs if not c.side]
    assert pairs, _explain(pair.proxied)
    fewer = [
        f"{what}: {c.cache_read} -> {p.cache_read} tokens read from the cache"
        for what, c, p in pairs
        if p.cache_read < c.cache_read
    ]
    assert not fewer, "fewer prompt-cache reads through the proxy:\n" + "\n".join(fewer)


@pytest.mark.parametrize("client_id", CLIENTS)
def test_fact_recalled_in_a_new_session(agent_runs: AgentRuns, client_id: str) -> None:
    memory = agent_runs.memory(client_id)
    assert memory.first.rcs == [0] and memory.second.rcs == [0], _explain(memory.second)
    asked = [r for r in memory.second.requests if r.answer.startswith("step")]
    assert asked, _explain(memory.second)
    client_text = latest_text(asked[0].body)
    assert FACT not in client_text
    assert FACT in all_text(asked[0].body), (
        f"the fact {FACT!r} told in session 1 is not in the request the proxy forwarded in "
        f"session 2\n{_explain(memory.second)}"
    )
