"""The ``contextfold`` command line, driven through typer's ``CliRunner``."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import contextfold
import contextfold.tokens
from contextfold.budget import fixed5_budget
from contextfold.cli import app
from contextfold.cli.request import parse_request
from contextfold.errors import TokenizerError
from contextfold.items import SourceType
from contextfold.tokens import CLAUDE_SAFETY_MARGIN, TiktokenCounter

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "travel_request.json"
TEXT = "Ride-hailing (Uber, Lyft) is reimbursable when public transport is impractical.\n"
SECTIONS = ("instructions", "goal", "memory", "retrieval", "tool_outputs")


def invoke(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(app, list(args), input=input)


def assert_clean_error(result: Result, code: int, fragment: str) -> None:
    """One ``error:`` line on stderr naming the problem, the exit code, no traceback."""
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit)  # not an unhandled exception
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert fragment in lines[0]


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"contextfold {contextfold.__version__}"


def test_python_dash_m_runs_the_same_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"contextfold {contextfold.__version__}"


@pytest.mark.parametrize(
    ("args", "encoding", "margin"),
    [
        ((), "o200k_base", 0.0),
        (("--encoding", "cl100k_base"), "cl100k_base", 0.0),
        (("--model", "gpt-4"), "cl100k_base", 0.0),
        (("--model", "gpt-4o-mini"), "o200k_base", 0.0),
        (("--model", "claude-sonnet-4-5"), "o200k_base", CLAUDE_SAFETY_MARGIN),
        (("--model", "gemini-2.5-pro"), "o200k_base", CLAUDE_SAFETY_MARGIN),
    ],
)
def test_tokens_counts_match_tiktoken(
    tmp_path: Path, args: tuple[str, ...], encoding: str, margin: float
) -> None:
    path = tmp_path / "policy.txt"
    path.write_text(TEXT * 20, encoding="utf-8")
    raw = TiktokenCounter(encoding).count(TEXT * 20)
    result = invoke("tokens", str(path), *args, "--json")
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["tokens"] == (math.ceil(raw * (1 + margin)) if margin else raw)
    assert facts["encoding"] == encoding
    assert facts["estimated"] is (margin > 0)
    assert facts["characters"] == len(TEXT * 20)


def test_tokens_reads_stdin_and_prints_a_summary(o200k: TiktokenCounter) -> None:
    result = invoke("tokens", "-", input=TEXT)
    assert result.exit_code == 0, result.output
    assert re.search(rf"tokens\s+{o200k.count(TEXT)}\s+\(exact\)", result.stdout)
    assert re.search(r"encoding\s+o200k_base", result.stdout)
    assert re.search(rf"characters\s+{len(TEXT)}", result.stdout)


def test_tokens_marks_claude_counts_estimated() -> None:
    result = invoke("tokens", "-", "--model", "claude-opus-4", input=TEXT)
    assert result.exit_code == 0, result.output
    assert "(estimated)" in result.stdout
    assert "o200k_base+15%" in result.stdout


def _row(table: str, section: str) -> str:
    match = re.search(rf"^│ {section}\s.*$", table, re.MULTILINE)
    assert match, f"no row for {section!r} in:\n{table}"
    return match.group(0)


def test_build_fixed5_example_truncates_only_retrieval() -> None:
    result = invoke("build", "--input", str(EXAMPLE), "--budget", "fixed5", "--explain")
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith("Can I expense Uber rides during business travel?")
    assert "⚠ TRUNCATED" in _row(result.stderr, "retrieval")
    for section in SECTIONS:
        if section != "retrieval":
            row = _row(result.stderr, section)
            assert "TRUNCATED" not in row and "OVER" not in row
            assert re.search(r"│ \d+%\s+│", row), row
    assert re.search(r"truncated\s+retrieval\s+\S+\s+\d+ → \d+ tokens: ", result.stderr)
    assert re.search(r"dropped\s+retrieval\s+\S+\s+\d+ → 0 tokens: ", result.stderr)


def test_build_json_stays_within_budget() -> None:
    result = invoke("build", "-i", str(EXAMPLE), "--budget", "fixed5", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    diagnostics = payload["diagnostics"]
    assert 0 < diagnostics["used_tokens"] <= diagnostics["available"]
    assert diagnostics["available"] == fixed5_budget().available
    assert [s["name"] for s in diagnostics["sections"]][:5] == list(SECTIONS)
    used = {s["name"]: s["used"] for s in diagnostics["sections"]}
    assert used["retrieval"] <= 550
    assert payload["query"]["query_str"] == "Can I expense Uber rides during business travel?"


@pytest.mark.parametrize(
    ("fmt", "key"), [("openai", "messages"), ("anthropic", "messages"), ("gemini", "contents")]
)
def test_build_provider_formats_print_json_payloads(fmt: str, key: str) -> None:
    result = invoke("build", "-i", str(EXAMPLE), "--budget", "rag", "--format", fmt)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload[key]
    assert "Can I expense Uber rides" in json.dumps(payload)


def test_build_flags_override_the_file() -> None:
    result = invoke(
        "build", "-i", str(EXAMPLE), "--system", "Be terse.", "--query", "Is a taxi ok?", "--json"
    )
    assert result.exit_code == 0, result.output
    text = json.loads(result.stdout)["text"]
    assert "Be terse." in text and "Is a taxi ok?" in text
    assert "Northwind" not in text and "Uber rides" not in text


def test_input_file_maps_fields_to_source_types() -> None:
    request = parse_request(EXAMPLE.read_text(encoding="utf-8"), "travel_request.json")
    sources = [item.source for item in request.items]
    assert sources.count(SourceType.MEMORY) == 2
    assert sources.count(SourceType.RETRIEVAL) == 7
    assert sources.count(SourceType.TOOL) == 1
    history = [i for i in request.items if i.source is SourceType.CONVERSATION]
    assert [i.message.role for i in history if i.message] == ["user", "assistant"]
    scores = [i.score for i in request.items if i.source is SourceType.RETRIEVAL]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0


BAD_INPUTS = [
    (("build", "-i", "{missing}"), None, 2, "no such file"),
    (("build", "-i", "{dir}"), None, 2, "is a directory"),
    (("build", "-i", "-"), '{"query": "x",', 2, "is not valid JSON"),
    (("build", "-i", "-"), "[1, 2]", 2, "must hold a JSON object"),
    (("build", "-i", "-"), '{"quer": "x"}', 2, "unknown key(s) quer"),
    (("build", "-i", "-"), '{"query": 5}', 2, '"query" must be a string'),
    (("build", "-i", "-"), '{"query": "q", "memory": "x"}', 2, '"memory" must be a list'),
    (("build", "-i", "-"), '{"query": "q", "memory": [3]}', 2, "memory[0] must be a string"),
    (
        ("build", "-i", "-"),
        '{"query": "q", "retrieval": [{"content": "x", "score": "high"}]}',
        2,
        "retrieval[0].score must be a number",
    ),
    (
        ("build", "-i", "-"),
        '{"query": "q", "history": [{"role": "tool", "content": "x"}]}',
        2,
        "history[0].role must be",
    ),
    (("build", "-i", "-"), b'{"query": "\xff"}', 2, "not UTF-8"),
    (("build",), None, 2, "no query"),
    (("build", "--query", "q", "--budget", "huge"), None, 2, "unknown budget 'huge'"),
    (("build", "--query", "q", "--format", "xml"), None, 2, "unknown format 'xml'"),
    (("build", "--query", "q", "--budget", "fixed5", "--max-tokens", "9000"), None, 2, "fixed5"),
    (("build", "--query", "q", "--max-tokens", "-5"), None, 2, "--max-tokens must be a positive"),
    (("build", "--query", "hello there", "--max-tokens", "12"), None, 2, "BudgetError: pinned"),
    (("build", "--query", "q", "--budget", "fixed5", "--system", "word " * 400), None, 2, "255"),
    (("tokens", "{missing}"), None, 2, "no such file"),
    (("tokens", "-", "--encoding", "p50k"), "x", 2, "unknown encoding 'p50k'"),
    # a model whose tokenizer is known counts with it: another --encoding is not dropped quietly
    (("tokens", "-", "--model", "gpt-4o", "--encoding", "cl100k_base"), "x", 2, "o200k_base"),
    (("tokens", "-", "--model", "claude-sonnet-4", "--encoding", "cl100k_base"), "x", 2, "claude"),
]


@pytest.mark.parametrize(("args", "stdin", "code", "fragment"), BAD_INPUTS)
def test_bad_input_exits_with_one_clear_line(
    tmp_path: Path, args: tuple[str, ...], stdin: str | bytes | None, code: int, fragment: str
) -> None:
    paths = {"missing": str(tmp_path / "nope.json"), "dir": str(tmp_path)}
    result = invoke(*(a.format(**paths) if a.startswith("{") else a for a in args), input=stdin)
    assert_clean_error(result, code, fragment)


@pytest.mark.parametrize(
    ("encoding", "expected"), [(None, "o200k_base"), ("cl100k_base", "cl100k_base")]
)
def test_unknown_model_counts_with_the_default_encoding_as_estimated(
    encoding: str | None, expected: str
) -> None:
    text = "Llama models have their own tokenizer; this count is an estimate."
    args = ["tokens", "-", "--model", "llama-9", "--json"]
    result = invoke(*args, *(["--encoding", encoding] if encoding else []), input=text)
    assert result.exit_code == 0, result.output
    assert "note: no tokenizer is known for 'llama-9'" in result.stderr
    report = json.loads(result.stdout)
    assert report["estimated"] is True
    assert report["tokens"] == TiktokenCounter(expected).count(text)


def test_runtime_library_error_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> None:
        raise TokenizerError(f"the {name} encoding file is corrupt; reinstall 'bpe-openai'")

    monkeypatch.setattr(contextfold.tokens, "load_encoding", broken)
    result = invoke("tokens", "-", input="hello")
    assert_clean_error(result, 1, "TokenizerError: the o200k_base encoding file is corrupt")


@pytest.mark.parametrize("args", [("build", "--bogus"), ("build", "--max-tokens", "many")])
def test_option_errors_exit_2_without_traceback(args: tuple[str, ...]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def test_cli_reference_is_current() -> None:
    script = ROOT / "scripts" / "gen_cli_docs.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.index("```bash") < readme.index("\n## ")  # the commands come first
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in first_block.splitlines() if not line.startswith("#")]


def test_readme_starts_with_the_two_setup_commands() -> None:
    main_job, tests = readme_commands()
    assert main_job.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")
    assert ".venv/bin/contextfold ingest examples/policies && " in main_job
    assert tests == (
        'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && scripts/install-agents'
        " && scripts/check"
    )


def test_readme_main_job_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's contextfold commands, run in order from the repository root (the venv
    steps are CI's job); the corpus goes to the test's own CONTEXTFOLD_HOME."""
    monkeypatch.chdir(ROOT)
    main_job, _ = readme_commands()
    steps = [step for step in main_job.split(" && ") if step.startswith(".venv/bin/contextfold ")]
    assert len(steps) == 2
    outputs = []
    for step in steps:
        result = invoke(*shlex.split(step)[1:])
        assert result.exit_code == 0, f"{step}\n{result.output}"
        outputs.append(result.stdout)
    assert "ingested 19 new document(s)" in outputs[0]
    assert outputs[1].startswith("no LLM configured, so no answer (add --llm BASE_URL")
    shown = (
        (ROOT / "README.md").read_text(encoding="utf-8").split("```text\n", 1)[1].split("```", 1)[0]
    )
    assert outputs[1] == shown  # the README shows exactly what the main job prints


def test_readme_library_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert "Retrieved document chunks" in capsys.readouterr().out
    assert isinstance(namespace["result"], contextfold.ContextResult)
