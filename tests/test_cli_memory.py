"""``contextfold memory`` / ``config`` / ``init`` / ``cost-report`` / ``chat`` through typer's
``CliRunner``, on the demo conversation in ``examples/conversation.json``.

The configs use a 512-token context window (so 30 messages really compact) and no embedder
(no model loads); memory lives in a tmp folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from contextfold.cli import app
from contextfold.memory.config import load_config
from contextfold.memory.engine import MemoryEngine

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CONVERSATION = ROOT / "examples" / "conversation.json"
SMALL = "context_window: 512\nrecall: {embedder: none}\n"


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_error(result: Result, fragment: str) -> None:
    """Exit 2, an ``error:`` first line on stderr naming the problem, no traceback."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ")
    assert fragment in result.stderr.splitlines()[0], result.stderr


def write_config(folder: Path, extra: str = "") -> Path:
    path = folder / "contextfold.yaml"
    path.write_text(f"{SMALL}storage_path: {folder / 'memory.db'}\n{extra}", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A config whose store holds the demo conversation, ingested and compacted."""
    folder = tmp_path_factory.mktemp("memory")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONTEXTFOLD_HOME", str(folder / "home"))
        config = write_config(folder)
        result = invoke("memory", "compact", "-i", CONVERSATION, "-c", config)
        assert result.exit_code == 0, result.output
        yield config


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    return write_config(tmp_path)


def test_compact_ingests_compacts_and_skips_stored_turns(fresh: Path) -> None:
    first = invoke("memory", "compact", "-i", CONVERSATION, "-c", fresh)
    assert first.exit_code == 0, first.output
    assert "stored 30 new turn(s) of 30 message(s)" in first.stdout
    assert "turns compacted" in first.stdout and "watermark" in first.stdout
    again = invoke("memory", "compact", "-i", CONVERSATION, "-c", fresh, "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["turns_stored"] == 0
    assert "ingest" not in report  # nothing new, nothing more to compact


def test_status_after_compact_shows_segments(compacted: Path) -> None:
    status = json.loads(invoke("memory", "status", "-c", compacted, "--json").stdout)
    assert status["turns"] == 30
    assert status["segments"] > 0
    assert 0 < status["compaction_watermark"] <= 30
    assert status["live_tokens"] < status["context_window"]
    table = invoke("memory", "status", "-c", compacted)
    assert table.exit_code == 0, table.output
    assert "segments" in table.stdout and "512 tokens" in table.stdout


def test_tags_lists_counts_and_summary_state(compacted: Path) -> None:
    rows = json.loads(invoke("memory", "tags", "-c", compacted, "--json").stdout)
    assert rows and rows == sorted(rows, key=lambda r: -r["turns"])
    by_tag = {r["tag"]: r for r in rows}
    assert by_tag["kitchen"]["turns"] >= 3
    assert any(r["summary"] for r in rows)
    table = invoke("memory", "tags", "-c", compacted, "--limit", "5")
    assert table.exit_code == 0, table.output
    assert "kitchen" in table.stdout


def test_recall_prints_the_tag_summary_and_its_segments(compacted: Path) -> None:
    data = json.loads(invoke("memory", "recall", "Quartz", "-c", compacted, "--json").stdout)
    assert data["tag"] == "quartz"
    assert data["segments"] and all("quartz" in s["tags"] for s in data["segments"])
    result = invoke("memory", "recall", "quartz", "-c", compacted)
    assert result.exit_code == 0, result.output
    assert data["summary"]["summary"] in result.stdout
    assert f"{len(data['segments'])} segment(s) tagged 'quartz'" in result.stdout


def test_recall_of_an_unknown_tag_lists_close_matches(compacted: Path) -> None:
    assert_error(invoke("memory", "recall", "kitchn", "-c", compacted), "close matches: kitchen")


def test_recall_of_an_unknown_tag_without_close_matches_lists_the_most_used(
    compacted: Path,
) -> None:
    rows = json.loads(invoke("memory", "tags", "-c", compacted, "--json").stdout)
    most_used = ", ".join(r["tag"] for r in rows[:8])  # as `memory tags` orders them
    result = invoke("memory", "recall", "zzqqxx", "-c", compacted)
    assert_error(result, f"; most used tags: {most_used}")
    assert result.stderr.splitlines()[0].endswith(most_used)


def test_retrieve_json_has_the_matched_tags_and_signals(compacted: Path) -> None:
    question = "What did the vet say about Biscuit's ears?"
    result = invoke("memory", "retrieve", "-m", question, "-c", compacted)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "biscuit" in data["matched_tags"]
    assert data["broad"] is False and data["temporal"] is False
    assert data["recalled"] and set(data["recalled"][0]) >= {"seq", "score", "signals"}
    assert any("Riverside" in r["text"] for r in data["recalled"])
    assert 0 < data["budget"]["used"] <= data["budget"]["budget"]


def test_transform_prints_a_verbatim_turn_and_the_budget(compacted: Path) -> None:
    question = "What did the vet say about Biscuit's ears?"
    result = invoke("memory", "transform", "-m", question, "-c", compacted, "--budget", "1024")
    assert result.exit_code == 0, result.output
    assert "Constant ear scratching in dogs is often an ear infection or an allergy." in (
        result.stdout
    )
    assert "<memory>" in result.stdout
    assert "of 1,024 tokens; tags: biscuit" in result.stderr
    assert "recalled turns" in result.stderr


def test_quote_finds_a_compacted_turn(compacted: Path) -> None:
    result = invoke("memory", "quote", "Calacatta Mist", "-c", compacted, "--json")
    assert result.exit_code == 0, result.output
    quotes = json.loads(result.stdout)
    first = next(q for q in quotes if q["seq"] == 7)
    assert first["compacted"] is True and first["segment_id"] is not None
    assert "Calacatta Mist" in first["excerpt"]


def test_aliases_add_then_list(fresh: Path) -> None:
    added = invoke("memory", "aliases", "add", "K8s", "Kubernetes", "-c", fresh)
    assert added.exit_code == 0, added.output
    assert added.stdout.strip() == "alias k8s → kubernetes"
    listed = invoke("memory", "aliases", "list", "-c", fresh)
    assert listed.stdout.strip() == "k8s → kubernetes"
    as_json = invoke("memory", "aliases", "list", "-c", fresh, "--json")
    assert json.loads(as_json.stdout) == {"k8s": "kubernetes"}
    cycle = invoke("memory", "aliases", "add", "kubernetes", "k8s", "-c", fresh)
    assert_error(cycle, "would make a cycle")


def test_aliases_added_with_a_session_stay_in_it_and_are_removed(compacted: Path) -> None:
    added = invoke("memory", "aliases", "add", "slab", "marble", "-s", "default", "-c", compacted)
    assert added.exit_code == 0, added.output
    assert added.stdout.strip() == "alias slab → marble in session 'default'"
    scoped = invoke("memory", "aliases", "list", "-s", "default", "-c", compacted, "--json")
    assert json.loads(scoped.stdout)["slab"] == "marble"
    everywhere = invoke("memory", "aliases", "list", "-c", compacted, "--json")
    assert "slab" not in json.loads(everywhere.stdout)
    other = invoke("memory", "aliases", "add", "x", "y", "-s", "nope", "-c", compacted)
    assert_error(other, "no session 'nope'")
    removed = invoke("memory", "aliases", "remove", "slab", "-s", "default", "-c", compacted)
    assert removed.exit_code == 0 and "removed alias slab" in removed.stdout
    again = invoke("memory", "aliases", "remove", "slab", "-s", "default", "-c", compacted)
    assert_error(again, "no alias 'slab' in session 'default'")


def test_aliases_remove_a_store_wide_alias(fresh: Path) -> None:
    assert invoke("memory", "aliases", "add", "db", "database", "-c", fresh).exit_code == 0
    removed = invoke("memory", "aliases", "remove", "DB", "-c", fresh)
    assert removed.exit_code == 0, removed.output
    assert invoke("memory", "aliases", "list", "-c", fresh, "--json").stdout.strip() == "{}"
    assert_error(invoke("memory", "aliases", "remove", "db", "-c", fresh), "no alias 'db'")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["aliases", "frob"], "unknown action 'frob'"),
        (["aliases", "remove"], "remove takes ALIAS"),
        (["aliases", "add", "db"], "add takes ALIAS CANONICAL"),
        (["aliases", "list", "db"], "list takes no tags"),
        (["status", "-s", "nope"], "no session 'nope'"),
        (["recall", "kitchen", "-s", "nope"], "no session 'nope'"),
        (["retrieve", "-m", " "], "--message is empty"),
        (["transform", "-m", "hi", "--budget", "10"], "--budget must be at least 64"),
        (["quote", "x", "-k", "0"], "-k must be a positive"),
        (["tags", "--limit", "-3"], "--limit must be 0 or more, got -3"),
        (["tags", "--limit", "-1", "--json"], "--limit must be 0 or more, got -1"),
        (["retrieve", "-m", "hi", "--limit", "-1"], "--limit must be 0 or more, got -1"),
    ],
)
def test_memory_bad_input(compacted: Path, args: list[str], fragment: str) -> None:
    assert_error(invoke("memory", *args, "-c", compacted), fragment)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('[{"role": "user", "content": "hi"},', "invalid JSON at line 1"),
        ('{"conversation": []}', 'expected a list of messages or an object with a "messages"'),
        ('"hello"', "expected a list of messages, got a string"),
        ("[]", "the message list is empty"),
        ('[{"role": "user", "content": "a"}, {"text": "b"}]', "message 2 must be an object"),
        ('[{"role": "robot", "content": "a"}]', "message 1: role:"),
    ],
)
def test_compact_rejects_a_bad_message_file(
    fresh: Path, tmp_path: Path, content: str, fragment: str
) -> None:
    path = tmp_path / "msgs.json"
    path.write_text(content, encoding="utf-8")
    result = invoke("memory", "compact", "-i", path, "-c", fresh)
    assert_error(result, f"{path}: {fragment}")


def test_config_validate_ok_prints_a_summary(fresh: Path) -> None:
    result = invoke("config", "validate", fresh)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: {fresh}")
    assert "512 tokens (cl100k_base)" in result.stdout
    assert "embedder none" in result.stdout
    data = json.loads(invoke("config", "validate", fresh, "--json").stdout)
    assert data["ok"] is True and data["config"]["context_window"] == 512


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("recall:\n  embedder: none\n   rrf_k: 3\n", "invalid YAML at line 3"),
        ("context_windw: 512\n", "1 invalid setting"),
        ("compaction: {soft_threshold: 0.9, hard_threshold: 0.8}\n", "1 invalid setting"),
        ("- a list\n", "expected a mapping at the top level"),
    ],
)
def test_config_validate_reports_errors(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "contextfold.yaml"
    path.write_text(content, encoding="utf-8")
    assert_error(invoke("config", "validate", path), fragment)


def test_config_validate_names_the_bad_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_error(invoke("config", "validate"), "not found; create one with `contextfold init")
    Path("contextfold.yaml").write_text("context_windw: 512\n", encoding="utf-8")
    result = invoke("config", "validate")
    assert_error(result, "contextfold.yaml: 1 invalid setting")
    assert "context_windw: Extra inputs are not permitted" in result.stderr


PASTED_KEY = "sk-proj-Zq4T8mV1xR7bN2kLp9Wc3Yd6Hf0Js5Ga"


@pytest.mark.parametrize(
    "content",
    [
        f"llm: {{provider: openai, model: gpt-4o-mini, api_key_env: {PASTED_KEY}}}\n",
        "llm: {provider: openai, model: m, api_key_env: Zq4T8mV1xR7bN2kLp9Wc3Yd6Hf0Js5Ga}\n",
        "llm: {provider: openai, model: m, api_key_env: 'my key'}\n",
        f"dashboard: {{token_env: {PASTED_KEY}}}\n",  # a server config
        f"secret_env: {PASTED_KEY}\n",
        "context_api: {api_keys: {ghp_Zq4T8mV1xR7bN2kLp9Wc3Yd6Hf0Js5Ga: [support]}}\n",
    ],
)
@pytest.mark.parametrize("json_out", [False, True])
def test_config_validate_refuses_a_pasted_key_without_echoing_it(
    tmp_path: Path, content: str, json_out: bool
) -> None:
    path = tmp_path / "conf.yaml"
    path.write_text(content, encoding="utf-8")
    result = invoke("config", "validate", path, *(["--json"] if json_out else []))
    assert result.exit_code == 2, result.output
    for secret in (PASTED_KEY, "Zq4T8mV1xR7bN2kLp9Wc3Yd6Hf0Js5Ga", "my key"):
        assert secret not in result.output
    assert "the value is not shown" in result.output or "looks like an API key" in result.output


@pytest.mark.parametrize(
    ("content", "kind", "fragment"),
    [
        ("context_windw: 512\n", "memory", "context_windw: Extra inputs are not permitted"),
        ("recall:\n  embedder: none\n   rrf_k: 3\n", "memory", "invalid YAML at line 3"),
        ("port: 99999\n", "server", "port: Input should be less than or equal to 65535"),
        ("server:\n  host: 0.0.0.0\n", "server", "not under 'server:'; remove that line"),
    ],
)
def test_config_validate_json_is_json_when_the_file_is_invalid(
    tmp_path: Path, content: str, kind: str, fragment: str
) -> None:
    path = tmp_path / "conf.yaml"
    path.write_text(content, encoding="utf-8")
    result = invoke("config", "validate", path, "--json")
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert (data["ok"], data["kind"], data["error"]) == (False, kind, "ConfigError")
    assert fragment in data["message"]
    assert result.stderr == ""


def test_config_validate_checks_a_server_config_by_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        "host: 0.0.0.0\ncontext_api:\n  api_keys:\n    SUPPORT_API_KEY: [support, shared]\n"
        "dashboard:\n  token_env: CONTEXTFOLD_DASHBOARD_TOKEN\n",
        encoding="utf-8",
    )
    result = invoke("config", "validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: {path} (server config)")
    assert "1 (SUPPORT_API_KEY)" in result.stdout
    data = json.loads(invoke("config", "validate", path, "--json").stdout)
    assert data["kind"] == "server" and data["config"]["host"] == "0.0.0.0"


@pytest.mark.parametrize("kind", ["chat", "coding", "rag"])
def test_init_writes_a_template_that_validates(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "conf" / f"{kind}.yaml"
    result = invoke("init", kind, "--path", path)
    assert result.exit_code == 0, result.output
    assert f"wrote {path} ({kind} template)" in result.stdout
    assert path.read_text(encoding="utf-8").startswith("# contextfold.yaml")
    checked = invoke("config", "validate", path)
    assert checked.exit_code == 0, checked.output
    assert checked.stdout.startswith(f"ok: {path}")


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    path = tmp_path / "contextfold.yaml"
    path.write_text("# mine\n", encoding="utf-8")
    assert_error(invoke("init", "chat", "--path", path), "already exists; pass --force")
    assert path.read_text(encoding="utf-8") == "# mine\n"
    assert invoke("init", "chat", "--path", path, "--force").exit_code == 0
    assert "template: chat" in path.read_text(encoding="utf-8")
    assert_error(invoke("init", "poem", "--path", tmp_path / "x.yaml"), "unknown template")


def test_cost_report_of_an_empty_session(fresh: Path) -> None:
    result = invoke("cost-report", "-c", fresh)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "no LLM calls logged for session 'default'"
    report = json.loads(invoke("cost-report", "--all", "-c", fresh, "--json").stdout)
    assert report == {
        "calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "by_kind": {},
    }
    assert_error(invoke("cost-report", "--all", "-s", "x", "-c", fresh), "not both")
    assert not (fresh.parent / "memory.db").exists(), "a report created the store it read"


def test_only_commands_that_call_the_llm_need_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = write_config(tmp_path, "llm: {provider: openai, model: gpt-4o-mini}\n")
    assert invoke("cost-report", "-c", config).exit_code == 0
    assert invoke("memory", "aliases", "list", "-c", config).exit_code == 0
    result = invoke("memory", "compact", "-i", CONVERSATION, "-c", config)
    assert_error(result, "openai needs an API key: set OPENAI_API_KEY")


def test_an_unopenable_store_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder", encoding="utf-8")
    config = tmp_path / "contextfold.yaml"
    config.write_text(f"storage_path: {tmp_path / 'file' / 'memory.db'}\n", encoding="utf-8")
    assert_error(invoke("memory", "status", "-c", config), "cannot open the memory store")


def test_chat_replay_of_a_txt_file_writes_every_turn(fresh: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "We are planning a trip to Lisbon in May.\n\nOur dog Pepper needs a sitter.\n"
        "Where in Lisbon did we want to stay?\n",
        encoding="utf-8",
    )
    out = tmp_path / "session.json"
    result = invoke("chat", "--replay", prompts, "-c", fresh, "--out", out)
    assert result.exit_code == 0, result.output
    assert "replay into session 'default'" in result.stdout
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [t["turn"] for t in data["turns"]] == [1, 2, 3]
    assert {t["reply_source"] for t in data["turns"]} == {"placeholder"}
    assert "lisbon" in data["turns"][-1]["matched_tags"]
    assert len(data["messages"]) == 6 and data["messages"][1]["content"] == "(no model configured)"


def test_chat_replay_of_a_json_conversation_reuses_replies_and_compacts(
    fresh: Path, tmp_path: Path
) -> None:
    out = tmp_path / "session.json"
    result = invoke("chat", "--replay", CONVERSATION, "-c", fresh, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    turns = json.loads(out.read_text(encoding="utf-8"))["turns"]
    assert len(turns) == 15 and {t["reply_source"] for t in turns} == {"file"}
    assert sum(t["compacted_turns"] for t in turns) > 0
    assert turns[-1]["memory_tokens"] > 0 and "backsplash" in turns[-1]["matched_tags"]
    again = invoke("chat", "--replay", out, "-c", fresh, "-s", "copy", "--json")
    assert again.exit_code == 0, again.output
    assert [t["reply"] for t in json.loads(again.stdout)["turns"]] == [t["reply"] for t in turns]


def test_chat_replay_of_the_example_shows_memory_at_work_with_a_small_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented command: under the default 120,000-token window the example never
    compacts, so memory stays empty; with --context-window 1024 it compacts and recalls."""
    monkeypatch.chdir(tmp_path)  # no ./contextfold.yaml: the defaults
    default = invoke("chat", "--replay", CONVERSATION, "--json", "-s", "wide")
    assert default.exit_code == 0, default.output
    assert {t["recalled"] for t in json.loads(default.stdout)["turns"]} == {0}
    small = invoke("chat", "--replay", CONVERSATION, "--context-window", "1024", "--json")
    assert small.exit_code == 0, small.output
    turns = json.loads(small.stdout)["turns"]
    assert sum(t["compacted_turns"] for t in turns) > 0
    assert max(t["recalled"] for t in turns) > 0 and turns[-1]["memory_tokens"] > 0
    assert "backsplash" in turns[-1]["matched_tags"]
    too_small = invoke("chat", "--replay", CONVERSATION, "--context-window", "100")
    assert_error(too_small, "--context-window: 1 invalid setting")
    assert "context_window: Input should be greater than or equal to 512" in too_small.stderr


def test_chat_replay_asks_the_configured_llm_and_logs_its_cost(tmp_path: Path, fake_llm) -> None:
    fake_llm.reply = "Alfama or Príncipe Real are good bases."
    llm = (
        f"llm: {{provider: openai, model: test-model, base_url: '{fake_llm.base_url}', "
        "prompt_price_per_million: 1.0, completion_price_per_million: 2.0}\n"
    )
    config = write_config(tmp_path, llm)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Where should we stay in Lisbon?\nAnd for one night in Porto?\n")
    result = invoke("chat", "--replay", prompts, "-c", config, "--json")
    assert result.exit_code == 0, result.output
    turns = json.loads(result.stdout)["turns"]
    assert [t["reply_source"] for t in turns] == ["llm", "llm"]
    assert turns[0]["reply"] == "Alfama or Príncipe Real are good bases."
    assert fake_llm.requests[-1].body["messages"][-1]["content"] == "And for one night in Porto?"
    report = json.loads(invoke("cost-report", "-c", config, "--json").stdout)
    assert report["calls"] == 2 and report["cost_usd"] > 0 and set(report["by_kind"]) == {"chat"}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "the chat needs a terminal"),
        (["--headless"], "--headless runs a file: pass --replay FILE"),
        (["--replay", "/no/such/prompts.txt"], "no such file"),
        (["--replay", str(CONVERSATION), "--budget", "8"], "--budget must be at least 64"),
        (["--replay", str(CONVERSATION), "--out", "/no/such/dir/s.json"], "cannot write"),
    ],
)
def test_chat_bad_input(fresh: Path, args: list[str], fragment: str) -> None:
    assert_error(invoke("chat", *args, "-c", fresh), fragment)


@pytest.mark.parametrize("where", ["missing/s.json", "folder"])
def test_chat_replay_checks_out_before_storing_anything(
    fresh: Path, tmp_path: Path, where: str
) -> None:
    """An --out that cannot be written is refused before the replay: nothing is stored, so
    running it again with a good --out does not store the conversation twice."""
    (tmp_path / "folder").mkdir()
    bad = tmp_path / where
    result = invoke("chat", "--replay", CONVERSATION, "-c", fresh, "--out", bad)
    assert_error(result, f"{bad}: cannot write")
    assert not bad.is_file()
    assert_error(invoke("memory", "status", "-c", fresh), "no session 'default'")
    good = tmp_path / "s.json"
    again = invoke("chat", "--replay", CONVERSATION, "-c", fresh, "--out", good, "--no-progress")
    assert again.exit_code == 0, again.output
    status = json.loads(invoke("memory", "status", "-c", fresh, "--json").stdout)
    assert status["turns"] == 30


def test_transform_says_what_expiry_held_back(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "tagger: {keywords: {debugging: [websocket]}}\n"
        "tag_rules: [{match: 'debug*', ttl_days: 7}]\n",
    )
    with MemoryEngine(load_config(config), embedder=None) as engine:
        engine.on_turn_complete(
            [{"role": "user", "content": "The websocket test is flaky."}],
            timestamps=[datetime(2020, 1, 1, tzinfo=UTC)],
        )
    result = invoke("memory", "transform", "-m", "the websocket test?", "-c", config)
    assert result.exit_code == 0, result.output
    assert "expired (held back)" in result.stderr and "1 turn(s) of debugging" in result.stderr
    as_json = invoke("memory", "retrieve", "-m", "the websocket test?", "-c", config)
    assert json.loads(as_json.stdout)["expired"] == {"tags": ["debugging"], "turns_held_back": 1}


READ_ONLY = [
    ["status"],
    ["status", "--json"],
    ["tags"],
    ["domains"],
    ["recall", "kitchen"],
    ["quote", "kitchen"],
    ["retrieve", "-m", "the kitchen?"],
    ["transform", "-m", "the kitchen?"],
    ["compact"],  # nothing to ingest: nothing to compact either
    ["export", "out"],
]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: " ".join(a))
def test_a_command_that_reads_memory_does_not_create_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """In a fresh home, a command that only reads memory says there is none yet and creates
    nothing (no memory.db); the first conversation creates the store."""
    home = tmp_path / "home"
    monkeypatch.chdir(tmp_path)  # no ./contextfold.yaml: the default store
    monkeypatch.setenv("CONTEXTFOLD_HOME", str(home))
    monkeypatch.delenv("CONTEXTFOLD_STORE_URL", raising=False)
    result = invoke("memory", *args)
    assert_error(result, f"no memory store at {home / 'memory.db'} yet")
    assert "memory compact" in result.stderr and "chat" in result.stderr
    assert not home.exists() or list(home.iterdir()) == []
    assert not (tmp_path / "out").exists()

    stored = invoke("memory", "compact", "-i", CONVERSATION)
    assert stored.exit_code == 0, stored.output
    assert (home / "memory.db").is_file()


def test_a_configured_store_that_is_not_there_is_named(tmp_path: Path) -> None:
    config = tmp_path / "contextfold.yaml"
    config.write_text(f"{SMALL}storage_path: {tmp_path / 'db' / 'memory.db'}\n", "utf-8")
    assert_error(invoke("memory", "status", "-c", config), f"no memory store at {tmp_path / 'db'}")
    assert not (tmp_path / "db").exists()


def test_a_command_that_reads_memory_creates_no_postgres_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    import psycopg

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONTEXTFOLD_STORE_URL", postgres_url)
    for args in (["status"], ["tags"], ["export", "out"]):
        result = invoke("memory", *args)
        assert result.exit_code == 2, result.output
        first = result.stderr.splitlines()[0]
        assert first.startswith("error: ") and "no memory store at postgresql://" in first, first
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    assert rows == []
