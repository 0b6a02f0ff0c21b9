"""Running the real coding agents (installed by ``scripts/install-agents``) against the
scripted upstream (``agent_upstream``), directly (the control run) or through a real
``contextfold proxy`` process, and comparing the two.

- ``agent_binary(name)``: the pinned client's launcher, or a failure (``CI=true``) / skip
  saying to run ``scripts/install-agents``;
- ``ProxyProcess``: ``python -m contextfold proxy --upstream …`` with its own
  ``CONTEXTFOLD_HOME``, on a free port of 127.0.0.1;
- ``Workspace``: a fresh git repository (fixed author and dates, so commit hashes repeat)
  and an isolated ``HOME``, at the same paths for the control and the proxied run;
- ``ClaudeCode`` / ``Codex`` / ``Aider``: one client invocation each (``Invocation``), every
  update check and telemetry off, pointed at a base URL with a given API key;
- ``injection_diff`` / ``breakpoints``: the checks on the bodies the upstream received.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_upstream import Recorded, ScriptedUpstream, Step
from contextfold.testing import proxy_command

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("CONTEXTFOLD_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "agents"
AGENTS_DIR = Path(os.environ.get("AGENTS_DIR") or ROOT / ".agents")
PINS = Path(__file__).with_name("versions.txt")
MARKER = "contextfold:session"
FIXED_DATE = "2026-01-01T00:00:00+00:00"
RUN_TIMEOUT_S = 120
#: how long a run waits after its client exits for the proxy to write the last records
RECORD_WAIT_S = 10


# -- installed clients ---------------------------------------------------------------------


def pins() -> dict[str, tuple[str, str, str]]:
    """name -> (registry, package, version), from ``versions.txt``."""
    out = {}
    for line in PINS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, registry, package, version = line.split()
            out[name] = (registry, package, version)
    return out


def agent_binary(name: str) -> Path:
    """The launcher of the pinned client ``name``. When it is missing or another version:
    with ``CI=true`` the test fails (CI must run these), else it is skipped, both saying to
    run ``scripts/install-agents``."""
    _, package, version = pins()[name]
    path = AGENTS_DIR / "bin" / name
    stamp = AGENTS_DIR / name / ".installed"
    want = f"{package}@{version}"
    found = stamp.read_text().strip() if stamp.exists() else None
    if not path.exists() or found != want:
        what = "not installed" if found is None else f"installed as {found}"
        message = f"{name} ({want}) is {what} in {AGENTS_DIR}: run scripts/install-agents"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


# -- the proxy as a process ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ProxyProcess:
    """``contextfold proxy --upstream URL`` in its own process and ``CONTEXTFOLD_HOME``;
    ``tool_outputs``: its ``proxy.tool_outputs`` settings (tool-output compaction)."""

    def __init__(
        self, upstream: str, home: Path, tool_outputs: dict[str, Any] | None = None
    ) -> None:
        self.home = home
        self.port = free_port()
        self.log_path = home / "proxy.log"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CONTEXTFOLD_HOME": str(home), "CONTEXTFOLD_SECRET": "agents-test"}
        env.pop("CONTEXTFOLD_PORT", None)
        # The coding-agent set-up of docs/proxy.md (a new session continues the credential's
        # latest one: recall_scope principal), and the memory deadline: on a loaded machine
        # 50 ms can pass, and a request forwarded without memory would make the runs differ
        # from one time to the next.
        config = home / "server.yaml"
        text = "proxy:\n  memory_deadline_ms: 10000\n  recall_scope: principal\n"
        if tool_outputs is not None:
            text += f"  tool_outputs: {json.dumps(tool_outputs)}\n"
        config.write_text(text)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            proxy_command(upstream, self.port, "--config", str(config), "--log-level", "info"),
            cwd=home,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90  # the first start loads the embedding model
        while True:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"contextfold proxy exited at start:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"contextfold proxy did not come up:\n{self.log()}")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, start: int = 0) -> str:
        self._log.flush()
        return self.log_path.read_bytes()[start:].decode("utf-8", "replace")

    def log_size(self) -> int:
        self._log.flush()
        return self.log_path.stat().st_size

    def records(self) -> list[dict[str, Any]]:
        """The dashboard's request records, oldest first ([] when it does not answer)."""
        try:
            answer = httpx.get(self.url + "/dashboard/api/records", timeout=5)
            return list(reversed(answer.json())) if answer.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


# -- workspaces and runs -------------------------------------------------------------------


def _git_env() -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": "Agent Test",
        "GIT_AUTHOR_EMAIL": "agent@test.invalid",
        "GIT_COMMITTER_NAME": "Agent Test",
        "GIT_COMMITTER_EMAIL": "agent@test.invalid",
        "GIT_AUTHOR_DATE": FIXED_DATE,
        "GIT_COMMITTER_DATE": FIXED_DATE,
        "GIT_CONFIG_NOSYSTEM": "1",
    }


@dataclass
class Workspace:
    """``root/work`` (a git repository with one commit) and ``root/home`` (the client's
    ``HOME``), made anew by ``fresh()`` at the same paths, so two runs see the same paths."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def fresh(self) -> Workspace:
        for path in (self.work, self.home):
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        env = {**base_env(self.home)}
        for args in (
            ["git", "init", "-q", "-b", "main"],
            ["git", "config", "user.name", "Agent Test"],
            ["git", "config", "user.email", "agent@test.invalid"],
            ["git", "config", "commit.gpgsign", "false"],
        ):
            subprocess.run(args, cwd=self.work, env=env, check=True)
        (self.work / "README.md").write_text("# demo\n\nA tiny project for the agent tests.\n")
        subprocess.run(["git", "add", "README.md"], cwd=self.work, env=env, check=True)
        subprocess.run(["git", "commit", "-q", "-m", "Start"], cwd=self.work, env=env, check=True)
        return self


def base_env(home: Path) -> dict[str, str]:
    """What every client gets: no variable of the developer's shell but PATH (no provider
    keys or base URLs, no HTTP proxy), its own HOME, fixed git identity and dates."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        **_git_env(),
    }


@dataclass
class Invocation:
    """One client run: a prompt, and whether it continues the previous session."""

    prompt: str
    resume: bool = False
    files: Sequence[str] = ()  # aider: the files to add to the chat
    output_format: str = "text"  # Claude Code: text or json


@dataclass
class AgentRun:
    """What one scenario (one or more invocations in one workspace) produced."""

    label: str
    rcs: list[int]
    stdouts: list[str]
    stderrs: list[str]
    visible: list[Any]  # the client-visible output of each invocation, normalised
    seconds: list[float]  # how long each invocation took
    files: dict[str, str]  # the work tree's files (not .git, not the client's own state)
    commits: str  # git log: subjects and bodies
    texts: dict[str, str]  # every readable file under work and home (for the marker scan)
    requests: list[Recorded]
    proxy_log: str = ""
    # the proxy's dashboard records of each invocation's requests (memory routes only)
    records: list[list[dict[str, Any]]] = field(default_factory=list)

    def save(self, folder: Path) -> Path:
        """Write the run (outputs, files, commits, every upstream request without its
        credentials) to ``folder/<label>.json``, for a person to read after a failure."""
        folder.mkdir(parents=True, exist_ok=True)
        secret = {"authorization", "x-api-key", "api-key"}
        data = {
            "label": self.label,
            "rcs": self.rcs,
            "seconds": self.seconds,
            "stdouts": self.stdouts,
            "stderrs": self.stderrs,
            "visible": self.visible,
            "files": self.files,
            "commits": self.commits,
            "proxy_log": self.proxy_log,
            "records": self.records,
            "requests": [
                {
                    "method": r.method,
                    "path": r.path,
                    "query": r.query,
                    "answer": r.answer,
                    "side": r.side,
                    "cache_read": r.cache_read,
                    "headers": {k: v for k, v in r.headers.items() if k not in secret},
                    "body": r.body,
                }
                for r in self.requests
            ],
        }
        path = folder / f"{self.label.replace(' ', '-')}.json"
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False, default=str))
        return path

    def marker_hits(self) -> list[str]:
        """Where ``contextfold:session`` occurs: outputs, files, commits, upstream bodies."""
        hits = []
        for i, (out, err) in enumerate(zip(self.stdouts, self.stderrs, strict=True)):
            if MARKER in out:
                hits.append(f"stdout of invocation {i + 1}: {_around(out)}")
            if MARKER in err:
                hits.append(f"stderr of invocation {i + 1}: {_around(err)}")
        for name, text in self.texts.items():
            if MARKER in text:
                hits.append(f"file {name}: {text.count(MARKER)}x, {_around(text)}")
        if MARKER in self.commits:
            hits.append(f"git commit messages: {_around(self.commits)}")
        for i, r in enumerate(self.requests):
            if MARKER.encode() in r.raw:
                hits.append(f"upstream request {i} ({r.path}, {r.answer})")
        return hits


def _around(text: str) -> str:
    at = text.find(MARKER)
    return repr(text[max(0, at - 60) : at + 60])


STATE_PREFIXES = (".git/", ".aider")


def snapshot(ws: Workspace) -> tuple[dict[str, str], str, dict[str, str]]:
    files: dict[str, str] = {}
    texts: dict[str, str] = {}
    for base, tag in ((ws.work, "work"), (ws.home, "home")):
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            rel = path.relative_to(base).as_posix()
            if rel.startswith(".git/") or path.stat().st_size > 4_000_000:
                continue
            text = path.read_bytes().decode("utf-8", "replace")
            texts[f"{tag}/{rel}"] = text
            if tag == "work" and not rel.startswith(STATE_PREFIXES):
                files[rel] = text
    log = subprocess.run(
        ["git", "log", "--format=%h %s%n%b"],
        cwd=ws.work,
        capture_output=True,
        text=True,
        env=base_env(ws.home),
    ).stdout
    return files, log, texts


class Client:
    """A coding agent: how to run one invocation against ``base_url`` with ``api_key``."""

    name: str
    binary: Path
    model: str
    path_prefix: str  # the upstream route of its conversation

    def command(self, ws: Workspace, inv: Invocation, base_url: str) -> list[str]:
        raise NotImplementedError

    def env(self, ws: Workspace, base_url: str, api_key: str) -> dict[str, str]:
        return base_env(ws.home)

    def visible(self, stdout: str, inv: Invocation) -> Any:
        return stdout

    def prepare(self, ws: Workspace) -> None:
        """Set up the fresh ``ws.home`` (config files the client reads)."""

    def run(
        self,
        label: str,
        ws: Workspace,
        upstream: ScriptedUpstream,
        base_url: str,
        api_key: str,
        invocations: Sequence[Invocation],
        steps: list[Step],
        proxy: ProxyProcess | None = None,
        fresh: bool = True,
    ) -> AgentRun:
        if fresh:
            ws.fresh()
            self.prepare(ws)
            upstream.reset(steps)
        else:
            upstream.script(steps)
        first_request = len(upstream.requests)
        log_start = proxy.log_size() if proxy else 0
        seen = {r.get("id") for r in proxy.records()} if proxy else set()
        records: list[list[dict[str, Any]]] = []
        rcs, outs, errs, seconds = [], [], [], []
        for inv in invocations:
            inv_first_request = len(upstream.requests)
            start = time.monotonic()
            done = subprocess.run(
                self.command(ws, inv, base_url),
                cwd=ws.work,
                env=self.env(ws, base_url, api_key),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=RUN_TIMEOUT_S,
            )
            seconds.append(round(time.monotonic() - start, 1))
            rcs.append(done.returncode)
            outs.append(done.stdout)
            errs.append(done.stderr)
            if proxy is not None:
                # The proxy writes a request's record after the reply has gone out, so the
                # client can exit before the last one exists: wait (a while) for as many
                # records as the invocation made conversation requests.
                made = sum(
                    r.answer.startswith("step") for r in upstream.requests[inv_first_request:]
                )
                new = [r for r in proxy.records() if r.get("id") not in seen]
                deadline = time.monotonic() + RECORD_WAIT_S
                while len(new) < made and time.monotonic() < deadline:
                    time.sleep(0.1)
                    new = [r for r in proxy.records() if r.get("id") not in seen]
                seen |= {r.get("id") for r in new}
                records.append(new)
        files, commits, texts = snapshot(ws)
        return AgentRun(
            label=label,
            rcs=rcs,
            stdouts=outs,
            stderrs=errs,
            visible=[self.visible(o, i) for o, i in zip(outs, invocations, strict=True)],
            seconds=seconds,
            files=files,
            commits=commits,
            texts=texts,
            requests=list(upstream.requests[first_request:]),
            proxy_log=proxy.log(log_start) if proxy else "",
            records=records,
        )


class ClaudeCode(Client):
    path_prefix = "/v1/messages"
    model = ""  # the client's default

    def __init__(self, name: str) -> None:
        self.name = name
        self.binary = agent_binary(name)

    def command(self, ws: Workspace, inv: Invocation, base_url: str) -> list[str]:
        # The client's default model, as a developer gets it (2.1.x: a model that makes it
        # send a role "system" message inside messages, with more anthropic-beta flags).
        args = [
            str(self.binary),
            "-p",
            inv.prompt,
            "--output-format",
            inv.output_format,
            "--dangerously-skip-permissions",
        ]
        return [*args, "--continue"] if inv.resume else args

    def env(self, ws: Workspace, base_url: str, api_key: str) -> dict[str, str]:
        return {
            **base_env(ws.home),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
            "IS_SANDBOX": "1",  # --dangerously-skip-permissions as root (containers, CI)
        }

    def visible(self, stdout: str, inv: Invocation) -> Any:
        if inv.output_format != "json":
            return stdout
        try:
            result = json.loads(stdout)
        except ValueError:
            return stdout
        return {k: result.get(k) for k in ("type", "subtype", "is_error", "num_turns", "result")}


class Codex(Client):
    name = "codex"
    path_prefix = "/v1/responses"
    model = "gpt-5-codex"

    def __init__(self) -> None:
        self.binary = agent_binary("codex")

    def prepare(self, ws: Workspace) -> None:
        (ws.home / ".codex").mkdir()

    def command(self, ws: Workspace, inv: Invocation, base_url: str) -> list[str]:
        provider = (
            f'model_providers.cf={{name="contextfold-test", base_url="{base_url}/v1", '
            'wire_api="responses", env_key="CF_TEST_API_KEY", request_max_retries=0, '
            "stream_max_retries=0}"
        )
        config = [
            "-c",
            provider,
            "-c",
            "model_provider=cf",
            "-c",
            "analytics.enabled=false",
            "-c",
            "check_for_update_on_startup=false",
        ]
        flags = [
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-m",
            self.model,
        ]
        if inv.resume:  # (`exec resume` takes no --color)
            return [str(self.binary), "exec", "resume", *config, *flags, "--last", inv.prompt]
        return [str(self.binary), "exec", *config, *flags, "--color", "never", inv.prompt]

    def env(self, ws: Workspace, base_url: str, api_key: str) -> dict[str, str]:
        return {
            **base_env(ws.home),
            "CODEX_HOME": str(ws.home / ".codex"),
            "CF_TEST_API_KEY": api_key,
        }


_AIDER_NOISE = re.compile(r"^(Tokens: .*|Update git (name|email) with: .*)$", re.MULTILINE)


class Aider(Client):
    name = "aider"
    path_prefix = "/v1/chat/completions"
    model = "gpt-4o-mini"

    def __init__(self) -> None:
        self.binary = agent_binary("aider")

    def prepare(self, ws: Workspace) -> None:
        # aider fetches litellm's model price list from the internet unless a fresh cached
        # copy that is not empty exists: this one keeps it offline.
        caches = ws.home / ".aider" / "caches"
        caches.mkdir(parents=True)
        info = {
            "max_input_tokens": 128000,
            "max_output_tokens": 16384,
            "mode": "chat",
            "input_cost_per_token": 1.5e-07,
            "output_cost_per_token": 6e-07,
            "litellm_provider": "openai",
        }
        prices = {self.model: info, f"openai/{self.model}": info}
        (caches / "model_prices_and_context_window.json").write_text(json.dumps(prices))

    def command(self, ws: Workspace, inv: Invocation, base_url: str) -> list[str]:
        args = [
            str(self.binary),
            "--model",
            f"openai/{self.model}",
            "--openai-api-base",
            base_url + "/v1",
            "--no-check-update",
            "--analytics-disable",
            "--no-show-release-notes",
            "--no-show-model-warnings",
            "--yes-always",
            "--no-pretty",
            "--no-fancy-input",
            "--no-gitignore",
            "--edit-format",
            "whole",
            "--map-tokens",
            "0",
        ]
        if inv.resume:
            args.append("--restore-chat-history")
        return [*args, "--message", inv.prompt, *inv.files]

    def env(self, ws: Workspace, base_url: str, api_key: str) -> dict[str, str]:
        return {
            **base_env(ws.home),
            "OPENAI_API_KEY": api_key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "AIDER_ANALYTICS": "false",
        }

    def visible(self, stdout: str, inv: Invocation) -> Any:
        return _AIDER_NOISE.sub("", stdout)


# -- comparing what the upstream received -----------------------------------------------------

_VOLATILE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])"), "<hex64>"),
    (re.compile(r"\b1[0-9]{12}\b"), "<ms>"),
    (re.compile(r"Wall time: [0-9.]+ seconds"), "Wall time: <s> seconds"),
    (re.compile(r"Chunk ID: [0-9a-f]+"), "Chunk ID: <id>"),
    # Claude Code's budget reminder counts the tokens the upstream reported, which memory
    # the proxy added legitimately raises.
    (re.compile(r"<total_tokens>[0-9]+ tokens left</total_tokens>"), "<total_tokens>"),
]


def normalise(body: Any) -> Any:
    """``body`` with what differs between two identical runs (session ids, random user ids,
    timestamps, timings) replaced by placeholders."""
    text = json.dumps(body, ensure_ascii=False)
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return json.loads(text)


def breakpoints(body: Any) -> int:
    """The number of ``cache_control`` breakpoints in a body."""
    count = 0

    def walk(value: Any) -> None:
        nonlocal count
        if isinstance(value, dict):
            if "cache_control" in value:
                count += 1
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(body)
    return count


@dataclass
class Unit:
    where: str
    value: Any
    breakpoint: bool
    region: str  # "prefix" or "last" (the last user / tool-result message and after)


def _units(body: dict[str, Any]) -> tuple[dict[str, Any], list[Unit]]:
    """The body as (its scalar fields, its prompt in order: tools, system, messages/items,
    each block one unit)."""
    seq: list[Unit] = []
    if "messages" in body:
        key = "messages"
    elif "input" in body:
        key = "input"
    else:
        key = ""
    top = {k: v for k, v in body.items() if k not in {key, "tools", "system"}}
    for i, tool in enumerate(body.get("tools") or []):
        seq.append(
            Unit(f"tools[{i}]", tool, isinstance(tool, dict) and "cache_control" in tool, "prefix")
        )
    system = body.get("system")
    if isinstance(system, list):
        for j, block in enumerate(system):
            seq.append(Unit(f"system[{j}]", block, "cache_control" in block, "prefix"))
    elif system is not None:
        seq.append(Unit("system", system, False, "prefix"))
    items = body.get(key) or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    last_user = 0
    for i, item in enumerate(items):
        if isinstance(item, dict) and (
            item.get("role") in {"user", "tool"}
            or item.get("type") in {"function_call_output", "custom_tool_call_output"}
        ):
            last_user = i
    for i, item in enumerate(items):
        region = "last" if i >= last_user else "prefix"
        content = item.get("content") if isinstance(item, dict) else None
        head = {k: v for k, v in item.items() if k != "content"} if isinstance(item, dict) else {}
        role = head.get("role") or head.get("type")
        if isinstance(content, list):
            for j, block in enumerate(content):
                seq.append(
                    Unit(
                        f"{key}[{i}]({role}).content[{j}]",
                        {"item": head, "block": block},
                        isinstance(block, dict) and "cache_control" in block,
                        region,
                    )
                )
        else:
            seq.append(Unit(f"{key}[{i}]({role})", item, False, region))
    return top, seq


def _texts(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(_texts(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return "\n".join(_texts(v) for v in value)
    return ""


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def injection_diff(client: Any, forwarded: Any) -> str | None:
    """``None`` when ``forwarded`` is ``client`` (both normalised) with memory added only at
    the injection point: after the last ``cache_control`` breakpoint and inside the last user
    (or tool-result) message or after it; else the first difference, said in words.

    Allowed: whole blocks or items added there, or text added to a block there (the client's
    text still inside it). Everything before — scalar fields, tools, system, earlier messages,
    the blocks up to the last breakpoint — must be JSON-equal."""
    client, forwarded = normalise(client), normalise(forwarded)
    if not isinstance(client, dict) or not isinstance(forwarded, dict):
        return None if client == forwarded else "the bodies are not both JSON objects"
    top_c, seq_c = _units(client)
    top_f, seq_f = _units(forwarded)
    for key in sorted(set(top_c) | set(top_f)):
        if top_c.get(key) != top_f.get(key):
            return (
                f"field {key!r} differs: client {_short(top_c.get(key))}, "
                f"forwarded {_short(top_f.get(key))}"
            )
    k = 0
    while k < len(seq_c) and k < len(seq_f) and seq_c[k].value == seq_f[k].value:
        k += 1
    if k == len(seq_c) and k == len(seq_f):
        return None
    last_bp = max((i for i, u in enumerate(seq_c) if u.breakpoint), default=-1)
    first_last = next((i for i, u in enumerate(seq_c) if u.region == "last"), len(seq_c))
    point = max(last_bp + 1, first_last)
    if k < point:
        where = seq_c[k].where if k < len(seq_c) else "(end of the client's prompt)"
        why = (
            "before the last cache_control breakpoint"
            if k <= last_bp
            else "before the last user message"
        )
        got = seq_f[k].value if k < len(seq_f) else "(missing)"
        want = seq_c[k].value if k < len(seq_c) else "(nothing)"
        return (
            f"changed {why} (injection point: unit {point} of {len(seq_c)}), first at unit "
            f"{k} {where}: client {_short(want)}; forwarded {_short(got)}"
        )
    # After the injection point: every client unit still there, in order, possibly with
    # text added around it; forwarded units in between are the injected memory.
    j = k
    for unit in seq_c[k:]:
        while j < len(seq_f):
            f = seq_f[j].value
            if f == unit.value or (
                _texts(unit.value)
                and _texts(unit.value) in _texts(f)
                and _strip_texts(f) == _strip_texts(unit.value)
            ):
                break
            j += 1
        if j == len(seq_f):
            return (
                f"the client's {unit.where} is missing after the injection point: "
                f"{_short(unit.value)}"
            )
        j += 1
    return None


def _strip_texts(value: Any) -> Any:
    if isinstance(value, str):
        return ""
    if isinstance(value, dict):
        return {k: _strip_texts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_texts(v) for v in value]
    return value


def pair_requests(
    control: Sequence[Recorded], proxied: Sequence[Recorded]
) -> tuple[list[tuple[str, Recorded, Recorded]], list[str]]:
    """The model requests of two runs matched by what answered them (the script step, or the
    side-call answer and its order); and what is left unmatched on either side."""

    def keyed(requests: Sequence[Recorded]) -> dict[tuple[str, str, int], Recorded]:
        out: dict[tuple[str, str, int], Recorded] = {}
        seen: dict[tuple[str, str], int] = {}
        for r in requests:
            if r.method != "POST" or not r.answer or r.answer in {"count_tokens", "passthrough"}:
                continue
            base = (r.path, r.answer if not r.side else f"{r.answer} {_signature(r.body)}")
            n = seen.get(base, 0)
            seen[base] = n + 1
            out[(*base, n)] = r
        return out

    c, p = keyed(control), keyed(proxied)
    pairs = [(f"{k[1]} #{k[2]} {k[0]}", c[k], p[k]) for k in c if k in p]
    unmatched = [f"control only: {k}" for k in c if k not in p]
    unmatched += [f"proxied only: {k}" for k in p if k not in c]
    return pairs, unmatched


def _signature(body: Any) -> str:
    """A side call's kind: its system prompt and tool names (normalised), hashed."""
    if not isinstance(body, dict):
        return ""
    system = body.get("system") or ""
    if not system and isinstance(body.get("messages"), list) and body["messages"]:
        first = body["messages"][0]
        system = first.get("content") if first.get("role") == "system" else ""
    tools = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    text = json.dumps([normalise(system), tools], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]
