"""A long agent session from the real Claude Code: the scripted model walks a copy of a real
repository with hundreds of tool calls (Read, Edit, and Bash: ``grep``, ``find``, ``ls``,
``wc``, ``git log``; Claude Code 2.1 answered Grep and Glob calls here with "not available in
this session, use grep / find via Bash"), the client runs each of them for real, and every
request body it sends is seen as the upstream got it.

- ``prepare_repository(ws, source)``: ``source`` copied into the workspace's git repository,
  committed folder by folder (fixed author and dates, so ``git log`` has a history to show);
- ``long_task(ws, files, calls, seed)``: the script (one ``Step`` per model turn, a
  few with parallel calls, then a final answer), deterministic for a seed;
- ``RecordingUpstream``: the scripted upstream, handing each request of the main
  conversation to a callback as it arrives and then forgetting its body (a 400-call session
  sends hundreds of megabytes in all);
- ``record_session(...)``: one run of the client against it (``claude -p``, its own
  auto-compaction off), and what it did (``Session``).

``benchmarks/record_agent_session.py`` writes such a session to a file for
``benchmarks/bench_tool_outputs.py``; ``test_long_session.py`` runs a short one through the
proxy with tool-output compaction.
"""

from __future__ import annotations

import random
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_harness import ClaudeCode, Invocation, Workspace, base_env, pins
from agent_upstream import Call, Recorded, ScriptedUpstream, Step

__all__ = [
    "FINAL",
    "PROMPT",
    "RecordingUpstream",
    "Session",
    "long_task",
    "prepare_repository",
    "record_session",
]

JSON = dict[str, Any]
PROMPT = (
    "Review this repository module by module: read the sources, search for how the pieces "
    "connect, check the history, and mark each module you reviewed with a short comment."
)
FINAL = "Review finished: every module read, the history checked, reviewed modules marked."
RUN_TIMEOUT_S = 3600


# -- the repository and the script ---------------------------------------------------------


def prepare_repository(ws: Workspace, source: Path) -> list[Path]:
    """``source`` (a folder of Python sources) copied to ``ws.work/src`` and committed one
    top-level part at a time; the copied ``.py`` files, sorted."""
    target = ws.work / "src"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = base_env(ws.home)
    parts = sorted(target.iterdir(), key=lambda p: (p.is_dir(), p.name))
    for n, part in enumerate(parts):
        date = f"2026-01-{1 + n % 28:02d}T{9 + n // 28:02d}:00:00+00:00"
        dated = {**env, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        subprocess.run(["git", "add", "--", str(part)], cwd=ws.work, env=dated, check=True)
        message = f"Add {part.relative_to(ws.work).as_posix()}"
        subprocess.run(["git", "commit", "-q", "-m", message], cwd=ws.work, env=dated, check=True)
    return sorted(target.rglob("*.py"))


_PATTERNS = [
    "def __init__",
    "class .*Error",
    "import json",
    "async def ",
    "raise ",
    "TODO|FIXME",
    "@dataclass",
    "yield ",
    "lru_cache|cache",
    "__all__",
    "logging.getLogger",
    "Protocol",
    "return None",
    "with open|read_text",
    "sqlite3",
]


def _unique_line(text: str) -> str | None:
    """A code line that occurs once in ``text`` (an ``Edit``'s ``old_string`` must)."""
    lines = text.splitlines()
    for line in lines:
        stripped = line.strip()
        if (
            stripped.startswith(("def ", "class "))
            and stripped.endswith(":")
            and text.count(line) == 1
        ):
            return line
    return None


def long_task(ws: Workspace, files: list[Path], calls: int, seed: int = 7) -> list[Step]:
    """The script of a review of ``files`` in ``calls`` tool calls (about): mostly one call
    per turn, one turn in six reading two or three files at once; each file is read once
    and edited at most once, after it was read; a final answer ends the task."""
    rng = random.Random(seed)
    work = ws.work
    unread = list(files)
    rng.shuffle(unread)
    read: list[Path] = []
    edited: set[Path] = set()
    folders = sorted({p.parent for p in files})
    steps: list[Step] = []
    made = 0

    def rel(path: Path) -> str:
        return path.relative_to(work).as_posix()

    def one() -> Call:
        kinds = ["Read", "Grep", "Bash", "Glob", "Edit"]
        weights = [6 if unread else 0, 2, 2, 1, 1 if read else 0]
        kind = rng.choices(kinds, weights=weights)[0]
        if kind == "Read":
            path = unread.pop()
            read.append(path)
            return Call("Read", {"file_path": str(path)})
        if kind == "Grep":  # Grep is "not available in this session": grep in Bash
            pattern = rng.choice(_PATTERNS)
            folder = rng.choice(folders)
            if rng.random() < 0.3:
                command = f"grep -rlE {shlex.quote(pattern)} src"
            else:
                command = f"grep -rnE {shlex.quote(pattern)} {rel(folder)}"
            return Call("Bash", {"command": command, "description": f"Search for {pattern}"})
        if kind == "Glob":  # nor a Glob tool: find in Bash
            folder = rng.choice(folders)
            command = f"find {rel(folder)} -name '*.py' | sort"
            return Call("Bash", {"command": command, "description": f"Files in {rel(folder)}"})
        if kind == "Edit":
            candidates = [p for p in read if p not in edited]
            rng.shuffle(candidates)
            for path in candidates:
                line = _unique_line(path.read_text(encoding="utf-8"))
                if line is not None:
                    edited.add(path)
                    return Call(
                        "Edit",
                        {
                            "file_path": str(path),
                            "old_string": line,
                            "new_string": f"{line}  # reviewed",
                        },
                    )
        folder = rng.choice(folders)
        target = rng.choice(files)
        commands = [
            (f"ls -la {rel(folder)}", f"List {rel(folder)}"),
            (f"wc -l {rel(folder)}/*.py", f"Count lines in {rel(folder)}"),
            (f"git log --stat -5 -- {rel(folder)}", f"History of {rel(folder)}"),
            (f"git log --oneline -- {rel(target)}", f"History of {rel(target)}"),
            ("git status --short", "Show the working tree status"),
            (f"git diff --stat -- {rel(folder)}", f"Changes in {rel(folder)}"),
            (f"head -40 {rel(target)}", f"First lines of {rel(target)}"),
        ]
        command, description = rng.choice(commands)
        return Call("Bash", {"command": command, "description": description})

    while made < calls:
        width = rng.choice([2, 2, 3]) if rng.random() < 1 / 6 else 1
        turn = [one() for _ in range(min(width, calls - made))]
        made += len(turn)
        text = "Reviewing the next part." if rng.random() < 0.2 else ""
        steps.append(Step(text=text, calls=turn))
    steps.append(Step(text=FINAL))
    return steps


# -- recording -------------------------------------------------------------------------------


class RecordingUpstream(ScriptedUpstream):
    """The scripted upstream, handing each request body of the main conversation (not the
    side calls) to ``on_request`` once it is answered, in arrival order, then dropping its
    body and bytes."""

    def __init__(
        self, steps: list[Step], on_request: Callable[[JSON], None], **kwargs: Any
    ) -> None:
        super().__init__(steps, **kwargs)
        self._on_request = on_request
        self._write_lock = threading.Lock()
        self.tool_calls = 0

    def answer(self, request: Recorded) -> tuple[int, dict[str, str], bytes | Iterator[bytes]]:
        answered = super().answer(request)
        if request.answer.startswith(("step", "unscripted")) and isinstance(request.body, dict):
            with self._write_lock:
                self._on_request(request.body)
                self.tool_calls += _uses_answered(request.body)
        request.body, request.raw = None, b""
        return answered


def _uses_answered(body: JSON) -> int:
    """The tool results in the request's last message (the calls the client just ran)."""
    messages = body.get("messages") or []
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if not isinstance(content, list):
                return 0
            return sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
    return 0


@dataclass
class Session:
    """What one recorded run did."""

    client: str
    version: str
    rc: int
    stdout: str
    stderr: str
    seconds: float
    requests: int  # of the main conversation, recorded
    tool_calls: int  # tool results the client sent back
    unscripted: int
    steps_used: int
    steps: int
    extra: JSON = field(default_factory=dict)

    def meta(self) -> JSON:
        return {
            "client": self.client,
            "version": self.version,
            "recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "requests": self.requests,
            "tool_calls": self.tool_calls,
            "exit_code": self.rc,
            "seconds": self.seconds,
            **self.extra,
        }


def record_session(
    root: Path,
    source: Path,
    on_request: Callable[[JSON], None],
    *,
    client_id: str = "claude-latest",
    calls: int = 300,
    seed: int = 7,
) -> Session:
    """Run ``client_id`` on the review of a copy of ``source`` (in ``root``, made anew) with
    about ``calls`` tool calls, handing every request body of its conversation to
    ``on_request``; what it did."""
    client = ClaudeCode(client_id)
    version = pins()[client_id][2]
    ws = Workspace(root).fresh()
    files = prepare_repository(ws, source)
    steps = long_task(ws, files, calls, seed)
    with RecordingUpstream(steps, on_request) as upstream:
        env = {
            **client.env(ws, upstream.url, "sk-recording"),
            # the whole session, as a client whose own compaction is off sends it
            "DISABLE_AUTO_COMPACT": "1",
        }
        start = time.monotonic()
        done = subprocess.run(
            client.command(ws, Invocation(PROMPT), upstream.url),
            cwd=ws.work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=RUN_TIMEOUT_S,
        )
        seconds = round(time.monotonic() - start, 1)
        main = upstream.main_requests("/v1/messages")
    return Session(
        client=client_id,
        version=version,
        rc=done.returncode,
        stdout=done.stdout,
        stderr=done.stderr,
        seconds=seconds,
        requests=len(main),
        tool_calls=upstream.tool_calls,
        unscripted=sum(1 for r in main if r.answer == "unscripted"),
        steps_used=sum(1 for s in upstream.steps if s.used),
        steps=len(upstream.steps),
        extra={
            "command": "claude -p PROMPT --output-format text --dangerously-skip-permissions",
            "environment": "DISABLE_AUTO_COMPACT=1, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
            "prompt": PROMPT,
            "scripted_calls": sum(len(s.calls) for s in steps),
            "seed": seed,
            "final_answer": FINAL in done.stdout,
        },
    )
