"""The docs are executable: every shell (```bash, ```sh, ```console) and Python (```python)
block in README.md and docs/*.md runs, one case per block (id ``file:line``), and every
```yaml block validates as the config it shows. A doc that drifts from the code fails here.

A block may carry a marker, an HTML comment on the line before its fence:

- ``<!-- doc-test: skip: REASON -->``: not runnable on purpose (installs from PyPI, needs a
  real provider key or a data set that is not shipped); the reason is required, and the case
  is reported as skipped with it. No other block is ever skipped: a run that cannot start
  (curl missing, a server that does not come up) fails.
- ``<!-- doc-test: fake-llm -->``: needs an LLM; runs against ``tests/fake_llm.py``. Ollama's
  URL (``http://localhost:11434/v1``) in the block is pointed at it, the providers' default
  URLs are too (for Python blocks), and dummy provider keys are set.
- ``<!-- doc-test: server -->``: talks to ``contextfold serve``; the test starts one (in the
  file's directory and home) and points ``localhost:5757`` at it. ``curl`` fails on an HTTP
  error unless the line prints the status itself (``-w``).
- ``<!-- doc-test: proxy -->``: talks to the LLM proxy; the test starts ``contextfold proxy``
  in front of the fake LLM and points ports 5757-5759 at it.
- ``<!-- doc-test: background -->``: starts a server that runs until stopped; it runs with
  ``CONTEXTFOLD_PORT`` set to a free port until ``/healthz`` answers, and is then stopped.
- ``<!-- doc-test: postgres -->``: needs a PostgreSQL server; ``DATABASE_URL`` holds the URL
  of a database on the tests' real server (``tests/postgres_support.py``), one per doc file.
- ``<!-- doc-test: continues -->``: a Python block that goes on from the one before it (runs
  after it, in one interpreter).
- ``<!-- doc-test: output -->`` on a ```text block: what the runnable block before it prints
  (stdout and stderr); compared line by line, trailing spaces and ``… ms`` timings aside.

Kinds combine with commas (``fake-llm, continues``). The blocks of one file run in order and
share a directory (a copy of ``examples/`` and ``docs/``) and a ``CONTEXTFOLD_HOME``, so a
block may use what an earlier one made; the project's venv ``bin`` comes first on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from fake_llm import FakeLLMServer
from fake_responses import ResponsesFake

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGS = {"bash": "shell", "sh": "shell", "console": "shell", "python": "python"}
KINDS = {
    "skip", "fake-llm", "server", "proxy", "background", "continues", "output", "postgres"
}  # fmt: skip
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 180
UP_TIMEOUT_S = 90  # a server's first start loads the embedding model
OLLAMA_URLS = ("http://localhost:11434/v1", "http://127.0.0.1:11434/v1")
LOCAL_PORTS = ("localhost:5757", "127.0.0.1:5757", "127.0.0.1:5758", "127.0.0.1:5759")
SHELL_PRELUDE = "set -euo pipefail\n"
CURL_FAILS = """curl() {
    case " $* " in
        *" -w "*) command curl "$@" ;;
        *) command curl --fail-with-body "$@" ;;
    esac
}
"""


@dataclass
class Block:
    """One fenced block of a doc: where it is, its language and code, and its marker."""

    file: str
    line: int
    lang: str
    code: str
    kinds: frozenset[str] = frozenset()
    reason: str = ""
    output: str | None = None  # the ```text block marked as its output
    previous: Block | None = None  # the block a ``continues`` block goes on from

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def _marker(line: str, where: str) -> tuple[frozenset[str], str]:
    match = MARKER.match(line)
    if match is None:
        return frozenset(), ""
    body = match["body"]
    if body.startswith("skip"):
        reason = body.removeprefix("skip").lstrip(" :").strip()
        if not reason:
            raise ValueError(f"{where}: a doc-test skip marker needs a reason")
        return frozenset({"skip"}), reason
    kinds = frozenset(k.strip() for k in body.split(",") if k.strip())
    if not kinds or kinds - KINDS:
        raise ValueError(f"{where}: unknown doc-test marker {body!r}; known: {sorted(KINDS)}")
    return kinds, ""


def collect(path: Path) -> tuple[list[Block], list[Block]]:
    """The runnable blocks of ``path`` and its YAML blocks, in document order."""
    name = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    runnable: list[Block] = []
    yamls: list[Block] = []
    last_python: Block | None = None
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None or not fence["lang"]:
            i += 1
            continue
        indent, lang, start = len(fence["indent"]), fence["lang"], i + 1
        end = start
        while not lines[end].strip().startswith("```"):
            end += 1
        code = textwrap.dedent("\n".join(line[indent:] for line in lines[start:end])) + "\n"
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        kinds, reason = _marker(prev, f"{name}:{start}")
        block = Block(name, start, lang, code, kinds, reason)
        if lang in LANGS:
            if "output" in kinds:
                raise ValueError(f"{block.id}: an output marker belongs on a ```text block")
            if "continues" in kinds:
                if last_python is None or lang != "python":
                    raise ValueError(f"{block.id}: 'continues' needs a Python block before it")
                block.previous = last_python
            runnable.append(block)
            if lang == "python":
                last_python = block
        elif "output" in kinds:
            if not runnable or runnable[-1].output is not None:
                raise ValueError(f"{block.id}: an output block needs a runnable block before it")
            runnable[-1].output = code
        elif lang == "yaml":
            yamls.append(block)
        elif kinds:
            raise ValueError(f"{block.id}: doc-test markers go on runnable blocks")
        i = end + 1
    return runnable, yamls


BLOCKS = [b for path in DOC_FILES for b in collect(path)[0]]
YAML_BLOCKS = [b for path in DOC_FILES for b in collect(path)[1]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[str]) -> str:
    """Ctrl-C to the process group, then kill if it lingers; its output."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    out, _ = process.communicate()
    return out or ""


def _wait_up(process: subprocess.Popen[str], port: int) -> bool:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


@dataclass
class DocSession:
    """What the blocks of one doc share: a directory, a home, and the servers they need."""

    root: Path
    env: dict[str, str]
    fake: FakeLLMServer | None = None
    servers: dict[str, tuple[subprocess.Popen[str], int]] = field(default_factory=dict)

    def fake_llm(self) -> FakeLLMServer:
        if self.fake is None:
            self.fake = FakeLLMServer(reply="Yes, within policy [Source 1].").start()
            ResponsesFake(self.fake)  # the OpenAI Responses API too
        return self.fake

    def server(self, kind: str) -> int:
        """The port of this doc's ``contextfold serve`` (or ``proxy`` in front of the fake
        LLM), started on first use."""
        if kind not in self.servers:
            port = _free_port()
            args = ["contextfold", "serve", "--port", str(port)]
            if kind == "proxy":
                args = ["contextfold", "proxy", "--upstream", self.fake_llm().url]
                args += ["--port", str(port)]
            process = self.popen(args)
            self.servers[kind] = (process, port)
            if not _wait_up(process, port):
                pytest.fail(f"{' '.join(args)} did not come up:\n{_stop(process)}")
        return self.servers[kind][1]

    def popen(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            args,
            cwd=self.root,
            env=env or self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def close(self) -> None:
        for process, _ in self.servers.values():
            _stop(process)
        if self.fake is not None:
            self.fake.stop()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DocSession]]:
    made: dict[str, DocSession] = {}
    yield made
    for session in made.values():
        session.close()


def _session(sessions: dict[str, DocSession], block: Block, base: Path) -> DocSession:
    if block.file not in sessions:
        root = base / block.file.replace("/", "_")
        root.mkdir()
        for folder in ("examples", "docs"):
            shutil.copytree(ROOT / folder, root / folder)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFOLD_")}
        env |= {
            "CONTEXTFOLD_HOME": str(root / ".home"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
            ),
            "OPENAI_API_KEY": "sk-doc-test",
            "ANTHROPIC_API_KEY": "doc-test",
            "GEMINI_API_KEY": "doc-test",
        }
        sessions[block.file] = DocSession(root, env)
    return sessions[block.file]


def _python_prelude(fake: FakeLLMServer) -> str:
    return textwrap.dedent(
        f"""\
        import contextfold.llm.factory as _factory
        _factory.DEFAULT_BASE_URLS.update(
            openai={fake.base_url!r}, ollama={fake.base_url!r},
            anthropic={fake.url!r}, gemini={fake.url!r},
        )
        """
    )


def _source(block: Block, session: DocSession) -> str:
    code = block.code
    if block.lang == "console":
        code = "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"
    if block.previous is not None:
        code = _source(block.previous, session) + code
    if "fake-llm" in block.kinds:
        for url in OLLAMA_URLS:
            code = code.replace(url, session.fake_llm().base_url)
    for kind in ("server", "proxy"):
        if kind in block.kinds:
            port = session.server(kind)
            for address in LOCAL_PORTS:
                code = code.replace(address, f"127.0.0.1:{port}")
    return code


def _command(block: Block, session: DocSession) -> list[str]:
    code = _source(block, session)
    if block.lang == "python":
        if "fake-llm" in block.kinds:
            code = _python_prelude(session.fake_llm()) + code
        script = session.root / f"block_{block.line}.py"
        script.write_text(code, encoding="utf-8")
        return [sys.executable, str(script)]
    prelude = SHELL_PRELUDE + (CURL_FAILS if "server" in block.kinds else "")
    return ["bash", "-c", prelude + code]


def _normalized(text: str) -> list[str]:
    lines = [re.sub(r"\d[\d,.]* ms\b", "<n> ms", line).rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _run_background(block: Block, session: DocSession) -> None:
    port = _free_port()
    env = {**session.env, "CONTEXTFOLD_PORT": str(port)}
    process = session.popen(_command(block, session), env=env)
    up = _wait_up(process, port)
    out = _stop(process)
    assert up, f"{block.id}: the server never answered /healthz on :{port}\n{out}"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block_runs(
    block: Block,
    sessions: dict[str, DocSession],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    if "skip" in block.kinds:
        pytest.skip(f"marked not runnable: {block.reason}")
    base = tmp_path_factory.getbasetemp() / "docs"
    base.mkdir(exist_ok=True)
    session = _session(sessions, block, base)
    if "postgres" in block.kinds and "DATABASE_URL" not in session.env:
        session.env["DATABASE_URL"] = request.getfixturevalue("postgres_server").new_database()
    if "background" in block.kinds:
        _run_background(block, session)
        return
    process = session.popen(_command(block, session))
    try:
        out, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        out = _stop(process)
        pytest.fail(f"{block.id}: still running after {BLOCK_TIMEOUT_S} s\n{out}")
    assert process.returncode == 0, f"{block.id} exited {process.returncode}:\n{out}"
    if block.output is not None:
        assert _normalized(out) == _normalized(block.output), f"{block.id}: output drifted"


def test_every_block_runs_or_says_why_not() -> None:
    """Skipping is explicit: each skipped block carries its reason, and most blocks run."""
    assert len(BLOCKS) >= 30
    skipped = [b for b in BLOCKS if "skip" in b.kinds]
    assert all(b.reason for b in skipped)
    assert len(skipped) <= len(BLOCKS) // 4, [b.id for b in skipped]


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[b.id for b in YAML_BLOCKS])
def test_doc_yaml_is_a_valid_config(block: Block, tmp_path: Path) -> None:
    """Each YAML example validates as the config it shows (a server config when every
    top-level key is a server key, else contextfold.yaml): what `config validate` checks."""
    from contextfold.cli.config_cmd import config_kind
    from contextfold.memory.config import load_config
    from contextfold.server.config import load_server_config

    assert isinstance(yaml.safe_load(block.code), dict)
    path = tmp_path / "example.yaml"
    path.write_text(block.code, encoding="utf-8")
    if config_kind(path) == "server":
        load_server_config(path)
    else:
        load_config(path)


def test_the_cli_budget_presets_the_docs_name_are_the_clis() -> None:
    """Every ``CLI `--budget NAME` `` in configuration.md is a preset the CLI has, and each
    of the CLI's presets is documented there."""
    from contextfold.cli.build import BUDGETS

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    named = re.findall(r"CLI `--budget (\w+)`", text)
    assert sorted(named) == sorted(BUDGETS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `contextfold/budget.py`"))
    named_in_readme = set(re.findall(r"`(\w+)`", row.split("(the CLI's `--budget` names)")[0]))
    assert named_in_readme - {"TokenBudget", "SectionBudget"} == set(BUDGETS)
