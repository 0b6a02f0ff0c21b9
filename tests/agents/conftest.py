"""Fixtures of the coding-agent tests: one scripted upstream and (started on first use) one
``contextfold proxy`` process in front of it for the whole session, and the scenario runs,
each made once and shared by the tests that check it (``AgentRuns``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_scenarios import AgentRuns
from agent_upstream import ScriptedUpstream


@pytest.fixture(scope="session")
def agent_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRuns]:
    with ScriptedUpstream() as upstream:
        runs = AgentRuns(upstream, tmp_path_factory)
        try:
            yield runs
        finally:
            runs.close()
