"""``contextfold memory domains``, ``contextfold init --from virtual-context.yaml`` (seed 001's
config file) and ``contextfold proxy`` without ``--upstream`` starting the configured instances."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner, Result

from contextfold.cli import app
from contextfold.memory.config import load_config
from contextfold.server.config import load_server_config
from fake_llm import FakeLLMServer
from proxy_support import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CONVERSATION = ROOT / "examples" / "conversation.json"

# Seed 001's configuration example and its multi-instance proxy section, as the seed gives them.
SEED_CONFIG = """\
version: "0.2"
storage_root: ".virtualcontext"
context_window: 120000

tag_generator:
  type: "llm"
  provider: "ollama"
  model: "qwen3:4b-instruct-2507-fp16"
  min_tags: 5
  max_tags: 10
  keyword_fallback:
    tag_keywords:
      legal: [court, filing, motion, attorney]
      code: [function, bug, deploy, API, database]
  tag_splitting:
    enabled: true
    frequency_threshold: 15
    frequency_pct_threshold: 0.15

tag_rules:
  - match: "architecture*"
    priority: 10
    ttl_days: null
    summary_prompt: |
      Summarize architectural decisions and tradeoffs.
      Preserve component names and rationale.
  - match: "debug*"
    priority: 7
    ttl_days: 7
  - match: "*"
    priority: 5
    ttl_days: 30

compaction:
  soft_threshold: 0.70
  hard_threshold: 0.85
  protected_recent_turns: 6
  max_concurrent_summaries: 4

assembly:
  context_hint_enabled: true
  context_hint_max_tokens: 200

providers:
  ollama:
    type: "generic_openai"
    base_url: "http://127.0.0.1:11434/v1"

storage:
  backend: "sqlite"
  sqlite:
    path: ".virtualcontext/store.db"
"""
SEED_PROXY = """\
proxy:
  instances:
    - port: {p1}
      upstream: {u1}
      label: anthropic
    - port: {p2}
      upstream: {u2}
      label: openai
"""


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("domains")
    config = folder / "contextfold.yaml"
    config.write_text(
        f"context_window: 512\nrecall: {{embedder: none}}\nstorage_path: {folder / 'm.db'}\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONTEXTFOLD_HOME", str(folder / "home"))
        result = invoke("memory", "compact", "-i", CONVERSATION, "-c", config)
        assert result.exit_code == 0, result.output
        yield config


def test_domains_lists_every_tag_with_its_turns_and_summary(compacted: Path) -> None:
    tags = json.loads(invoke("memory", "tags", "-c", compacted, "--json").stdout)
    result = invoke("memory", "domains", "-c", compacted, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["tag"], r["turns"]) for r in rows] == [(t["tag"], t["turns"]) for t in tags]
    summarized = [r for r in rows if r["summary"]]
    assert summarized and all(r["summary_tokens"] > 0 and r["segments"] > 0 for r in summarized)
    kitchen = next(r for r in rows if r["tag"] == "kitchen")
    table = invoke("memory", "domains", "-c", compacted, "--full")
    assert table.exit_code == 0, table.output
    assert "kitchen" in table.stdout and str(kitchen["turns"]) in table.stdout
    first_words = " ".join(summarized[0]["summary"].split()[:3])
    assert first_words in " ".join(table.stdout.split())


def test_domains_of_an_unknown_session_is_an_error(compacted: Path) -> None:
    result = invoke("memory", "domains", "-c", compacted, "-s", "nope")
    assert result.exit_code == 2 and "nope" in result.stderr


def test_init_from_converts_the_seed_config_and_its_instances(tmp_path: Path) -> None:
    seed = tmp_path / "virtual-context.yaml"
    seed.write_text(
        SEED_CONFIG
        + SEED_PROXY.format(
            p1=5757, u1="https://api.anthropic.com", p2=5758, u2="https://api.openai.com/v1"
        )
    )
    target = tmp_path / "out" / "contextfold.yaml"
    result = invoke("init", "--from", seed, "--path", target)
    assert result.exit_code == 0, result.output
    memory = load_config(target)
    assert memory.context_window == 120_000 and memory.storage_path == ".virtualcontext/store.db"
    assert memory.tagger.type == "llm" and memory.tagger.max_tags == 10
    assert memory.tagger.keywords["legal"] == ["court", "filing", "motion", "attorney"]
    assert memory.tagger.splitting.enabled and memory.tagger.splitting.frequency_threshold == 15
    assert memory.llm is not None and memory.llm.provider == "ollama"
    assert (memory.llm.model, memory.llm.base_url) == (
        "qwen3:4b-instruct-2507-fp16",
        "http://127.0.0.1:11434/v1",
    )
    rules = {r.match: (r.priority, r.ttl_days) for r in memory.tag_rules}
    assert rules == {"architecture*": (10, None), "debug*": (7, 7), "*": (5, 30)}
    assert memory.compaction.protected_recent_turns == 6
    assert memory.assembly.context_hint_max_tokens == 200
    server = load_server_config(tmp_path / "out" / "server.yaml")
    assert (server.port, server.proxy.upstream) == (5757, "https://api.anthropic.com")
    assert [(i.name, i.port, i.upstream) for i in server.proxy.instances] == [
        ("openai", 5758, "https://api.openai.com/v1")
    ]
    assert server.memory_config == str(target.resolve())
    assert "tag_generator.min_tags: no contextfold equivalent" in result.stdout  # said, not lost
    again = invoke("init", "--from", seed, "--path", target)
    assert again.exit_code == 2 and "already exists" in again.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["init", "chat", "--from", "x.yaml"], "not both"),
        (["init"], "pass a template KIND"),
        (["init", "--from", "missing.yaml"], "no such file"),
    ],
)
def test_init_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr


def test_init_from_names_the_keys_that_do_not_convert(tmp_path: Path) -> None:
    seed = tmp_path / "virtual-context.yaml"
    seed.write_text("context_window: 100\n")  # below contextfold's 512 minimum
    result = invoke("init", "--from", seed, "--path", tmp_path / "c.yaml")
    assert result.exit_code == 2 and "context_window" in result.stderr
    assert not (tmp_path / "c.yaml").exists()  # nothing half-written


def test_proxy_without_upstream_needs_configured_instances() -> None:
    result = invoke("proxy")
    assert result.exit_code == 2 and "no upstream" in result.stderr


def test_proxy_without_upstream_starts_the_converted_instances(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "from the fake upstream"
    p1, p2 = free_port(), free_port()
    seed = tmp_path / "virtual-context.yaml"
    config = yaml.safe_load(SEED_CONFIG)
    config["storage"]["sqlite"]["path"] = str(tmp_path / "store.db")
    config["tag_generator"]["type"] = "keyword"
    seed.write_text(
        yaml.safe_dump(config)
        + SEED_PROXY.format(p1=p1, u1="http://127.0.0.1:9", p2=p2, u2=fake_llm.url)
    )
    assert invoke("init", "--from", seed, "--path", tmp_path / "contextfold.yaml").exit_code == 0
    command = [sys.executable, "-m", "contextfold", "proxy", "-c", str(tmp_path / "server.yaml")]
    env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path)}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                for port in (p1, p2):
                    httpx.get(f"http://127.0.0.1:{port}/healthz").raise_for_status()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        answer = httpx.post(f"http://127.0.0.1:{p2}/v1/chat/completions", json=body, timeout=30)
        assert answer.json()["choices"][0]["message"]["content"] == "from the fake upstream"
        assert fake_llm.requests  # the openai instance forwarded to its own upstream
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert f"http://127.0.0.1:{p2}" in err  # every listener is announced
