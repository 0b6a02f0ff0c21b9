"""``contextfold mcp`` through the MCP SDK's own client over stdio.

Each server is the real console script started as a subprocess by ``mcp.client.stdio``; the
tests drive ``mcp.Client`` from sync code through an anyio blocking portal. The memory store
(``examples/conversation.json``, compacted in a 512-token window, no embedder) and the document
corpus (BM25 only) are seeded through the library into a tmp home before the server starts, so
nothing loads a model and nothing touches the network. The server's stderr goes to a file that
the tests check for tracebacks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent
from typer.testing import CliRunner

from contextfold.cli import app
from contextfold.memory.config import load_config
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.index import DocumentIndex

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CONVERSATION = json.loads((ROOT / "examples" / "conversation.json").read_text(encoding="utf-8"))
CONTEXTFOLD = Path(sys.executable).with_name("contextfold")
TOOLS = {
    "recall_context",
    "compact_context",
    "domain_status",
    "expand_topic",
    "collapse_topic",
    "find_quote",
    "search_documents",
    "get_context",
}
DOCS = [
    ("Refunds are processed within 14 days of the request. Contact billing.", "refunds.md"),
    ("The office is closed on public holidays. Support answers within a day.", "hours.md"),
    ("Shipping to Canada takes five to eight business days by ground.", "shipping.md"),
]


@dataclass
class Home:
    folder: Path
    config: Path
    db: Path


def make_home(folder: Path, *, seed: bool) -> Home:
    """A tmp home with a config; with ``seed``, the demo conversation stored and compacted in
    session ``demo`` and three documents ingested (tenant ``acme``)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "contextfold.yaml"
    config.write_text(
        f"context_window: 512\nrecall: {{embedder: none}}\nstorage_path: {folder / 'memory.db'}\n",
        encoding="utf-8",
    )
    db = folder / "documents.db"
    if seed:
        with MemoryEngine(load_config(config), session_id="demo") as engine:
            engine.on_turn_complete(CONVERSATION)
            engine.compact()
        index = DocumentIndex(db, embedder=False)
        for text, source in DOCS:
            index.add_document(text, {"kind": "policy"}, tenant="acme", source=source)
        index.save()
        index.store.close()
    return Home(folder, config, db)


@dataclass
class Server:
    """A running ``contextfold mcp`` and the SDK client connected to it."""

    client: Client
    portal: BlockingPortal
    stderr: Path

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
        result: CallToolResult = self.portal.call(self.client.call_tool, name, arguments or {})
        return result

    def ok(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The structured result of a call that must succeed (and match its text content)."""
        result = self.call(name, arguments)
        text = result.content[0]
        assert isinstance(text, TextContent)
        assert not result.is_error, text.text
        assert result.structured_content is not None
        assert json.loads(text.text) == result.structured_content
        return result.structured_content

    def error(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        result = self.call(name, arguments)
        assert result.is_error
        text = result.content[0]
        assert isinstance(text, TextContent)
        return text.text

    def read(self, uri: str) -> Any:
        result = self.portal.call(self.client.read_resource, uri)
        contents = result.contents[0]
        assert contents.mime_type == "application/json"
        return json.loads(contents.text)  # type: ignore[union-attr]

    def prompt(self, name: str, arguments: dict[str, str] | None = None) -> str:
        result = self.portal.call(self.client.get_prompt, name, arguments)
        assert [m.role for m in result.messages] == ["user"]
        content = result.messages[0].content
        assert isinstance(content, TextContent)
        return content.text


@contextmanager
def serve(home: Home, *args: str, mode: str = "auto", embed: bool = False) -> Iterator[Server]:
    params = StdioServerParameters(
        command=str(CONTEXTFOLD),
        args=["mcp", "--config", str(home.config), "--db", str(home.db), *args]
        + ([] if embed else ["--no-embed"]),
        env={"CONTEXTFOLD_HOME": str(home.folder / "home")},
        cwd=str(home.folder),
    )
    stderr = home.folder / "server-stderr.log"
    with (
        stderr.open("w", encoding="utf-8") as errlog,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=60)
        ) as client,
    ):
        yield Server(client, portal, stderr)
    assert "Traceback" not in stderr.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The seeded home, served for session ``demo`` (tests here only read or page topics)."""
    home = make_home(tmp_path_factory.mktemp("mcp-seeded"), seed=True)
    with serve(home, "--session", "demo") as running:
        yield running


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Home]]:
    """An empty store and no corpus, connected with the legacy initialize handshake (what
    Claude Desktop and most clients speak)."""
    home = make_home(tmp_path_factory.mktemp("mcp-empty"), seed=False)
    with serve(home, "--session", "fresh", mode="legacy") as running:
        yield running, home


# -- listing ------------------------------------------------------------------------------------


def test_lists_every_tool_with_a_description_and_typed_schemas(server: Server) -> None:
    tools = {t.name: t for t in server.portal.call(server.client.list_tools).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 60, tool.name
        assert "\n" not in tool.description and "  " not in tool.description
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False, tool.name  # extras refused
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
    recall = tools["recall_context"].input_schema
    assert recall["required"] == ["message"]
    assert recall["properties"]["budget"]["anyOf"][0]["minimum"] == 64
    assert tools["expand_topic"].input_schema["properties"]["depth"]["enum"] == [
        "summary",
        "segments",
        "full",
    ]
    assert tools["search_documents"].input_schema["properties"]["mode"]["default"] == "hybrid"
    assert tools["domain_status"].annotations is not None
    assert tools["domain_status"].annotations.read_only_hint is True


def test_lists_resources_the_topic_template_and_prompts(server: Server) -> None:
    resources = server.portal.call(server.client.list_resources).resources
    assert [(r.uri, r.mime_type) for r in resources] == [
        ("contextfold://topics", "application/json")
    ]
    templates = server.portal.call(server.client.list_resource_templates).resource_templates
    assert [t.uri_template for t in templates] == ["contextfold://topics/{tag}"]
    prompts = {p.name: p for p in server.portal.call(server.client.list_prompts).prompts}
    assert set(prompts) == {"recall", "summarize_session"}
    assert [(a.name, a.required) for a in prompts["recall"].arguments or []] == [("topic", True)]
    assert [(a.name, a.required) for a in prompts["summarize_session"].arguments or []] == [
        ("focus", False)
    ]


# -- memory tools -------------------------------------------------------------------------------


def test_recall_context_brings_back_a_compacted_fact(server: Server) -> None:
    status = server.ok("domain_status")
    assert status["compaction_watermark"] > 1  # turn 1 (the quote) is compacted
    result = server.ok("recall_context", {"message": "What did Marek quote for the kitchen?"})
    assert result["session_id"] == "demo"
    assert "kitchen" in result["matched_tags"]
    assert "$18,500" in result["prepend_text"]
    assert 0 < result["tokens_used"] <= result["budget"]


def test_recall_context_stays_within_the_given_budget(server: Server) -> None:
    history = [{"role": "user", "content": CONVERSATION[-2]["content"]}]
    result = server.ok(
        "recall_context",
        {"message": "Which countertop did we pick?", "history": history, "budget": 96},
    )
    assert result["budget"] == 96
    assert result["tokens_used"] <= 96


def test_domain_status_reports_the_seeded_session(server: Server) -> None:
    status = server.ok("domain_status")
    assert status["session_id"] == "demo"
    assert status["turns"] == len(CONVERSATION)
    assert status["segments"] > 0
    assert status["live_tokens"] < status["context_window"] == 512
    assert status["tags"]["kitchen"] >= 2
    assert status["level"] == "none"


def test_expand_then_collapse_pages_a_topic_in_and_out(server: Server) -> None:
    full = server.ok("expand_topic", {"tag": "Kitchen"})  # any spelling
    assert (full["tag"], full["depth"]) == ("kitchen", "full")
    assert "Marek Nowak" in full["content"]
    assert full["changes"][0]["after"] == "full"
    assert full["working_set_tokens"] <= full["budget"]
    assert server.ok("domain_status")["working_set"]["kitchen"] == "full"
    summary = server.ok("collapse_topic", {"tag": "kitchen"})
    assert summary["depth"] == "summary" and summary["tokens"] < full["tokens"]
    gone = server.ok("collapse_topic", {"tag": "kitchen", "depth": "none"})
    assert (gone["depth"], gone["tokens"], gone["content"]) == ("none", 0, "")


def test_collapsing_an_unknown_topic_is_an_error_and_leaves_the_working_set(
    server: Server,
) -> None:
    before = server.ok("domain_status")["working_set"]
    for depth in ("summary", "none"):
        message = server.error("collapse_topic", {"tag": "kitchn", "depth": depth})
        assert "no stored topic 'kitchn'; stored topics: " in message
        assert "none yet" not in message  # the stored topics, as expand_topic lists them
    assert server.ok("domain_status")["working_set"] == before
    assert "kitchn" not in before


def test_find_quote_finds_a_raw_compacted_turn(server: Server) -> None:
    result = server.ok("find_quote", {"query": "40% deposit", "limit": 3})
    quotes = result["quotes"]
    assert 1 <= len(quotes) <= 3
    assert quotes[0]["seq"] == 3 and quotes[0]["role"] == "user"
    assert "40% deposit" in quotes[0]["excerpt"]
    assert quotes[0]["compacted"] is True
    assert "deposit" in quotes[0]["tags"]


# -- corpus tools -------------------------------------------------------------------------------


def test_search_documents_ranks_the_matching_chunk_first(server: Server) -> None:
    result = server.ok("search_documents", {"query": "how long do refunds take", "k": 2})
    assert result["mode"] == "hybrid"
    hits = result["hits"]
    assert len(hits) == 2
    assert hits[0]["metadata"]["source"] == "refunds.md"
    assert hits[0]["metadata"]["tenant"] == "acme"
    assert hits[0]["match_source"] == "bm25"  # --no-embed: hybrid is BM25 alone
    assert hits[0]["score"] >= hits[1]["score"]


def test_search_documents_filters_by_tenant(server: Server) -> None:
    query = {"query": "refunds", "mode": "bm25"}
    assert server.ok("search_documents", {**query, "tenants": ["acme"]})["hits"]
    assert server.ok("search_documents", {**query, "tenants": ["globex"]})["hits"] == []


def test_get_context_composes_labelled_sources_within_max_tokens(server: Server) -> None:
    result = server.ok("get_context", {"query": "shipping to Canada", "k": 2})
    context = result["context"]
    assert context.startswith("Query: shipping to Canada")
    assert "[Source 1: shipping.md]" in context
    assert "five to eight business days" in context
    query = {"query": "refunds, shipping or office hours", "k": 3}
    full = server.ok("get_context", query)
    assert full["context"].count("[Source ") == 3
    small = server.ok("get_context", {**query, "max_tokens": 64})
    assert small["tokens"] <= 64 < full["tokens"]
    assert small["context"].count("[Source ") < 3


# -- bad calls ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("find_quote", {"query": 5}, "Input should be a valid string, got a number"),
        ("find_quote", {}, "argument 'query' is missing; it takes a string of 1 to 100000"),
        ("find_quote", {"query": "x", "limit": 0}, "greater than or equal to 1"),
        ("recall_context", {"message": ""}, "at least 1 character"),
        ("recall_context", {"message": "hi", "budget": 10}, "greater than or equal to 64"),
        ("recall_context", {"message": "hi", "history": [{"role": "robot"}]}, "history.0.role"),
        ("expand_topic", {"tag": "nosuchtopic"}, "no stored topic 'nosuchtopic'; stored topics:"),
        ("collapse_topic", {"tag": "kitchen", "depth": "full"}, "'summary' or 'none'"),
        ("collapse_topic", {"tag": "kitchn"}, "no stored topic 'kitchn'; stored topics:"),
        ("search_documents", {"query": "x", "mode": "dense"}, "runs with --no-embed"),
        ("search_documents", {"query": "x", "mode": "fuzzy"}, "'bm25', 'dense' or 'hybrid'"),
        ("no_such_tool", {}, "Unknown tool: no_such_tool"),
        # strings and booleans are not numbers, nor numbers booleans
        ("recall_context", {"message": "hi", "budget": "100"}, "'budget': Input should be a"),
        ("recall_context", {"message": "hi", "budget": True}, "got a boolean"),
        ("find_quote", {"query": "x", "limit": 2.5}, "'limit': Input should be a valid integer"),
        ("compact_context", {"force": "yes"}, "'force': Input should be a valid boolean"),
        # unknown arguments are refused, naming them and the ones the tool takes
        (
            "recall_context",
            {"message": "x", "extra": 1},
            "recall_context: unknown argument 'extra'; it takes message, history, budget",
        ),
        ("domain_status", {"x": 1, "y": 2}, "unknown arguments 'x', 'y'; it takes no arguments"),
    ],
)
def test_a_bad_call_is_a_tool_error_and_the_server_keeps_serving(
    server: Server, tool: str, arguments: dict[str, Any], message: str
) -> None:
    assert message in server.error(tool, arguments)
    assert server.ok("domain_status")["turns"] == len(CONVERSATION)


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        (
            "recall_context",
            {"message": "x", "budget": "100"},
            "recall_context: argument 'budget': Input should be a valid integer, got a string; "
            "it takes an integer from 64 to 200000, or null",
        ),
        (
            "get_context",
            {"query": "x", "max_tokens": 10},
            "get_context: argument 'max_tokens': Input should be greater than or equal to 64; "
            "it takes an integer from 64 to 200000",
        ),
        (
            "expand_topic",
            {"tag": "kitchen", "depth": "all"},
            "expand_topic: argument 'depth': Input should be 'summary', 'segments' or 'full'; "
            "it takes one of 'summary', 'segments', 'full'",
        ),
        (
            "search_documents",
            {"query": "x", "tenants": "acme"},
            "search_documents: argument 'tenants': Input should be a valid list, got a string; "
            "it takes a list of strings, or null",
        ),
        (
            "compact_context",
            {"messages": [{"role": "user"}]},
            "compact_context: argument 'messages.0.content' is missing",
        ),
        ("expand_topic", {"tag": "nosuchtopic"}, "no stored topic 'nosuchtopic'"),
    ],
)
def test_a_bad_argument_is_one_short_message_without_the_sdk_wrapping(
    server: Server, tool: str, arguments: dict[str, Any], message: str
) -> None:
    """docs/mcp.md: a bad call says what was wrong and what to do; `Error executing tool` is
    for unexpected failures only, and pydantic's report (its URL, the input echoed) is not it."""
    text = server.error(tool, arguments)
    assert text.startswith(message)
    for noise in ("Error executing tool", "validation error", "pydantic", "Arguments", "input_"):
        assert noise not in text


# -- resources and prompts ----------------------------------------------------------------------


def test_topics_resource_lists_topics_with_turn_counts_and_gists(server: Server) -> None:
    data = server.read("contextfold://topics")
    assert data["session_id"] == "demo" and data["turns"] == len(CONVERSATION)
    topics = {t["tag"]: t for t in data["topics"]}
    status = server.ok("domain_status")
    assert {tag: t["turns"] for tag, t in topics.items()} == status["tags"]
    kitchen = topics["kitchen"]
    assert kitchen["segments"] > 0
    assert "Marek Nowak" in kitchen["gist"]
    assert len(kitchen["gist"]) <= 200


def test_topic_resource_shows_the_tag_summary_and_segments(server: Server) -> None:
    data = server.read("contextfold://topics/kitchens")  # plural folds to the stored tag
    assert data["tag"] == "kitchen"
    assert data["summary"]["tokens"] > 0 and "Marek" in data["summary"]["summary"]
    assert data["segments"]
    for segment in data["segments"]:
        assert "kitchen" in segment["tags"]
        assert segment["first_seq"] <= segment["last_seq"]
        assert "full_text" not in segment


def test_unknown_topic_resource_is_invalid_params_naming_close_tags(server: Server) -> None:
    with pytest.raises(MCPError) as raised:
        server.portal.call(server.client.read_resource, "contextfold://topics/kitchn")
    assert raised.value.code == INVALID_PARAMS
    assert "no topic 'kitchn' in session 'demo'; close: kitchen" in raised.value.message


def test_recall_prompt_carries_the_recalled_memory(server: Server) -> None:
    text = server.prompt("recall", {"topic": "the kitchen contractor"})
    assert text.startswith("Recall what we discussed about 'the kitchen contractor'")
    assert "Marek Nowak" in text
    assert "find_quote" in text and "expand_topic" in text


def test_summarize_session_prompt_lists_topics_and_state(server: Server) -> None:
    text = server.prompt("summarize_session", {"focus": "kitchen"})
    assert "session 'demo', focusing on 'kitchen'" in text
    assert f"It has {len(CONVERSATION)} stored turns" in text
    assert "- kitchen (" in text
    assert server.prompt("summarize_session") != text  # focus is optional


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("recall", {}, "prompt 'recall' needs the argument(s): topic"),
        ("recall", {"topic": "  "}, "prompt 'recall' needs a non-empty topic"),
        ("summarize_session", {"bogus": "1"}, "has no argument(s) bogus; it takes: focus"),
        ("no_such_prompt", {}, "unknown prompt 'no_such_prompt'; prompts: recall, summarize"),
    ],
)
def test_a_bad_prompt_call_is_invalid_params_with_a_message(
    server: Server, name: str, arguments: dict[str, str], message: str
) -> None:
    with pytest.raises(MCPError) as raised:
        server.prompt(name, arguments)
    assert raised.value.code == INVALID_PARAMS
    assert message in raised.value.message


def test_an_unknown_resource_uri_is_invalid_params(server: Server) -> None:
    with pytest.raises(MCPError) as raised:
        server.portal.call(server.client.read_resource, "contextfold://nothing")
    assert raised.value.code == INVALID_PARAMS
    assert "Unknown resource: contextfold://nothing" in raised.value.message


# -- an empty home, the legacy handshake ----------------------------------------------------------


def test_compact_context_stores_then_compacts_and_skips_stored_turns(
    empty: tuple[Server, Home],
) -> None:
    server, _ = empty
    assert server.ok("domain_status")["turns"] == 0
    first = server.ok("compact_context", {"messages": CONVERSATION})
    assert (first["session_id"], first["turns_stored"]) == ("fresh", len(CONVERSATION))
    assert first["compactions"] and first["compactions"][-1]["watermark_after"] > 1
    again = server.ok("compact_context", {"messages": CONVERSATION, "force": False})
    assert again["turns_stored"] == 0 and again["compactions"] == []
    assert server.ok("find_quote", {"query": "Calacatta Mist"})["quotes"]


def test_corpus_ingested_after_the_server_started_is_found(empty: tuple[Server, Home]) -> None:
    server, home = empty
    message = server.error("search_documents", {"query": "refunds"})
    assert f"no document corpus at {home.db}; ingest documents first" in message
    index = DocumentIndex(home.db, embedder=False)
    index.add_document(DOCS[0][0], source=DOCS[0][1])
    index.save()
    index.store.close()
    hits = server.ok("search_documents", {"query": "refunds"})["hits"]
    assert [h["metadata"]["source"] for h in hits] == ["refunds.md"]


def test_embed_serves_dense_and_hybrid_search_with_the_offline_model(tmp_path: Path) -> None:
    home = make_home(tmp_path, seed=False)
    index = DocumentIndex(home.db)  # the default offline MiniLM embedder
    for text, source in DOCS:
        index.add_document(text, source=source)
    index.save()
    index.store.close()
    with serve(home, embed=True) as server:
        dense = server.ok(
            "search_documents",
            {"query": "how long until I get my money back", "mode": "dense", "k": 1},
        )
        assert [h["metadata"]["source"] for h in dense["hits"]] == ["refunds.md"]
        assert dense["hits"][0]["match_source"] == "vector"
        hybrid = server.ok("search_documents", {"query": "refunds", "k": 1})
        assert hybrid["hits"][0]["match_source"] == "hybrid"
        # "money back" alone is under the hybrid mode's relevance floor (no word in common,
        # cosine below the hybrid floor): get_context is asked with a word of the document too
        context = server.ok("get_context", {"query": "money back on refunds"})["context"]
        assert "[Source 1: refunds.md]" in context


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "missing.yaml"], "config file 'missing.yaml' not found"),
        (["--log-level", "LOUD"], "--log-level must be one of DEBUG"),
        (["--session", " "], "--session is empty"),
    ],
)
def test_mcp_command_rejects_bad_options_before_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["mcp", *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # stdout belongs to the protocol
    assert result.stderr.startswith("error: ") and message in result.stderr


def test_mcp_command_without_the_sdk_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [m for m in sys.modules if m.startswith(("contextfold.mcp_server", "mcp."))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if the extra were not installed
    result = CliRunner().invoke(app, ["mcp"])
    assert result.exit_code == 2, result.output
    assert "the MCP server needs the mcp SDK (mcp is missing)" in result.stderr
    assert 'pip install "contextfold[mcp]"' in result.stderr


def test_bench_mcp_quick_writes_a_result(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_mcp.py"),
            "--quick",
            "--results-dir",
            str(tmp_path),
            "--results-md",
            str(tmp_path / "RESULTS.md"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (path,) = tmp_path.glob("mcp-*-quick.json")
    result = json.loads(path.read_text(encoding="utf-8"))
    assert set(result["configs"]) >= {"domain_status", "recall_context", "search_documents"}
    assert all(c["timings"]["n"] > 0 for c in result["configs"].values())
    assert all(result["correctness"].values())
