"""A memory budget that cannot fit the context window it is set beside is a configuration
error, named where it is set; a default that exceeds a small window is left alone (callers
such as ``chat --context-window 512`` set only the window)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contextfold.errors import ConfigError
from contextfold.memory.config import parse_config


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (
            {"context_window": 1024, "assembly": {"memory_budget": 50_000}},
            ["assembly.memory_budget", "50,000", "context_window", "1,024"],
        ),
        (
            {"context_window": 1024, "paging": {"budget": 90_000}},
            ["paging.budget", "90,000", "1,024"],
        ),
        ({"assembly": {"memory_budget": 200_000}}, ["assembly.memory_budget", "120,000"]),
    ],
)
def test_a_budget_larger_than_the_window_is_refused(
    data: dict[str, object], fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="c.yaml")
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "data",
    [
        {"context_window": 512},  # the default budgets (2,048 and 4,096) are not set here
        {"context_window": 4096, "assembly": {"memory_budget": 4096}, "paging": {"budget": 0}},
    ],
)
def test_budgets_that_fit_or_are_defaults_are_accepted(data: dict[str, object]) -> None:
    config = parse_config(data)
    assert config.context_window == data["context_window"]


def test_config_validate_reports_it_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "mb.yaml"
    path.write_text("context_window: 1024\nassembly:\n  memory_budget: 50000\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "config", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error:") and "assembly.memory_budget" in done.stderr
    assert "Traceback" not in done.stderr
