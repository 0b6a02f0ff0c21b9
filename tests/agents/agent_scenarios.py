"""The scripted tasks each agent performs, and ``AgentRuns``, which runs each scenario once
(control: straight to the fake upstream; proxied: through ``contextfold proxy``) and keeps
the result for every test that checks it.

Every client's API key is its own (a principal of its own in the proxy), so the scenarios of
one session never see each other's memory."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent_harness import (
    ARTIFACTS,
    AgentRun,
    Aider,
    ClaudeCode,
    Client,
    Codex,
    Invocation,
    ProxyProcess,
    Workspace,
)
from agent_upstream import Call, ScriptedUpstream, Step

#: The pinned clients (``versions.txt``).
CLIENTS = ["claude-latest", "claude-2.0", "codex", "aider"]
ANTHROPIC = [c for c in CLIENTS if c.startswith("claude")]

FACT = "blue-heron-42"
HELLO = 'print("hello")\n'
HELLO_WORLD = 'print("hello, world")\n'
CREATE = "Create hello.py that prints hello."
CHANGE = "Make hello.py print hello, world, then run it."
DONE = "Done: hello.py now prints hello, world."


def make_client(client_id: str) -> Client:
    if client_id.startswith("claude"):
        return ClaudeCode(client_id)
    if client_id == "codex":
        return Codex()
    return Aider()


def task(client: Client, ws: Workspace) -> tuple[list[Invocation], list[Step]]:
    """The tiny coding task: create hello.py (first session), then continue that session to
    change it and run it. Files: hello.py == HELLO_WORLD at the end. Claude Code prints
    its first answer as text (``-p``), the continued one as JSON (``--output-format json``)."""
    hello = str(ws.work / "hello.py")
    if isinstance(client, ClaudeCode):
        return [Invocation(CREATE), Invocation(CHANGE, resume=True, output_format="json")], [
            Step(calls=[Call("Write", {"file_path": hello, "content": HELLO})], when=CREATE),
            Step(text="Created hello.py.", when="File created successfully"),
            Step(calls=[Call("Read", {"file_path": hello})], when=CHANGE),
            Step(
                calls=[
                    Call(
                        "Edit",
                        {
                            "file_path": hello,
                            "old_string": HELLO.strip(),
                            "new_string": HELLO_WORLD.strip(),
                        },
                    )
                ],
                when=HELLO.strip(),
            ),
            Step(
                calls=[
                    Call("Bash", {"command": "python3 hello.py", "description": "Run hello.py"})
                ],
                when="has been updated",
            ),
            Step(text=DONE, when="hello, world"),
        ]
    if isinstance(client, Codex):
        write = "printf 'print(\"hello\")\\n' > hello.py"
        change = 'sed -i \'s/"hello"/"hello, world"/\' hello.py && python3 hello.py'
        return [Invocation(CREATE), Invocation(CHANGE, resume=True)], [
            Step(calls=[Call("exec_command", {"cmd": write, "login": False})], when=CREATE),
            Step(text="Created hello.py.", when="exited with code 0"),
            Step(calls=[Call("exec_command", {"cmd": change, "login": False})], when=CHANGE),
            Step(text=DONE, when="hello, world"),
        ]
    return [
        Invocation(CREATE, files=["hello.py"]),
        Invocation(CHANGE, resume=True, files=["hello.py"]),
    ], [
        Step(text=f"hello.py\n```python\n{HELLO}```\n", when=CREATE),
        Step(text=f"hello.py\n```python\n{HELLO_WORLD}```\n", when=CHANGE),
    ]


def memory_sessions() -> tuple[Invocation, Invocation, list[Step], list[Step]]:
    """Session 1 tells the agent a fact; session 2, a new session of the same client (its
    history does not hold the fact), asks for it."""
    tell = f"Remember this for later: the deploy password hint is '{FACT}'. Just say noted."
    ask = "What is the deploy password hint I told you earlier?"
    return (
        Invocation(tell),
        Invocation(ask),
        [Step(text="Noted.", when=FACT)],
        [Step(text="I do not have that hint in this conversation.", when=ask)],
    )


@dataclass
class Pair:
    control: AgentRun
    proxied: AgentRun


@dataclass
class Memory:
    first: AgentRun
    second: AgentRun


class AgentRuns:
    """Runs each scenario once per session and keeps its result."""

    def __init__(self, upstream: ScriptedUpstream, factory: pytest.TempPathFactory) -> None:
        self.upstream = upstream
        self.factory = factory
        self._proxy: ProxyProcess | None = None
        self._pairs: dict[str, Pair] = {}
        self._memory: dict[str, Memory] = {}
        self._keys = 0

    @property
    def proxy(self) -> ProxyProcess:
        if self._proxy is None:
            self._proxy = ProxyProcess(self.upstream.url, self.factory.mktemp("contextfold-home"))
        return self._proxy

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()

    def _key(self, client_id: str) -> str:
        self._keys += 1
        return f"sk-agents-test-{client_id}-{self._keys}"

    def pair(self, client_id: str) -> Pair:
        """The task, run straight to the upstream and then through the proxy, in the same
        paths (the workspace is made anew between them)."""
        if client_id not in self._pairs:
            client = make_client(client_id)
            ws = Workspace(self.factory.mktemp(f"agent-{client_id}"))
            invocations, steps = task(client, ws)
            key = self._key(client_id)
            control = client.run(
                "control", ws, self.upstream, self.upstream.url, key, invocations, steps
            )
            proxy = self.proxy
            proxied = client.run(
                "proxied", ws, self.upstream, proxy.url, key, invocations, steps, proxy=proxy
            )
            for run in (control, proxied):
                run.save(ARTIFACTS / client_id)
            self._pairs[client_id] = Pair(control, proxied)
        return self._pairs[client_id]

    def memory(self, client_id: str) -> Memory:
        """Two sessions through the proxy, the second new (not continued)."""
        if client_id not in self._memory:
            client = make_client(client_id)
            ws = Workspace(self.factory.mktemp(f"memory-{client_id}"))
            tell, ask, steps1, steps2 = memory_sessions()
            key = self._key(client_id)
            proxy = self.proxy
            first = client.run(
                "session 1", ws, self.upstream, proxy.url, key, [tell], steps1, proxy=proxy
            )
            second = client.run(
                "session 2",
                ws,
                self.upstream,
                proxy.url,
                key,
                [ask],
                steps2,
                proxy=proxy,
                fresh=False,
            )
            for run in (first, second):
                run.save(ARTIFACTS / f"memory-{client_id}")
            self._memory[client_id] = Memory(first, second)
        return self._memory[client_id]
